//! Operations against a live shard group: `kshard status`.
//!
//! Read-only: it reads the group's assignment ConfigMap `<group>-assignment` and its Leases (members
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
use kube_shard::group::assignment::{Assignment, DATA_KEY};
use kube_shard::group::report::{MemberReport, GROUP_LABEL, INCARNATION, REPORT, ROLE_LABEL};
use kube_shard::ownership::Handoff;
use kube_shard::{ShardCount, ShardKey, ShardSet};
use serde::Serialize;

use crate::cli::CliError;

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
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

/// One member as the status shows it.
#[derive(Debug, Serialize)]
pub(crate) struct MemberStatus {
    pub(crate) name: String,
    pub(crate) incarnation: String,
    pub(crate) ready: bool,
    pub(crate) leaving: bool,
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
            lease_age_seconds: age.map(|x| (x * 10.0).round() / 10.0),
            owned: owned.len(),
            owned_shards: set_string(owned),
            admitted: report.admitted.to_string(),
            serving: report.serving.to_string(),
            applied_generation: report.applied_generation,
            stale_incarnation: stale,
        });
        reports.insert(mname.to_owned(), report);
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

pub(crate) fn status(args: &StatusArgs, out: &mut impl Write) -> Result<(), CliError> {
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
            if m.leaving { "  (leaving)" } else { "" }
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
