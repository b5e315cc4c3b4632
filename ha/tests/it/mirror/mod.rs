//! The HA mirror (`kube_shard_ha::mirror`, HA.md "The mirror") on two testservers whose
//! resourceVersion counters start far apart (the source at 10^9, so a comparison across domains or as
//! strings cannot pass by luck) with garbage collection on, paused time. Each test drives the source
//! (the Active's cluster) and reads the copies and the checkpoint on the target (the Standby's).

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::Api;
use kube_shard_ha::mirror::plan::{
    MIRRORED_FROM, SOURCE_DELETING, SOURCE_FINALIZERS, SOURCE_OWNERS, SOURCE_RV, SOURCE_UID,
};
use kube_shard_ha::mirror::{Backoff, KindSet, KindStatus, Mirror, MirrorConfig, MirrorWiring};
use kube_shard_ha::switchover::{checkpoint_name, write_position, Kind};
use kube_shard_ha::{HaConfig, HaMode};
use kube_shard_testserver::TestServer;
use serde_json::json;
use tokio::time::Instant;

pub(crate) const APPS: &str = "apps";
pub(crate) const HA_NS: &str = "control";
pub(crate) const SOURCE_RV_START: u64 = 1_000_000_000;
pub(crate) const WIDGETS: &str = "widgets.example.kube-shard.io";

pub(crate) fn widget_resource() -> ApiResource {
    ApiResource {
        group: "example.kube-shard.io".into(),
        version: "v1".into(),
        api_version: "example.kube-shard.io/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

pub(crate) fn widgets(s: &TestServer, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(s.client("admin"), ns, &widget_resource())
}

pub(crate) fn cms(s: &TestServer, ns: &str) -> Api<ConfigMap> {
    Api::namespaced(s.client("admin"), ns)
}

pub(crate) async fn namespace(s: &TestServer, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(s.client("admin"))
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
}

/// Install the CRD of `kind` (plural: lowercase + "s") in group `example.kube-shard.io`, with a status
/// subresource; `scope`: "Namespaced" or "Cluster".
pub(crate) async fn install_crd(s: &TestServer, kind: &str, scope: &str) {
    let plural = format!("{}s", kind.to_lowercase());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.example.kube-shard.io")},
        "spec": {
            "group": "example.kube-shard.io",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "scope": scope,
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(s.client("admin"))
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
}

pub(crate) async fn install(s: &TestServer) {
    install_crd(s, "Widget", "Namespaced").await;
    namespace(s, HA_NS).await;
}

/// The source (RVs from 10^9) and the target, both with the Widget CRD, the HA namespace and `apps`.
pub(crate) async fn pair() -> (TestServer, TestServer) {
    let a = TestServer::builder()
        .resource_version_start(SOURCE_RV_START)
        .controllers(true)
        .build();
    let b = TestServer::builder().controllers(true).build();
    for s in [&a, &b] {
        install(s).await;
        namespace(s, APPS).await;
    }
    (a, b)
}

pub(crate) fn ha() -> HaConfig {
    HaConfig::builder("widgets")
        .mode(HaMode::Standby)
        .cluster("b", 2)
        .namespace(HA_NS)
        .kubeconfigs(None, Some("/peer".into()), None)
        .build()
        .unwrap()
}

fn kinds() -> Vec<Kind> {
    vec![
        format!("{WIDGETS}/v1").parse().unwrap(),
        "configmaps/v1".parse().unwrap(),
    ]
}

pub(crate) fn config() -> MirrorConfig {
    let ks = kinds();
    let set = KindSet::builder()
        .mirrored(ks[0].clone())
        .mirrored(ks[1].clone())
        .build(&ks)
        .unwrap();
    MirrorConfig::new(ha(), "a", set)
        .epoch(2001)
        .whole_builtin_kinds(true)
        .assignment(HA_NS, "g-assignment")
        .probe_period(Duration::from_secs(2))
}

pub(crate) async fn start(a: &TestServer, b: &TestServer, cfg: MirrorConfig) -> Mirror {
    Mirror::start(
        cfg,
        a.client("mirror"),
        b.client("mirror"),
        MirrorWiring::default(),
    )
    .await
    .unwrap()
}

/// Poll `check` every 100 ms for at most `secs` (paused time): `Err` names what never held.
pub(crate) async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let t0 = Instant::now();
    while !check().await {
        if t0.elapsed() > Duration::from_secs(secs) {
            return Err(format!("not within {secs} s: {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

pub(crate) fn rv_of<K: kube::Resource>(o: &K) -> u64 {
    o.meta()
        .resource_version
        .as_deref()
        .unwrap()
        .parse()
        .unwrap()
}

pub(crate) fn ann(o: &DynamicObject, k: &str) -> Option<String> {
    o.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(k).cloned())
}

/// The copy of widget `name` holds the source's current version (marker == the source's RV).
pub(crate) async fn widget_in_step(a: &TestServer, b: &TestServer, name: &str) -> bool {
    let (Ok(s), Ok(Some(c))) = (
        widgets(a, APPS).get(name).await,
        widgets(b, APPS).get_opt(name).await,
    ) else {
        return false;
    };
    ann(&c, SOURCE_RV).is_some_and(|m| m.ends_with(&format!(" rv={}", rv_of(&s))))
        && c.data.get("spec") == s.data.get("spec")
        && c.data.get("status") == s.data.get("status")
}

fn kind(m: &Mirror, key: &str) -> KindStatus {
    m.kind(key).unwrap()
}

async fn source_rv(a: &TestServer) -> u64 {
    let l = widgets(a, APPS)
        .list(&kube::api::ListParams::default().limit(1))
        .await
        .unwrap();
    l.metadata.resource_version.unwrap().parse().unwrap()
}

async fn checkpoint(b: &TestServer, key: &str) -> Option<String> {
    cms(b, HA_NS)
        .get_opt(&checkpoint_name(&ha()))
        .await
        .unwrap()
        .and_then(|c| c.data)
        .and_then(|d| d.get(key).cloned())
}

pub(crate) fn widget(name: &str, v: u64) -> DynamicObject {
    let mut w = DynamicObject::new(name, &widget_resource()).within(APPS);
    w.data = json!({"spec": {"v": v}});
    w
}

#[tokio::test(start_paused = true)]
async fn creates_updates_status_and_deletes_converge() {
    let (a, b) = pair().await;
    let src = widgets(&a, APPS);
    let mut w = src
        .create(&PostParams::default(), &widget("w1", 1))
        .await
        .unwrap();
    w.data["status"] = json!({"ready": false});
    src.replace_status("w1", &PostParams::default(), &w)
        .await
        .unwrap();
    let m = start(&a, &b, config()).await;

    eventually(30, "w1 created with spec and status", || {
        widget_in_step(&a, &b, "w1")
    })
    .await
    .unwrap();
    let c = widgets(&b, APPS).get("w1").await.unwrap();
    let labels = c.metadata.labels.clone().unwrap();
    assert_eq!(labels.get(MIRRORED_FROM).map(String::as_str), Some("a"));
    assert_eq!(
        ann(&c, "kube-shard.io/fence").as_deref(),
        Some("2001:mirror")
    );
    assert_eq!(
        ann(&c, SOURCE_UID),
        src.get("w1").await.unwrap().metadata.uid
    );
    assert!(
        rv_of(&c) < SOURCE_RV_START,
        "the copy lives in the target's own RV domain"
    );

    // spec, then status, then both
    src.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"v": 2}})),
    )
    .await
    .unwrap();
    eventually(30, "spec update", || widget_in_step(&a, &b, "w1"))
        .await
        .unwrap();
    src.patch_status(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"ready": true}})),
    )
    .await
    .unwrap();
    eventually(30, "status update", || widget_in_step(&a, &b, "w1"))
        .await
        .unwrap();
    assert_eq!(
        widgets(&b, APPS).get("w1").await.unwrap().data["status"],
        json!({"ready": true})
    );

    // the position reaches the source's current version, and the checkpoint records it
    let now = source_rv(&a).await;
    eventually(30, "position at the source's version", || {
        let p = kind(&m, WIDGETS).position;
        async move { p.is_some_and(|p| p >= now) }
    })
    .await
    .unwrap();
    eventually(30, "checkpoint written", || async {
        checkpoint(&b, WIDGETS)
            .await
            .is_some_and(|v| v.starts_with("v1 source=a/"))
    })
    .await
    .unwrap();

    src.delete("w1", &DeleteParams::default()).await.unwrap();
    eventually(30, "w1's copy deleted", || async {
        widgets(&b, APPS).get_opt("w1").await.unwrap().is_none()
    })
    .await
    .unwrap();
    assert!(kind(&m, WIDGETS).failed.is_empty());
    m.stop().await;
}

#[tokio::test(start_paused = true)]
async fn uid_derived_fields_and_a_terminating_source() {
    let (a, b) = pair().await;
    let owner = cms(&a, APPS)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap(),
        )
        .await
        .unwrap();
    let mut w = widget("child", 1);
    w.metadata.finalizers = Some(vec!["example.com/cleanup".into()]);
    w.metadata.labels = Some([("kube-shard.io/shard".to_string(), "3".to_string())].into());
    w.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            name: "owner".into(),
            uid: owner.metadata.uid.clone().unwrap(),
            ..Default::default()
        },
    ]);
    widgets(&a, APPS)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
    let m = start(&a, &b, config()).await;
    eventually(30, "child copied", || widget_in_step(&a, &b, "child"))
        .await
        .unwrap();
    let c = widgets(&b, APPS).get("child").await.unwrap();
    assert!(
        c.metadata.owner_references.is_none(),
        "no live owner reference: B's GC never touches copies"
    );
    assert!(c.metadata.finalizers.is_none());
    assert!(!c
        .metadata
        .labels
        .clone()
        .unwrap()
        .contains_key("kube-shard.io/shard"));
    assert!(ann(&c, SOURCE_OWNERS)
        .unwrap()
        .contains(owner.metadata.uid.as_deref().unwrap()));
    assert_eq!(
        ann(&c, SOURCE_FINALIZERS).as_deref(),
        Some(r#"["example.com/cleanup"]"#)
    );

    // B's garbage collector runs: the copy survives though its source owner's uid exists nowhere on B
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(widgets(&b, APPS).get_opt("child").await.unwrap().is_some());

    // terminating: recorded, the copy stays live until the source is gone
    widgets(&a, APPS)
        .delete("child", &DeleteParams::default())
        .await
        .unwrap();
    eventually(30, "deletion recorded", || async {
        widgets(&b, APPS)
            .get("child")
            .await
            .ok()
            .and_then(|c| ann(&c, SOURCE_DELETING))
            .is_some()
    })
    .await
    .unwrap();
    assert!(widgets(&b, APPS)
        .get("child")
        .await
        .unwrap()
        .metadata
        .deletion_timestamp
        .is_none());
    widgets(&a, APPS)
        .patch(
            "child",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    eventually(30, "copy gone with its source", || async {
        widgets(&b, APPS).get_opt("child").await.unwrap().is_none()
    })
    .await
    .unwrap();
    m.stop().await;
}

#[tokio::test(start_paused = true)]
async fn scope_own_objects_and_the_conflict_guard() {
    let (a, b) = pair().await;
    namespace(&a, "other").await;
    namespace(&b, "other").await;
    let cm = |name: &str, labels: serde_json::Value| -> ConfigMap {
        serde_json::from_value(
            json!({"metadata": {"name": name, "labels": labels}, "data": {"k": name}}),
        )
        .unwrap()
    };
    let pp = PostParams::default();
    cms(&a, APPS)
        .create(&pp, &cm("plain", json!({})))
        .await
        .unwrap();
    cms(&a, APPS)
        .create(&pp, &cm("member", json!({"kube-shard.io/group": "g"})))
        .await
        .unwrap();
    cms(&a, "other")
        .create(&pp, &cm("elsewhere", json!({})))
        .await
        .unwrap();
    cms(&a, HA_NS)
        .create(&pp, &cm("g-assignment", json!({})))
        .await
        .unwrap();
    // a pre-existing object on B that the mirror did not make
    cms(&b, APPS)
        .create(&pp, &cm("taken", json!({"owner": "b"})))
        .await
        .unwrap();
    let taken_src = cms(&a, APPS)
        .create(&pp, &cm("taken", json!({})))
        .await
        .unwrap();
    // created after the poison object: applied, while the watermark stays below the poison
    let later = cms(&a, APPS)
        .create(&pp, &cm("later", json!({})))
        .await
        .unwrap();

    let m = start(&a, &b, config().namespaces([APPS, HA_NS])).await;
    eventually(30, "plain and later copied", || async {
        cms(&b, APPS).get_opt("plain").await.unwrap().is_some()
            && cms(&b, APPS).get_opt("later").await.unwrap().is_some()
    })
    .await
    .unwrap();
    eventually(30, "taken on the failed list", || {
        let f = kind(&m, "configmaps").failed;
        async move { f.iter().any(|f| f.key.1 == "taken") }
    })
    .await
    .unwrap();
    let s = kind(&m, "configmaps");
    assert!(
        s.position.unwrap() < rv_of(&taken_src),
        "the watermark stops at a failed object"
    );
    assert!(
        s.errors.get("conflict").is_some_and(|n| *n >= 1),
        "the conflict counted by operation: {:?}",
        s.errors
    );
    assert!(rv_of(&later) > rv_of(&taken_src));
    let t = cms(&b, APPS).get("taken").await.unwrap();
    assert_eq!(t.data.unwrap()["k"], "taken");
    assert_eq!(
        t.metadata.labels.unwrap().get("owner").map(String::as_str),
        Some("b"),
        "never touched"
    );
    assert!(
        cms(&b, APPS).get_opt("member").await.unwrap().is_none(),
        "kube-shard's own objects"
    );
    assert!(
        cms(&b, HA_NS)
            .get_opt("g-assignment")
            .await
            .unwrap()
            .is_none(),
        "the assignment"
    );
    assert!(
        cms(&b, "other")
            .get_opt("elsewhere")
            .await
            .unwrap()
            .is_none(),
        "out of scope"
    );
    m.stop().await;
}

/// Y (in a namespace B lacks) retries below X, applied later; the mirror restarts in between; then the
/// namespace appears. `Err` when Y's copy never arrives or the position passed Y while it was pending.
async fn retry_below_applied_with_restart(planted: bool) -> Result<(), String> {
    let (a, b) = pair().await;
    namespace(&a, "late").await;
    let pp = PostParams::default();
    let mk = |n: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": n}})).unwrap()
    };
    let cfg = config().backoff(Backoff {
        base: Duration::from_millis(500),
        max: Duration::from_secs(2),
        max_attempts: 1000,
    });
    let _planted = planted.then(|| {
        kube_shard::testing::faults::plant(kube_shard_ha::faults::WATERMARK_IGNORES_QUEUE)
    });
    let m = start(&a, &b, cfg.clone()).await;
    let y = cms(&a, "late").create(&pp, &mk("y")).await.unwrap();
    let x = cms(&a, APPS).create(&pp, &mk("x")).await.unwrap();
    eventually(30, "x copied", || async {
        cms(&b, APPS).get_opt("x").await.unwrap().is_some()
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await; // checkpoints are written
    let pos = kind(&m, "configmaps").position.unwrap_or(0);
    let held = pos < rv_of(&y);
    m.stop().await;
    let m = start(&a, &b, cfg.clone()).await;
    namespace(&b, "late").await;
    let got = eventually(60, "y copied after the restart", || async {
        cms(&b, "late").get_opt("y").await.unwrap().is_some()
    })
    .await;
    m.stop().await;
    got?;
    assert!(rv_of(&x) > rv_of(&y));
    if !held {
        return Err(format!(
            "the position {pos} passed y's pending change at {}",
            rv_of(&y)
        ));
    }
    Ok(())
}

#[tokio::test(start_paused = true)]
async fn a_retrying_object_below_a_later_applied_one_survives_a_restart() {
    retry_below_applied_with_restart(false).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_restart_check_catches_a_watermark_that_ignores_the_retry_queue() {
    let e = retry_below_applied_with_restart(true).await.unwrap_err();
    eprintln!("planted: {e}");
    assert!(
        e.contains("y copied after the restart") || e.contains("passed"),
        "{e}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_source_below_the_checkpoint_stops_the_kind() {
    let (a, b) = pair().await;
    // a checkpoint from this source far above its current version: as after an etcd restore
    let uid = Api::<Namespace>::all(a.client("admin"))
        .get("kube-system")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let now = source_rv(&a).await;
    write_position(
        &b.client("admin"),
        &ha(),
        WIDGETS,
        &format!("a/{uid}"),
        now + 1_000_000,
    )
    .await
    .unwrap();
    let m = start(&a, &b, config()).await;
    eventually(30, "the kind stopped with a regression alarm", || {
        let s = kind(&m, WIDGETS).stopped;
        async move { s.is_some_and(|s| s.contains("below the checkpoint")) }
    })
    .await
    .unwrap();
    // the other kind, with no checkpoint, runs
    assert!(kind(&m, "configmaps").stopped.is_none());
    m.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_frozen_watch_shows_as_growing_lag() {
    let (a, b) = pair().await;
    let clock = kube_shard::rt::Clock::system();
    let m = Mirror::start(
        config(),
        a.client("mirror"),
        b.client("mirror"),
        MirrorWiring::new(clock.clone(), None),
    )
    .await
    .unwrap();
    widgets(&a, APPS)
        .create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    eventually(30, "confirmed", || {
        let s = kind(&m, WIDGETS);
        let c = clock.elapsed();
        async move { s.lag(c).is_some_and(|l| l < Duration::from_secs(5)) }
    })
    .await
    .unwrap();
    a.faults()
        .freeze_watches(kube_shard_testserver::Scope::identity("mirror"), true);
    widgets(&a, APPS)
        .create(&PostParams::default(), &widget("w2", 1))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let lag = kind(&m, WIDGETS).lag(clock.elapsed()).unwrap();
    assert!(
        lag >= Duration::from_secs(25),
        "a frozen watch must not read as a small lag: {lag:?}"
    );
    assert!(widgets(&b, APPS).get_opt("w2").await.unwrap().is_none());
    m.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_recreated_source_is_a_delete_and_a_create() {
    let (a, b) = pair().await;
    let m = start(&a, &b, config()).await;
    let src = widgets(&a, APPS);
    src.create(&PostParams::default(), &widget("r", 1))
        .await
        .unwrap();
    eventually(30, "r copied", || widget_in_step(&a, &b, "r"))
        .await
        .unwrap();
    let first = widgets(&b, APPS).get("r").await.unwrap().metadata.uid;
    src.delete("r", &DeleteParams::default()).await.unwrap();
    let again = src
        .create(&PostParams::default(), &widget("r", 2))
        .await
        .unwrap();
    eventually(30, "the new r copied", || async {
        widgets(&b, APPS)
            .get("r")
            .await
            .ok()
            .and_then(|c| ann(&c, SOURCE_UID))
            == again.metadata.uid
    })
    .await
    .unwrap();
    eventually(30, "in step", || widget_in_step(&a, &b, "r"))
        .await
        .unwrap();
    assert_ne!(
        widgets(&b, APPS).get("r").await.unwrap().metadata.uid,
        first,
        "a new copy"
    );
    m.stop().await;
}

/// Every committed version of the copy whose marker names source version r holds a spec and a status
/// the source had at r or later (the marker is the commit marker, written last: between `/status` and the
/// main write the copy may hold a newer status under the older marker, never an older one under a newer
/// marker). `Err` names the first commit that claims more than it holds.
async fn markers_claim_only_what_the_copy_holds(planted: bool) -> Result<usize, String> {
    use kube_shard_testserver::ResourceFilter;
    let (a, b) = pair().await;
    let f = ResourceFilter::resource(WIDGETS).namespace(APPS).name("w");
    a.history().record(f.clone());
    b.history().record(f.clone());
    let cfg = config();
    let _planted =
        planted.then(|| kube_shard::testing::faults::plant(kube_shard_ha::faults::MARKER_FIRST));
    let m = start(&a, &b, cfg).await;
    let src = widgets(&a, APPS);
    let pp = PatchParams::default();
    src.create(&PostParams::default(), &widget("w", 1))
        .await
        .unwrap();
    for i in 1..5u64 {
        let st = json!({"status": {"n": i}});
        src.patch_status("w", &pp, &Patch::Merge(st)).await.unwrap();
        eventually(30, "in step", || widget_in_step(&a, &b, "w")).await?;
        let spec = json!({"spec": {"v": i + 1}});
        src.patch("w", &pp, &Patch::Merge(spec)).await.unwrap();
        let both = json!({"status": {"n": 10 + i}});
        src.patch_status("w", &pp, &Patch::Merge(both))
            .await
            .unwrap();
        eventually(30, "in step", || widget_in_step(&a, &b, "w")).await?;
    }
    m.stop().await;
    let source: std::collections::BTreeMap<u64, serde_json::Value> = a
        .history()
        .of(&f)
        .into_iter()
        .map(|c| (c.resource_version, c.object))
        .collect();
    let mut claims = 0;
    for c in b.history().of(&f) {
        let marker = c.object["metadata"]["annotations"][SOURCE_RV]
            .as_str()
            .map(str::to_string);
        let Some(r) = marker.and_then(|m| {
            m.rsplit_once(" rv=")
                .and_then(|(_, r)| r.parse::<u64>().ok())
        }) else {
            continue;
        };
        claims += 1;
        let s = &source[&r];
        let held = |field: &str| {
            source
                .range(r..)
                .any(|(_, v)| v.get(field) == c.object.get(field))
        };
        if !held("spec") || !held("status") {
            return Err(format!(
                "copy commit {} claims source {r} but holds spec {:?} status {:?} (source: {:?} {:?})",
                c.resource_version,
                c.object.get("spec"),
                c.object.get("status"),
                s.get("spec"),
                s.get("status")
            ));
        }
    }
    Ok(claims)
}

#[tokio::test(start_paused = true)]
async fn the_marker_is_written_last() {
    let claims = markers_claim_only_what_the_copy_holds(false).await.unwrap();
    assert!(claims >= 5, "{claims} marker commits checked");
}

#[tokio::test(start_paused = true)]
async fn the_marker_check_catches_a_marker_written_first() {
    let e = markers_claim_only_what_the_copy_holds(true)
        .await
        .unwrap_err();
    eprintln!("planted: {e}");
    assert!(e.contains("claims source"), "{e}");
}

pub(crate) async fn kube_system_uid(s: &TestServer) -> String {
    Api::<Namespace>::all(s.client("admin"))
        .get("kube-system")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

/// A quiet kind whose watch is also frozen: its token version is far above its last event. Without
/// catch-up the position stays behind (bookmarks come once a minute, and not at all through a frozen
/// watch); one catch-up LIST applies the missed delete and brings the position to the token, asked
/// in-process and, from `promote --token`'s side, through the checkpoint.
#[tokio::test(start_paused = true)]
async fn catch_up_brings_a_quiet_kind_to_the_token() {
    let (a, b) = pair().await;
    let m = start(&a, &b, config()).await;
    let src = widgets(&a, APPS);
    for n in ["keep", "gone"] {
        src.create(&PostParams::default(), &widget(n, 1))
            .await
            .unwrap();
        eventually(30, "copied", || widget_in_step(&a, &b, n))
            .await
            .unwrap();
    }
    a.faults()
        .freeze_watches(kube_shard_testserver::Scope::identity("mirror"), true);
    src.delete("gone", &DeleteParams::default()).await.unwrap();
    let uid = kube_system_uid(&a).await;
    let pp = PostParams::default();
    // the source term's epoch (`config()`); a token from an earlier term is ignored. A token covers
    // every mirrored kind (one lacking a kind is refused)
    let token_at = |e: u64, id: &str, rv: u64| -> kube_shard_ha::switchover::DemotionToken {
        format!("v1;src=a/{uid};e={e};k=configmaps:{rv},{WIDGETS}:{rv};id={id}")
            .parse()
            .unwrap()
    };
    let token_for = |id: &str, rv: u64| -> kube_shard_ha::switchover::DemotionToken {
        format!("v1;src=a/{uid};e=2001;k=configmaps:{rv},{WIDGETS}:{rv};id={id}")
            .parse()
            .unwrap()
    };
    let lacking: kube_shard_ha::switchover::DemotionToken =
        format!("v1;src=a/{uid};e=2001;k={WIDGETS}:1;id=t0")
            .parse()
            .unwrap();
    let e = m.catch_up(&lacking).await.unwrap_err();
    assert!(e.to_string().contains("missing configmaps"), "{e}");
    for i in 0..20 {
        let c: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).unwrap();
        cms(&a, APPS).create(&pp, &c).await.unwrap();
    }
    let t1 = source_rv(&a).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        kind(&m, WIDGETS).position.unwrap() < t1,
        "behind without catch-up"
    );

    assert_eq!(m.catch_up(&token_for("t1", t1)).await.unwrap(), 2);
    eventually(5, "position at the token", || {
        let p = kind(&m, WIDGETS).position;
        async move { p.is_some_and(|p| p >= t1) }
    })
    .await
    .unwrap();
    assert!(
        widgets(&b, APPS).get_opt("gone").await.unwrap().is_none(),
        "the missed delete applied"
    );
    assert!(widgets(&b, APPS).get_opt("keep").await.unwrap().is_some());
    let foreign = format!("v1;src=a/not-{uid};e=1001;k={WIDGETS}:{t1};id=t9");
    assert!(m.catch_up(&foreign.parse().unwrap()).await.is_err());

    // through the checkpoint, as `promote --token` asks a mirror in another process
    src.patch(
        "keep",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"v": 9}})),
    )
    .await
    .unwrap();
    let t2 = source_rv(&a).await;
    let text = token_for("t2", t2).to_string();
    let cp: Api<ConfigMap> = cms(&b, HA_NS);
    cp.patch(
        &checkpoint_name(&ha()),
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {kube_shard_ha::switchover::CATCH_UP_KEY: text}})),
    )
    .await
    .unwrap();
    eventually(10, "position at the second token", || {
        let p = kind(&m, WIDGETS).position;
        async move { p.is_some_and(|p| p >= t2) }
    })
    .await
    .unwrap();
    assert!(widget_in_step(&a, &b, "keep").await);
    eventually(10, "checkpoint at the second token", || async {
        checkpoint(&b, WIDGETS)
            .await
            .and_then(|v| {
                v.rsplit_once(" rv=")
                    .and_then(|(_, r)| r.parse::<u64>().ok())
            })
            .is_some_and(|r| r >= t2)
    })
    .await
    .unwrap();
    assert_eq!(kind(&m, WIDGETS).catchups, 2);
    // acknowledged, and held while the request stays: a source change is not copied
    let data = || async {
        cp.get(&checkpoint_name(&ha()))
            .await
            .unwrap()
            .data
            .unwrap_or_default()
    };
    eventually(5, "the acknowledgement", || async {
        data().await.get(kube_shard_ha::switchover::CAUGHT_UP_KEY)
            == Some(&"t2 failed=0".to_string())
    })
    .await
    .unwrap();
    src.patch(
        "keep",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"v": 10}})),
    )
    .await
    .unwrap();
    a.faults()
        .freeze_watches(kube_shard_testserver::Scope::identity("mirror"), false);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!widget_in_step(&a, &b, "keep").await, "copied while held");
    // a request from an earlier term of the source replaces it: the hold is released, the request
    // ignored (no catch-up, no acknowledgement), and the mirror copies again
    let old = token_at(1001, "t3", source_rv(&a).await).to_string();
    cp.patch(
        &checkpoint_name(&ha()),
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {kube_shard_ha::switchover::CATCH_UP_KEY: old}})),
    )
    .await
    .unwrap();
    eventually(10, "copied after the release", || {
        widget_in_step(&a, &b, "keep")
    })
    .await
    .unwrap();
    assert_eq!(kind(&m, WIDGETS).catchups, 2);
    assert_eq!(
        data().await.get(kube_shard_ha::switchover::CAUGHT_UP_KEY),
        Some(&"t2 failed=0".to_string())
    );
    m.stop().await;
}

/// Two mirrors write the same copies (a restart overlapping the old process): every copy write carries
/// the copy's uid and resourceVersion as read, so no committed version of the copy ever carries an older
/// source version than one before it, and both converge on the source.
#[tokio::test(start_paused = true)]
async fn two_writers_of_one_copy_never_apply_an_older_version() {
    let writers = two_writers_of_one_copy(kube_shard_testserver::Verb::Update).await;
    assert_eq!(writers.len(), 2, "both mirrors wrote the copy: {writers:?}");
}

/// The same with the first mirror's *read* of the copy slowed: the copy it then reads carries a newer
/// marker than its earlier read of the source (the second mirror applied the newer version in between).
/// That is not corruption unless the marker is above the source's current version: the older version is
/// never written over it.
#[tokio::test(start_paused = true)]
async fn a_copy_read_after_a_newer_write_never_takes_the_older_version() {
    let _ = two_writers_of_one_copy(kube_shard_testserver::Verb::Get).await;
    // (the slowed mirror finds every copy ahead of its read of the source, and skips it)
}

/// Two mirrors over one source object changed 40 times, the first mirror's `slow` requests on B delayed
/// 120 ms: the committed markers of the copy never go back. Returns who wrote the copy.
async fn two_writers_of_one_copy(
    slow: kube_shard_testserver::Verb,
) -> std::collections::BTreeSet<String> {
    use kube_shard_testserver::ResourceFilter;
    let (a, b) = pair().await;
    let f = ResourceFilter::resource(WIDGETS).namespace(APPS).name("w");
    b.history().record(f.clone());
    let m1 = start(&a, &b, config()).await;
    let m2 = Mirror::start(
        config(),
        a.client("mirror2"),
        b.client("mirror2"),
        MirrorWiring::default(),
    )
    .await
    .unwrap();
    // the first mirror's writes (or reads) on B are slow: the second overtakes it in between
    b.faults().latency(
        kube_shard_testserver::Scope::identity("mirror").verb(slow),
        Some(Duration::from_millis(120)),
    );
    let src = widgets(&a, APPS);
    src.create(&PostParams::default(), &widget("w", 0))
        .await
        .unwrap();
    for i in 1..40u64 {
        src.patch(
            "w",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"v": i}})),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(37)).await;
    }
    eventually(30, "in step", || widget_in_step(&a, &b, "w"))
        .await
        .unwrap();
    m1.stop().await;
    m2.stop().await;
    let markers: Vec<u64> = b
        .history()
        .of(&f)
        .iter()
        .filter_map(|c| {
            c.object["metadata"]["annotations"][SOURCE_RV]
                .as_str()
                .map(str::to_string)
        })
        .filter_map(|m| m.rsplit_once(" rv=").and_then(|(_, r)| r.parse().ok()))
        .collect();
    assert!(markers.len() >= 3, "{markers:?}");
    assert!(
        markers.windows(2).all(|w| w[0] <= w[1]),
        "an older version over a newer one: {markers:?}"
    );
    let writers: std::collections::BTreeSet<String> = b
        .history()
        .of(&f)
        .iter()
        .map(|c| c.identity.clone())
        .collect();
    eprintln!(
        "copy writers: {writers:?}, {} marker commits",
        markers.len()
    );
    writers
}

/// A copy whose source's delete the mirror never saw (made here after the mirror's LIST, as a lost
/// delete leaves it): `true` when it is gone (or terminating) 3 minutes later; asserts nothing
/// happens to it within the grace.
async fn stray_copy_pruned(prune: Option<Duration>) -> (bool, u64) {
    let (a, b) = pair().await;
    widgets(&a, APPS)
        .create(&PostParams::default(), &widget("w1", 1))
        .await
        .unwrap();
    let m = start(&a, &b, config().prune(prune, Duration::from_secs(30))).await;
    eventually(60, "w1 in step", || widget_in_step(&a, &b, "w1"))
        .await
        .unwrap();
    let mut stray = widget("stray", 1);
    stray.metadata.labels = Some(
        [(
            kube_shard_ha::mirror::plan::MIRRORED_FROM.to_string(),
            "a".to_string(),
        )]
        .into(),
    );
    stray.metadata.annotations = Some(
        [(
            kube_shard_ha::mirror::plan::SOURCE_UID.to_string(),
            "a-uid-long-gone".to_string(),
        )]
        .into(),
    );
    widgets(&b, APPS)
        .create(&PostParams::default(), &stray)
        .await
        .unwrap();
    let live =
        |o: Option<DynamicObject>| o.is_some_and(|o| o.metadata.deletion_timestamp.is_none());
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert!(
        live(widgets(&b, APPS).get_opt("stray").await.unwrap()),
        "nothing happens within the grace"
    );
    assert!(live(widgets(&b, APPS).get_opt("w1").await.unwrap()));
    tokio::time::sleep(Duration::from_secs(160)).await;
    let gone = !live(widgets(&b, APPS).get_opt("stray").await.unwrap());
    assert!(
        live(widgets(&b, APPS).get_opt("w1").await.unwrap()),
        "a copy whose source lives is never pruned"
    );
    let prunes = m.kind(WIDGETS).map_or(0, |k| k.prunes);
    m.stop().await;
    (gone, prunes)
}

#[tokio::test(start_paused = true)]
async fn the_prune_backstop_deletes_a_copy_whose_source_delete_was_lost_after_its_grace() {
    let (gone, prunes) = stray_copy_pruned(Some(Duration::from_secs(60))).await;
    assert!(gone, "the stray copy is still there");
    assert_eq!(prunes, 1);
}

#[tokio::test(start_paused = true)]
async fn without_the_prune_backstop_a_lost_delete_leaves_the_copy() {
    let (gone, prunes) = stray_copy_pruned(None).await;
    assert!(!gone, "only the backstop removes it");
    assert_eq!(prunes, 0);
}

/// The schema check at start: the target's Widget CRD drops the status subresource → the mirror does
/// not start, and says why; put back alike, it starts.
#[tokio::test(start_paused = true)]
async fn a_differently_defined_kind_refuses_to_start_the_mirror() {
    let (a, b) = pair().await;
    let crds: Api<CustomResourceDefinition> = Api::all(b.client("admin"));
    let mut crd = crds.get(WIDGETS).await.unwrap();
    let alike = crd.clone();
    crd.spec.versions[0].subresources = None;
    crds.replace(WIDGETS, &PostParams::default(), &crd)
        .await
        .unwrap();
    let err = Mirror::start(
        config(),
        a.client("mirror"),
        b.client("mirror"),
        MirrorWiring::default(),
    )
    .await
    .expect_err("started against a different definition");
    let text = err.to_string();
    assert!(
        text.contains("define it differently") && text.contains("subresources"),
        "{text}"
    );
    let mut fixed = crds.get(WIDGETS).await.unwrap();
    fixed.spec = alike.spec;
    crds.replace(WIDGETS, &PostParams::default(), &fixed)
        .await
        .unwrap();
    start(&a, &b, config()).await.stop().await;
}

/// A failing status write and a poison object: the Standby refuses the copy's status write for good (a 422).
/// The marker (written last) never claims the version, the object goes to the failed list, and the position
/// stays below it (so a token wait reports it); once the Standby accepts again, the next source change brings
/// the copy — status and marker — up to date.
#[tokio::test(start_paused = true)]
async fn a_status_write_refused_for_good_is_a_failed_object_and_holds_the_position() {
    status_refused_for_good(false).await;
}

/// The same with the marker written first (a planted bug): the copy claims a version whose status it does not
/// hold.
#[tokio::test(start_paused = true)]
#[should_panic(expected = "a marker without the status")]
async fn the_refused_status_check_catches_a_marker_written_first() {
    status_refused_for_good(true).await;
}

async fn status_refused_for_good(marker_first: bool) {
    use kube_shard_testserver::{FailRule, Scope, Verb};
    let (a, b) = pair().await;
    let src = widgets(&a, APPS);
    let cfg = config();
    let _planted = marker_first
        .then(|| kube_shard::testing::faults::plant(kube_shard_ha::faults::MARKER_FIRST));
    let m = start(&a, &b, cfg).await;
    b.faults().fail_next(
        Scope::identity("mirror").verb(Verb::Update).name("p1"),
        FailRule::status(422).times(u32::MAX),
    );
    let mut w = src
        .create(&PostParams::default(), &widget("p1", 1))
        .await
        .unwrap();
    w.data["status"] = json!({"ready": true});
    let w = src
        .replace_status("p1", &PostParams::default(), &w)
        .await
        .unwrap();
    let p1 = rv_of(&w);
    src.create(&PostParams::default(), &widget("ok", 1))
        .await
        .unwrap();
    eventually(30, "the healthy object copied", || {
        widget_in_step(&a, &b, "ok")
    })
    .await
    .unwrap();
    eventually(30, "p1 on the failed list", || {
        let f = kind(&m, WIDGETS).failed;
        async move { f.iter().any(|f| f.key.1 == "p1") }
    })
    .await
    .unwrap();
    let st = kind(&m, WIDGETS);
    assert!(st.position.unwrap() < p1, "{st:?}");
    let f = st.failed.iter().find(|f| f.key.1 == "p1").unwrap();
    assert!(f.error.contains("422"), "{f:?}");
    // the copy was created (main resource) but its marker does not claim the source's version
    let c = widgets(&b, APPS).get("p1").await.unwrap();
    assert_eq!(ann(&c, SOURCE_RV), None, "a marker without the status");
    assert_ne!(c.data["status"], json!({"ready": true}));
    // the Standby accepts again; the next change of the source is applied whole
    b.faults().clear();
    src.patch(
        "p1",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"v": 2}})),
    )
    .await
    .unwrap();
    eventually(30, "p1 copied after the fix", || {
        widget_in_step(&a, &b, "p1")
    })
    .await
    .unwrap();
    eventually(30, "p1 off the failed list", || {
        let f = kind(&m, WIDGETS).failed;
        async move { f.is_empty() }
    })
    .await
    .unwrap();
    m.stop().await;
}

/// Re-creation with an immutable field: a source re-created under the same name with another value of a field
/// the server keeps immutable (an `immutable: true` ConfigMap's data). An in-place update of the copy is
/// refused for good (shown first, as the server answers it); the mirror re-creates the copy (delete with
/// preconditions, then create) and nothing lands on the failed list.
#[tokio::test(start_paused = true)]
async fn a_source_recreated_with_an_immutable_field_changed_is_copied_by_delete_and_create() {
    let (a, b) = pair().await;
    let m = start(&a, &b, config()).await;
    let immutable = |v: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": "imm"}, "immutable": true, "data": {"v": v}
        }))
        .unwrap()
    };
    let pp = PostParams::default();
    let src = cms(&a, APPS);
    src.create(&pp, &immutable("1")).await.unwrap();
    let on_b = cms(&b, APPS);
    eventually(30, "imm copied", || async {
        on_b.get_opt("imm").await.unwrap().and_then(|c| c.data) == immutable("1").data
    })
    .await
    .unwrap();
    let first = on_b.get("imm").await.unwrap();
    // the field really is immutable on the Standby: an in-place update is refused
    let mut edit = first.clone();
    edit.data = immutable("2").data;
    let refused = cms(&b, APPS).replace("imm", &pp, &edit).await.unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(e) if e.code == 422),
        "{refused}"
    );
    // the source is deleted and re-created with the other value
    src.delete("imm", &DeleteParams::default()).await.unwrap();
    src.create(&pp, &immutable("2")).await.unwrap();
    eventually(30, "the new imm copied", || async {
        on_b.get_opt("imm").await.unwrap().and_then(|c| c.data) == immutable("2").data
    })
    .await
    .unwrap();
    let again = on_b.get("imm").await.unwrap();
    assert_ne!(again.metadata.uid, first.metadata.uid, "a new copy");
    assert_eq!(
        again
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SOURCE_UID))
            .cloned(),
        src.get("imm").await.unwrap().metadata.uid
    );
    assert!(kind(&m, "configmaps").failed.is_empty());
    m.stop().await;
}

/// "Synced" means a full LIST was applied, not that a position exists: the position is checkpointed
/// within a second of the first LIST's arrival, long before its objects are copied. With 200 source
/// objects and the target's creates slowed, the unplanned promotion check refuses the kind after the
/// first checkpoint and passes once every listed object is copied.
#[tokio::test(start_paused = true)]
async fn a_kind_counts_as_synced_only_once_its_initial_list_is_applied() {
    use kube_shard_ha::promotion::{check_target, TargetRefused};
    use kube_shard_testserver::{Scope, Verb};
    let (a, b) = pair().await;
    let pp = PostParams::default();
    for i in 0..200 {
        widgets(&a, APPS)
            .create(&pp, &widget(&format!("w{i:03}"), 1))
            .await
            .unwrap();
    }
    b.faults().latency(
        Scope::identity("mirror")
            .verb(Verb::Create)
            .resource("widgets"),
        Some(Duration::from_millis(200)),
    );
    let ks: Vec<Kind> = vec![format!("{WIDGETS}/v1").parse().unwrap()];
    let set = KindSet::builder()
        .mirrored(ks[0].clone())
        .build(&ks)
        .unwrap();
    let cfg = MirrorConfig::new(ha(), "a", set).epoch(2001);
    let m = start(&a, &b, cfg.clone()).await;
    eventually(10, "the first checkpoint", || async {
        checkpoint(&b, WIDGETS).await.is_some()
    })
    .await
    .unwrap();
    let copies = || async {
        widgets(&b, APPS)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len()
    };
    let early = copies().await;
    assert!(early < 200, "{early}");
    let r = check_target(&cfg, &b.client("check"), true).await;
    assert!(
        matches!(&r, Err(TargetRefused::Unsynced { kinds, .. }) if kinds == &[WIDGETS.to_string()]),
        "with {early} of 200 objects copied: {r:?}"
    );
    eventually(120, "synced once the LIST is applied", || async {
        check_target(&cfg, &b.client("check"), true).await.is_ok()
    })
    .await
    .unwrap();
    assert_eq!(copies().await, 200);
    let k = check_target(&cfg, &b.client("check"), true).await.unwrap();
    let synced = k[0].synced.clone().unwrap();
    assert_eq!((synced.objects, synced.failed), (200, 0), "{synced:?}");
    assert!(k[0].position.unwrap() >= synced.list_rv, "{k:?}");
    m.stop().await;
}

mod duty;
mod lag;
mod pool;
mod repair;
mod scope;
