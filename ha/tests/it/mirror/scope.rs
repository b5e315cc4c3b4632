//! The mirror's scope on what real clusters hold: objects each cluster makes for itself are never
//! mirrored, paired or deleted, and a namespace scope never leaves a cluster-scoped kind out.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ApiResource, DynamicObject, PostParams};
use kube::Api;
use kube_shard_ha::mirror::{KindSet, MirrorConfig};
use kube_shard_ha::switchover::Kind;
use kube_shard_testserver::TestServer;
use serde_json::json;

use super::{cms, config, eventually, ha, install_crd, pair, start, APPS, HA_NS};

const GADGETS: &str = "gadgets.example.kube-shard.io";

fn gadget_resource() -> ApiResource {
    ApiResource {
        group: "example.kube-shard.io".into(),
        version: "v1".into(),
        api_version: "example.kube-shard.io/v1".into(),
        kind: "Gadget".into(),
        plural: "gadgets".into(),
    }
}

fn gadgets(s: &TestServer) -> Api<DynamicObject> {
    Api::all_with(s.client("admin"), &gadget_resource())
}

/// A cluster-scoped kind mirrored under a namespace scope is copied whole: the scope names namespaces,
/// which a cluster-scoped object has none of, so leaving the kind out would lose it at failover while
/// its position said "synced".
#[tokio::test(start_paused = true)]
async fn a_namespace_scope_never_leaves_a_cluster_scoped_kind_out() {
    let (a, b) = pair().await;
    for s in [&a, &b] {
        install_crd(s, "Gadget", "Cluster").await;
    }
    let mut g = DynamicObject::new("g1", &gadget_resource());
    g.data = json!({"spec": {"v": 1}});
    gadgets(&a)
        .create(&PostParams::default(), &g)
        .await
        .unwrap();
    let ks: Vec<Kind> = vec![format!("{GADGETS}/v1").parse().unwrap()];
    let set = KindSet::builder()
        .mirrored(ks[0].clone())
        .build(&ks)
        .unwrap();
    let cfg = MirrorConfig::new(ha(), "a", set)
        .epoch(2001)
        .probe_period(Duration::from_secs(2))
        .namespaces([APPS]);
    let m = start(&a, &b, cfg).await;
    eventually(30, "the gadget copied", || async {
        gadgets(&b).get_opt("g1").await.unwrap().is_some()
    })
    .await
    .unwrap();
    m.stop().await;
}

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": value}})).unwrap()
}

/// Every namespace of a real cluster holds a `kube-root-ca.crt` ConfigMap its controller manager made,
/// with that cluster's own CA: the mirror neither copies the source's over it nor holds it as a failed
/// object (which would block every promotion by token), and a user's ConfigMap beside it is copied.
#[tokio::test(start_paused = true)]
async fn objects_each_cluster_makes_for_itself_are_neither_copied_nor_failed() {
    let (a, b) = pair().await;
    let pp = PostParams::default();
    cms(&a, APPS)
        .create(&pp, &cm("kube-root-ca.crt", "ca of a"))
        .await
        .unwrap();
    cms(&b, APPS)
        .create(&pp, &cm("kube-root-ca.crt", "ca of b"))
        .await
        .unwrap();
    cms(&a, APPS)
        .create(&pp, &cm("settings", "x"))
        .await
        .unwrap();
    let m = start(&a, &b, config().namespaces([APPS, HA_NS])).await;
    eventually(30, "settings copied", || async {
        cms(&b, APPS).get_opt("settings").await.unwrap().is_some()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let s = m.kind("configmaps").unwrap();
    assert!(s.failed.is_empty(), "failed objects: {:?}", s.failed);
    let ca = cms(&b, APPS).get("kube-root-ca.crt").await.unwrap();
    assert_eq!(ca.data.unwrap()["k"], "ca of b", "never touched");
    m.stop().await;
}

/// A kind an aggregated API server serves (its APIService names a service) is refused at start: its
/// resourceVersions, consistent LISTs and admission are that server's, not the cluster's.
#[tokio::test(start_paused = true)]
async fn a_kind_an_aggregated_api_server_serves_is_refused() {
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
    let (a, b) = pair().await;
    let svc: APIService = serde_json::from_value(json!({
        "metadata": {"name": "v1.example.kube-shard.io"},
        "spec": {
            "group": "example.kube-shard.io", "version": "v1",
            "groupPriorityMinimum": 1000, "versionPriority": 15,
            "service": {"namespace": "metrics", "name": "widgets-api"}
        }
    }))
    .unwrap();
    Api::<APIService>::all(a.client("admin"))
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let err = kube_shard_ha::mirror::Mirror::start(
        config(),
        a.client("mirror"),
        b.client("mirror"),
        kube_shard_ha::mirror::MirrorWiring::default(),
    )
    .await
    .expect_err("started on an aggregated kind");
    let text = err.to_string();
    assert!(
        text.contains("aggregated") && text.contains("metrics/widgets-api"),
        "{text}"
    );
}
