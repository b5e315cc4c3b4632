//! Every fault, observed from a client.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Api, ListParams, PostParams, WatchEvent, WatchParams},
    core::Request,
};
use kube_shard::{ShardCount, ShardKey, ShardSelector, ShardSet};
use kube_shard_testserver::{FailRule, GateSkew, Scope, TestServer, Verb};
use tower::ServiceExt;

use crate::common::{cm, code, create_cms, enc, get_json};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn fail_next_with_each_status() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let other: Api<ConfigMap> = Api::namespaced(server.client("b"), "default");
    for status in [403u16, 429, 500, 503, 504] {
        server
            .faults()
            .fail_next(Scope::identity("a"), FailRule::status(status));
        assert!(
            other.list(&ListParams::default()).await.is_ok(),
            "only identity a fails"
        );
        let err = api.list(&ListParams::default()).await.unwrap_err();
        assert_eq!(code(&err), Some(status));
        assert!(
            api.list(&ListParams::default()).await.is_ok(),
            "only the next request"
        );
    }
    // Several, only for one verb and resource.
    server.faults().fail_next(
        Scope::All,
        FailRule::status(503)
            .times(2)
            .verb(Verb::Create)
            .resource("configmaps"),
    );
    assert!(api.list(&ListParams::default()).await.is_ok());
    assert_eq!(
        code(
            &api.create(&PostParams::default(), &cm("x"))
                .await
                .unwrap_err()
        ),
        Some(503)
    );
    assert_eq!(
        code(
            &other
                .create(&PostParams::default(), &cm("x"))
                .await
                .unwrap_err()
        ),
        Some(503)
    );
    api.create(&PostParams::default(), &cm("x")).await.unwrap();
    assert_eq!(server.accounting("a").errors, 6);
}

#[tokio::test]
async fn too_many_requests_carries_retry_after() {
    let server = TestServer::new();
    server
        .faults()
        .fail_next(Scope::All, FailRule::status(429).retry_after(7));
    let resp = server
        .service("a")
        .oneshot(http::Request::get(CMS).body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    let err = {
        server
            .faults()
            .fail_next(Scope::All, FailRule::status(429).retry_after(7));
        let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
        api.list(&ListParams::default()).await.unwrap_err()
    };
    let kube::Error::Api(s) = err else { panic!() };
    assert_eq!(s.reason, "TooManyRequests");
}

#[tokio::test(start_paused = true)]
async fn latency_delays_requests() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("slow"), "default");
    server
        .faults()
        .latency(Scope::identity("slow"), Some(Duration::from_secs(3)));
    let t0 = tokio::time::Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(t0.elapsed() >= Duration::from_secs(3));
    server.faults().latency(Scope::identity("slow"), None);
    let t0 = tokio::time::Instant::now();
    api.list(&ListParams::default()).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(1));
}

async fn open_watch(
    server: &TestServer,
    identity: &str,
) -> futures::stream::BoxStream<'static, kube::Result<WatchEvent<ConfigMap>>> {
    let client = server.client(identity);
    let rv = server.resource_version().to_string();
    let req = Request::new(CMS)
        .watch(&WatchParams::default().timeout(3000), &rv)
        .unwrap();
    client
        .request_events::<ConfigMap>(req)
        .await
        .unwrap()
        .boxed()
}

#[tokio::test(start_paused = true)]
async fn close_and_freeze_watches() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("setup"), "default");
    let mut closed = open_watch(&server, "c").await;
    let mut frozen = open_watch(&server, "f").await;
    server.faults().close_watches(Scope::identity("c"));
    assert!(closed.next().await.is_none(), "the stream ends");
    server.faults().freeze_watches(Scope::identity("f"), true);
    api.create(&PostParams::default(), &cm("x")).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_secs(3600), frozen.next())
            .await
            .is_err(),
        "nothing, not even the timeout"
    );
    server.faults().freeze_watches(Scope::identity("f"), false);
    match frozen.next().await.unwrap().unwrap() {
        WatchEvent::Added(o) => assert_eq!(o.metadata.name.as_deref(), Some("x")),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn partition_and_outage_refuse_requests() {
    let server = TestServer::new();
    let a: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let b: Api<ConfigMap> = Api::namespaced(server.client("b"), "default");
    server.faults().partition(Scope::identity("a"), true);
    let err = a.list(&ListParams::default()).await.unwrap_err();
    assert!(matches!(err, kube::Error::Service(_)), "{err:?}");
    assert!(b.list(&ListParams::default()).await.is_ok());
    server.faults().partition(Scope::identity("a"), false);
    assert!(a.list(&ListParams::default()).await.is_ok());
    assert_eq!(server.accounting("a").refused, 1);

    let mut w = open_watch(&server, "w").await;
    server.faults().outage(Duration::from_secs(10));
    assert!(w.next().await.is_none(), "an outage ends every watch");
    assert!(a.list(&ListParams::default()).await.is_err());
    assert!(b.list(&ListParams::default()).await.is_err());
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(a.list(&ListParams::default()).await.is_ok());
}

#[tokio::test]
async fn lagging_lists_serve_a_stale_snapshot() {
    let server = TestServer::new();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm("old"))
        .await
        .unwrap();
    server.faults().lagging_lists(true);
    let stale_rv = server.resource_version();
    api.create(&PostParams::default(), &cm("new"))
        .await
        .unwrap();
    let any = get_json(&client, &format!("{CMS}?resourceVersion=0"))
        .await
        .unwrap();
    assert_eq!(crate::common::item_names(&any), ["old"]);
    assert_eq!(any["metadata"]["resourceVersion"], stale_rv.to_string());
    let fresh = get_json(&client, CMS).await.unwrap();
    assert_eq!(crate::common::item_names(&fresh), ["new", "old"]);
    server.faults().lagging_lists(false);
    let any = get_json(&client, &format!("{CMS}?resourceVersion=0"))
        .await
        .unwrap();
    assert_eq!(crate::common::item_names(&any).len(), 2);
}

fn half() -> String {
    let s = ShardCount::new(2).unwrap();
    enc(
        &ShardSelector::for_shards(ShardKey::Uid, s, &ShardSet::parse("0", s).unwrap())
            .unwrap()
            .to_string(),
    )
}

#[tokio::test]
async fn gate_skew_per_request_and_per_connection() {
    let server = TestServer::builder().shard_selector(true).build();
    let client = server.client("a");
    let uri = format!("{CMS}?shardSelector={}", half());
    server.faults().gate_skew(GateSkew::PerRequest);
    let echoed: Vec<bool> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            let l = get_json(&client, &uri).await.unwrap();
            v.push(l["metadata"].get("shardInfo").is_some());
        }
        v
    };
    assert_eq!(echoed.iter().filter(|e| **e).count(), 2, "{echoed:?}");
    assert_ne!(echoed[0], echoed[1]);

    server.faults().gate_skew(GateSkew::PerConnection);
    let c1 = server.client("a");
    let c2 = server.client("a");
    let e1 = get_json(&c1, &uri).await.unwrap()["metadata"]
        .get("shardInfo")
        .is_some();
    let e2 = get_json(&c2, &uri).await.unwrap()["metadata"]
        .get("shardInfo")
        .is_some();
    assert_ne!(e1, e2);
    for _ in 0..3 {
        assert_eq!(
            get_json(&c1, &uri).await.unwrap()["metadata"]
                .get("shardInfo")
                .is_some(),
            e1,
            "sticky"
        );
    }
}

#[tokio::test]
async fn list_filtered_but_watch_not() {
    let server = TestServer::builder().shard_selector(true).build();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    server.faults().unfiltered_watch("configmaps", true);
    let rv = server.resource_version();
    let objs = create_cms(&api, "cm", 20).await;
    let list = get_json(&client, &format!("{CMS}?shardSelector={}", half()))
        .await
        .unwrap();
    assert!(list["items"].as_array().unwrap().len() < 20);
    let req = http::Request::get(format!(
        "{CMS}?watch=true&resourceVersion={rv}&timeoutSeconds=30&shardSelector={}",
        half()
    ))
    .body(Vec::new())
    .unwrap();
    let events: Vec<_> = client
        .request_events::<ConfigMap>(req)
        .await
        .unwrap()
        .take(objs.len())
        .collect()
        .await;
    assert_eq!(events.len(), 20, "every object, unfiltered");
}
