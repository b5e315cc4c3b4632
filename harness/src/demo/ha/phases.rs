//! The demo's steps against the pair: the mirror in one direction, the planned switchover (demote with
//! the freeze and the token, promote with the token), the partition of the Active's apiserver and the
//! forced promotion, the heal, and the failback pairing of the old Active's objects.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::api::ListParams;
use kube::Api;
use kube_shard::rt::Clock;
use kube_shard_ha::failback::{Failback, FailbackOptions};
use kube_shard_ha::failover::ForceOptions;
use kube_shard_ha::mirror::{KindSet, Mirror, MirrorConfig, MirrorWiring};
use kube_shard_ha::promotion::PromotionChecks;
use kube_shard_ha::switchover::{self, DemoteOptions, FreezeScope, Kind, PromoteOptions};
use kube_shard_ha::{FailoverEpoch, HaClients, HaMode};
use kube_shard_testserver::Scope;
use tokio::time::Instant;

use super::cluster_objects::selector;
use super::setup::{ha_config, Backend, Cluster, EXEMPT};
use crate::demo::DemoError;
use kube_shard_example_operator::widget::Widget;

/// The Widget kind, whose writes the demo counts.
pub(crate) fn kind() -> Kind {
    "widgets.example.kube-shard.io/v1"
        .parse()
        .expect("a valid kind")
}

/// The mirrored kinds: the Widgets, and ConfigMaps (a built-in kind: scoped by the demo's label).
fn kinds() -> Vec<Kind> {
    vec![kind(), "configmaps/v1".parse().expect("a valid kind")]
}

fn failed(what: &str) -> impl FnOnce(String) -> DemoError + '_ {
    move |e| DemoError::failed(format!("{what}: {e}"))
}

/// The mirror configuration of `standby` (source `active`): the demo's Widgets in `ns`.
fn mirror_config(standby: &Cluster, active: &Cluster, ns: &str) -> Result<MirrorConfig, DemoError> {
    let ks = kinds();
    let set = ks
        .iter()
        .fold(KindSet::builder(), |b, k| b.mirrored(k.clone()))
        .build(&ks)
        .map_err(|e| failed("the mirror's kinds")(e.to_string()))?;
    MirrorConfig::new(
        ha_config(standby.id, standby.rank, HaMode::Standby, ns)?,
        active.id,
        set,
    )
    .namespaces([ns])
    .labels(&selector())
    .map(|m| {
        m.probe_period(Duration::from_secs(1))
            .checkpoint_period(Duration::from_millis(250))
    })
    .map_err(|e| failed("the mirror's scope")(e.to_string()))
}

/// Start the mirror of `active`'s Widgets into `standby` (run by the Standby, identity
/// `<standby>-mirror`) and wait until its first full LIST is applied.
#[tracing::instrument(skip_all, fields(standby = standby.id, source = active.id))]
pub(crate) async fn start_mirror(
    standby: &Cluster,
    active: &Cluster,
    ns: &str,
    clock: Clock,
) -> Result<Mirror, DemoError> {
    let cfg = mirror_config(standby, active, ns)?;
    let who = format!("{}-mirror", standby.id);
    let m = Mirror::start(
        cfg,
        active.client(&who),
        standby.client(&who),
        MirrorWiring::new(clock, Some(standby.control.clone())),
    )
    .await
    .map_err(|e| failed("starting the mirror")(e.to_string()))?;
    let t0 = Instant::now();
    while kinds()
        .iter()
        .any(|k| m.kind(&k.key()).and_then(|k| k.synced).is_none())
    {
        if t0.elapsed() > Duration::from_secs(30) {
            return Err(DemoError::failed(
                "the mirror did not complete its first LIST in 30 s",
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(m)
}

/// Stop a mirror (bounded: its requests to a partitioned cluster fail at once).
pub(crate) async fn stop_mirror(m: Mirror) {
    let _ = tokio::time::timeout(Duration::from_secs(10), m.stop()).await;
}

/// A planned switchover from `from` to `to`, as `kshard ha demote` and `kshard ha promote --token`
/// would run it: the new epoch.
#[tracing::instrument(skip_all, fields(from = from.id, to = to.id))]
pub(crate) async fn switchover(
    from: &Cluster,
    to: &Cluster,
    ns: &str,
    clock: Clock,
) -> Result<FailoverEpoch, DemoError> {
    let who = format!("{}-cmd", from.id);
    let cfg = ha_config(from.id, from.rank, HaMode::Standby, ns)?;
    let clients = HaClients::new(from.client(&who), to.client(&who), None);
    let scope = FreezeScope::new(vec![ns.to_owned()], Some(&selector()))
        .map_err(|e| failed("the freeze's scope")(e.to_string()))?;
    let opts = DemoteOptions::new(kinds())
        .scope(scope)
        .freeze_exempt(EXEMPT.iter().map(|s| (*s).to_owned()).collect());
    let token = switchover::demote(&cfg, &clients, &opts, |l| {
        tracing::info!("demote {}: {l}", from.id)
    })
    .await
    .map_err(|e| failed("demote")(e.to_string()))?;
    let who = format!("{}-cmd", to.id);
    let cfg = ha_config(to.id, to.rank, HaMode::Standby, ns)?;
    let clients = HaClients::new(to.client(&who), from.client(&who), None);
    switchover::promote_with_token(
        &cfg,
        clients,
        clock,
        &token,
        &PromoteOptions::new(Duration::from_secs(60)).checks(cross_checks(from, ns)?),
        |l| tracing::info!("promote {}: {l}", to.id),
    )
    .await
    .map_err(|e| failed("promote --token")(e.to_string()))
}

/// Cut `active`'s apiserver off: every request to it goes unanswered, and its elector cannot reach the
/// peer either (its whole site is partitioned). `false` heals. On testserver: its fault injection; on
/// real clusters: the demo's proxies (new connections refused, open ones stalled, closed at the heal).
pub(crate) fn partition(active: &Cluster, peer: &Cluster, on: bool) {
    match (&active.backend, &peer.backend) {
        (Backend::Embedded(s), Backend::Embedded(p)) => {
            s.faults().partition(Scope::All, on);
            p.faults()
                .partition(Scope::identity(format!("{}-ha", active.id)), on);
        }
        (Backend::Real(s), Backend::Real(p)) => s.cut(on, p),
        // the demo never mixes them
        _ => {}
    }
}

/// Hold (or release) the watches the mirror running in `standby` has open on `active`: nothing is
/// delivered, events are kept (testserver's `freeze_watches`). Embedded clusters only: `run` refuses
/// `--stall-mirror` on real ones.
pub(crate) fn hold_mirror(active: &Cluster, standby: &Cluster, on: bool) {
    if let Backend::Embedded(s) = &active.backend {
        s.faults()
            .freeze_watches(Scope::identity(format!("{}-mirror", standby.id)), on);
    }
}

/// `kshard ha promote --force --old-active-stopped` on `standby`: the new epoch.
#[tracing::instrument(skip_all, fields(standby = standby.id))]
pub(crate) async fn force_promote(
    standby: &Cluster,
    old: &Cluster,
    ns: &str,
    clock: Clock,
) -> Result<FailoverEpoch, DemoError> {
    check_target(standby, old, ns, true).await?;
    let who = format!("{}-cmd", standby.id);
    let cfg = ha_config(standby.id, standby.rank, HaMode::Standby, ns)?;
    let clients = HaClients::new(standby.client(&who), old.client(&who), None);
    // the demo stops the mirror beside the promotion: a short wait for its hold acknowledgement
    let opts = ForceOptions::new(Duration::from_secs(60))
        .hold_mirror(Duration::from_secs(2))
        .checks(cross_checks(old, ns)?);
    kube_shard_ha::failover::force_promote_with(&cfg, clients, clock, &opts, |l| {
        tracing::info!("promote --force {}: {l}", standby.id);
    })
    .await
    .map_err(|e| failed("promote --force")(e.to_string()))
}

/// What the demo's commands name of the promoting cluster's mirror (the checks read the mirror from
/// its checkpoint and compare): the Widgets of `ns` from `source`.
fn cross_checks(source: &Cluster, ns: &str) -> Result<PromotionChecks, DemoError> {
    PromotionChecks::default()
        .kinds(kinds())
        .source(Some(source.id.to_owned()))
        .namespaces(vec![ns.to_owned()])
        .labels(Some(&selector()))
        .map_err(|e| failed("the promotion's cross-checks")(e.to_string()))
}

/// The new Active's Widgets: name → `spec.size`. A Terminating Widget counts as deleted (on a cluster
/// without a garbage collector a copy the mirror deleted with `propagationPolicy: Orphan` stays so).
pub(crate) async fn held(
    c: &Cluster,
    ns: &str,
) -> Result<std::collections::BTreeMap<String, u64>, DemoError> {
    let api: Api<Widget> = Api::namespaced(c.client("demo-oracle"), ns);
    let l = api
        .list(&ListParams::default())
        .await
        .map_err(|e| failed("listing Widgets")(e.to_string()))?;
    Ok(l.items
        .into_iter()
        .filter(|w| w.metadata.deletion_timestamp.is_none())
        .map(|w| {
            (
                w.metadata.name.clone().unwrap_or_default(),
                w.spec.size.and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
            )
        })
        .collect())
}

/// A Standby rejoining under `active`: the library's failback (`kube_shard_ha::failback::Failback`,
/// HA.md "Promotion and adoption") pairs each of `standby`'s Widgets with `active`'s by name and
/// recorded source uid (equal: labelled a copy; different: updated in place), and deletes the rest
/// (divergent) with no prune grace (the demo's writer is paused meanwhile). Of the divergent ones,
/// those `deleted_by_active` names were deleted by the Active since; the others are reported. Passes
/// run until one finds nothing left to do.
#[tracing::instrument(skip_all, fields(standby = standby.id, active = active.id))]
pub(crate) async fn rejoin(
    standby: &Cluster,
    active: &Cluster,
    ns: &str,
    deleted_by_active: &BTreeSet<String>,
) -> Result<Rejoined, DemoError> {
    // failback is the Standby's mirror duty: it writes as the mirror, which the old Active's freeze (in
    // place since the planned switchover) exempts
    let who = format!("{}-mirror", standby.id);
    let mut fb = Failback::new(
        mirror_config(standby, active, ns)?,
        standby.client(&who),
        active.client(&who),
        // every Widget here is the demo writer's, whose lost writes the demo counts: it decides, as a person
        // reading the report would, that the divergent ones kube-shard never stamped may go too
        FailbackOptions::default()
            .prune_grace(Duration::ZERO)
            .delete_unstamped(true),
    );
    let mut out = Rejoined::default();
    let mut seen = BTreeSet::new();
    let mut last = None;
    for pass in 0..10 {
        let r = fb
            .run_once()
            .await
            .map_err(|e| failed(&format!("failback of {}", standby.id))(e.to_string()))?;
        for d in &r.divergent {
            if !seen.insert(d.at.name.clone()) {
                continue;
            }
            if deleted_by_active.contains(&d.at.name) {
                out.deleted_by_active += 1;
            } else {
                out.divergent.push(d.at.name.clone());
            }
        }
        if r.divergent.is_empty() && r.failed.is_empty() {
            return Ok(out);
        }
        last = r.failed.first().map(|p| format!("{}: {}", p.at, p.what));
        tracing::info!(
            pass,
            divergent = r.divergent.len(),
            failed = r.failed.len(),
            "failback: another pass"
        );
    }
    Err(DemoError::failed(format!(
        "failback of {} did not finish in 10 passes (last failure: {})",
        standby.id,
        last.unwrap_or_else(|| "none".into())
    )))
}

/// Refuse `standby` as a promotion target while it holds Widgets that are not copies of `old`'s
/// (`kshard ha promote --kind`'s check), `synced`: also while it never mirrored them.
pub(crate) async fn check_target(
    standby: &Cluster,
    old: &Cluster,
    ns: &str,
    synced: bool,
) -> Result<(), DemoError> {
    let cfg = mirror_config(standby, old, ns)?;
    kube_shard_ha::promotion::check_target(&cfg, &standby.client("demo-check"), synced)
        .await
        .map(|_| ())
        .map_err(|e| failed(&format!("{} as a promotion target", standby.id))(e.to_string()))
}

/// What a rejoin found among the objects only the rejoining Standby holds (all of them pruned).
#[derive(Debug, Default)]
pub(crate) struct Rejoined {
    /// Objects the Active never held: writes the Standby accepted that the Active did not get.
    pub(crate) divergent: Vec<String>,
    /// Objects the Active deleted since (the writer's latest acknowledged write of the name is a delete
    /// by the Active): not divergent, the mirror would have deleted a copy of them.
    pub(crate) deleted_by_active: u64,
}
