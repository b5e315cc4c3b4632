//! Applying a fault to the world, and the writer that changes Widgets meanwhile.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use kube_shard::group::assignment::DATA_KEY;
use kube_shard_example_operator::widget::{Widget, WidgetSpec};
use kube_shard_testserver::{FailRule, Scope};

use crate::fault::Fault;
use crate::rng::Rng;
use crate::world::{World, CP_NS, GROUP, NS};

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
        Fault::WallJump { member, secs } => {
            if let Some(i) = pick(w, member) {
                w.members[i]
                    .wall_offset
                    .fetch_add(secs.saturating_mul(1_000), Ordering::SeqCst);
            }
        }
    }
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

/// Undo every lasting fault: the faults switched off, every member resumed, wall clocks back in step.
pub fn heal(w: &World) {
    w.server.faults().clear();
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
