//! Seeded uids and names, far-apart resourceVersion counters, and the injected wall clock.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, WatchEvent, WatchParams};
use kube_shard_testserver::TestServer;

use crate::common::cm;

async fn names_and_uids(server: &TestServer) -> Vec<(String, String)> {
    let api: Api<ConfigMap> = Api::namespaced(server.client("m0"), "default");
    let mut out = Vec::new();
    for i in 0..5 {
        let mut c = cm("");
        c.metadata.name = None;
        c.metadata.generate_name = Some(format!("gen-{i}-"));
        let made = api.create(&PostParams::default(), &c).await.unwrap();
        out.push((made.metadata.name.unwrap(), made.metadata.uid.unwrap()));
    }
    out
}

#[tokio::test(start_paused = true)]
async fn one_seed_gives_the_same_uids_and_names() {
    let seeded = |s| TestServer::builder().seed(s).build();
    let a = names_and_uids(&seeded(42)).await;
    assert_eq!(a, names_and_uids(&seeded(42)).await);
    assert_ne!(a, names_and_uids(&seeded(43)).await);
    let (x, y) = (TestServer::new(), TestServer::new());
    assert_ne!(
        names_and_uids(&x).await,
        names_and_uids(&y).await,
        "default: random"
    );
    assert!(a[0].0.starts_with("gen-0-") && a[0].0.len() == "gen-0-".len() + 5);
}

#[tokio::test(start_paused = true)]
async fn resource_versions_start_where_asked() {
    let far = TestServer::builder()
        .resource_version_start(1_000_000_000)
        .build();
    let near = TestServer::new();
    assert!(near.resource_version() < 1_000);
    assert!(far.resource_version() >= 1_000_000_000);
    let api: Api<ConfigMap> = Api::namespaced(far.client("m0"), "default");
    let made = api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let rv: u64 = made.metadata.resource_version.unwrap().parse().unwrap();
    assert!(rv > 1_000_000_000);
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.metadata.resource_version.unwrap(), rv.to_string());
    // Watching from it works; watching from below the start is a 410.
    let mut w = api
        .watch(&WatchParams::default(), &rv.to_string())
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("b")).await.unwrap();
    assert!(matches!(w.next().await, Some(Ok(WatchEvent::Added(_)))));
    let mut old = api
        .watch(&WatchParams::default(), "5")
        .await
        .unwrap()
        .boxed();
    assert!(matches!(old.next().await, Some(Ok(WatchEvent::Error(e))) if e.code == 410));
}

fn created_at(c: &ConfigMap) -> jiff::Timestamp {
    c.metadata.creation_timestamp.as_ref().unwrap().0
}

#[tokio::test(start_paused = true)]
async fn each_server_stamps_with_its_own_clock() {
    let behind = TestServer::builder()
        .clock_offset(jiff::SignedDuration::from_hours(-1))
        .build();
    let fast = TestServer::builder().clock_rate(2.0).build();
    let api = |s: &TestServer| Api::<ConfigMap>::namespaced(s.client("m0"), "default");
    let first = (
        api(&behind)
            .create(&PostParams::default(), &cm("a"))
            .await
            .unwrap(),
        api(&fast)
            .create(&PostParams::default(), &cm("a"))
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_secs(100)).await;
    let second = (
        api(&behind)
            .create(&PostParams::default(), &cm("b"))
            .await
            .unwrap(),
        api(&fast)
            .create(&PostParams::default(), &cm("b"))
            .await
            .unwrap(),
    );
    let secs = |a: &ConfigMap, b: &ConfigMap| created_at(b).duration_since(created_at(a)).as_secs();
    assert_eq!(secs(&first.0, &second.0), 100);
    assert_eq!(secs(&first.1, &second.1), 200);
    let skew = created_at(&second.1)
        .duration_since(created_at(&second.0))
        .as_secs();
    assert!(
        (3_700..=3_702).contains(&skew),
        "one hour plus 100 s apart: {skew}"
    );

    // deletionTimestamp comes from the same clock.
    let mut held = cm("held");
    held.metadata = ObjectMeta {
        name: Some("held".into()),
        finalizers: Some(vec!["example.com/hold".into()]),
        ..Default::default()
    };
    let a = api(&behind);
    a.create(&PostParams::default(), &held).await.unwrap();
    a.delete("held", &DeleteParams::default()).await.unwrap();
    let deleting = a.get("held").await.unwrap();
    let stamped = deleting.metadata.deletion_timestamp.unwrap().0;
    let now = behind.wall_clock();
    assert!(
        now.duration_since(stamped).as_secs().abs() <= 1,
        "{now} vs {stamped}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_fixed_wall_clock_start_stamps_the_same_times_in_every_run() {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600); // 2026-01-01T00:00:00Z
    let stamp = |server: TestServer| async move {
        tokio::time::sleep(Duration::from_secs(7)).await;
        let api: Api<ConfigMap> = Api::namespaced(server.client("m0"), "default");
        let made = api.create(&PostParams::default(), &cm("t")).await.unwrap();
        made.metadata.creation_timestamp.unwrap().0.to_string()
    };
    let a = stamp(TestServer::builder().wall_clock_start(at).build()).await;
    assert_eq!(a, "2026-01-01T00:00:07Z");
    let b = stamp(TestServer::builder().wall_clock_start(at).build()).await;
    assert_eq!(a, b);
}

#[tokio::test(start_paused = true)]
async fn the_request_tap_sees_every_request_in_order_and_its_answer() {
    use std::sync::{Arc, Mutex};
    let seen: Arc<Mutex<Vec<kube_shard_testserver::Tapped>>> = Arc::default();
    let s = seen.clone();
    let server = TestServer::builder()
        .request_tap(move |t| s.lock().unwrap().push(t.clone()))
        .build();
    let api: Api<ConfigMap> = Api::namespaced(server.client("m0"), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    assert!(api.get("missing").await.is_err());
    let seen = seen.lock().unwrap().clone();
    let line = |t: &kube_shard_testserver::Tapped| {
        format!("{} {} {} {:?}", t.identity, t.method, t.uri, t.status)
    };
    let lines: Vec<String> = seen.iter().map(line).collect();
    assert_eq!(
        lines,
        [
            "m0 POST /api/v1/namespaces/default/configmaps? None",
            "m0 POST /api/v1/namespaces/default/configmaps? Some(201)",
            "m0 GET /api/v1/namespaces/default/configmaps/missing None",
            "m0 GET /api/v1/namespaces/default/configmaps/missing Some(404)",
        ]
    );
    assert_ne!(
        seen[0].body_digest, seen[2].body_digest,
        "a body, then none"
    );
    assert_eq!(seen[2].body_digest, kube_shard::fnv1a64(b""));
}
