//! Applying a fault to the world, and the writer that changes Widgets meanwhile.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use kube_shard::group::assignment::Assignment;
use kube_shard::group::assignment::DATA_KEY;
use kube_shard::{ShardCount, ShardKey};
use kube_shard_example_operator::widget::{Widget, WidgetSpec, PLURAL};
use kube_shard_testserver::{FailRule, GateSkew, Scope, Target, Verb};

use crate::fault::Fault;
use crate::rng::Rng;
use crate::world::{shards, World, CP_NS, GROUP, NS};

fn later(after: Duration, f: impl FnOnce() + Send + 'static) {
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        f();
    });
}

/// The live member `i` points at (modulo their number).
fn pick(w: &World, i: usize) -> Option<usize> {
    let live = w.live();
    (!live.is_empty()).then(|| live[i % live.len()])
}

/// The member holding the coordinator Lease, if it is one of ours and alive.
async fn coordinator(w: &World) -> Option<usize> {
    let leases: Api<Lease> = Api::namespaced(w.server.client("admin"), CP_NS);
    let l = leases
        .get_opt(&format!("{GROUP}-coordinator"))
        .await
        .ok()??;
    let holder = l.spec?.holder_identity?;
    let name = holder.split('/').next()?.to_owned();
    w.live()
        .into_iter()
        .rev()
        .find(|&i| w.members[i].name == name)
}

/// Apply `f` now.
pub async fn apply(w: &mut World, f: &Fault) {
    w.note(format!("fault {f:?}"));
    let faults = w.server.faults();
    match *f {
        Fault::Kill { member } => kill(w, pick(w, member)),
        Fault::Pause { member, secs } => {
            if let Some(i) = pick(w, member) {
                let sw = w.members[i].switch.clone();
                sw.set_frozen(true);
                later(Duration::from_secs(secs), move || sw.set_frozen(false));
            }
        }
        Fault::Partition { member, secs } => {
            if let Some(i) = pick(w, member) {
                let scope = Scope::identity(w.members[i].name.clone());
                faults.partition(scope.clone(), true);
                later(Duration::from_secs(secs), move || {
                    faults.partition(scope, false);
                });
            }
        }
        Fault::KillCoordinator => {
            let c = coordinator(w).await;
            kill(w, c);
        }
        Fault::ScaleUp => {
            let n = w.fresh_name();
            w.spawn(&n);
        }
        Fault::Leave { member } => leave(w, pick(w, member)),
        Fault::RollingRestart { member } => {
            if let Some(i) = pick(w, member) {
                let name = w.members[i].name.clone();
                leave(w, Some(i));
                w.spawn(&name);
            }
        }
        Fault::SameName { member } => {
            if let Some(i) = pick(w, member) {
                let name = w.members[i].name.clone();
                w.spawn(&name);
            }
        }
        Fault::ErrorBurst { code, times } => {
            faults.fail_next(Scope::All, FailRule::status(code).times(times));
        }
        Fault::Latency { ms, secs } => {
            faults.latency(Scope::All, Some(Duration::from_millis(ms)));
            later(Duration::from_secs(secs), move || {
                faults.latency(Scope::All, None);
            });
        }
        Fault::CloseWatches => faults.close_watches(Scope::All),
        Fault::FreezeWatches { secs } => {
            faults.freeze_watches(Scope::All, true);
            later(Duration::from_secs(secs), move || {
                faults.freeze_watches(Scope::All, false);
            });
        }
        Fault::Compact => faults.compact(),
        Fault::Outage { secs } => faults.outage(Duration::from_secs(secs)),
        Fault::DeleteAssignment => {
            let cms: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
            let _ = cms
                .delete(&format!("{GROUP}-assignment"), &DeleteParams::default())
                .await;
        }
        Fault::CorruptAssignment => {
            let cms: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
            let patch = serde_json::json!({"data": {DATA_KEY: "not an assignment"}});
            let _ = cms
                .patch(
                    &format!("{GROUP}-assignment"),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await;
        }
        Fault::DeleteMemberLease { member } => {
            if let Some(i) = pick(w, member) {
                let leases: Api<Lease> = Api::namespaced(w.server.client("admin"), CP_NS);
                let name = format!("{GROUP}-{}", w.members[i].name);
                let _ = leases.delete(&name, &DeleteParams::default()).await;
            }
        }
        Fault::DeleteCoordinatorLease => {
            let leases: Api<Lease> = Api::namespaced(w.server.client("admin"), CP_NS);
            let _ = leases
                .delete(&format!("{GROUP}-coordinator"), &DeleteParams::default())
                .await;
        }
        Fault::SlowHandoff { member, ms, leave } => {
            if let Some(i) = pick(w, member) {
                late_writes(w, i, ms);
                bump_all(w).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                if leave {
                    self::leave(w, Some(i));
                } else {
                    let n = w.fresh_name();
                    w.spawn(&n);
                }
                // changes right after the handoff: the new owners' watches move past their barrier
                // LISTs at once, so they act while the old owner's requests may still be in flight
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    bump_all(w).await;
                }
            }
        }
        Fault::LaggingJoin { secs } => lagging_join(w, secs).await,
        Fault::StaleAssignment => stale_assignment(w).await,
        Fault::DeleteLeaseUnderLoad { member, ms } => {
            if let Some(i) = pick(w, member) {
                late_writes(w, i, ms);
                bump_all(w).await;
                let leases: Api<Lease> = Api::namespaced(w.server.client("admin"), CP_NS);
                let name = format!("{GROUP}-{}", w.members[i].name);
                let _ = leases.delete(&name, &DeleteParams::default()).await;
            }
        }
        Fault::GateSkew {
            secs,
            per_connection,
        } => {
            faults.gate_skew(if per_connection {
                GateSkew::PerConnection
            } else {
                GateSkew::PerRequest
            });
            later(Duration::from_secs(secs), move || {
                faults.gate_skew(GateSkew::None)
            });
        }
        Fault::UnfilteredWatch { secs } => {
            faults.unfiltered_watch(PLURAL, true);
            later(Duration::from_secs(secs), move || {
                faults.unfiltered_watch(PLURAL, false)
            });
        }
        Fault::AnotherS { secs } => {
            let n = w.fresh_name();
            let other = ShardCount::new(shards().get() * 2).expect("a valid shard count");
            w.spawn_with(&n, other);
            let sw = w.members[w.members.len() - 1].switch.clone();
            later(Duration::from_secs(secs), move || sw.kill());
        }
        Fault::WallJump { member, secs } => {
            if let Some(i) = pick(w, member) {
                w.members[i]
                    .wall_offset
                    .fetch_add(secs.saturating_mul(1_000), Ordering::SeqCst);
            }
        }
    }
}

/// The targets of member `i`'s fenced writes in the Widget namespace (creates, replaces, patches).
fn write_targets(w: &World, i: usize) -> Vec<Target> {
    [Verb::Create, Verb::Update, Verb::Patch]
        .into_iter()
        .map(|v| {
            Scope::identity(w.members[i].name.clone())
                .verb(v)
                .namespace(NS)
        })
        .collect()
}

/// Member `i`'s fenced writes commit `ms` late and are never answered, for 8 s.
fn late_writes(w: &World, i: usize, ms: u64) {
    let faults = w.server.faults();
    let targets = write_targets(w, i);
    for t in &targets {
        faults.late_commit(t.clone(), Duration::from_millis(ms));
    }
    later(Duration::from_secs(8), move || {
        for t in targets {
            faults.answer_normally(t);
        }
    });
}

/// The writer changes every Widget's spec (a rollout): every owner has reconciles queued.
async fn bump_all(w: &World) {
    let api: Api<Widget> = Api::namespaced(w.server.client("writer"), NS);
    let names: Vec<String> = w
        .server
        .objects("example.kube-shard.io", "widgets")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let size = w.now_ms();
    for n in names {
        let patch = serde_json::json!({"spec": {"size": size}});
        let _ = api
            .patch(&n, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
    }
}

/// A new member whose Widget watches freeze for `secs` (after their first LIST), while every Widget
/// changes every 200 ms.
async fn lagging_join(w: &mut World, secs: u64) {
    let n = w.fresh_name();
    w.spawn(&n);
    let faults = w.server.faults();
    let target = Scope::identity(n.clone())
        .verb(Verb::Watch)
        .resource("widgets");
    faults.freeze_watches(target.clone(), true);
    // its Lease writes (the warm acks) take 400 ms: each move stays in Moving — the old owner serving,
    // the new one's LIST done — while changes land
    let acks = Scope::identity(n).verb(Verb::Update).resource("leases");
    faults.latency(acks.clone(), Some(Duration::from_millis(400)));
    // changes every 200 ms: some land while its moves are in Moving (after its LIST, before the
    // release), so the old owner writes a newer spec its frozen cache never sees
    for _ in 0..secs.min(6) * 5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        bump_all(w).await;
    }
    let rest = secs.saturating_sub(secs.min(6));
    later(Duration::from_secs(rest), move || {
        faults.freeze_watches(target, false);
        faults.latency(acks, None);
    });
}

/// Rewrite the assignment as a restored backup would be: its owners, every epoch one lower, at a higher
/// generation.
async fn stale_assignment(w: &World) {
    let cms: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
    let name = format!("{GROUP}-assignment");
    let Ok(cm) = cms.get(&name).await else {
        return;
    };
    let Some(text) = cm.data.as_ref().and_then(|d| d.get(DATA_KEY)) else {
        return;
    };
    let Ok(mut a) = Assignment::decode(text, shards(), ShardKey::Uid) else {
        return;
    };
    a.view.generation += 1;
    for sa in a.view.shards.values_mut() {
        sa.epoch = sa.epoch.saturating_sub(1).max(1);
    }
    let patch = serde_json::json!({"data": {DATA_KEY: a.encode()}});
    let _ = cms
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
}

fn kill(w: &mut World, i: Option<usize>) {
    if let Some(i) = i {
        w.note(format!("kill {}", w.members[i].name));
        w.members[i].switch.kill();
    }
}

fn leave(w: &mut World, i: Option<usize>) {
    if let Some(i) = i {
        w.members[i].leaving = true;
        w.members[i].handle.leave();
    }
}

/// Undo every lasting fault: the faults switched off, every member resumed, wall clocks back in step,
/// and an assignment no member decodes deleted. That last one is the admin's repair: by design no
/// coordinator writes over an assignment it cannot decode (it could be a newer format), so until someone
/// repairs it nothing moves — a member that was leaving stays, and its name's successor waits for it.
pub async fn heal(w: &World) {
    w.server.faults().clear();
    let cms: Api<ConfigMap> = Api::namespaced(w.server.client("admin"), CP_NS);
    let name = format!("{GROUP}-assignment");
    if let Ok(Some(cm)) = cms.get_opt(&name).await {
        let text = cm.data.as_ref().and_then(|d| d.get(DATA_KEY));
        if text.is_none_or(|t| Assignment::decode(t, shards(), ShardKey::Uid).is_err()) {
            let _ = cms.delete(&name, &DeleteParams::default()).await;
            w.note("heal: deleted the assignment no member decodes");
        }
    }
    for m in &w.members {
        m.switch.set_frozen(false);
        m.wall_offset.store(0, Ordering::SeqCst);
    }
    w.note("heal");
}

/// Create `n` Widgets `w-0 … w-{n-1}`.
pub async fn seed_widgets(w: &World, n: usize) {
    let api: Api<Widget> = Api::namespaced(w.server.client("writer"), NS);
    for i in 0..n {
        let _ = api
            .create(&PostParams::default(), &widget(&format!("w-{i}"), 0))
            .await;
    }
}

fn widget(name: &str, size: i64) -> Widget {
    Widget::new(
        name,
        NS,
        WidgetSpec {
            size: Some(size),
            ..WidgetSpec::default()
        },
    )
}

/// One writer step: a spec change, a create, a delete, or a delete + re-create under one name (at most
/// `max` Widgets). Errors (faults) are ignored: the writer is a user, not a checked party.
pub async fn write_step(w: &World, rng: &mut Rng, max: usize) {
    let api: Api<Widget> = Api::namespaced(w.server.client("writer"), NS);
    let names: Vec<String> = w
        .server
        .objects("example.kube-shard.io", "widgets")
        .iter()
        .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    let Some(name) = rng.pick(&names).cloned() else {
        return;
    };
    match rng.range(0, 9) {
        0..=5 => {
            let patch = serde_json::json!({"spec": {"size": rng.range(0, 1_000_000)}});
            let _ = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
        }
        6 if names.len() < max => {
            let n = format!("w-x{}", rng.range(0, 1_000_000));
            let _ = api.create(&PostParams::default(), &widget(&n, 1)).await;
        }
        7 => {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
        _ => {
            if api.delete(&name, &DeleteParams::default()).await.is_ok() {
                let _ = api.create(&PostParams::default(), &widget(&name, 2)).await;
            }
        }
    }
}
