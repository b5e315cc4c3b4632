//! The pre-wired controller's shutdown: a signal makes the member leave the group before the controller
//! stops, so its shards move at once instead of after a lease.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{controller::Action, watcher};
use kube::Api;

use crate::harness::{builder, group_server, s, until, CP_NS, GROUP};
use crate::read_path::watcher::NS;

fn member(
    server: &kube_shard_testserver::TestServer,
    name: &str,
    on_signal: bool,
) -> (kube_shard::group::GroupHandle, tokio::task::JoinHandle<()>) {
    let group = builder(server, name).build().expect("valid config");
    let api: Api<ConfigMap> = Api::namespaced(server.client(&format!("{name}-app")), NS);
    let mut controller = kube_shard::Controller::new(api, watcher::Config::default(), group);
    if on_signal {
        controller = controller.shutdown_on_signal();
    }
    let handle = controller.handle();
    let run = controller.run(
        |_: Arc<ConfigMap>, _: Arc<()>| async {
            // kube's reconciler signature: the permit is in scope, and fences this reconcile's writes
            assert!(matches!(kube_shard::Current::fence(), Some(Ok(_))));
            Ok::<_, std::convert::Infallible>(Action::await_change())
        },
        |_, _, _| Action::requeue(Duration::from_secs(1)),
        Arc::new(()),
    );
    (handle, tokio::spawn(run.for_each(|_| async {})))
}

fn owns_every_shard(h: &kube_shard::group::GroupHandle) -> bool {
    (0..s().get()).all(|shard| h.ownership().admit_shard(shard).is_ok())
}

/// SIGTERM to this process: `a` (the only controller listening for signals) leaves, and its controller
/// stops only after the leave finished — `b` owns every shard by then, well within a lease.
#[tokio::test(start_paused = true)]
async fn shutdown_on_signal_leaves_the_group_before_the_controller_stops() {
    let (server, _log) = group_server().await;
    crate::read_path::watcher::seed(&server.client("admin"), 0).await;
    let (a, a_task) = member(&server, "a", true);
    let (b, b_task) = member(&server, "b", false);
    until(Duration::from_secs(60), "a and b share the shards", || {
        (0..s().get()).all(|shard| {
            a.ownership().admit_shard(shard).is_ok() != b.ownership().admit_shard(shard).is_ok()
        })
    })
    .await;
    assert!(
        !owns_every_shard(&b),
        "a holds some shards before the signal"
    );

    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    // (no timing here: paused time runs ahead while the signal is in flight)
    until(Duration::from_secs(30), "a's controller stopped", || {
        a_task.is_finished()
    })
    .await;
    // the controller stopped after the leave: a had released every shard (b activates each once its
    // read is warm) and deleted its Lease
    assert!(
        (0..s().get()).all(|shard| a.ownership().shard_state(shard).is_none()),
        "a released every shard before its controller stopped: {:?}",
        a.ownership().shard_states()
    );
    let leases: Api<Lease> = Api::namespaced(server.client("admin"), CP_NS);
    assert!(
        leases
            .get_opt(&format!("{GROUP}-a"))
            .await
            .unwrap()
            .is_none(),
        "a deleted its member Lease (a killed member's would wait out its lease)"
    );
    until(Duration::from_secs(10), "b owns every shard", || {
        owns_every_shard(&b)
    })
    .await;
    assert!(
        !b_task.is_finished(),
        "b, not listening for signals, runs on"
    );
    b_task.abort();
}

/// `owns`: a child's change reconciles its parent (read sharded with it, by its controller ownerReference),
/// the parent unchanged.
#[tokio::test(start_paused = true)]
async fn owns_reconciles_the_parent_when_its_child_changes() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::{ObjectMeta, PostParams};
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    let (server, _log) = group_server().await;
    crate::read_path::watcher::seed(&server.client("admin"), 0).await;
    let admin: Api<ConfigMap> = Api::namespaced(server.client("admin"), NS);
    let object = |name: &str, role: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([("role".to_owned(), role.to_owned())])),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    let parent = admin
        .create(&PostParams::default(), &object("p", "parent"))
        .await
        .unwrap();

    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let group = builder(&server, "a").build().expect("valid config");
    let app = server.client("a-app");
    let controller = kube_shard::Controller::new(
        Api::namespaced(app.clone(), NS),
        watcher::Config::default().labels("role=parent"),
        group,
    )
    .owns(
        Api::<ConfigMap>::namespaced(app, NS),
        watcher::Config::default().labels("role=child"),
    );
    let log = seen.clone();
    let run = controller.run(
        move |p: Arc<ConfigMap>, _: Arc<()>| {
            log.lock().unwrap().push(p.metadata.name.clone().unwrap());
            async { Ok::<_, std::convert::Infallible>(Action::await_change()) }
        },
        |_, _, _| Action::requeue(Duration::from_secs(1)),
        Arc::new(()),
    );
    let task = tokio::spawn(run.for_each(|_| async {}));
    let count = || seen.lock().unwrap().iter().filter(|n| *n == "p").count();
    until(
        Duration::from_secs(60),
        "the parent reconciled once",
        || count() >= 1,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = count();

    let mut child = object("c", "child");
    child.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "p".into(),
        uid: parent.metadata.uid.clone().unwrap(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    admin.create(&PostParams::default(), &child).await.unwrap();
    until(
        Duration::from_secs(10),
        "the child's parent reconciled again",
        || count() > before,
    )
    .await;
    let now = admin.get("p").await.unwrap();
    assert_eq!(
        now.metadata.resource_version,
        parent.metadata.resource_version
    );
    task.abort();
}
