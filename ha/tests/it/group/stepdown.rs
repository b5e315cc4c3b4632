//! HA in a shard group (HA.md "HA in a shard group"): a member's delayed HA view, and a step-down and
//! re-promotion under a long reconcile. Two testservers, paused time, the cross-cluster overlap checker
//! (`kube_shard_ha::overlap`) fed by every member's worker (`ha_group::work`); each run is repeated
//! with a planted flaw the checker (or an assertion on the object) must catch.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use kube_shard::fence_policy::FencePolicyConfig;
use kube_shard::ownership::fenced_write::FencedApi;
use kube_shard::ownership::FenceError;
use kube_shard_ha::faults::{self, Faults};
use kube_shard_ha::overlap::{HaOverlap, Violation};
use kube_shard_ha::HaMode;
use kube_shard_testserver::{Scope, TestServer, Verb};
use tokio::time::Instant;

use crate::elector::until;
use crate::group::{
    force_promote, ha_builder, is_admitting, side, two_active_members_and_a_standby, two_servers,
    Side, Worker,
};

/// The HA renew deadline (default timings: 15 s lease, 10 s renew deadline, 2 s retry, 2.5 s request
/// timeout, 2 s grace).
const HA_RENEW: Duration = Duration::from_secs(10);

fn overlaps(o: &HaOverlap) -> bool {
    o.violations()
        .iter()
        .any(|v| matches!(v, Violation::Overlap { .. }))
}

fn cut(servers: [&TestServer; 2], who: &str, on: bool) {
    for s in servers {
        s.faults().partition(Scope::identity(who), on);
    }
}

/// Until B's elector has read A's record in both Leases (and is no longer armed by their absence).
async fn b_has_read_a(b: &Side) {
    let control = &b.ha.control;
    for _ in 0..100 {
        let st = control.status().await.unwrap();
        if !st.armed
            && st
                .leases
                .iter()
                .all(|l| l.holder.as_deref() == Some("a/1001"))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("B never read A's Leases");
}

// ---------------------------------------------------------------------------------------------------------
// 1. A member's delayed HA view
// ---------------------------------------------------------------------------------------------------------

struct Delayed {
    o: HaOverlap,
    /// When a2's renewals stalled (and a1 was cut off).
    stall: Instant,
    /// How long after the stall a2 stopped admitting (`None`: still admitting when B was promoted).
    a2_stopped: Option<Duration>,
}

/// Cluster A is a group of two (`a1`, `a2`), B one Standby (`b1`). Then `a2`'s view of the HA term is
/// delayed: every read of the HA Leases (its own cluster's and the peer's) takes 1 s, and every renewal
/// 5 s, beyond the 2.5 s request timeout, so none lands; at the same time `a1`'s elector is cut from both
/// apiservers. Nobody renews A's Lease any more, though `a2` keeps reading it (still naming A at 1001).
/// A human promotes B as soon as it is armed. `a2`'s elector runs with `flaws`.
async fn delayed_member_view(flaws: Faults) -> Delayed {
    let (sa, sb) = two_servers().await;
    let o = HaOverlap::default();
    let a1 = side(
        ha_builder("a1", "a", 1, HaMode::Active, &sa, &sb),
        "a1",
        "a",
        &o,
        Worker::Honest,
    );
    let a2 = side(
        ha_builder("a2", "a", 1, HaMode::Active, &sa, &sb).ha_faults(flaws),
        "a2",
        "a",
        &o,
        Worker::Honest,
    );
    let b = side(
        ha_builder("b1", "b", 2, HaMode::Standby, &sb, &sa),
        "b1",
        "b",
        &o,
        Worker::Honest,
    );
    until(Duration::from_secs(40), "both A members admitting", || {
        is_admitting(&a1.ownership()) && is_admitting(&a2.ownership())
    })
    .await;
    b_has_read_a(&b).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    for s in [&sa, &sb] {
        let f = s.faults();
        f.latency(
            Scope::identity("a2-ha").verb(Verb::Get),
            Some(Duration::from_secs(1)),
        );
        f.latency(
            Scope::identity("a2-ha").verb(Verb::Update),
            Some(Duration::from_secs(5)),
        );
    }
    cut([&sa, &sb], "a1-ha", true);
    let stall = Instant::now();
    let mut a2_stopped = None;
    let promote = force_promote(&b);
    tokio::pin!(promote);
    loop {
        tokio::select! {
            _ = &mut promote => break,
            () = tokio::time::sleep(Duration::from_millis(50)) => {
                if a2_stopped.is_none() && !is_admitting(&a2.ownership()) {
                    a2_stopped = Some(stall.elapsed());
                }
            }
        }
    }
    until(Duration::from_secs(40), "B admitting", || {
        o.intervals().contains_key(&("b".to_string(), 2002))
    })
    .await;
    // a2's delayed reads reach B's record in A's Lease: it stands by
    until(Duration::from_secs(20), "a2 standing by", || {
        !is_admitting(&a2.ownership())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(a2.ha.control.status().await.unwrap().role, "standby");
    for s in [&a1, &a2, &b] {
        s.kill();
    }
    Delayed {
        o,
        stall,
        a2_stopped,
    }
}

/// HA.md "HA in a shard group": each member dates the term from its own requests. The Lease still names A
/// at 1001 (nobody overwrote it), but `a2`'s own renewals stopped landing at the stall: it stops admitting
/// (and its fences end) within the renew deadline of its last renewal's start, so before B is armed, and
/// the checker finds no two clusters acting at once.
#[tokio::test(start_paused = true)]
async fn ha_group_a_members_delayed_ha_view_stops_it_within_the_renew_deadline() {
    let d = delayed_member_view(Faults::none()).await;
    let stopped = d
        .a2_stopped
        .expect("a2 stopped admitting before B was promoted");
    eprintln!("[ha-group-t8] a2's renewals stalled → a2 stopped admitting after {stopped:?}");
    assert!(stopped <= HA_RENEW, "{stopped:?}");
    let i = d.o.intervals();
    // the last request under (a, 1001), any member's, completed within the renew deadline of the stall
    let a_end = i[&("a".to_string(), 1001)].end;
    assert!(a_end.duration_since(d.stall) <= HA_RENEW, "{i:?}");
    let b_start = i[&("b".to_string(), 2002)].start;
    eprintln!(
        "[ha-group-t8] A's last request → B's first admission: {:?}",
        b_start.duration_since(a_end)
    );
    assert_eq!(d.o.violations(), vec![], "{i:?}");
}

/// PLANTED (`Flaws::hold_from_reads`): `a2` counts each read that shows A's record at its epoch as a
/// renewal dated at the read's receipt — the term trusted from someone else's (here: `a1`'s last) renewal.
/// It keeps admitting past the renew deadline, still admits when B is promoted, and the checker finds the
/// overlap.
#[tokio::test(start_paused = true)]
async fn ha_group_the_overlap_checker_finds_a_member_dating_its_term_from_reads() {
    let flaws = Faults::none().with(faults::HOLD_FROM_READS);
    let d = delayed_member_view(flaws).await;
    assert_eq!(d.a2_stopped, None, "the flawed member kept admitting");
    eprintln!("[ha-group-t8] planted: {:?}", d.o.violations());
    assert!(
        overlaps(&d.o),
        "the planted overlap was not found: {:?}",
        d.o.intervals()
    );
}

// ---------------------------------------------------------------------------------------------------------
// 2. A step-down and a re-promotion under a long reconcile
// ---------------------------------------------------------------------------------------------------------

const APP_NS: &str = "apps";
const FENCE: &str = "kube-shard.io/fence";

/// How the long reconcile sends its late write, and what the server enforces.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Late {
    /// Through `FencedApi` (the fence re-checked at send time), fence policy installed.
    Fenced,
    /// Its fence checked once before the I/O, not at send time; the fence policy installed.
    UncheckedWithPolicy,
    /// PLANTED: not re-checked, and no fence policy on the cluster.
    UncheckedNoPolicy,
}

struct LongRun {
    o: HaOverlap,
    /// The late write's result (`Ok`: it landed).
    late: Result<(), String>,
    /// The object's fence token after everything.
    stored: String,
    /// Re-enqueue signals of the object's shard seen after the re-promotion began.
    reenqueued: usize,
    /// The failover epoch of the reconcile after the re-promotion.
    again: u64,
}

fn token_of(cm: &ConfigMap) -> String {
    cm.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(FENCE))
        .cloned()
        .unwrap_or_default()
}

fn failover_of(token: &str) -> u64 {
    token.split(':').next().unwrap().parse().unwrap()
}

async fn create_object(sa: &TestServer) -> ConfigMap {
    let admin = sa.client("admin");
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(APP_NS.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(admin, APP_NS)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("obj".into()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([("state".into(), "new".into())])),
                ..ConfigMap::default()
            },
        )
        .await
        .unwrap()
}

/// Cluster A (two members) is Active at 1001; the member owning `apps/obj` admits a reconcile of it and
/// writes once (fenced, 1001). Its I/O then runs long while: A is cut off and B is promoted by force
/// (2002); A comes back and stands by; B is cut off and A is promoted by force again (3001); promotion
/// re-enqueues the object's shard and its reconcile under 3001 writes (fenced). Only then does the long
/// reconcile send its late write, from a fresh read, as `late` says.
async fn long_reconcile_across_re_promotion(late: Late) -> LongRun {
    let (sa, sb) = two_servers().await;
    if late != Late::UncheckedNoPolicy {
        let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
            .generate()
            .unwrap();
        crate::harness::post_policies(&sa, &set).await;
    }
    let o = HaOverlap::default();
    let (a, b) = two_active_members_and_a_standby(&sa, &sb, &o).await;
    // B has read A's Leases (a promotion before that would be armed on the bootstrap's missing Leases)
    b_has_read_a(&b).await;
    let cm = create_object(&sa).await;
    let owner: &Side = a
        .iter()
        .find(|s| s.ownership().admit(&cm).is_ok())
        .expect("a member of A owns the object's shard");
    let own = owner.ownership();
    let shard = own.shard_of(&cm).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(sa.client(&owner.member.name), APP_NS);
    let fenced = FencedApi::new(api.clone());

    // the long reconcile: admitted under 1001, one fenced write, then long I/O
    let permit = own.admit(&cm).unwrap();
    assert_eq!(permit.failover_epoch().map(|e| e.wire()), Some(1001));
    let fence = permit.fence().unwrap();
    let mut first = api.get("obj").await.unwrap();
    first.data = Some(BTreeMap::from([("state".into(), "seen-under-1001".into())]));
    {
        let _w = o.admit("a", 1001);
        fenced.replace(&fence, &first).await.unwrap();
    }

    let io_start = Instant::now();
    // A loses its term; B is promoted (2002)
    for s in &a {
        cut([&sa, &sb], &format!("{}-ha", s.member.name), true);
    }
    force_promote(&b).await;
    until(Duration::from_secs(40), "B admitting", || {
        o.intervals().contains_key(&("b".to_string(), 2002))
    })
    .await;
    // A returns and reads B's epoch: it stands by
    for s in &a {
        cut([&sa, &sb], &format!("{}-ha", s.member.name), false);
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    for s in &a {
        assert!(!is_admitting(&s.ownership()), "A admitted under B's term");
    }
    // B is cut off; A is promoted again (3001)
    let mut transitions = own.transitions();
    cut([&sa, &sb], "b1-ha", true);
    let control = &a[0].ha.control;
    let mut promoted = false;
    for _ in 0..60 {
        if control.force_promote().await.is_ok() {
            promoted = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(promoted, "A never armed");
    until(
        Duration::from_secs(40),
        "the object's owner admitting at 3001",
        || {
            own.admit(&cm)
                .is_ok_and(|p| p.failover_epoch().is_some_and(|e| e.wire() == 3001))
        },
    )
    .await;
    // promotion re-enqueued the object's shard: its reconcile runs again, under 3001
    let mut reenqueued = 0;
    while let Some(t) = transitions.try_next_transition() {
        if t.shard == shard && t.is_reenqueue() {
            reenqueued += 1;
        }
    }
    let p = own.admit(&cm).unwrap();
    let again = p.failover_epoch().unwrap().wire();
    let f = p.fence().unwrap();
    let mut cur = api.get("obj").await.unwrap();
    cur.data = Some(BTreeMap::from([("state".into(), "seen-under-3001".into())]));
    {
        let _w = o.admit("a", again);
        fenced.replace(&f, &cur).await.unwrap();
    }

    // the long reconcile's late write, from a fresh read (the preconditions pass)
    eprintln!(
        "[ha-group-t8] the long reconcile's I/O under 1001 took {:?} ({late:?})",
        io_start.elapsed()
    );
    let mut stale = api.get("obj").await.unwrap();
    stale.data = Some(BTreeMap::from([("state".into(), "stale-from-1001".into())]));
    let late_result = match late {
        Late::Fenced => {
            // its permit and fence name 1001: neither gives a fence under 3001
            assert!(
                matches!(permit.fence(), Err(FenceError::TermEnded { .. })),
                "{:?}",
                permit.fence().map(|f| f.token().to_string())
            );
            assert!(matches!(fence.check(), Err(FenceError::TermEnded { .. })));
            fenced
                .replace(&fence, &stale)
                .await
                .map(drop)
                .map_err(|e| format!("{e:?}"))
        }
        Late::UncheckedWithPolicy | Late::UncheckedNoPolicy => {
            stale
                .metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert(FENCE.into(), fence.token().to_string());
            let r = api.replace("obj", &PostParams::default(), &stale).await;
            if r.is_ok() {
                // it landed: a request under (a, 1001), completed now
                drop(o.admit("a", 1001));
            }
            r.map(drop).map_err(|e| format!("{e:?}"))
        }
    };
    let stored = token_of(&api.get("obj").await.unwrap());
    for s in a.iter().chain([&b]) {
        s.kill();
    }
    LongRun {
        o,
        late: late_result,
        stored,
        reenqueued,
        again,
    }
}

fn assert_refused_and_reconciled_again(r: &LongRun) {
    assert!(r.late.is_err(), "the late write landed");
    assert_eq!(r.again, 3001, "the reconcile after re-promotion");
    assert!(r.reenqueued >= 1, "the object's shard was not re-enqueued");
    assert_eq!(failover_of(&r.stored), 3001, "{}", r.stored);
    assert_eq!(r.o.violations(), vec![], "{:?}", r.o.intervals());
    // no request under 1001 completed after 2002 began
    let i = r.o.intervals();
    assert!(i[&("a".to_string(), 1001)].end < i[&("b".to_string(), 2002)].start);
    assert!(i[&("b".to_string(), 2002)].end < i[&("a".to_string(), 3001)].start);
}

/// The long reconcile's permit and fence record 1001: after the re-promotion neither issues nor passes a
/// fence (the term at 1001 is over, though the same cluster leads again, at the same shard epoch), so
/// `FencedApi` sends nothing. Promotion re-enqueued the shard and the object was reconciled under 3001.
#[tokio::test(start_paused = true)]
async fn ha_group_a_long_reconcile_across_step_down_and_re_promotion_cannot_write_late() {
    let r = long_reconcile_across_re_promotion(Late::Fenced).await;
    assert!(
        r.late.as_ref().unwrap_err().contains("TermEnded"),
        "{r:?}",
        r = r.late
    );
    assert_refused_and_reconciled_again(&r);
}

/// The same late write sent without the send-time check: the server's fence policy compares failover
/// epochs first and refuses 1001 over the stored 3001.
#[tokio::test(start_paused = true)]
async fn ha_group_the_fence_policy_refuses_a_late_write_of_an_earlier_term() {
    let r = long_reconcile_across_re_promotion(Late::UncheckedWithPolicy).await;
    let err = r.late.as_ref().unwrap_err();
    assert!(
        err.contains("422") && err.contains("ValidatingAdmissionPolicy"),
        "{err}"
    );
    assert_refused_and_reconciled_again(&r);
}

/// PLANTED: no send-time check and no fence policy: the late write lands, stamped 1001 over 3001. The
/// object's token goes back to an earlier term, and the checker finds (a, 1001) spanning B's term and A's
/// next one.
#[tokio::test(start_paused = true)]
async fn ha_group_the_checker_finds_a_late_write_of_an_earlier_term() {
    let r = long_reconcile_across_re_promotion(Late::UncheckedNoPolicy).await;
    assert!(r.late.is_ok(), "{:?}", r.late);
    eprintln!(
        "[ha-group-t8] planted late write: stored {}, {:?}",
        r.stored,
        r.o.violations()
    );
    assert_eq!(failover_of(&r.stored), 1001, "{}", r.stored);
    let v = r.o.violations();
    assert!(overlaps(&r.o), "{v:?}");
    assert!(
        v.iter().any(|v| matches!(v, Violation::Overlap { a, b }
            if *a == ("a".to_string(), 1001) && *b == ("a".to_string(), 3001))),
        "{v:?}"
    );
}
