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

/// A built-in kind holds objects other tools make (Helm, cert-manager, the cluster's controllers), so it
/// is mirrored only with a label selector: without one the mirror refuses to start; with one it copies
/// the labelled objects and never touches an unlabelled one of the same name the Standby has.
#[tokio::test(start_paused = true)]
async fn a_built_in_kind_is_mirrored_only_through_a_label_selector() {
    let (a, b) = pair().await;
    let err = kube_shard_ha::mirror::Mirror::start(
        config().whole_builtin_kinds(false),
        a.client("mirror"),
        b.client("mirror"),
        kube_shard_ha::mirror::MirrorWiring::default(),
    )
    .await
    .expect_err("started on configmaps without a selector");
    assert!(err.to_string().contains("label selector"), "{err}");
    let pp = PostParams::default();
    let mut ours = cm("ours", "x");
    ours.metadata.labels = Some([("app".to_string(), "shop".to_string())].into());
    cms(&a, APPS).create(&pp, &ours).await.unwrap();
    cms(&a, APPS)
        .create(&pp, &cm("release", "a's"))
        .await
        .unwrap();
    cms(&b, APPS)
        .create(&pp, &cm("release", "b's"))
        .await
        .unwrap();
    let cfg = config()
        .whole_builtin_kinds(false)
        .labels("app in (shop)")
        .unwrap();
    let m = start(&a, &b, cfg).await;
    eventually(30, "the labelled ConfigMap copied", || async {
        cms(&b, APPS).get_opt("ours").await.unwrap().is_some()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let s = m.kind("configmaps").unwrap();
    assert!(s.failed.is_empty(), "failed objects: {:?}", s.failed);
    let r = cms(&b, APPS).get("release").await.unwrap();
    assert_eq!(
        r.data.unwrap()["k"],
        "b's",
        "an unlabelled object was touched"
    );
    m.stop().await;
}

/// Namespaces scoped by label, as the seed's users mirror them: a labelled Namespace is copied, an
/// unlabelled one is not.
#[tokio::test(start_paused = true)]
async fn namespaces_are_mirrored_by_label() {
    use k8s_openapi::api::core::v1::Namespace;
    let (a, b) = pair().await;
    let ks: Vec<Kind> = vec!["namespaces/v1".parse().unwrap()];
    let set = KindSet::builder()
        .mirrored(ks[0].clone())
        .build(&ks)
        .unwrap();
    let cfg = MirrorConfig::new(ha(), "a", set)
        .epoch(2001)
        .probe_period(Duration::from_secs(2))
        .labels("mirror.example.com/slice=green")
        .unwrap();
    let api = |s: &TestServer| Api::<Namespace>::all(s.client("admin"));
    for (name, labelled) in [("team-a", true), ("team-b", false)] {
        let mut ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        if labelled {
            ns.metadata.labels =
                Some([("mirror.example.com/slice".to_string(), "green".to_string())].into());
        }
        api(&a).create(&PostParams::default(), &ns).await.unwrap();
    }
    let m = start(&a, &b, cfg).await;
    eventually(30, "the labelled namespace copied", || async {
        api(&b).get_opt("team-a").await.unwrap().is_some()
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(api(&b).get_opt("team-b").await.unwrap().is_none());
    assert!(m.kind("namespaces").unwrap().failed.is_empty());
    m.stop().await;
}
