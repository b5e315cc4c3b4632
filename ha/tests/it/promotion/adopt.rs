//! Adoption at promotion and failback (HA.md "Promotion and adoption") on two testservers (the old Active's
//! RVs from 10^9), garbage collection on, paused time.
//!
//! Promotion: B mirrors A, then B's elector becomes Active (bootstrap, A's cluster holds no HA Lease)
//! with [`Adoption`] hooked on its handle. A probe admits through the handle every 10 ms and, at the
//! first admission, checks that adoption's effects are all visible (finalizers restored, the child's
//! owner reference remapped to the owner copy, the terminating copy deleted); the adopter's requests
//! are slowed so an admission opened early is seen. Failback: A pairs its objects with B's.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use kube_shard::hash::ShardKey;
use kube_shard::shard::ShardCount;
use kube_shard_ha::adoption::{AdoptConfig, Adoption, ShardSpec};
use kube_shard_ha::failback::{divergent_objects, promotable, Failback, FailbackOptions};
use kube_shard_ha::mirror::plan::{MIRRORED_FROM, SOURCE_FINALIZERS, SOURCE_RV, SOURCE_UID};
use kube_shard_ha::mirror::{KindSet, MirrorConfig};
use kube_shard_ha::{HaClients, HaConfig, HaHandle, HaMetrics, HaMode};
use kube_shard_testserver::{Scope, TestServer};
use serde_json::json;

use crate::mirror::{
    ann, cms, config, eventually, pair, start, widget, widget_in_step, widgets, APPS, HA_NS,
};

const SHARDS: u32 = 16;

fn spec() -> ShardSpec {
    ShardSpec {
        key: ShardKey::Uid,
        count: ShardCount::new(SHARDS).unwrap(),
    }
}

/// B's elector: bootstrap Active against A's cluster (no HA Lease there).
fn elector(b: &TestServer, a: &TestServer) -> (HaHandle, tokio::task::JoinHandle<()>) {
    let cfg = HaConfig::builder("widgets")
        .mode(HaMode::Active)
        .cluster("b", 2)
        .namespace(HA_NS)
        .kubeconfigs(None, Some("/peer".into()), None)
        .build()
        .unwrap();
    let clients = HaClients::new(b.client("b-op"), a.client("b-op"), None);
    let (h, _control, task) = kube_shard_ha::spawn(
        &cfg,
        clients,
        kube_shard::rt::Clock::system(),
        HaMetrics::default(),
    );
    (h, task.expect("not standalone"))
}

fn owned_by(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        ..Default::default()
    }
}

/// What must hold at the first admission, read on B (`None`: all of it).
async fn adoption_visible(b: &TestServer) -> Option<String> {
    let (Some(owner), Some(child)) = (
        cms(b, APPS).get_opt("owner").await.unwrap(),
        widgets(b, APPS).get_opt("child").await.unwrap(),
    ) else {
        return Some("a copy is missing".into());
    };
    let fins = owner.metadata.finalizers.unwrap_or_default();
    if fins != ["example.com/cleanup"] {
        return Some(format!("owner copy's finalizers not restored: {fins:?}"));
    }
    let refs = child.metadata.owner_references.unwrap_or_default();
    if refs.len() != 1 || Some(&refs[0].uid) != owner.metadata.uid.as_ref() {
        return Some(format!("child's owner reference not remapped: {refs:?}"));
    }
    let gone = widgets(b, APPS).get_opt("doomed").await.unwrap();
    if gone.is_some_and(|d| d.metadata.deletion_timestamp.is_none()) {
        return Some("the terminating source's copy is live".into());
    }
    None
}

struct Run {
    violations: Vec<String>,
    refused_during_adoption: usize,
}

struct Promoted {
    run: Run,
    a: TestServer,
    b: TestServer,
    adoption: Adoption,
    elector: tokio::task::JoinHandle<()>,
}

impl Promoted {
    fn stop(&self) {
        self.adoption.abort();
        self.elector.abort();
    }
}

/// Mirror A into B, promote B with adoption (`planted`: admission opened before adoption), and check
/// at the first admission.
async fn promotion(planted: bool) -> Promoted {
    let (a, b) = pair().await;
    // a child mirrored before its owner: the owner's copy writes are slowed
    b.faults().latency(
        Scope::identity("mirror").resource("configmaps"),
        Some(Duration::from_secs(2)),
    );
    let mut owner: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "owner"}})).unwrap();
    owner.metadata.finalizers = Some(vec!["example.com/cleanup".into()]);
    let owner = cms(&a, APPS)
        .create(&PostParams::default(), &owner)
        .await
        .unwrap();
    let mut child = widget("child", 1);
    child.metadata.labels = Some([("kube-shard.io/shard".to_string(), "3".to_string())].into());
    child.metadata.owner_references = Some(vec![owned_by(
        "owner",
        owner.metadata.uid.as_deref().unwrap(),
    )]);
    widgets(&a, APPS)
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
    let mut doomed = widget("doomed", 1);
    doomed.metadata.finalizers = Some(vec!["example.com/cleanup".into()]);
    widgets(&a, APPS)
        .create(&PostParams::default(), &doomed)
        .await
        .unwrap();
    widgets(&a, APPS)
        .delete("doomed", &DeleteParams::default())
        .await
        .unwrap();

    let cfg = config().epoch(1001);
    let m = start(&a, &b, cfg.clone()).await;
    eventually(60, "copies in step", || async {
        widget_in_step(&a, &b, "child").await
            && widget_in_step(&a, &b, "doomed").await
            && cms(&b, APPS).get_opt("owner").await.unwrap().is_some()
    })
    .await
    .unwrap();
    let c = widgets(&b, APPS).get("child").await.unwrap();
    assert!(
        c.metadata.owner_references.is_none(),
        "the copy has no live owner reference"
    );

    // promotion: adoption's requests are slowed, so an early admission is seen
    b.faults()
        .latency(Scope::identity("adopter"), Some(Duration::from_millis(300)));
    let (h, elector) = elector(&b, &a);
    let acfg = AdoptConfig::new(cfg).shard(spec());
    let _planted = planted
        .then(|| kube_shard::testing::faults::plant(kube_shard_ha::faults::OPEN_BEFORE_ADOPTION));
    let adoption = Adoption::spawn(h.clone(), b.client("adopter"), acfg, Some(m));
    let mut run = Run {
        violations: Vec::new(),
        refused_during_adoption: 0,
    };
    let t0 = tokio::time::Instant::now();
    loop {
        assert!(t0.elapsed() < Duration::from_secs(120), "never admitted");
        match h.admit() {
            Ok(_) => {
                run.violations.extend(adoption_visible(&b).await);
                break;
            }
            Err(_) if h.leading_epoch().is_some() => run.refused_during_adoption += 1,
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    b.faults().latency(Scope::identity("adopter"), None);
    Promoted {
        run,
        a,
        b,
        adoption,
        elector,
    }
}

#[tokio::test(start_paused = true)]
async fn adoption_restores_before_admission_opens_and_relabels_after() {
    let p = promotion(false).await;
    let (run, a, b, adoption) = (&p.run, &p.a, &p.b, &p.adoption);
    assert_eq!(run.violations, Vec::<String>::new());
    assert!(
        run.refused_during_adoption > 0,
        "admission was tried and refused during adoption"
    );
    let st = adoption.status();
    assert_eq!(st.epoch, Some(1002));
    assert!(st.problems.is_empty(), "{:?}", st.problems);
    assert_eq!((st.restored, st.deleted), (3, 1), "{st:?}");

    let owner = cms(b, APPS).get("owner").await.unwrap();
    let child = widgets(b, APPS).get("child").await.unwrap();
    assert_eq!(
        ann(&child, "kube-shard.io/fence").as_deref(),
        Some("1002:mirror")
    );
    let want = spec()
        .count
        .shard_of(ShardKey::Uid.hash_meta(&owner.metadata).unwrap())
        .to_string();
    assert_eq!(
        child
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .get("kube-shard.io/shard"),
        Some(&want),
        "the shard label from the owner copy's uid"
    );
    assert!(
        ann(&child, "kube-shard.io/source-owners").is_none(),
        "consumed"
    );
    // the terminating source's copy: deleted, held by its restored finalizer for the new Active's cleanup
    let d = widgets(b, APPS).get("doomed").await.unwrap();
    assert!(d.metadata.deletion_timestamp.is_some());
    assert_eq!(
        d.metadata.finalizers.as_deref(),
        Some(&["example.com/cleanup".to_string()][..])
    );

    // relabelled in the background: the conflict guard and marker go, the source uid stays
    eventually(30, "relabelled", || async move {
        adoption.status().state == "relabelled"
    })
    .await
    .unwrap();
    let child = widgets(b, APPS).get("child").await.unwrap();
    assert!(!child
        .metadata
        .labels
        .as_ref()
        .unwrap()
        .contains_key(MIRRORED_FROM));
    assert!(ann(&child, SOURCE_RV).is_none());
    assert_eq!(
        ann(&child, SOURCE_UID),
        widgets(a, APPS).get("child").await.unwrap().metadata.uid
    );
    // B's garbage collector keeps the child: its owner reference names a live owner
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(widgets(b, APPS).get_opt("child").await.unwrap().is_some());
    p.stop();
}

#[tokio::test(start_paused = true)]
async fn the_first_admission_check_catches_admission_opened_before_adoption() {
    let p = promotion(true).await;
    assert!(
        !p.run.violations.is_empty(),
        "the planted early admission was not caught"
    );
    p.stop();
}

/// Cluster A's mirror configuration after the failover: it mirrors B.
fn config_on_a() -> MirrorConfig {
    let base = config();
    let ha = HaConfig::builder("widgets")
        .mode(HaMode::Standby)
        .cluster("a", 1)
        .namespace(HA_NS)
        .kubeconfigs(None, Some("/peer".into()), None)
        .build()
        .unwrap();
    let kinds: Vec<_> = base.kinds.mirrored().cloned().collect();
    let mut set = KindSet::builder();
    for k in &kinds {
        set = set.mirrored(k.clone());
    }
    MirrorConfig::new(ha, "b", set.build(&kinds).unwrap())
        .epoch(1002)
        .whole_builtin_kinds(true)
        .assignment(HA_NS, "g-assignment")
}

/// A's own widget `name` (finalizer) and B's adopted object for it (recorded source uid), with
/// spec `b_v` (`None`: B has none).
async fn both(a: &TestServer, b: &TestServer, name: &str, b_v: Option<u64>) -> DynamicObject {
    let mut w = widget(name, 1);
    w.metadata.finalizers = Some(vec!["example.com/cleanup".into()]);
    w.metadata.annotations =
        Some([("kube-shard.io/fence".to_string(), "1001:0/1".to_string())].into());
    let old = widgets(a, APPS)
        .create(&PostParams::default(), &w)
        .await
        .unwrap();
    if let Some(v) = b_v {
        let mut n = widget(name, v);
        n.metadata.annotations =
            Some([(SOURCE_UID.to_string(), old.metadata.uid.clone().unwrap())].into());
        widgets(b, APPS)
            .create(&PostParams::default(), &n)
            .await
            .unwrap();
    }
    old
}

async fn failback(keep: bool) -> (TestServer, TestServer, Vec<String>) {
    let (a, b) = pair().await;
    both(&a, &b, "same", Some(1)).await;
    both(&a, &b, "changed", Some(2)).await;
    both(&a, &b, "only-on-a", None).await;
    let cfg = config_on_a();
    let opts = FailbackOptions::default()
        .keep_divergent(keep)
        .prune_grace(Duration::from_secs(60));
    let mut f = Failback::new(
        cfg.clone(),
        a.client("failback"),
        b.client("failback"),
        opts,
    );
    let r = f.run_once().await.unwrap();
    let names = |v: &[kube_shard_ha::adoption::ObjRef]| {
        v.iter().map(|o| o.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(&r.labelled), ["same"]);
    assert_eq!(names(&r.updated), ["changed"]);
    assert_eq!(r.divergent.len(), 1);
    assert_eq!(r.divergent[0].at.name, "only-on-a");
    assert_eq!(
        r.divergent[0].fence.as_deref(),
        Some("1001:0/1"),
        "its epoch stamp is reported"
    );
    assert!(r.deleted.is_empty() && r.failed.is_empty(), "{r:?}");
    for n in ["same", "changed"] {
        let o = widgets(&a, APPS).get(n).await.unwrap();
        assert_eq!(o.metadata.labels.as_ref().unwrap()[MIRRORED_FROM], "b");
        assert!(o.metadata.finalizers.is_none(), "stripped as for any copy");
        assert!(ann(&o, SOURCE_FINALIZERS).is_none(), "B's object has none");
        assert_eq!(
            ann(&o, "kube-shard.io/fence").as_deref(),
            Some("1002:mirror")
        );
        assert!(ann(&o, SOURCE_RV).is_some(), "the commit marker");
        assert_eq!(
            o.data["spec"],
            widgets(&b, APPS).get(n).await.unwrap().data["spec"]
        );
    }
    // a Standby with divergent objects is not a valid promotion target
    let div = divergent_objects(&cfg, &a.client("check")).await.unwrap();
    assert_eq!(div.len(), 1);
    assert!(promotable(&div).is_err());
    // within the grace: reported, not deleted; after it: deleted unless kept
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(f.run_once().await.unwrap().deleted.is_empty());
    tokio::time::sleep(Duration::from_secs(31)).await;
    let r = f.run_once().await.unwrap();
    (a, b, names(&r.deleted))
}

#[tokio::test(start_paused = true)]
async fn failback_labels_equal_updates_different_and_deletes_divergent_after_the_grace() {
    let (a, _b, deleted) = failback(false).await;
    assert_eq!(deleted, ["only-on-a"]);
    eventually(10, "divergent object gone", || async {
        widgets(&a, APPS)
            .get_opt("only-on-a")
            .await
            .unwrap()
            .is_none()
    })
    .await
    .unwrap();
    let div = divergent_objects(&config_on_a(), &a.client("check"))
        .await
        .unwrap();
    assert!(promotable(&div).is_ok(), "{div:?}");
}

#[tokio::test(start_paused = true)]
async fn failback_with_keep_divergent_reports_and_never_deletes() {
    let (a, _b, deleted) = failback(true).await;
    assert!(deleted.is_empty());
    assert!(widgets(&a, APPS)
        .get_opt("only-on-a")
        .await
        .unwrap()
        .is_some());
    let div = divergent_objects(&config_on_a(), &a.client("check"))
        .await
        .unwrap();
    assert_eq!(promotable(&div).unwrap_err().0.len(), 1);
}

/// Failback deletes (after the grace) only divergent objects kube-shard wrote — with a fence stamp or a
/// mirror marker. One nobody stamped (a person's, another controller's) is reported as never written by
/// kube-shard and left for a person; it keeps the cluster from being a promotion target meanwhile.
#[tokio::test(start_paused = true)]
async fn failback_never_deletes_a_divergent_object_kube_shard_never_wrote() {
    let (a, b) = pair().await;
    both(&a, &b, "stamped", None).await;
    widgets(&a, APPS)
        .create(&PostParams::default(), &widget("unstamped", 1))
        .await
        .unwrap();
    let cfg = config_on_a();
    let opts = FailbackOptions::default().prune_grace(Duration::from_secs(60));
    let mut f = Failback::new(
        cfg.clone(),
        a.client("failback"),
        b.client("failback"),
        opts,
    );
    f.run_once().await.unwrap();
    tokio::time::sleep(Duration::from_secs(61)).await;
    let r = f.run_once().await.unwrap();
    let names = |v: &[kube_shard_ha::adoption::ObjRef]| {
        v.iter().map(|o| o.name.clone()).collect::<Vec<_>>()
    };
    assert_eq!(names(&r.deleted), ["stamped"], "{r:?}");
    assert_eq!(names(&r.never_written), ["unstamped"], "{r:?}");
    assert!(widgets(&a, APPS)
        .get_opt("unstamped")
        .await
        .unwrap()
        .is_some());
    let div = divergent_objects(&cfg, &a.client("check")).await.unwrap();
    assert_eq!(promotable(&div).unwrap_err().0.len(), 1, "{div:?}");
    // a person decides they may go: the next pass past the grace deletes them too
    let mut f = Failback::new(
        cfg.clone(),
        a.client("failback"),
        b.client("failback"),
        opts.delete_unstamped(true),
    );
    f.run_once().await.unwrap();
    tokio::time::sleep(Duration::from_secs(61)).await;
    let r = f.run_once().await.unwrap();
    assert_eq!(names(&r.deleted), ["unstamped"], "{r:?}");
}
