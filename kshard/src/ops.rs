//! Operations against a live shard group: `kshard status`, `explain`, and the assignment edits `pin`,
//! `unpin`, `pause`, `resume`, `drain`, `undrain`.
//!
//! `status` and `explain` are read-only: they read the group's assignment ConfigMap `<group>-assignment` and its Leases (members
//! `<group>-<name>` with their reports, the coordinator `<group>-coordinator`). `S` and the key are taken
//! from the assignment itself.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use kube::{Api, Client};
use kube_shard::group::assignment::Handoff;
use kube_shard::group::assignment::{Assignment, DATA_KEY};
use kube_shard::group::report::{MemberReport, GROUP_LABEL, INCARNATION, REPORT, ROLE_LABEL};
use kube_shard::{ShardCount, ShardKey, ShardSet};
use serde::Serialize;

use crate::cli::CliError;

/// One member as the status shows it.
#[derive(Debug, Serialize)]
pub(crate) struct MemberStatus {
    pub(crate) name: String,
    pub(crate) incarnation: String,
    pub(crate) ready: bool,
    pub(crate) leaving: bool,
    /// Drained by `kshard drain`: planned with quota 0 until `kshard undrain`.
    pub(crate) drained: bool,
    /// Not renewed within its `leaseDurationSeconds` (by this machine's clock): its report is stale and
    /// does not count toward multi-owned shards.
    pub(crate) expired: bool,
    /// Seconds since `spec.renewTime` (by this machine's clock).
    pub(crate) lease_age_seconds: Option<f64>,
    pub(crate) owned: usize,
    pub(crate) owned_shards: String,
    pub(crate) admitted: String,
    pub(crate) serving: String,
    pub(crate) applied_generation: u64,
    /// Its incarnation is not the one the assignment names for its shards (a restart not yet seen).
    pub(crate) stale_incarnation: bool,
}

/// The group as `kshard status` shows it.
#[derive(Debug, Serialize)]
pub(crate) struct GroupStatusView {
    pub(crate) group: String,
    pub(crate) namespace: String,
    pub(crate) shards: u32,
    pub(crate) key: String,
    pub(crate) coordinator: Option<String>,
    pub(crate) generation: u64,
    pub(crate) paused: bool,
    /// Members drained by `kshard drain` (by name).
    pub(crate) drained: Vec<String>,
    pub(crate) moves_in_flight: usize,
    pub(crate) members: Vec<MemberStatus>,
    /// Shards without an owner in the assignment.
    pub(crate) unowned: String,
    pub(crate) unowned_count: usize,
    /// Shards admitted by more than one member (per their reports).
    pub(crate) multi_owned: String,
    pub(crate) multi_owned_count: usize,
    /// Shards owned (stable) in the assignment that their owner's report does not serve.
    pub(crate) owned_not_serving: String,
    pub(crate) owned_not_serving_count: usize,
    /// The ring: one character per 1/64 of the hash space, a letter per member (`.` unowned, upper case
    /// while moving).
    pub(crate) ring: String,
    pub(crate) legend: BTreeMap<String, String>,
}

fn set_string(v: impl IntoIterator<Item = u32>) -> String {
    let s: ShardSet = v.into_iter().collect();
    s.to_string()
}

/// Read the group's state.
pub(crate) async fn read_group(
    client: Client,
    namespace: &str,
    group: &str,
) -> Result<GroupStatusView, CliError> {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let name = format!("{group}-assignment");
    let cm = cms
        .get_opt(&name)
        .await
        .map_err(|e| CliError::failed(format!("reading {namespace}/{name}: {e}")))?
        .ok_or_else(|| {
            CliError::failed(format!(
                "no assignment ConfigMap {namespace}/{name}: is group {group:?} running there?"
            ))
        })?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .ok_or_else(|| CliError::failed(format!("{name} has no data key {DATA_KEY:?}")))?;
    let raw: serde_json::Value = serde_json::from_str(text)?;
    let s = raw["shards"]
        .as_u64()
        .and_then(|n| ShardCount::new(u32::try_from(n).ok()?).ok())
        .ok_or_else(|| CliError::failed(format!("{name}: no valid shard count")))?;
    let key: ShardKey = raw["key"]
        .as_str()
        .and_then(|k| k.parse().ok())
        .ok_or_else(|| CliError::failed(format!("{name}: no valid key")))?;
    let a =
        Assignment::decode(text, s, key).map_err(|e| CliError::failed(format!("{name}: {e}")))?;

    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let list = leases
        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={group}")))
        .await
        .map_err(|e| CliError::failed(format!("listing the group's Leases: {e}")))?;
    let now_ms = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let mut coordinator = None;
    let mut members = Vec::new();
    let mut reports: BTreeMap<String, MemberReport> = BTreeMap::new();
    for l in list.items {
        let labels = l.metadata.labels.clone().unwrap_or_default();
        if labels.get(ROLE_LABEL).is_some_and(|r| r == "coordinator") {
            coordinator = l
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty());
            continue;
        }
        let Some(mname) = l
            .metadata
            .name
            .as_deref()
            .and_then(|n| n.strip_prefix(&format!("{group}-")))
        else {
            continue;
        };
        let ann = l.metadata.annotations.clone().unwrap_or_default();
        let incarnation = ann.get(INCARNATION).cloned().unwrap_or_default();
        let report = ann
            .get(REPORT)
            .and_then(|t| MemberReport::decode(t, s).ok())
            .unwrap_or_default();
        let age = l
            .spec
            .as_ref()
            .and_then(|sp| sp.renew_time.as_ref())
            .map(|t| (now_ms - t.0.as_millisecond()) as f64 / 1000.0);
        let duration = l
            .spec
            .as_ref()
            .and_then(|sp| sp.lease_duration_seconds)
            .unwrap_or(15);
        let expired = age.is_none_or(|a| a > f64::from(duration));
        let owned: Vec<u32> = a
            .view
            .shards
            .iter()
            .filter(|(_, sa)| sa.owner.name.as_ref() == mname)
            .map(|(s, _)| *s)
            .collect();
        let stale = a
            .view
            .shards
            .values()
            .any(|sa| sa.owner.name.as_ref() == mname && *sa.owner.incarnation != *incarnation);
        members.push(MemberStatus {
            name: mname.to_owned(),
            incarnation,
            ready: report.ready,
            leaving: report.leaving,
            drained: a.drained.contains(mname),
            expired,
            lease_age_seconds: age.map(|x| (x * 10.0).round() / 10.0),
            owned: owned.len(),
            owned_shards: set_string(owned),
            admitted: report.admitted.to_string(),
            serving: report.serving.to_string(),
            applied_generation: report.applied_generation,
            stale_incarnation: stale,
        });
        if !expired {
            reports.insert(mname.to_owned(), report);
        }
    }
    members.sort_by(|x, y| x.name.cmp(&y.name));

    let unowned: Vec<u32> = a.unowned().iter().collect();
    let multi: Vec<u32> = (0..s.get())
        .filter(|sh| {
            reports
                .values()
                .filter(|r| r.admitted.contains(*sh))
                .count()
                > 1
        })
        .collect();
    let not_serving: Vec<u32> = a
        .view
        .shards
        .iter()
        .filter(|(_, sa)| sa.handoff == Handoff::Stable)
        .filter(|(sh, sa)| {
            !reports
                .get(sa.owner.name.as_ref())
                .is_some_and(|r| r.serving.contains(**sh))
        })
        .map(|(sh, _)| *sh)
        .collect();

    // the ring: a letter per member
    let mut legend = BTreeMap::new();
    let mut letter_of: BTreeMap<String, char> = BTreeMap::new();
    let mut names: Vec<String> = a
        .view
        .shards
        .values()
        .map(|sa| sa.owner.name.to_string())
        .collect();
    names.extend(members.iter().map(|m| m.name.clone()));
    names.sort();
    names.dedup();
    for (i, n) in names.iter().enumerate() {
        let c = (b'a' + (i % 26) as u8) as char;
        letter_of.insert(n.clone(), c);
        legend.insert(c.to_string(), n.clone());
    }
    let cells = 64usize;
    let ring: String = (0..cells)
        .map(|cell| {
            let shard = (cell * s.get() as usize / cells) as u32;
            match a.view.shards.get(&shard) {
                None => '.',
                Some(sa) => {
                    let c = letter_of
                        .get(sa.owner.name.as_ref())
                        .copied()
                        .unwrap_or('?');
                    if sa.handoff == Handoff::Stable {
                        c
                    } else {
                        c.to_ascii_uppercase()
                    }
                }
            }
        })
        .collect();

    Ok(GroupStatusView {
        group: group.to_owned(),
        namespace: namespace.to_owned(),
        shards: s.get(),
        key: key.to_string(),
        coordinator,
        generation: a.view.generation,
        paused: a.paused,
        drained: a.drained.iter().cloned().collect(),
        moves_in_flight: a.moves_in_flight(),
        members,
        unowned_count: unowned.len(),
        unowned: set_string(unowned),
        multi_owned_count: multi.len(),
        multi_owned: set_string(multi),
        owned_not_serving_count: not_serving.len(),
        owned_not_serving: set_string(not_serving),
        ring,
        legend,
    })
}

pub(crate) fn status(args: &GroupArgs, out: &mut impl Write) -> Result<(), CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let view = rt.block_on(async {
        let client = crate::operator::client_from(args.kubeconfig.as_deref()).await?;
        read_group(client, &args.namespace, &args.group).await
    })?;
    if args.json {
        serde_json::to_writer(&mut *out, &view)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(
        out,
        "group {}/{}  S={} key={}  generation {}{}  coordinator {}  moves in flight {}",
        view.namespace,
        view.group,
        view.shards,
        view.key,
        view.generation,
        if view.paused { " (paused)" } else { "" },
        view.coordinator.as_deref().unwrap_or("-"),
        view.moves_in_flight
    )?;
    writeln!(
        out,
        "{:<24} {:<10} {:>5} {:>8} {:>6}  OWNED SHARDS",
        "MEMBER", "INCARN", "READY", "LEASE", "OWNED"
    )?;
    for m in &view.members {
        let inc: String = m.incarnation.chars().take(8).collect();
        writeln!(
            out,
            "{:<24} {:<10} {:>5} {:>8} {:>6}  {}{}",
            m.name,
            inc,
            if m.ready { "yes" } else { "no" },
            m.lease_age_seconds
                .map_or_else(|| "-".to_owned(), |a| format!("{a:.1}s")),
            m.owned,
            m.owned_shards,
            match (m.expired, m.leaving, m.drained) {
                (true, _, _) => "  (expired)",
                (false, true, _) => "  (leaving)",
                (false, false, true) => "  (drained)",
                (false, false, false) => "",
            }
        )?;
    }
    writeln!(
        out,
        "unowned {} [{}]  multi-owned {} [{}]  owned-not-serving {} [{}]",
        view.unowned_count,
        view.unowned,
        view.multi_owned_count,
        view.multi_owned,
        view.owned_not_serving_count,
        view.owned_not_serving
    )?;
    let legend: Vec<String> = view
        .legend
        .iter()
        .map(|(c, n)| format!("{c}={n}"))
        .collect();
    writeln!(out, "ring 0 |{}| 2^64   {}", view.ring, legend.join(" "))?;
    Ok(())
}

/// Which group to operate on.
#[derive(Debug, Args)]
pub(crate) struct GroupArgs {
    /// Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, else the in-cluster config).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The namespace of the group's Leases and assignment ConfigMap.
    #[arg(long, short = 'n', default_value = "default")]
    namespace: String,
    /// The shard group.
    #[arg(long, default_value = "widget-operator")]
    group: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct PinArgs {
    #[command(flatten)]
    pub(crate) group: GroupArgs,
    /// The logical shard.
    pub(crate) shard: u32,
    /// The member (name) it is pinned to.
    pub(crate) member: String,
}

#[derive(Debug, Args)]
pub(crate) struct UnpinArgs {
    #[command(flatten)]
    pub(crate) group: GroupArgs,
    /// The logical shard.
    pub(crate) shard: u32,
}

#[derive(Debug, Args)]
pub(crate) struct DrainArgs {
    #[command(flatten)]
    pub(crate) group: GroupArgs,
    /// The member (name) to drain: its shards move to the other members through ordinary handoffs, and
    /// it gets none until `kshard undrain` (also after a restart under the same name).
    pub(crate) member: String,
    /// Return once the drain is recorded, without waiting for the member to hand its shards off.
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// How long to wait for the member to own nothing.
    #[arg(long, default_value = "5m", value_parser = crate::duration::parse_duration)]
    pub(crate) timeout: std::time::Duration,
}

#[derive(Debug, Args)]
pub(crate) struct UndrainArgs {
    #[command(flatten)]
    pub(crate) group: GroupArgs,
    /// The member (name) to plan again.
    pub(crate) member: String,
}

#[derive(Debug, Args)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    group: GroupArgs,
    /// The kind, plural or `plural.group` of the object (e.g. `Widget`, `configmaps`).
    kind: String,
    /// `NAMESPACE/NAME`, or `NAME` for a cluster-scoped object.
    object: String,
}

/// What `pin`, `unpin`, `pause`, `resume`, `drain` and `undrain` do to the assignment.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Edit {
    Pin(u32),
    Unpin(u32),
    Pause,
    Resume,
    Drain,
    Undrain,
}

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

fn decode_any(name: &str, text: &str) -> Result<(Assignment, ShardCount, ShardKey), CliError> {
    let raw: serde_json::Value = serde_json::from_str(text)?;
    let s = raw["shards"]
        .as_u64()
        .and_then(|n| ShardCount::new(u32::try_from(n).ok()?).ok())
        .ok_or_else(|| CliError::failed(format!("{name}: no valid shard count")))?;
    let key: ShardKey = raw["key"]
        .as_str()
        .and_then(|k| k.parse().ok())
        .ok_or_else(|| CliError::failed(format!("{name}: no valid key")))?;
    let a =
        Assignment::decode(text, s, key).map_err(|e| CliError::failed(format!("{name}: {e}")))?;
    Ok((a, s, key))
}

/// Change pins, the pause flag or the drained members with a compare-and-swap on the assignment
/// ConfigMap (the coordinator reads them at its next pass; the generation increases as with every
/// assignment write), and print the result.
pub(crate) fn edit(
    args: &GroupArgs,
    edit: Edit,
    member: Option<&str>,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let rt = runtime()?;
    let a = rt.block_on(async {
        let client = crate::operator::client_from(args.kubeconfig.as_deref()).await?;
        edit_assignment(&client, args, edit, member).await
    })?;
    print_edit(args, &a, None, out)
}

/// `kshard drain MEMBER`: mark it drained, then (unless `--no-wait`) wait until the assignment gives it
/// nothing and no move involving it is in flight.
pub(crate) fn drain(args: &DrainArgs, out: &mut impl Write) -> Result<(), CliError> {
    let rt = runtime()?;
    let g = &args.group;
    let (a, waited) = rt.block_on(async {
        let client = crate::operator::client_from(g.kubeconfig.as_deref()).await?;
        let a = edit_assignment(&client, g, Edit::Drain, Some(&args.member)).await?;
        let view = read_group(client.clone(), &g.namespace, &g.group).await?;
        if !view.members.iter().any(|m| m.name == args.member) {
            eprintln!(
                "warning: group {:?} has no member named {:?} now; it is drained when it joins",
                g.group, args.member
            );
        }
        if a.paused {
            eprintln!("warning: the group is paused: the drain starts when it is resumed");
        }
        if args.no_wait {
            return Ok((a, None));
        }
        let start = std::time::Instant::now();
        loop {
            let a = read_assignment(&client, g).await?;
            let held = holding(&a, &args.member);
            if held == 0 {
                return Ok((a, Some(start.elapsed())));
            }
            if start.elapsed() >= args.timeout {
                return Err(CliError::failed(format!(
                    "{} still holds {held} shards after {:?}: is another member live (a drained member keeps its shards when it is the only one)? is the group paused?",
                    args.member, args.timeout
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    })?;
    let extra = serde_json::json!({
        "member": args.member,
        "holds": holding(&a, &args.member),
        "waited_seconds": waited.map(|w| (w.as_secs_f64() * 100.0).round() / 100.0),
    });
    print_edit(g, &a, Some(extra), out)
}

/// Shards `member` (by name) owns or is receiving.
fn holding(a: &Assignment, member: &str) -> usize {
    a.view
        .shards
        .values()
        .filter(|sa| {
            let to = match &sa.handoff {
                Handoff::Moving { to, .. } | Handoff::Draining { to, .. } => Some(to),
                _ => None,
            };
            sa.owner.name.as_ref() == member || to.is_some_and(|t| t.name.as_ref() == member)
        })
        .count()
}

/// The group's assignment ConfigMap and what it decodes to (`S` and the key as the assignment says).
async fn fetch_assignment(
    api: &Api<ConfigMap>,
    args: &GroupArgs,
) -> Result<(ConfigMap, Assignment, ShardCount), CliError> {
    let name = format!("{}-assignment", args.group);
    let cm = api
        .get_opt(&name)
        .await
        .map_err(|e| CliError::failed(format!("reading {name}: {e}")))?
        .ok_or_else(|| {
            CliError::failed(format!("no assignment ConfigMap {}/{name}", args.namespace))
        })?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .ok_or_else(|| CliError::failed(format!("{name} has no data key {DATA_KEY:?}")))?;
    let (a, s, _) = decode_any(&name, text)?;
    Ok((cm, a, s))
}

async fn read_assignment(client: &Client, args: &GroupArgs) -> Result<Assignment, CliError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    Ok(fetch_assignment(&api, args).await?.1)
}

fn print_edit(
    args: &GroupArgs,
    a: &Assignment,
    extra: Option<serde_json::Value>,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let drained: Vec<&String> = a.drained.iter().collect();
    if args.json {
        let pins: BTreeMap<String, String> = a
            .pins
            .iter()
            .map(|(s, m)| (s.to_string(), m.clone()))
            .collect();
        let mut v = serde_json::json!({"generation": a.view.generation, "paused": a.paused, "pins": pins, "drained": drained});
        if let (Some(obj), Some(serde_json::Value::Object(more))) = (v.as_object_mut(), extra) {
            obj.extend(more);
        }
        serde_json::to_writer(&mut *out, &v)?;
        writeln!(out)?;
    } else {
        let pins: Vec<String> = a.pins.iter().map(|(s, m)| format!("{s}={m}")).collect();
        let names: Vec<&str> = drained.iter().map(|s| s.as_str()).collect();
        write!(
            out,
            "generation {}  paused {}  pins [{}]  drained [{}]",
            a.view.generation,
            a.paused,
            pins.join(","),
            names.join(",")
        )?;
        if let Some(extra) = extra {
            if let Some(w) = extra["waited_seconds"].as_f64() {
                write!(
                    out,
                    "  {} owns nothing after {w:.1}s",
                    extra["member"].as_str().unwrap_or_default()
                )?;
            }
        }
        writeln!(out)?;
    }
    Ok(())
}

async fn edit_assignment(
    client: &Client,
    args: &GroupArgs,
    edit: Edit,
    member: Option<&str>,
) -> Result<Assignment, CliError> {
    {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
        let name = format!("{}-assignment", args.group);
        for _ in 0..20 {
            let (mut cm, mut a, s) = fetch_assignment(&api, args).await?;
            refuse_rolled_back(client, args, &a, s).await?;
            match edit {
                Edit::Pin(shard) | Edit::Unpin(shard) if shard >= s.get() => {
                    return Err(CliError::failed(format!(
                        "shard {shard} is out of range: the group has {} shards",
                        s.get()
                    )));
                }
                Edit::Pin(shard) => {
                    a.pins.insert(shard, member.unwrap_or_default().to_owned());
                }
                Edit::Unpin(shard) => {
                    a.pins.remove(&shard);
                }
                Edit::Pause => a.paused = true,
                Edit::Resume => a.paused = false,
                Edit::Drain | Edit::Undrain
                    if member.is_none_or(|m| m.is_empty() || m.len() > 253) =>
                {
                    return Err(CliError::failed("a member name is 1 to 253 characters"));
                }
                Edit::Drain => {
                    a.drained.insert(member.unwrap_or_default().to_owned());
                }
                Edit::Undrain => {
                    a.drained.remove(member.unwrap_or_default());
                }
            }
            let now_ms =
                u64::try_from(k8s_openapi::jiff::Timestamp::now().as_millisecond()).unwrap_or(0);
            a.view.generation = Assignment::next_generation(a.view.generation, now_ms);
            cm.data
                .get_or_insert_with(Default::default)
                .insert(DATA_KEY.to_owned(), a.encode());
            match api
                .replace(&name, &kube::api::PostParams::default(), &cm)
                .await
            {
                Ok(_) => return Ok(a),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => return Err(CliError::failed(format!("writing {name}: {e}"))),
            }
        }
        Err(CliError::failed(format!("{name}: too many conflicts")))
    }
}

/// An edit is written over the stored assignment, so it must never be a rolled-back one (a restored backup,
/// a re-applied manifest): its owners have moved on, and an edit at a newer generation would make members
/// follow them. Refused, with the coordinator's alarm text, while a live member (its Lease renewed within
/// its duration) reports a higher generation applied.
async fn refuse_rolled_back(
    client: &Client,
    args: &GroupArgs,
    a: &Assignment,
    s: ShardCount,
) -> Result<(), CliError> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), &args.namespace);
    let list = leases
        .list(&ListParams::default().labels(&format!("{GROUP_LABEL}={}", args.group)))
        .await
        .map_err(|e| CliError::failed(format!("listing the group's Leases: {e}")))?;
    let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    let live = kube_shard::group::report::live_reports(&list.items, now, s);
    let now_ms = u64::try_from(now).unwrap_or(0);
    let found = kube_shard::group::report::applied_above(
        a.view.generation,
        live.iter().map(|(n, r)| (n.as_str(), r)),
        now_ms,
    );
    match found {
        Some((lease, applied)) => Err(CliError::failed(format!(
            "the stored assignment (generation {}) is older than generation {applied} that {lease} applied (a restored backup or a re-applied manifest): not edited; the coordinator writes a newer one over it — retry once `kshard status` shows a generation of at least {applied}",
            a.view.generation
        ))),
        None => Ok(()),
    }
}

/// Where an object lives: its key value, hash, shard, and the shard's owner and epoch.
#[derive(Debug, Serialize)]
struct Explained {
    kind: String,
    namespace: Option<String>,
    name: String,
    uid: String,
    key: String,
    value: String,
    hash: String,
    shard: u32,
    owner: Option<String>,
    epoch: Option<u64>,
    handoff: String,
    pinned_to: Option<String>,
}

pub(crate) fn explain(args: &ExplainArgs, out: &mut impl Write) -> Result<(), CliError> {
    let rt = runtime()?;
    let e = rt.block_on(async {
        let client = crate::operator::client_from(args.group.kubeconfig.as_deref()).await?;
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &args.group.namespace);
        let name = format!("{}-assignment", args.group.group);
        let cm = cms
            .get_opt(&name)
            .await
            .map_err(|e| CliError::failed(format!("reading {name}: {e}")))?
            .ok_or_else(|| {
                CliError::failed(format!(
                    "no assignment ConfigMap {}/{name}",
                    args.group.namespace
                ))
            })?;
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(DATA_KEY))
            .cloned()
            .unwrap_or_default();
        let (a, s, key) = decode_any(&name, &text)?;

        let discovery = kube::discovery::Discovery::new(client.clone())
            .run()
            .await
            .map_err(|e| CliError::failed(format!("discovery: {e}")))?;
        let want = args.kind.to_ascii_lowercase();
        let (ar, caps) = discovery
            .groups()
            .flat_map(|g| g.recommended_resources())
            .find(|(ar, _)| {
                ar.kind.to_ascii_lowercase() == want
                    || ar.plural == want
                    || format!("{}.{}", ar.plural, ar.group) == want
            })
            .ok_or_else(|| {
                CliError::failed(format!("no resource {:?} on the server", args.kind))
            })?;
        let (ns, obj_name) = match args.object.split_once('/') {
            Some((ns, n)) => (Some(ns.to_owned()), n.to_owned()),
            None => (None, args.object.clone()),
        };
        let api: Api<kube::api::DynamicObject> = match (&ns, caps.scope) {
            (Some(ns), kube::discovery::Scope::Namespaced) => Api::namespaced_with(client, ns, &ar),
            (None, kube::discovery::Scope::Cluster) => Api::all_with(client, &ar),
            (None, _) => {
                return Err(CliError::failed(format!(
                    "{} is namespaced: give NAMESPACE/NAME",
                    ar.kind
                )))
            }
            (Some(_), _) => {
                return Err(CliError::failed(format!(
                    "{} is cluster-scoped: give NAME",
                    ar.kind
                )))
            }
        };
        let obj = api
            .get(&obj_name)
            .await
            .map_err(|e| CliError::failed(format!("reading {}: {e}", args.object)))?;
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let value = match key {
            ShardKey::Namespace => obj.metadata.namespace.clone().unwrap_or_default(),
            _ => uid.clone(),
        };
        let hash = kube_shard::fnv1a64(value.as_bytes());
        let shard = s.shard_of(hash);
        let sa = a.view.shards.get(&shard);
        Ok::<_, CliError>(Explained {
            kind: ar.kind.clone(),
            namespace: ns,
            name: obj_name,
            uid,
            key: key.to_string(),
            value,
            hash: format!("{hash:016x}"),
            shard,
            owner: sa.map(|sa| format!("{}/{}", sa.owner.name, sa.owner.incarnation)),
            epoch: sa.map(|sa| sa.epoch),
            handoff: match sa.map(|sa| &sa.handoff) {
                None => "unowned".to_owned(),
                Some(Handoff::Stable) => "stable".to_owned(),
                Some(Handoff::Moving { id, to }) => format!("moving {id} to {}", to.name),
                Some(Handoff::Draining { id, to }) => format!("draining {id} to {}", to.name),
                Some(_) => "moving".to_owned(),
            },
            pinned_to: a.pins.get(&shard).cloned(),
        })
    })?;
    if args.group.json {
        serde_json::to_writer(&mut *out, &e)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{} {}{}  {}={}  hash {}  shard {}  owner {}  epoch {}  {}{}",
            e.kind,
            e.namespace
                .as_deref()
                .map(|n| format!("{n}/"))
                .unwrap_or_default(),
            e.name,
            e.key,
            e.value,
            e.hash,
            e.shard,
            e.owner.as_deref().unwrap_or("-"),
            e.epoch.map_or_else(|| "-".to_owned(), |x| x.to_string()),
            e.handoff,
            e.pinned_to
                .as_deref()
                .map(|m| format!("  pinned to {m}"))
                .unwrap_or_default()
        )?;
    }
    Ok(())
}
