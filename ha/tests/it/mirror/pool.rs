//! The worker pool and the global rate limit on two testservers (paused time): several applies per kind
//! in flight at once, but one object's changes still in order; a hold that starts no apply and waits for
//! the ones in flight; and one request rate over every kind. A request tap on each server records the
//! mirror's requests as they arrive and as they are answered.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube_shard_ha::mirror::plan::SOURCE_RV;
use kube_shard_ha::switchover::{checkpoint_name, CAUGHT_UP_KEY, HOLD_KEY};
use kube_shard_testserver::{ResourceFilter, Scope, TestServer, Verb};
use serde_json::json;
use tokio::time::Instant;

use super::{
    cms, config, eventually, ha, install, namespace, start, widget, widget_in_step, widgets, APPS,
    HA_NS, SOURCE_RV_START, WIDGETS,
};

/// One request of the mirror to an object in `apps` (an apply's reads and writes: not the watches,
/// LISTs, probes or checkpoint writes), on arrival or answer.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    /// `a` (the source) or `b` (the target).
    server: &'static str,
    /// The object's name (`None`: a create, whose name is in its body).
    name: Option<String>,
    answered: bool,
}

type Log = Arc<Mutex<Vec<Seen>>>;

fn tap(server: &'static str, log: &Log) -> impl Fn(&kube_shard_testserver::Tapped) + Send + Sync {
    let log = log.clone();
    move |t| {
        let path = t.uri.split('?').next().unwrap_or_default();
        let Some((_, rest)) = path.split_once(&format!("/namespaces/{APPS}/")) else {
            return;
        };
        if t.identity != "mirror" || (t.method == "GET" && !rest.contains('/')) {
            return; // another client, or a LIST
        }
        let name = rest.split('/').nth(1).map(str::to_string);
        if let Ok(mut l) = log.lock() {
            l.push(Seen {
                at: Instant::now(),
                server,
                name,
                answered: t.status.is_some(),
            });
        }
    }
}

/// The source and the target as [`super::pair`] makes them, with the mirror's apply requests logged.
async fn tapped_pair() -> (TestServer, TestServer, Log) {
    let log = Log::default();
    let a = TestServer::builder()
        .resource_version_start(SOURCE_RV_START)
        .controllers(true)
        .request_tap(tap("a", &log))
        .build();
    let b = TestServer::builder()
        .controllers(true)
        .request_tap(tap("b", &log))
        .build();
    for s in [&a, &b] {
        install(s).await;
        namespace(s, APPS).await;
    }
    (a, b, log)
}

/// The most requests in flight at once: overall, and of one object on one server.
fn most_at_once(log: &[Seen]) -> (usize, usize) {
    let (mut now, mut most, mut per) = (0usize, 0, 0);
    let mut by: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for s in log {
        let n = s
            .name
            .as_deref()
            .map(|n| by.entry((s.server, n)).or_default());
        if s.answered {
            now = now.saturating_sub(1);
            if let Some(n) = n {
                *n = n.saturating_sub(1);
            }
        } else {
            now += 1;
            most = most.max(now);
            if let Some(n) = n {
                *n += 1;
                per = per.max(*n);
            }
        }
    }
    (most, per)
}

/// Create `n` widgets `w000`.. in the source.
async fn widgets_in_source(a: &TestServer, n: usize) {
    let pp = PostParams::default();
    for i in 0..n {
        widgets(a, APPS)
            .create(&pp, &widget(&format!("w{i:03}"), 1))
            .await
            .unwrap();
    }
}

/// Eight workers, every request of the mirror slowed by 50 ms, and one hot object changed every 20 ms
/// for two seconds (faster than an apply of it takes) while 40 others are copied: up to eight applies run at once, but
/// never two of one object, its copy's markers never go back, no write of it conflicts with another,
/// and it ends in step.
#[tokio::test(start_paused = true)]
async fn with_eight_workers_one_objects_changes_are_still_applied_in_order() {
    let (a, b, log) = tapped_pair().await;
    widgets_in_source(&a, 40).await;
    widgets(&a, APPS)
        .create(&PostParams::default(), &widget("hot", 0))
        .await
        .unwrap();
    let hot = ResourceFilter::resource(WIDGETS)
        .namespace(APPS)
        .name("hot");
    b.history().record(hot.clone());
    for s in [&a, &b] {
        s.faults()
            .latency(Scope::identity("mirror"), Some(Duration::from_millis(50)));
    }
    let m = start(&a, &b, config().workers(8)).await;
    eventually(10, "hot copied", || async {
        widgets(&b, APPS).get_opt("hot").await.unwrap().is_some()
    })
    .await
    .unwrap();
    for v in 1..=100u64 {
        widgets(&a, APPS)
            .patch(
                "hot",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"v": v}})),
            )
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eventually(60, "every widget in step", || async {
        for i in 0..40 {
            if !widget_in_step(&a, &b, &format!("w{i:03}")).await {
                return false;
            }
        }
        widget_in_step(&a, &b, "hot").await
    })
    .await
    .unwrap();
    let st = m.kind(WIDGETS).unwrap();
    m.stop().await;
    let (most, per_object) = most_at_once(&log.lock().unwrap());
    eprintln!("at most {most} requests at once, {per_object} of one object");
    assert_eq!(per_object, 1, "two requests of one object at once");
    assert!(most >= 6, "at most {most} requests at once: no pool");
    assert!(st.errors.is_empty(), "conflicting writes: {:?}", st.errors);
    let markers: Vec<u64> = b
        .history()
        .of(&hot)
        .iter()
        .filter_map(|c| c.object["metadata"]["annotations"][SOURCE_RV].as_str())
        .filter_map(|m| m.rsplit_once(" rv=").and_then(|(_, r)| r.parse().ok()))
        .collect();
    eprintln!("hot's copy: {} marker commits", markers.len());
    assert!(markers.len() >= 5, "{markers:?}");
    assert!(
        markers.windows(2).all(|w| w[0] < w[1]),
        "hot's copy went back: {markers:?}"
    );
}

/// The resourceVersion of the checkpoint's first commit holding `key`.
fn first_commit_with(b: &TestServer, f: &ResourceFilter, key: &str) -> Option<u64> {
    b.history()
        .of(f)
        .iter()
        .find(|c| c.object["data"].get(key).is_some())
        .map(|c| c.resource_version)
}

/// A bare hold (a forced promotion's) asked while eight applies are in flight, their copy writes slowed
/// by 3 s: the acknowledgement comes only after every one of them committed, and no apply starts while
/// held (the rest of the objects are not copied); released, the mirror copies them.
#[tokio::test(start_paused = true)]
async fn a_held_mirror_starts_no_apply_and_waits_for_the_ones_in_flight() {
    let (a, b, log) = tapped_pair().await;
    widgets_in_source(&a, 24).await;
    let copies = ResourceFilter::resource(WIDGETS).namespace(APPS);
    let cp = ResourceFilter::resource("configmaps")
        .namespace(HA_NS)
        .name(checkpoint_name(&ha()));
    b.history().record(copies.clone());
    b.history().record(cp.clone());
    b.faults().latency(
        Scope::identity("mirror")
            .verb(Verb::Update)
            .resource("widgets"),
        Some(Duration::from_secs(3)),
    );
    let m = start(&a, &b, config().workers(8)).await;
    eventually(10, "eight applies in flight", || {
        let n = m.kind(WIDGETS).map_or(0, |k| k.in_flight);
        async move { n == 8 }
    })
    .await
    .unwrap();
    cms(&b, HA_NS)
        .patch(
            &checkpoint_name(&ha()),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {HOLD_KEY: "e=2001 id=h1"}})),
        )
        .await
        .unwrap();
    eventually(20, "the hold acknowledged", || async {
        first_commit_with(&b, &cp, CAUGHT_UP_KEY).is_some()
    })
    .await
    .unwrap();
    let acked = first_commit_with(&b, &cp, CAUGHT_UP_KEY).unwrap();
    let requests_at_ack = log.lock().unwrap().len();
    let written: Vec<u64> = b
        .history()
        .of(&copies)
        .iter()
        .filter(|c| c.identity == "mirror")
        .map(|c| c.resource_version)
        .collect();
    assert!(!written.is_empty());
    assert!(
        written.iter().all(|rv| *rv < acked),
        "a copy write committed after the acknowledgement at {acked}: {written:?}"
    );
    assert_eq!(m.kind(WIDGETS).unwrap().in_flight, 0);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after: Vec<Seen> = log.lock().unwrap()[requests_at_ack..].to_vec();
    assert!(after.is_empty(), "requests while held: {after:?}");
    let n = widgets(&b, APPS).list(&Default::default()).await.unwrap();
    assert!(n.items.len() < 24, "every object copied while held");
    // released (the request leaves the checkpoint): the rest is copied
    cms(&b, HA_NS)
        .patch(
            &checkpoint_name(&ha()),
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {HOLD_KEY: null}})),
        )
        .await
        .unwrap();
    eventually(60, "every widget copied after the release", || async {
        widgets(&b, APPS)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .len()
            == 24
    })
    .await
    .unwrap();
    m.stop().await;
}

/// Two kinds (Widgets and ConfigMaps), 40 objects each, eight workers each, and a global limit of 10
/// requests a second: the apply requests over both kinds and both servers never exceed 10 in any
/// second (plus the one-request burst), and both kinds finish.
#[tokio::test(start_paused = true)]
async fn the_rate_limit_bounds_requests_per_second_over_every_kind() {
    let (a, b, log) = tapped_pair().await;
    widgets_in_source(&a, 40).await;
    let pp = PostParams::default();
    for i in 0..40 {
        let c: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("c{i:02}")}})).unwrap();
        cms(&a, APPS).create(&pp, &c).await.unwrap();
    }
    let t0 = Instant::now();
    let m = start(&a, &b, config().workers(8).rate_limit(Some(10.0))).await;
    eventually(120, "both kinds synced", || {
        let done = m.status().iter().all(|k| k.synced.is_some());
        async move { done }
    })
    .await
    .unwrap();
    let took = t0.elapsed();
    m.stop().await;
    let sent: Vec<Instant> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|s| !s.answered)
        .map(|s| s.at)
        .collect();
    let most = sent
        .iter()
        .map(|t0| {
            sent.iter()
                .filter(|t| **t >= *t0 && **t < *t0 + Duration::from_secs(1))
                .count()
        })
        .max()
        .unwrap();
    eprintln!(
        "{} requests in {took:?}, at most {most} in one second",
        sent.len()
    );
    assert!(most <= 11, "{most} requests in one second");
    // 80 objects of four requests each (two reads, a create, the marker): at the limit, not slower
    assert!(sent.len() >= 320, "{}", sent.len());
    let rate = sent.len() as f64 / took.as_secs_f64();
    assert!(rate > 8.0, "{rate:.1} requests a second over {took:?}");
}

/// Twelve objects whose copy writes the Standby refuses for good (422): each goes to the failed list,
/// and a Warning Event `MirrorSyncFailed` names the kind, the object and the operation — ten of them
/// (at most ten per kind per minute); one object failing again within the minute posts none.
#[tokio::test(start_paused = true)]
async fn a_failed_objects_event_is_rate_limited() {
    use k8s_openapi::api::core::v1::Event;
    use kube_shard_testserver::FailRule;
    let (a, b, _log) = tapped_pair().await;
    b.faults().fail_next(
        Scope::identity("mirror")
            .verb(Verb::Update)
            .resource("widgets"),
        FailRule::status(422).times(u32::MAX),
    );
    widgets_in_source(&a, 12).await;
    let m = start(&a, &b, config().workers(8)).await;
    eventually(30, "twelve objects on the failed list", || {
        let n = m.kind(WIDGETS).map_or(0, |k| k.failed.len());
        async move { n == 12 }
    })
    .await
    .unwrap();
    let events = || async {
        kube::Api::<Event>::namespaced(b.client("admin"), HA_NS)
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("MirrorSyncFailed"))
            .collect::<Vec<_>>()
    };
    eventually(5, "ten Events", || async { events().await.len() == 10 })
        .await
        .unwrap();
    let e = &events().await[0];
    assert_eq!(e.type_.as_deref(), Some("Warning"));
    let text = e.message.clone().unwrap_or_default();
    assert!(
        text.contains(WIDGETS) && text.contains("apps/w0") && text.contains("(update)"),
        "{text}"
    );
    // a newer change of a failed object: tried again, failed again within the minute: no Event
    widgets(&a, APPS)
        .patch(
            "w000",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"v": 2}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(m.kind(WIDGETS).unwrap().failed.len(), 12);
    assert_eq!(events().await.len(), 10);
    assert!(
        m.kind(WIDGETS)
            .unwrap()
            .errors
            .get("update")
            .copied()
            .unwrap_or(0)
            >= 13
    );
    m.stop().await;
}
