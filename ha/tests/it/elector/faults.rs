//! The elector's Lease rules under faults (HA.md "The elector"), on two testservers (three with a witness),
//! paused time, with the cross-cluster overlap checker. Each rule whose breaking the checker can see is also
//! run with the rule broken (`Flaws`), and the test shows the breakage caught.

use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::Api;
use kube_shard::rt::Clock;
use kube_shard_ha::faults::{self, Faults};
use kube_shard_ha::overlap::HaOverlap;
use kube_shard_ha::{HaMode, Timings};
use kube_shard_testserver::{Scope, TestServer, Verb};
use serde_json::json;
use tokio::time::Instant;

use crate::elector::{no_overlap, server, start, start_with, until, Op, NS};

const LEASE: &str = "widgets-ha";

fn leases(s: &TestServer) -> Api<Lease> {
    Api::namespaced(s.client("admin"), NS)
}

async fn holder(s: &TestServer) -> Option<String> {
    let l = leases(s).get_opt(LEASE).await.unwrap()?;
    l.spec.and_then(|s| s.holder_identity)
}

/// Someone else's merge patch of cluster `s`'s HA Lease.
async fn patch_lease(s: &TestServer, patch: serde_json::Value) {
    leases(s)
        .patch(LEASE, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// A and B without a witness, A Active.
async fn pair(o: &HaOverlap) -> (TestServer, TestServer, Op, Op) {
    let (sa, sb) = (server().await, server().await);
    let a = start("a", 1, HaMode::Active, &sa, &sb, None, o);
    let b = start("b", 2, HaMode::Standby, &sb, &sa, None, o);
    until(Duration::from_secs(30), "A active", || a.handle.is_active()).await;
    (sa, sb, a, b)
}

/// Samples `cond` every 100 ms for `span`; the first sample where it fails is returned.
async fn always(span: Duration, mut cond: impl FnMut() -> bool) -> Result<(), Duration> {
    let t = Instant::now();
    while t.elapsed() < span {
        if !cond() {
            return Err(t.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn force_until_armed(op: &Op) -> kube_shard_ha::FailoverEpoch {
    for _ in 0..60 {
        if let Ok(e) = op.control.force_promote().await {
            return e;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("never armed within 60 s");
}

/// Conflict, first half: someone else's write to the Active's own Lease that keeps the record (a label added
/// by kubectl) makes the next renewal conflict; the re-read still names this cluster at this epoch, so the
/// Active retries with the new resourceVersion and never stops admitting.
#[tokio::test(start_paused = true)]
async fn ha_a_renewal_conflict_that_keeps_the_record_is_retried_without_a_pause() {
    let o = HaOverlap::default();
    let (sa, _sb, a, b) = pair(&o).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before = leases(&sa).get(LEASE).await.unwrap();
    patch_lease(
        &sa,
        json!({"metadata": {"labels": {"touched-by": "kubectl"}}}),
    )
    .await;
    let n = a.admitted.load(Ordering::SeqCst);
    always(Duration::from_secs(30), || a.handle.is_active())
        .await
        .unwrap_or_else(|at| panic!("A stopped admitting {at:?} after the foreign write"));
    assert!(a.admitted.load(Ordering::SeqCst) > n + 50);
    let after = leases(&sa).get(LEASE).await.unwrap();
    let renewed = |l: &Lease| l.spec.as_ref().unwrap().renew_time.clone().unwrap().0;
    assert!(
        renewed(&after) > renewed(&before),
        "A did not renew after the conflict"
    );
    assert_eq!(holder(&sa).await.as_deref(), Some("a/1001"));
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0);
    no_overlap(&o);
    a.stop();
    b.stop();
}

/// Conflict, second half: a conflict whose re-read names another record (here a third cluster at a higher
/// epoch) steps the Active down at once, and it never writes over that record.
#[tokio::test(start_paused = true)]
async fn ha_a_renewal_conflict_naming_another_record_steps_the_active_down_at_once() {
    let o = HaOverlap::default();
    let (sa, _sb, a, b) = pair(&o).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    patch_lease(
        &sa,
        json!({"spec": {"holderIdentity": "c/3003", "leaseTransitions": 3003}}),
    )
    .await;
    // the next renewal (every retry period, 2 s) conflicts; the re-read shows c/3003
    let took = until(Duration::from_secs(5), "A stepped down", || {
        !a.handle.is_active()
    })
    .await;
    eprintln!("[ha] foreign record → A stepped down after {took:?}");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(!a.handle.is_active() && !b.handle.is_active());
    assert_eq!(holder(&sa).await.as_deref(), Some("c/3003"));
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0);
    no_overlap(&o);
    a.stop();
    b.stop();
}

/// Missing Lease: a deleted Lease is *unknown*, not free. Its holder stops counting it at the 404 (so the
/// Active stops admitting), and it is created again only after it has been seen missing for `lease_duration +
/// grace` (15 s + 2 s). With the rule broken (create at once) the Lease is back within a retry period.
async fn deleted_lease(flaws: Faults) -> Duration {
    let o = HaOverlap::default();
    let (sa, sb) = (server().await, server().await);
    let t = Timings::default();
    let a = start_with(
        "a",
        1,
        HaMode::Active,
        [&sa, &sb],
        None,
        &o,
        (t, flaws.clone()),
        Clock::system(),
    );
    let b = start("b", 2, HaMode::Standby, &sb, &sa, None, &o);
    until(Duration::from_secs(30), "A active", || a.handle.is_active()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    leases(&sa)
        .delete(LEASE, &DeleteParams::default())
        .await
        .unwrap();
    let deleted = Instant::now();
    if flaws.is_empty() {
        until(Duration::from_secs(5), "A inactive", || {
            !a.handle.is_active()
        })
        .await;
    }
    let mut back = None;
    while deleted.elapsed() < Duration::from_secs(60) {
        if back.is_none() && holder(&sa).await.is_some() {
            back = Some(deleted.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    no_overlap(&o);
    a.stop();
    b.stop();
    back.expect("the Lease was never created again")
}

#[tokio::test(start_paused = true)]
async fn ha_a_deleted_lease_stops_the_active_and_is_created_again_only_after_the_full_wait() {
    let back = deleted_lease(Faults::none()).await;
    eprintln!("[ha] deleted Lease created again after {back:?}");
    assert!(back >= Duration::from_secs(17), "{back:?}");
}

#[tokio::test(start_paused = true)]
async fn ha_the_deleted_lease_check_finds_an_elector_that_creates_it_at_once() {
    let flaws = Faults::none().with(faults::CREATE_MISSING_AT_ONCE);
    let back = deleted_lease(flaws).await;
    assert!(back < Duration::from_secs(17), "{back:?}");
}

/// An undecodable Lease means "a higher epoch may exist": stop admitting, raise the alarm, and never
/// overwrite it (a human or a newer version of the operator decides).
#[tokio::test(start_paused = true)]
async fn ha_an_undecodable_lease_stops_the_active_with_an_alarm_and_is_never_overwritten() {
    let o = HaOverlap::default();
    let (sa, _sb, a, b) = pair(&o).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    patch_lease(
        &sa,
        json!({"spec": {"holderIdentity": "written by a future version"}}),
    )
    .await;
    until(Duration::from_secs(5), "A inactive", || {
        !a.handle.is_active()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let st = a.control.status().await.unwrap();
    let alarm = st.alarm.clone().unwrap_or_default();
    assert!(alarm.contains("ndecodable"), "{st:?}");
    assert_eq!(
        holder(&sa).await.as_deref(),
        Some("written by a future version"),
        "the undecodable Lease was overwritten"
    );
    assert!(!a.handle.is_active() && !b.handle.is_active());
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0);
    no_overlap(&o);
    a.stop();
    b.stop();
}

/// Two forced promotions, each over a stopped Active: the epoch rises each time (2 then 3), the
/// returning side steps down by itself, and no two epochs' intervals overlap.
#[tokio::test(start_paused = true)]
async fn ha_two_forced_promotions_raise_the_epoch_each_time_without_overlap() {
    let o = HaOverlap::default();
    let (sa, sb, a, b) = pair(&o).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.stop();
    assert_eq!(force_until_armed(&b).await.n(), 2);
    until(Duration::from_secs(30), "B active", || b.handle.is_active()).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let a2 = start("a", 1, HaMode::Active, &sa, &sb, None, &o);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(a2.admitted.load(Ordering::SeqCst), 0);
    b.stop();
    assert_eq!(force_until_armed(&a2).await.n(), 3);
    until(Duration::from_secs(30), "A active again", || {
        a2.handle.is_active()
    })
    .await;
    let b2 = start("b", 2, HaMode::Active, &sb, &sa, None, &o);
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(b2.admitted.load(Ordering::SeqCst), 0);
    assert_eq!(holder(&sa).await.as_deref(), Some("a/3001"));
    let tags: Vec<_> = o.intervals().keys().cloned().collect();
    assert_eq!(
        tags,
        vec![
            ("a".to_string(), 1001),
            ("a".to_string(), 3001),
            ("b".to_string(), 2002)
        ]
    );
    no_overlap(&o);
    a2.stop();
    b2.stop();
}

/// An Active already running keeps running when the peer becomes unreachable; a process that starts
/// while the peer is unreachable is Standby with an alarm and admits nothing until it has read the peer's
/// Lease and found no higher epoch.
#[tokio::test(start_paused = true)]
async fn ha_a_restart_with_the_peer_unreachable_waits_for_the_peer_before_acting() {
    let o = HaOverlap::default();
    let (sa, sb, a, b) = pair(&o).await;
    sb.faults().partition(Scope::identity("a-op"), true);
    always(Duration::from_secs(30), || a.handle.is_active())
        .await
        .unwrap_or_else(|at| panic!("the running Active stopped {at:?} after losing the peer"));
    a.stop();
    let a2 = start("a", 1, HaMode::Active, &sa, &sb, None, &o);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let st = a2.control.status().await.unwrap();
    assert_eq!(st.role, "standby", "{st:?}");
    assert!(st.alarm.is_some(), "no alarm: {st:?}");
    assert_eq!(a2.admitted.load(Ordering::SeqCst), 0);
    sb.faults().partition(Scope::identity("a-op"), false);
    let took = until(
        Duration::from_secs(60),
        "A active after the peer is read",
        || a2.handle.is_active(),
    )
    .await;
    eprintln!("[ha] restarted behind a partition: active {took:?} after healing");
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0);
    no_overlap(&o);
    a2.stop();
    b.stop();
}

/// Published timings: the two sides run different timings. B's own `lease_duration` (6 s) is shorter than A's
/// published `renew_deadline + request timeout` (12.5 s), so a taker that waits only its own lease takes the
/// witness while A still holds its term.
async fn mismatched(flaws: Faults) -> HaOverlap {
    let o = HaOverlap::default();
    let (sa, sb, sw) = (server().await, server().await, server().await);
    let s = Duration::from_secs;
    let short = Timings::new(s(6), s(3), s(1), s(1), s(1));
    let a = start("a", 1, HaMode::Active, &sa, &sb, Some(&sw), &o);
    let b = start_with(
        "b",
        2,
        HaMode::Standby,
        [&sb, &sa],
        Some(&sw),
        &o,
        (short, flaws),
        Clock::system(),
    );
    until(Duration::from_secs(30), "A active", || a.handle.is_active()).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // A's site loses its WAN link: it keeps its own apiserver, not B's nor the witness
    sb.faults().partition(Scope::identity("a-op"), true);
    sw.faults().partition(Scope::identity("a-op"), true);
    until(Duration::from_secs(60), "B active", || b.handle.is_active()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.stop();
    b.stop();
    o
}

#[tokio::test(start_paused = true)]
async fn ha_mismatched_timings_the_taker_waits_the_holders_published_deadline() {
    let o = mismatched(Faults::none()).await;
    no_overlap(&o);
}

#[tokio::test(start_paused = true)]
async fn ha_the_overlap_checker_finds_a_taker_that_ignores_published_timings() {
    let flaws = Faults::none().with(faults::IGNORE_PUBLISHED_TIMINGS);
    let o = mismatched(flaws).await;
    assert!(
        !o.violations().is_empty(),
        "no overlap found: {:?}",
        o.intervals()
    );
}

/// A forced promotion that crashes between its two epoch writes (the own Lease written, the peer's not:
/// the peer's apiserver was unreachable). The own Lease is the durable record: restarted, B resumes at its
/// epoch once it reads the peer, writes the peer's Lease, and the returning A stands by.
#[tokio::test(start_paused = true)]
async fn ha_a_crash_between_the_epoch_writes_resumes_on_the_own_lease() {
    let o = HaOverlap::default();
    let (sa, sb, a, b) = pair(&o).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.stop();
    sa.faults().partition(Scope::identity("b-op"), true);
    assert_eq!(force_until_armed(&b).await.n(), 2);
    until(Duration::from_secs(30), "B active", || b.handle.is_active()).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    b.stop(); // the crash: only B's own Lease holds the new epoch
    assert_eq!(holder(&sb).await.as_deref(), Some("b/2002"));
    assert_eq!(holder(&sa).await.as_deref(), Some("a/1001"));
    sa.faults().partition(Scope::identity("b-op"), false);
    let a2 = start("a", 1, HaMode::Active, &sa, &sb, None, &o);
    let b2 = start("b", 2, HaMode::Standby, &sb, &sa, None, &o);
    until(Duration::from_secs(30), "B resumed", || {
        b2.handle.is_active()
    })
    .await;
    let t = Instant::now();
    while holder(&sa).await.as_deref() != Some("b/2002") {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "A's Lease never names B"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(a2.admitted.load(Ordering::SeqCst), 0);
    assert!(b2.handle.is_active() && !a2.handle.is_active());
    no_overlap(&o);
    a2.stop();
    b2.stop();
}

/// Found on the real server (e2e `ha_real_a_stopped_etcd_commits_late_without_two_actives`): the old
/// Active's renewal, stalled in its apiserver, commits after a forced promotion. The new Active's next write
/// of that Lease then conflicts and the re-read names the *lower* epoch: a deposed writer's late write, not a
/// reason to step down (it used to: both sides ended Standby, and a human had to force again). The new
/// Active keeps its term on its own Lease and takes the slot back after the full wait.
#[tokio::test(start_paused = true)]
async fn ha_a_late_commit_of_the_old_actives_renewal_does_not_depose_the_new_active() {
    let o = HaOverlap::default();
    let (sa, _sb, a, b) = pair(&o).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    // A's renewals stall in its apiserver and commit 25 s later; B cannot reach A's apiserver
    sa.faults().late_commit(
        Scope::identity("a-op").verb(Verb::Update),
        Duration::from_secs(25),
    );
    sa.faults().partition(Scope::identity("b-op"), true);
    let outage = Instant::now();
    until(Duration::from_secs(11), "A inactive", || {
        !a.handle.is_active()
    })
    .await;
    assert_eq!(force_until_armed(&b).await.n(), 2);
    until(Duration::from_secs(30), "B active", || b.handle.is_active()).await;
    // A's first stalled renewal has committed (25 s), then B reaches A's apiserver again
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(outage.elapsed())).await;
    assert_eq!(holder(&sa).await.as_deref(), Some("a/1001"));
    sa.faults().partition(Scope::identity("b-op"), false);
    always(Duration::from_secs(40), || b.handle.is_active())
        .await
        .unwrap_or_else(|at| panic!("B stepped down {at:?} after reaching A's apiserver again"));
    assert_eq!(holder(&sa).await.as_deref(), Some("b/2002"));
    assert!(!a.handle.is_active());
    no_overlap(&o);
    a.stop();
    b.stop();
}
