//! Every documented way to read sharded objects reconciles what an event stream alone cannot deliver: an
//! object held back while the member was self-fenced (once it is un-fenced), and an object of a shard taken
//! over from a dead member — neither object changing in between. Each scenario also runs with the
//! re-enqueues dropped (the `drop-reenqueue` fault point) where they are the only way the object comes
//! back, and must then fail: the test catches a lossy entry point.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube::{Api, Resource, ResourceExt};
use kube_shard::group::GroupHandle;
use kube_shard::testing::faults;
use kube_shard::{reconcile, Permit};
use kube_shard_testserver::{Scope, TestServer};

use crate::harness::{builder, group_server, s, until};
use crate::read_path::watcher::NS;

/// The ways an operator reads its objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    /// `kube_shard::Controller`, pre-wired.
    Controller,
    /// `kube_shard::reflector` into kube's `Controller::for_stream(..).reconcile_on(..)`.
    Reflector,
    /// `kube_shard::watcher` through kube's own `reflector`.
    Watcher,
    /// `kube_shard::metadata_watcher` through kube's own `reflector`.
    MetadataWatcher,
    /// Admission only: kube's `Controller::new`, the reconcile wrapper, `kube_shard::gained`.
    Gained,
}

/// (member, resourceVersion) of each reconcile of one object, in order.
type Reconciles = Vec<(String, String)>;

/// Who reconciled what: object name → its reconciles.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<BTreeMap<String, Reconciles>>>);

impl Log {
    fn record<K: Resource>(&self, who: &str, obj: &K) {
        let m = obj.meta();
        self.0
            .lock()
            .unwrap()
            .entry(m.name.clone().unwrap_or_default())
            .or_default()
            .push((
                who.to_owned(),
                m.resource_version.clone().unwrap_or_default(),
            ));
    }

    fn by(&self, name: &str, who: &str) -> Vec<String> {
        let log = self.0.lock().unwrap();
        let seen = log.get(name).map(Vec::as_slice).unwrap_or_default();
        seen.iter()
            .filter(|(w, _)| w == who)
            .map(|(_, rv)| rv.clone())
            .collect()
    }
}

struct Member {
    handle: GroupHandle,
    task: tokio::task::JoinHandle<()>,
}

fn reconciler<K: Resource + Send + Sync + 'static>(
    who: &str,
    log: &Log,
) -> impl FnMut(Arc<K>, Arc<()>, Permit) -> futures::future::Ready<Result<Action, Infallible>>
       + Send
       + Clone
       + 'static {
    let (who, log) = (who.to_owned(), log.clone());
    move |obj: Arc<K>, _ctx: Arc<()>, _permit: Permit| {
        log.record(&who, obj.as_ref());
        futures::future::ready(Ok(Action::await_change()))
    }
}

fn requeue<K, E>(_: Arc<K>, _: &E, _: Arc<()>) -> Action {
    Action::requeue(Duration::from_secs(1))
}

/// Member `name` reading ConfigMaps in [`NS`] through `entry` (its group client is identity `name`, its
/// application client `name-app`, so a partition of `name` stalls only its renewals).
fn launch(server: &TestServer, name: &str, entry: Entry, log: &Log) -> Member {
    let group = builder(server, name).build().expect("valid config");
    let api: Api<ConfigMap> = Api::namespaced(server.client(&format!("{name}-app")), NS);
    let cfg = watcher::Config::default();
    if entry == Entry::Controller {
        let controller = kube_shard::Controller::new(api, cfg, group);
        let handle = controller.handle();
        let run = controller.run_with_permit(reconciler(name, log), requeue, Arc::new(()));
        let task = tokio::spawn(run.for_each(|_| async {}));
        return Member { handle, task };
    }
    let (handle, group_task) = group.start();
    let own = handle.ownership();
    let controller = match entry {
        Entry::Reflector => {
            let r = kube_shard::reflector(api, cfg, own.clone());
            kube::runtime::Controller::for_stream(r.events.applied_objects(), r.store)
                .reconcile_on(r.reenqueue)
                .run(
                    reconcile::wrap(own, reconciler(name, log)),
                    requeue,
                    Arc::new(()),
                )
                .for_each(|_| async {})
                .boxed()
        }
        Entry::Watcher => {
            let w = kube_shard::watcher(api, cfg, own.clone());
            let (store, writer) = reflector::store();
            kube::runtime::Controller::for_stream(
                reflector(writer, w.events).applied_objects(),
                store,
            )
            .reconcile_on(w.reenqueue)
            .run(
                reconcile::wrap(own, reconciler(name, log)),
                requeue,
                Arc::new(()),
            )
            .for_each(|_| async {})
            .boxed()
        }
        Entry::MetadataWatcher => {
            let w = kube_shard::metadata_watcher(api, cfg, own.clone());
            let (store, writer) = reflector::store::<PartialObjectMeta<ConfigMap>>();
            kube::runtime::Controller::for_stream(
                reflector(writer, w.events).applied_objects(),
                store,
            )
            .reconcile_on(w.reenqueue)
            .run(
                reconcile::wrap(own, reconciler(name, log)),
                requeue,
                Arc::new(()),
            )
            .for_each(|_| async {})
            .boxed()
        }
        Entry::Gained => {
            let c = kube::runtime::Controller::new(api, cfg);
            let gained = kube_shard::gained(own.clone(), c.store());
            c.reconcile_on(gained)
                .run(
                    reconcile::wrap(own, reconciler(name, log)),
                    requeue,
                    Arc::new(()),
                )
                .for_each(|_| async {})
                .boxed()
        }
        Entry::Controller => unreachable!("handled above"),
    };
    let task = tokio::spawn(async move {
        let group = async move {
            if let Err(e) = group_task.await {
                panic!("member task failed: {e}");
            }
        };
        futures::future::join(group, controller).await;
    });
    Member { handle, task }
}

fn owns_all(members: &[&Member]) -> bool {
    (0..s().get()).all(|shard| {
        members
            .iter()
            .filter(|m| m.handle.ownership().admit_shard(shard).is_ok())
            .count()
            == 1
    })
}

async fn create(server: &TestServer, name: &str) -> ConfigMap {
    crate::read_path::watcher::seed(&server.client("admin"), 0).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("admin"), NS);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &cm).await.unwrap()
}

async fn unchanged(server: &TestServer, cm: &ConfigMap) {
    let api: Api<ConfigMap> = Api::namespaced(server.client("admin"), NS);
    let now = api.get(&cm.name_any()).await.unwrap();
    assert_eq!(
        now.resource_version(),
        cm.resource_version(),
        "the object did not change"
    );
}

/// An object created while its owner is self-fenced is reconciled once the owner renews again.
async fn held_while_fenced(entry: Entry, reenqueue: bool) -> bool {
    let _fault = (!reenqueue).then(|| faults::plant(faults::DROP_REENQUEUE));
    let (server, _log) = group_server().await;
    crate::read_path::watcher::seed(&server.client("admin"), 0).await;
    let log = Log::default();
    let a = launch(&server, "a", entry, &log);
    until(Duration::from_secs(30), "a owns every shard", || {
        owns_all(&[&a])
    })
    .await;

    server.faults().partition(Scope::identity("a"), true);
    until(Duration::from_secs(10), "a self-fenced", || {
        a.handle.ownership().is_self_fenced()
    })
    .await;
    let x = create(&server, "held").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        log.by("held", "a").is_empty(),
        "not reconciled while self-fenced"
    );

    server.faults().partition(Scope::identity("a"), false);
    until(Duration::from_secs(10), "a renewed", || {
        !a.handle.ownership().is_self_fenced()
    })
    .await;
    let reconciled = wait(Duration::from_secs(20), || !log.by("held", "a").is_empty()).await;
    unchanged(&server, &x).await;
    a.task.abort();
    reconciled
}

/// The objects of a dead member's shards are reconciled by the member that takes them over.
async fn taken_over(entry: Entry, reenqueue: bool) -> bool {
    let _fault = (!reenqueue).then(|| faults::plant(faults::DROP_REENQUEUE));
    let (server, _log) = group_server().await;
    crate::read_path::watcher::seed(&server.client("admin"), 0).await;
    let log = Log::default();
    let a = launch(&server, "a", entry, &log);
    let b = launch(&server, "b", entry, &log);
    until(Duration::from_secs(60), "every shard owned once", || {
        owns_all(&[&a, &b])
    })
    .await;
    let mut theirs = Vec::new();
    for i in 0..12 {
        let cm = create(&server, &format!("obj-{i}")).await;
        if b.handle.ownership().admit(&cm).is_ok() {
            theirs.push(cm);
        }
    }
    assert!(!theirs.is_empty(), "b owns some of twelve objects");
    until(Duration::from_secs(20), "b reconciled its objects", || {
        theirs
            .iter()
            .all(|cm| !log.by(&cm.name_any(), "b").is_empty())
    })
    .await;

    b.task.abort();
    let reconciled = wait(Duration::from_secs(30), || {
        theirs
            .iter()
            .all(|cm| !log.by(&cm.name_any(), "a").is_empty())
    })
    .await;
    for cm in &theirs {
        unchanged(&server, cm).await;
    }
    a.task.abort();
    reconciled
}

/// Whether `cond` holds within `limit`.
async fn wait(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < end {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cond()
}

macro_rules! entry_tests {
    ($($name:ident: $entry:expr, taken_over_needs_reenqueue: $needs:expr;)*) => {$(
        mod $name {
            use super::*;

            #[tokio::test(start_paused = true)]
            async fn reconciles_what_was_held_while_self_fenced() {
                assert!(held_while_fenced($entry, true).await, "reconciled after the un-fencing");
            }

            #[tokio::test(start_paused = true)]
            async fn without_reenqueues_what_was_held_stays_unreconciled() {
                assert!(!held_while_fenced($entry, false).await, "the check catches a lost re-enqueue");
            }

            #[tokio::test(start_paused = true)]
            async fn reconciles_the_objects_of_a_dead_members_shards() {
                assert!(taken_over($entry, true).await, "reconciled by the new owner");
            }

            #[tokio::test(start_paused = true)]
            async fn without_reenqueues_a_takeover_is_caught_where_they_are_needed() {
                let reconciled = taken_over($entry, false).await;
                assert_eq!(!reconciled, $needs, "a takeover without re-enqueues");
            }
        }
    )*};
}

// The sharded watchers deliver a gained shard's objects as events too (the new owner's read starts
// there), so only admission-only use depends on re-enqueues after a takeover.
entry_tests! {
    controller: Entry::Controller, taken_over_needs_reenqueue: false;
    reflector_: Entry::Reflector, taken_over_needs_reenqueue: false;
    watcher_: Entry::Watcher, taken_over_needs_reenqueue: false;
    metadata_watcher_: Entry::MetadataWatcher, taken_over_needs_reenqueue: false;
    gained_: Entry::Gained, taken_over_needs_reenqueue: true;
}
