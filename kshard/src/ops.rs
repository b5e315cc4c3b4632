//! Operations against a live shard group: `kshard explain`, and the assignment edits `pin`, `unpin`,
//! `pause`, `resume`, `drain`, `undrain` (`kshard status` is in `status.rs`).
//!
//! `explain` is read-only: it reads the group's assignment ConfigMap `<group>-assignment`. `S` and the key
//! are taken from the assignment itself.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use kube::api::DynamicObject;
use kube::{Api, Client};
use kube_shard::group::admin::{self, Edit, GroupRef};
use kube_shard::group::assignment::{Assignment, Handoff};
use kube_shard::ShardKey;
use serde::Serialize;

use crate::cli::CliError;

/// Which group to operate on.
#[derive(Debug, Args)]
pub(crate) struct GroupArgs {
    /// Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, else the in-cluster config).
    #[arg(long, value_name = "PATH")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// The namespace of the group's Leases and assignment ConfigMap.
    #[arg(long, short = 'n', default_value = "default")]
    pub(crate) namespace: String,
    /// The shard group.
    #[arg(long, default_value = "widget-operator")]
    pub(crate) group: String,
    /// Print one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
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
    #[arg(long, default_value = "5m", value_parser = kube_shard_example_operator::run::parse_duration)]
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

fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Change pins, the pause flag or the drained members ([`admin::edit`]: a compare-and-swap on the
/// assignment ConfigMap beside the coordinator's; it acts on them at its next pass), and print the result.
pub(crate) fn edit(args: &GroupArgs, edit: Edit, out: &mut impl Write) -> Result<(), CliError> {
    let rt = runtime()?;
    let a = rt.block_on(async {
        let client = crate::operator::client_from(args.kubeconfig.as_deref()).await?;
        Ok::<_, CliError>(admin::edit(client, &args.namespace, &args.group, edit).await?)
    })?;
    print_edit(args, &a, None, out)
}

/// `kshard drain MEMBER`: mark it drained, then (unless `--no-wait`) wait until the assignment gives it
/// nothing and no move involving it is in flight.
pub(crate) fn drain(args: &DrainArgs, out: &mut impl Write) -> Result<(), CliError> {
    let rt = runtime()?;
    let g = &args.group;
    let (a, held, waited) = rt.block_on(async {
        let client = crate::operator::client_from(g.kubeconfig.as_deref()).await?;
        let group = GroupRef::new(client, &g.namespace, &g.group);
        let a = group.edit(Edit::Drain(args.member.clone())).await?;
        let view = group.read().await?;
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
            let held = a.holding(&args.member);
            return Ok::<_, CliError>((a, held, None));
        }
        let start = std::time::Instant::now();
        loop {
            let view = group.read().await?;
            let held = view.holding(&args.member);
            if held == 0 {
                return Ok((view.assignment, 0, Some(start.elapsed())));
            }
            if start.elapsed() >= args.timeout {
                return Err(CliError::DrainTimedOut {
                    member: args.member.clone(),
                    held,
                    waited: args.timeout,
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    })?;
    let extra = serde_json::json!({
        "member": args.member,
        "holds": held,
        "waited_seconds": waited.map(|w| (w.as_secs_f64() * 100.0).round() / 100.0),
    });
    print_edit(g, &a, Some(extra), out)
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
        let a = GroupRef::new(client.clone(), &args.group.namespace, &args.group.group)
            .assignment()
            .await?;
        let (kind, ns, name, obj) = read_object(client, &args.kind, &args.object).await?;
        Ok::<_, CliError>(explained(&a, kind, ns, name, &obj))
    })?;
    if args.group.json {
        serde_json::to_writer(&mut *out, &e)?;
        writeln!(out)?;
    } else {
        print_explained(&e, out)?;
    }
    Ok(())
}

/// Why `kshard explain` could not place an object.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExplainError {
    #[error("discovery: {0}")]
    Discovery(kube::Error),
    #[error("no resource {0:?} on the server")]
    NoResource(String),
    #[error("{0} is namespaced: give NAMESPACE/NAME")]
    Namespaced(String),
    #[error("{0} is cluster-scoped: give NAME")]
    ClusterScoped(String),
    #[error("reading {object}: {source}")]
    Read { object: String, source: kube::Error },
}

/// The object `NAMESPACE/NAME` (or `NAME`) of the resource named by kind, plural or `plural.group`:
/// its kind, namespace, name and the object.
async fn read_object(
    client: Client,
    kind: &str,
    object: &str,
) -> Result<(String, Option<String>, String, DynamicObject), ExplainError> {
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .map_err(ExplainError::Discovery)?;
    let want = kind.to_ascii_lowercase();
    let (ar, caps) = discovery
        .groups()
        .flat_map(|g| g.recommended_resources())
        .find(|(ar, _)| {
            ar.kind.to_ascii_lowercase() == want
                || ar.plural == want
                || format!("{}.{}", ar.plural, ar.group) == want
        })
        .ok_or_else(|| ExplainError::NoResource(kind.to_owned()))?;
    let (ns, name) = match object.split_once('/') {
        Some((ns, n)) => (Some(ns.to_owned()), n.to_owned()),
        None => (None, object.to_owned()),
    };
    let api: Api<DynamicObject> = match (&ns, caps.scope) {
        (Some(ns), kube::discovery::Scope::Namespaced) => Api::namespaced_with(client, ns, &ar),
        (None, kube::discovery::Scope::Cluster) => Api::all_with(client, &ar),
        (None, _) => return Err(ExplainError::Namespaced(ar.kind)),
        (Some(_), _) => return Err(ExplainError::ClusterScoped(ar.kind)),
    };
    let obj = api.get(&name).await.map_err(|source| ExplainError::Read {
        object: object.to_owned(),
        source,
    })?;
    Ok((ar.kind, ns, name, obj))
}

/// Where `obj` lives in the group's assignment `a`.
fn explained(
    a: &Assignment,
    kind: String,
    namespace: Option<String>,
    name: String,
    obj: &DynamicObject,
) -> Explained {
    let uid = obj.metadata.uid.clone().unwrap_or_default();
    let value = match a.key {
        ShardKey::Namespace => obj.metadata.namespace.clone().unwrap_or_default(),
        _ => uid.clone(),
    };
    let hash = kube_shard::fnv1a64(value.as_bytes());
    let shard = a.shards.shard_of(hash);
    let sa = a.view.shards.get(&shard);
    Explained {
        kind,
        namespace,
        name,
        uid,
        key: a.key.to_string(),
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
    }
}

fn print_explained(e: &Explained, out: &mut impl Write) -> Result<(), CliError> {
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
    Ok(())
}
