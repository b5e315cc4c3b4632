//! The mirror duty (`MirrorDuty`): mirror, adoption and failback through a whole failover and back,
//! on two testservers (A's RVs from 10^9), garbage collection on, paused time. Each cluster runs its
//! own elector and duty, as `kshard operator --ha-mirror` does.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::Api;
use kube_shard_ha::adoption::AdoptConfig;
use kube_shard_ha::checkpoint::WAS_ACTIVE_KEY;
use kube_shard_ha::driver::PromoteError;
use kube_shard_ha::duty::MirrorDuty;
use kube_shard_ha::elector::ForceError;
use kube_shard_ha::failback::FailbackOptions;
use kube_shard_ha::mirror::plan::MIRRORED_FROM;
use kube_shard_ha::mirror::{KindSet, MirrorConfig, MirrorWiring};
use kube_shard_ha::promotion::{check_target, TargetRefused};
use kube_shard_ha::switchover::{checkpoint_name, Kind};
use kube_shard_ha::{HaClients, HaConfig, HaControl, HaHandle, HaMetrics, HaMode};
use kube_shard_testserver::TestServer;
use serde_json::json;

use crate::mirror::{ann, eventually, pair, widget, widgets, APPS, HA_NS};

const GRACE: Duration = Duration::from_secs(20);

fn ha_cfg(id: &str, rank: u64, mode: HaMode) -> HaConfig {
    HaConfig::builder("widgets")
        .mode(mode)
        .cluster(id, rank)
        .namespace(HA_NS)
        .kubeconfigs(None, Some("/peer".into()), None)
        .build()
        .unwrap()
}

fn widget_kind() -> Kind {
    "widgets.example.kube-shard.io/v1".parse().unwrap()
}

/// Cluster `id`'s mirror of `peer`'s Widgets in `apps` (plus `extra` kinds, mirrored too).
fn mirror_cfg(id: &str, rank: u64, peer: &str, extra: &[&str]) -> MirrorConfig {
    let mut kinds = vec![widget_kind()];
    kinds.extend(extra.iter().map(|k| k.parse::<Kind>().unwrap()));
    let set = kinds
        .iter()
        .fold(KindSet::builder(), |b, k| b.mirrored(k.clone()))
        .build(&kinds)
        .unwrap();
    MirrorConfig::new(ha_cfg(id, rank, HaMode::Standby), peer, set)
        .namespaces([APPS])
        .whole_builtin_kinds(true)
        .probe_period(Duration::from_secs(2))
}

/// One cluster's operator process: its elector and its duty.
struct Side {
    handle: HaHandle,
    control: HaControl,
    elector: tokio::task::JoinHandle<()>,
    duty: MirrorDuty,
}

impl Side {
    fn kill(&self) {
        self.duty.abort();
        self.elector.abort();
    }
}

fn start(
    id: &str,
    rank: u64,
    peer: &str,
    mode: HaMode,
    own: &TestServer,
    other: &TestServer,
) -> Side {
    let who = format!("{id}-op");
    let clients = HaClients::new(own.client(&who), other.client(&who), None);
    let (handle, control, task) = kube_shard_ha::spawn(
        &ha_cfg(id, rank, mode),
        clients.clone(),
        kube_shard::rt::Clock::system(),
        HaMetrics::default(),
    );
    let duty = MirrorDuty::spawn(
        handle.clone(),
        clients,
        AdoptConfig::new(mirror_cfg(id, rank, peer, &[])),
        MirrorWiring::new(handle.clock(), Some(control.clone())),
        FailbackOptions::default().prune_grace(GRACE),
    );
    Side {
        handle,
        control,
        elector: task.expect("not standalone"),
        duty,
    }
}

async fn mark(s: &TestServer) -> Option<String> {
    Api::<ConfigMap>::namespaced(s.client("test"), HA_NS)
        .get_opt(&checkpoint_name(&ha_cfg("x", 9, HaMode::Standby)))
        .await
        .unwrap()
        .and_then(|c| c.data)
        .and_then(|mut d| d.remove(WAS_ACTIVE_KEY))
}

fn mirrored_from(o: &DynamicObject) -> Option<String> {
    o.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MIRRORED_FROM).cloned())
}

async fn get(s: &TestServer, name: &str) -> Option<DynamicObject> {
    widgets(s, APPS).get_opt(name).await.unwrap()
}

async fn force(control: &HaControl) -> kube_shard_ha::FailoverEpoch {
    for _ in 0..120 {
        match control.force_promote().await {
            Ok(e) => return e,
            Err(PromoteError::Refused(ForceError::NotArmed)) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("force promotion: {e}"),
        }
    }
    panic!("never armed");
}

#[tokio::test(start_paused = true)]
async fn the_duty_mirrors_adopts_at_failover_and_fails_back_the_returning_active() {
    let (sa, sb) = pair().await;
    let a = start("a", 1, "b", HaMode::Active, &sa, &sb);
    let b = start("b", 2, "a", HaMode::Standby, &sb, &sa);
    let mut w1 = widget("w1", 1);
    w1.metadata.finalizers = Some(vec!["example.com/cleanup".into()]);
    for w in [w1, widget("w2", 1)] {
        widgets(&sa, APPS)
            .create(&PostParams::default(), &w)
            .await
            .unwrap();
    }

    // A adopts at its bootstrap epoch (nothing to adopt) and is marked; B mirrors A
    eventually(60, "A active", || async { a.handle.is_active() })
        .await
        .unwrap();
    assert_eq!(a.duty.status().phase, "active");
    assert_eq!(mark(&sa).await.as_deref(), Some("1001"));
    eventually(60, "B mirrors w1 and w2", || async {
        b.duty.status().phase == "mirroring"
            && get(&sb, "w1").await.is_some()
            && get(&sb, "w2").await.is_some()
    })
    .await
    .unwrap();
    assert_eq!(mark(&sb).await, None, "B never admitted");
    let copy = get(&sb, "w1").await.unwrap();
    assert_eq!(mirrored_from(&copy).as_deref(), Some("a"));
    assert!(copy.metadata.finalizers.is_none(), "kept aside on a copy");

    // A dies; a human promotes B: admission opens only after adoption restored the finalizer
    a.kill();
    let e = force(&b.control).await;
    assert_eq!(e.wire(), 2002);
    eventually(60, "B admits", || async { b.handle.is_active() })
        .await
        .unwrap();
    let st = b.duty.status();
    assert_eq!(st.adoption.epoch, Some(2002), "{st:?}");
    assert_eq!(
        st.adoption.restored, 1,
        "w1's finalizer; w2 needs no write: {st:?}"
    );
    assert_eq!(
        get(&sb, "w1").await.unwrap().metadata.finalizers.as_deref(),
        Some(&["example.com/cleanup".to_string()][..])
    );
    assert_eq!(mark(&sb).await.as_deref(), Some("2002"));

    // the new Active works on; the dead Active's cluster got a write nobody mirrored
    widgets(&sb, APPS)
        .create(&PostParams::default(), &widget("w3", 1))
        .await
        .unwrap();
    widgets(&sb, APPS)
        .patch(
            "w2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"v": 2}})),
        )
        .await
        .unwrap();
    let mut lost = widget("lost", 1);
    lost.metadata.annotations =
        Some([("kube-shard.io/fence".to_string(), "1001:0/1".to_string())].into());
    widgets(&sa, APPS)
        .create(&PostParams::default(), &lost)
        .await
        .unwrap();

    // A returns: it steps down by itself, fails back (divergent `lost` held for the grace), then
    // mirrors B
    let a = start("a", 1, "b", HaMode::Active, &sa, &sb);
    let a_mirror = mirror_cfg("a", 1, "b", &[]);
    eventually(60, "A fails back", || async {
        a.duty.status().phase == "failback"
    })
    .await
    .unwrap();
    assert!(!a.handle.is_active());
    let refused = check_target(&a_mirror, &sa.client("check"), false).await;
    assert!(
        matches!(&refused, Err(TargetRefused::Divergent(d)) if d.0.len() == 1 && d.0[0].at.name == "lost"),
        "A holds a divergent object: not a promotion target: {refused:?}"
    );
    eventually(120, "A mirrors B", || async {
        a.duty.status().phase == "mirroring"
    })
    .await
    .unwrap();
    assert!(!a.handle.is_active(), "A never admitted after its return");
    assert_eq!(mark(&sa).await, None, "cleared after failback");
    let fb = a.duty.status().failback.unwrap();
    assert_eq!(
        fb.deleted
            .iter()
            .map(|d| d.name.as_str())
            .collect::<Vec<_>>(),
        ["lost"]
    );
    eventually(60, "A holds B's state as copies", || async {
        let (Some(w2), Some(w3)) = (get(&sa, "w2").await, get(&sa, "w3").await) else {
            return false;
        };
        get(&sa, "lost").await.is_none()
            && w2.data["spec"]["v"] == 2
            && mirrored_from(&w2).as_deref() == Some("b")
            && mirrored_from(&w3).as_deref() == Some("b")
    })
    .await
    .unwrap();
    assert_eq!(
        ann(&get(&sa, "w3").await.unwrap(), "kube-shard.io/fence").as_deref(),
        Some("2002:mirror")
    );
    // the duty's metrics and Events
    let mut reg = prometheus_client::registry::Registry::default();
    a.duty.metrics().register(&mut reg);
    let scrape = || {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        text
    };
    // the duty publishes its mirror's state once per retry period
    eventually(5, "the position published", || async {
        scrape().contains("kube_shard_mirror_position{")
    })
    .await
    .unwrap();
    let text = scrape();
    for want in [
        "kube_shard_mirror_phase{phase=\"mirroring\"} 1",
        "kube_shard_mirror_position{kind=\"widgets.example.kube-shard.io\"}",
        "kube_shard_mirror_starts_total 1",
        "kube_shard_mirror_divergent_objects 0",
    ] {
        assert!(text.contains(want), "{want} missing in\n{text}");
    }
    let reasons = |s: &TestServer| {
        let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(s.client("test"), HA_NS);
        async move {
            api.list(&Default::default())
                .await
                .unwrap()
                .items
                .into_iter()
                .filter_map(|e| e.reason)
                .collect::<Vec<_>>()
        }
    };
    let (ra, rb) = (reasons(&sa).await, reasons(&sb).await);
    for r in [
        "Adopted",
        "FailbackDivergent",
        "FailbackDone",
        "MirrorStarted",
    ] {
        assert!(ra.contains(&r.to_string()), "A's Events lack {r}: {ra:?}");
    }
    for r in ["MirrorStarted", "Adopted"] {
        assert!(rb.contains(&r.to_string()), "B's Events lack {r}: {rb:?}");
    }
    // once its mirror checkpointed a position from B
    eventually(30, "A a valid promotion target again", || async {
        check_target(&a_mirror, &sa.client("check"), true)
            .await
            .is_ok()
    })
    .await
    .unwrap();
    a.kill();
    b.kill();
}

#[tokio::test(start_paused = true)]
async fn a_standby_that_never_admitted_keeps_objects_it_did_not_make_and_is_refused_as_a_target() {
    let (sa, sb) = pair().await;
    widgets(&sb, APPS)
        .create(&PostParams::default(), &widget("mine", 1))
        .await
        .unwrap();
    widgets(&sa, APPS)
        .create(&PostParams::default(), &widget("w1", 1))
        .await
        .unwrap();
    let b_cfg = mirror_cfg("b", 2, "a", &["configmaps/v1"]);
    // an object B did not make refuses it first
    let r = check_target(&mirror_cfg("b", 2, "a", &[]), &sb.client("check"), true).await;
    assert!(matches!(r, Err(TargetRefused::Divergent(_))), "{r:?}");

    let a = start("a", 1, "b", HaMode::Active, &sa, &sb);
    let b = start("b", 2, "a", HaMode::Standby, &sb, &sa);
    eventually(60, "B mirrors", || async {
        b.duty.status().phase == "mirroring" && get(&sb, "w1").await.is_some()
    })
    .await
    .unwrap();
    tokio::time::sleep(GRACE * 3).await;
    assert!(
        b.duty.status().failback.is_none(),
        "no failback without the mark"
    );
    assert!(get(&sb, "mine").await.is_some(), "kept");
    let r = check_target(&b_cfg, &sb.client("check"), true).await;
    assert!(
        matches!(&r, Err(TargetRefused::Divergent(d)) if d.0[0].at.name == "mine"),
        "{r:?}"
    );
    // without the divergent object: synced Widgets pass, the never-mirrored kind is refused
    widgets(&sb, APPS)
        .delete("mine", &Default::default())
        .await
        .unwrap();
    eventually(10, "mine gone", || async {
        get(&sb, "mine").await.is_none()
    })
    .await
    .unwrap();
    let r = check_target(&b_cfg, &sb.client("check"), true).await;
    assert!(
        matches!(&r, Err(TargetRefused::Unsynced { kinds, .. }) if kinds == &["configmaps".to_string()]),
        "{r:?}"
    );
    let positions = check_target(&b_cfg, &sb.client("check"), false)
        .await
        .unwrap();
    assert!(positions
        .iter()
        .any(|p| p.kind == "widgets.example.kube-shard.io" && p.position.is_some()));
    a.kill();
    b.kill();
}
