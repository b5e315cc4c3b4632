//! Tests of the handle: fences on both clocks with paused time, self-fencing, drains, re-enqueue signals,
//! admission against a concurrent drain, the reconcile wrapper and fenced writes against a mock client.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{api::ObjectMeta, runtime::controller::Action};

use crate::ownership::{
    inflight::Gate, state::*, AdmitError, FenceError, Ownership, OwnershipConfig,
};
use crate::rt::Clock;
use crate::testing::{self, TestDriver};

fn me() -> MemberId {
    MemberId::new("a", "1")
}
fn other() -> MemberId {
    MemberId::new("b", "1")
}

/// A boot clock the test moves by hand (milliseconds).
fn manual_clock() -> (Clock, Arc<AtomicU64>) {
    let ms = Arc::new(AtomicU64::new(1_000_000));
    let m = ms.clone();
    (
        Clock::with_boot(move || Duration::from_millis(m.load(Ordering::SeqCst))),
        ms,
    )
}

fn config() -> OwnershipConfig {
    OwnershipConfig {
        renew_deadline: Duration::from_secs(10),
        fence_margin: Duration::from_secs(1),
        drain_timeout: Duration::from_secs(5),
        ..OwnershipConfig::default()
    }
}

/// A member owning shard 0 at epoch 1, renewed now.
fn owning() -> (Ownership, TestDriver, Arc<AtomicU64>) {
    owning_with(config(), me())
}

/// `who` owning shard 0 at epoch 1 under `config`, renewed now.
fn owning_with(config: OwnershipConfig, who: MemberId) -> (Ownership, TestDriver, Arc<AtomicU64>) {
    let (clock, boot) = manual_clock();
    let (own, drv) = testing::driver_with_clock(config, who.clone(), clock);
    drv.renew();
    drv.apply(&AssignmentView::new(1).with(0, ShardAssignment::owned(who, 1)));
    drv.activate(0, 1);
    (own, drv, boot)
}

/// A fence lasts `renew − margin` = 1.8 s, longer than the 1 s drain.
fn fence_outlives_drain() -> OwnershipConfig {
    OwnershipConfig {
        renew_deadline: Duration::from_secs(2),
        fence_margin: Duration::from_millis(200),
        drain_timeout: Duration::from_secs(1),
        ..OwnershipConfig::default()
    }
}

fn draining_view(generation: u64) -> AssignmentView {
    AssignmentView::new(generation).with(
        0,
        ShardAssignment::owned(me(), 1).with_handoff(Handoff::Draining { id: 9, to: other() }),
    )
}

#[tokio::test(start_paused = true)]
async fn fence_lasts_until_renewal_start_plus_deadline_minus_margin() {
    let (own, _drv, _) = owning();
    let permit = own.admit_shard(0).unwrap();
    let fence = permit.fence().unwrap();
    assert_eq!(fence.token().to_string(), "0:0/1");
    assert_eq!(fence.check().unwrap(), Duration::from_secs(9));
    tokio::time::advance(Duration::from_millis(8_999)).await;
    assert_eq!(fence.check().unwrap(), Duration::from_millis(1));
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(
        fence.check(),
        Err(FenceError::Expired { shard: 0, epoch: 1 })
    );
    assert!(matches!(permit.fence(), Err(FenceError::Expired { .. })));
}

#[tokio::test(start_paused = true)]
async fn a_suspend_seen_only_by_the_boot_clock_expires_fences() {
    let (own, _drv, boot) = owning();
    let permit = own.admit_shard(0).unwrap();
    let fence = permit.fence().unwrap();
    boot.fetch_add(9_000, Ordering::SeqCst); // suspended 9 s; the runtime clock saw nothing
    assert!(fence.check().is_err());
    assert!(permit.fence().is_err());
    assert!(matches!(
        own.admit_shard(0),
        Err(AdmitError::SelfFenced { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn self_fencing_and_unfencing_with_reenqueue() {
    let (own, drv, _) = owning();
    let mut tr = own.transitions();
    tokio::time::advance(Duration::from_secs(9)).await;
    assert!(own.is_self_fenced());
    assert!(matches!(
        own.admit_shard(0),
        Err(AdmitError::SelfFenced { shard: 0 })
    ));
    assert!(crate::testing::member_state(&own).is_fenced());
    // a renewal that started now un-fences and re-enqueues the owned shard
    drv.renew();
    assert!(!own.is_self_fenced());
    let t = tr.next_transition().await.unwrap();
    assert_eq!((t.shard, t.admitted), (0, Some(AdmitCause::Unfenced)));
    assert!(own.admit_shard(0).is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_late_renewal_unfences_even_if_nobody_tried_to_admit() {
    let (own, drv, _) = owning();
    let mut tr = own.transitions();
    tokio::time::advance(Duration::from_secs(30)).await;
    drv.renew();
    let t = tr.next_transition().await.unwrap();
    assert_eq!(t.admitted, Some(AdmitCause::Unfenced));
}

#[tokio::test(start_paused = true)]
async fn a_renewal_whose_request_started_long_ago_does_not_extend() {
    let (own, drv, _) = owning();
    let started = own.inner.clock.now();
    tokio::time::advance(Duration::from_secs(9)).await;
    drv.renew_at(started); // the request took 9 s
    assert!(own.admit_shard(0).is_err());
}

#[tokio::test(start_paused = true)]
async fn takeover_fences_at_once() {
    let (own, drv, _) = owning();
    let permit = own.admit_shard(0).unwrap();
    let fence = permit.fence().unwrap();
    drv.taken_over();
    assert!(matches!(fence.check(), Err(FenceError::SelfFenced { .. })));
    assert!(own.admit_shard(0).is_err());
}

#[tokio::test(start_paused = true)]
async fn activation_emits_a_reenqueue_and_requeue_states_refuse() {
    let (clock, _) = manual_clock();
    let (own, drv) = testing::driver_with_clock(config(), me(), clock);
    drv.renew();
    let mut tr = own.transitions();
    drv.apply(&AssignmentView::new(1).with(0, ShardAssignment::owned(me(), 1)));
    assert!(matches!(
        own.admit_shard(0),
        Err(AdmitError::NotAdmitted {
            state: ShardState::Activating { epoch: 1 },
            ..
        })
    ));
    assert!(!tr.next_transition().await.unwrap().is_reenqueue());
    drv.activate(0, 1);
    let t = tr.next_transition().await.unwrap();
    assert_eq!(t.admitted, Some(AdmitCause::Activation));
    assert!(matches!(
        own.admit_shard(1),
        Err(AdmitError::NotOwned { shard: 1 })
    ));
}

#[tokio::test(start_paused = true)]
async fn outgoing_fences_end_at_the_drain_deadline_and_cancel_back_reenqueues() {
    let (own, drv, _) = owning();
    let permit = own.admit_shard(0).unwrap();
    let mut tr = own.transitions();
    drv.apply(&draining_view(2));
    assert!(matches!(
        own.admit_shard(0),
        Err(AdmitError::NotAdmitted {
            state: ShardState::Outgoing { .. },
            ..
        })
    ));
    // a fence taken while Outgoing lasts only until the drain deadline (5 s < 9 s)
    let fence = permit.fence().unwrap();
    assert_eq!(fence.check().unwrap(), Duration::from_secs(5));
    let _ = tr.next_transition().await.unwrap(); // Owned -> Outgoing
                                                 // cancel before release
    drv.apply(&AssignmentView::new(3).with(0, ShardAssignment::owned(me(), 1)));
    let t = tr.next_transition().await.unwrap();
    assert_eq!(t.admitted, Some(AdmitCause::CancelBack));
    assert!(own.admit_shard(0).is_ok());
    drop((fence, permit));
    // the old drain task must not release the shard it no longer drains
    tokio::time::advance(Duration::from_secs(6)).await;
    tokio::task::yield_now().await;
    assert_eq!(own.shard_state(0), Some(ShardState::Owned { epoch: 1 }));
}

#[tokio::test(start_paused = true)]
async fn drain_waits_for_permits_and_fences_then_releases() {
    let (own, drv, _) = owning();
    let permit = own.admit_shard(0).unwrap();
    let fence = permit.fence().unwrap();
    drop(permit);
    drv.apply(&draining_view(2));
    tokio::time::advance(Duration::from_secs(1)).await;
    tokio::task::yield_now().await;
    assert!(matches!(
        own.shard_state(0),
        Some(ShardState::Outgoing { .. })
    ));
    drop(fence); // the last outstanding fenced request completes
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert_eq!(own.shard_state(0), None);
    assert_eq!(
        crate::testing::member_state(&own).acks(),
        vec![Ack::Released {
            shard: 0,
            move_id: 9
        }]
    );
}

#[tokio::test(start_paused = true)]
async fn drain_releases_at_the_deadline_and_old_fences_are_dead() {
    let (own, drv, _) = owning();
    let permit = own.admit_shard(0).unwrap();
    drv.apply(&draining_view(2));
    tokio::time::advance(Duration::from_secs(5)).await;
    for _ in 0..5 {
        tokio::task::yield_now().await;
    }
    assert_eq!(own.shard_state(0), None);
    assert!(matches!(permit.fence(), Err(FenceError::NotHeld { .. })));
}

// === drains across holdings: a re-grant or a cancel-back retires the shard's gate ===

/// Renew 2 s, margin 0.2 s, drain 2 s: a fence lasts 1.8 s, within the drain.
fn regrant_config() -> OwnershipConfig {
    OwnershipConfig {
        renew_deadline: Duration::from_secs(2),
        fence_margin: Duration::from_millis(200),
        drain_timeout: Duration::from_secs(2),
        ..OwnershipConfig::default()
    }
}

/// A member owning shard 0 at epoch 10 (generation 10) under [`regrant_config`], renewed now.
fn owning_at_epoch_10() -> (Ownership, TestDriver) {
    let (clock, _) = manual_clock();
    let (own, drv) = testing::driver_with_clock(regrant_config(), me(), clock);
    drv.renew();
    drv.apply(&owned_view(10, 10));
    drv.activate(0, 10);
    (own, drv)
}

/// Shard 0 owned by `me` at `epoch`, Stable, in generation `generation`.
fn owned_view(generation: u64, epoch: u64) -> AssignmentView {
    AssignmentView::new(generation).with(0, ShardAssignment::owned(me(), epoch))
}

/// Shard 0 owned by `me` at `epoch`, Draining under move `id` to `to`, in generation `generation`.
fn draining_to(generation: u64, epoch: u64, id: MoveId, to: &str) -> AssignmentView {
    AssignmentView::new(generation).with(
        0,
        ShardAssignment::owned(me(), epoch).with_handoff(Handoff::Draining {
            id,
            to: MemberId::new(to, "1"),
        }),
    )
}

/// A fenced request admitted under one holding (epoch 10) is still in flight when the shard is re-granted
/// (epoch 20) and moved away again: the second drain must wait for it, although it was admitted under a
/// gate that the re-grant retired.
#[tokio::test(start_paused = true)]
async fn a_drain_waits_for_requests_admitted_under_a_retired_gate() {
    let (own, drv) = owning_at_epoch_10();
    let permit = own.admit_shard(0).unwrap();
    let fence = permit.fence().unwrap(); // stands in for a fenced write in flight
    drop(permit);
    drv.apply(&draining_to(11, 10, 1, "b"));
    drv.apply(&owned_view(20, 20)); // re-granted at epoch 20 while the first drain waits
    drv.apply(&draining_to(21, 20, 2, "c"));
    tokio::time::advance(Duration::from_millis(10)).await;
    settle_tasks().await;
    assert!(
        matches!(
            own.shard_state(0),
            Some(ShardState::Outgoing {
                epoch: 20,
                move_id: 2
            })
        ),
        "released under move 2 while a fence of epoch 10 lives: {:?}",
        own.shard_state(0)
    );
    assert!(
        crate::testing::member_state(&own).acks().is_empty(),
        "no released ack yet"
    );
    drop(fence); // the request admitted under epoch 10 ends
    settle_tasks().await;
    assert_eq!(own.shard_state(0), None);
    assert_eq!(
        crate::testing::member_state(&own).acks(),
        vec![Ack::Released {
            shard: 0,
            move_id: 2
        }]
    );
}

/// With nothing in flight, a retired gate holds nothing back: the second drain releases at once.
#[tokio::test(start_paused = true)]
async fn a_retired_gate_with_nothing_in_flight_does_not_delay_a_drain() {
    let (own, drv) = owning_at_epoch_10();
    drv.apply(&draining_to(11, 10, 1, "b"));
    drv.apply(&owned_view(20, 20));
    drv.apply(&draining_to(21, 20, 2, "c"));
    settle_tasks().await;
    assert_eq!(own.shard_state(0), None);
}

/// A retired gate whose fence never ends on the client (a leaked fence) holds a later drain only until
/// that fence's validity has passed, as a drain of its own gate would.
#[tokio::test(start_paused = true)]
async fn a_drain_waits_for_a_retired_gate_only_until_its_fences_expire() {
    let (own, drv) = owning_at_epoch_10();
    let permit = own.admit_shard(0).unwrap();
    let fence = permit.fence().unwrap();
    drop(permit);
    drv.apply(&draining_to(11, 10, 1, "b"));
    drv.apply(&owned_view(20, 20));
    drv.apply(&draining_to(21, 20, 2, "c"));
    tokio::time::advance(Duration::from_millis(1_790)).await;
    settle_tasks().await;
    assert!(matches!(
        own.shard_state(0),
        Some(ShardState::Outgoing { .. })
    ));
    // the drain deadline (2 s) and the fence's validity (1.8 s) both passed
    tokio::time::advance(Duration::from_millis(300)).await;
    settle_tasks().await;
    assert_eq!(own.shard_state(0), None);
    drop(fence);
}

/// After a cancel-back at the same epoch the shard is admitted under a new gate; a permit admitted before
/// the drain began belongs to the old one and can no longer mint fences, nor can its fences pass a check.
#[tokio::test(start_paused = true)]
async fn an_old_permit_mints_no_fence_after_a_cancel_back() {
    let (own, drv) = owning_at_epoch_10();
    let permit = own.admit_shard(0).unwrap();
    let early = permit.fence().unwrap();
    drv.apply(&draining_to(11, 10, 1, "b"));
    assert!(
        permit.fence().is_ok(),
        "still Outgoing at its epoch: fences until the deadline"
    );
    drv.apply(&owned_view(12, 10)); // cancel-back: Owned at epoch 10 again, on a new gate
    assert_eq!(own.shard_state(0), Some(ShardState::Owned { epoch: 10 }));
    assert_eq!(
        permit.fence().map(|f| f.token()),
        Err(FenceError::NotHeld {
            shard: 0,
            epoch: 10
        })
    );
    assert_eq!(
        early.check(),
        Err(FenceError::NotHeld {
            shard: 0,
            epoch: 10
        })
    );
    // a permit admitted now fences as usual
    let fresh = own.admit_shard(0).unwrap();
    assert!(fresh.fence().is_ok());
}

/// A retired gate is kept only while it can hold a drain back: once nothing is in flight on it and its
/// last fence's validity has passed, the next step forgets it.
#[tokio::test(start_paused = true)]
async fn a_retired_gate_is_forgotten_once_nothing_is_in_flight_and_its_fences_expired() {
    let (own, drv) = owning_at_epoch_10();
    let permit = own.admit_shard(0).unwrap();
    let fence = permit.fence().unwrap();
    drv.apply(&draining_to(11, 10, 1, "b"));
    drv.apply(&owned_view(20, 20));
    assert_eq!(own.snapshot().retired_gates(0), 1);
    drop((fence, permit));
    drv.renew();
    assert_eq!(
        own.snapshot().retired_gates(0),
        1,
        "its fence is still valid"
    );
    tokio::time::advance(Duration::from_millis(1_800)).await;
    drv.renew();
    drv.activate(0, 20);
    assert_eq!(own.snapshot().retired_gates(0), 0);
}

async fn settle_tasks() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

/// The gate itself: once a drain has seen zero in flight, no entry ever succeeds (real threads).
#[test]
fn gate_never_admits_after_a_drain_saw_zero() {
    for _round in 0..200 {
        let gate = Arc::new(Gate::default());
        let observed_zero = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(AtomicUsize::new(0));
        let admitted = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (gate, seen, bad, ok) = (
                    gate.clone(),
                    observed_zero.clone(),
                    violations.clone(),
                    admitted.clone(),
                );
                std::thread::spawn(move || {
                    for _ in 0..200 {
                        if gate.try_enter() {
                            ok.fetch_add(1, Ordering::Relaxed);
                            if seen.load(Ordering::SeqCst) {
                                bad.fetch_add(1, Ordering::SeqCst);
                            }
                            std::hint::spin_loop();
                            gate.leave();
                        }
                    }
                })
            })
            .collect();
        gate.close();
        while gate.in_flight() != 0 {
            std::hint::spin_loop();
        }
        observed_zero.store(true, Ordering::SeqCst);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(violations.load(Ordering::SeqCst), 0);
        assert!(!gate.try_enter());
    }
}

/// Admission through `Ownership` against a concurrent drain: after the shard is released no permit is ever
/// issued, and no permit issued before was alive when the drain completed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_against_a_concurrent_drain() {
    for round in 0..30u64 {
        let (own, drv) = testing::driver(config(), me());
        drv.renew();
        let g = round * 10 + 1;
        drv.apply(&AssignmentView::new(g).with(0, ShardAssignment::owned(me(), g)));
        drv.activate(0, g);
        let stop = Arc::new(AtomicBool::new(false));
        let live = Arc::new(AtomicUsize::new(0));
        let bad = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (own, stop, live, bad) = (own.clone(), stop.clone(), live.clone(), bad.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        if let Ok(p) = own.admit_shard(0) {
                            live.fetch_add(1, Ordering::SeqCst);
                            if own.shard_state(0).is_none() {
                                bad.fetch_add(1, Ordering::SeqCst);
                            }
                            live.fetch_sub(1, Ordering::SeqCst);
                            drop(p);
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(2));
        let mut tr = own.transitions();
        drv.apply(&AssignmentView::new(g + 1).with(
            0,
            ShardAssignment::owned(me(), g).with_handoff(Handoff::Draining { id: g, to: other() }),
        ));
        // wait for the release
        loop {
            let t = tr.next().await.unwrap();
            if t.to.is_none() {
                break;
            }
        }
        // the drain saw zero: nothing admitted can be live now
        assert_eq!(live.load(Ordering::SeqCst), 0, "round {round}");
        std::thread::sleep(Duration::from_millis(2));
        stop.store(true, Ordering::SeqCst);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(bad.load(Ordering::SeqCst), 0, "round {round}");
        assert!(own.admit_shard(0).is_err());
    }
}

// === static mode ===

#[tokio::test]
async fn static_mode_fences_at_epoch_zero() {
    let own = Ownership::new_static(OwnershipConfig::default(), 1, 4).unwrap();
    for s in 64..128 {
        assert_eq!(own.admit_shard(s).unwrap().fence().unwrap().epoch(), 0);
    }
    assert!(matches!(
        own.admit_shard(0),
        Err(AdmitError::NotOwned { .. })
    ));
    assert!(Ownership::new_static(OwnershipConfig::default(), 4, 4).is_err());
    assert!(Ownership::new_static(OwnershipConfig::default(), 0, 0).is_err());
    assert!(Ownership::new_static(OwnershipConfig::default(), 0, 257).is_err());
}

// === the reconcile wrapper ===

fn cm(uid: &str) -> Arc<ConfigMap> {
    Arc::new(ConfigMap {
        metadata: ObjectMeta {
            name: Some("x".into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            resource_version: Some("5".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    })
}

/// A uid that lands in shard `want` of 256.
fn uid_in(own: &Ownership, want: u32) -> String {
    (0..1_000_000u64)
        .map(|i| format!("{:016x}-uid", crate::hash::fnv1a64(&i.to_le_bytes())))
        .find(|u| own.shard_of(cm(u).as_ref()).unwrap() == want)
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn wrapper_unowned_never_calls_the_user_fn_and_held_requeues() {
    let (own, drv, _) = owning();
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let mut reconcile = crate::ownership::reconcile::wrap(
        own.clone(),
        move |_obj: Arc<ConfigMap>, _ctx: Arc<()>, p| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                assert!(p.fence().is_ok());
                Ok::<_, std::convert::Infallible>(Action::requeue(Duration::from_secs(300)))
            }
        },
    );
    let ctx = Arc::new(());
    // unowned: await_change, no call
    let unowned = cm(&uid_in(&own, 5));
    assert_eq!(
        reconcile(unowned.clone(), ctx.clone()).await.unwrap(),
        Action::await_change()
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // owned and admitted: the user fn runs with a permit
    let mine = cm(&uid_in(&own, 0));
    assert_eq!(
        reconcile(mine.clone(), ctx.clone()).await.unwrap(),
        Action::requeue(Duration::from_secs(300))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // held but not admitted (Outgoing): a short requeue, no call
    drv.apply(&draining_view(2));
    let action = reconcile(mine.clone(), ctx.clone()).await.unwrap();
    assert_ne!(action, Action::await_change());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // self-fenced: no call (and no requeue: un-fencing re-enqueues, see
    // held_requeue_loop_stops_held_and_self_fenced_wait_for_the_reenqueue)
    drv.apply(&AssignmentView::new(3).with(0, ShardAssignment::owned(me(), 1)));
    tokio::time::advance(Duration::from_secs(20)).await;
    let _ = reconcile(mine, ctx.clone()).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // Incoming: requeue, no call
    let incoming = cm(&uid_in(&own, 7));
    drv.renew();
    drv.apply(
        &AssignmentView::new(4)
            .with(0, ShardAssignment::owned(me(), 1))
            .with(
                7,
                ShardAssignment::owned(other(), 1)
                    .with_handoff(Handoff::Moving { id: 3, to: me() }),
            ),
    );
    let action = reconcile(incoming, ctx).await.unwrap();
    assert_ne!(action, Action::await_change());
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// An object held back by a member-wide hold (shadow mode, a live legacy leader) or by self-fencing is not
/// requeued every 2 s: lifting the hold and un-fencing re-enqueue every Owned shard through the transitions
/// stream, so the wrapper waits for that.
#[tokio::test(start_paused = true)]
async fn held_requeue_loop_stops_held_and_self_fenced_wait_for_the_reenqueue() {
    let (own, drv, _) = owning();
    let mine = cm(&uid_in(&own, 0));
    let mut tr = own.transitions();
    own.set_hold(crate::ownership::inner::Hold::Shadow, true);
    assert_eq!(
        crate::ownership::reconcile::admit(&own, mine.as_ref()).unwrap_err(),
        Action::await_change(),
        "held: wait for the hold to lift"
    );
    own.set_hold(crate::ownership::inner::Hold::Shadow, false);
    let t = tr.next_transition().await.unwrap();
    assert_eq!((t.shard, t.admitted), (0, Some(AdmitCause::Unfenced)));
    assert!(crate::ownership::reconcile::admit(&own, mine.as_ref()).is_ok());

    tokio::time::advance(Duration::from_secs(20)).await;
    assert_eq!(
        crate::ownership::reconcile::admit(&own, mine.as_ref()).unwrap_err(),
        Action::await_change(),
        "self-fenced: wait for the renewal"
    );
    drv.renew();
    let t = tr.next_transition().await.unwrap();
    assert_eq!((t.shard, t.admitted), (0, Some(AdmitCause::Unfenced)));
    assert!(crate::ownership::reconcile::admit(&own, mine.as_ref()).is_ok());
    // Outgoing still requeues soon (a cancel-back re-enqueues too, but nothing is lost if it is late)
    drv.apply(&draining_view(2));
    assert_ne!(
        crate::ownership::reconcile::admit(&own, mine.as_ref()).unwrap_err(),
        Action::await_change()
    );
}

// === fenced writes against a tower-test mock ===

pub(crate) mod fenced {
    use super::*;
    use crate::{
        ownership::fenced_write::{Deleted, Error, FencedApi},
        token::{FENCE_ANNOTATION, FENCE_HEADER},
    };
    use http::{Request, Response};
    use kube::{client::Body, Api, Client};
    use serde_json::{json, Value};

    type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

    fn api() -> (FencedApi<ConfigMap>, Handle) {
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, "default");
        (FencedApi::new(Api::namespaced(client, "default")), handle)
    }

    async fn next(handle: &mut Handle, reply: Value) -> (http::request::Parts, Value) {
        let (req, send) = handle.next_request().await.expect("a request");
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.unwrap();
        let v = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        send.send_response(
            Response::builder()
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap(),
        );
        (parts, v)
    }

    fn reply() -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default", "uid": "u1", "resourceVersion": "6"}})
    }

    #[tokio::test]
    async fn replace_sends_preconditions_annotation_and_header() {
        let (own, _drv, _) = owning();
        let permit = own.admit_shard(0).unwrap();
        let fence = permit.fence().unwrap();
        let (api, mut handle) = api();
        let obj = cm("u1");
        let server = tokio::spawn(async move { next(&mut handle, reply()).await });
        let out = api.replace(&fence, &obj).await.unwrap();
        assert_eq!(out.metadata.resource_version.as_deref(), Some("6"));
        let (parts, body) = server.await.unwrap();
        assert_eq!(parts.method, http::Method::PUT);
        assert_eq!(parts.uri.path(), "/api/v1/namespaces/default/configmaps/x");
        assert_eq!(parts.headers[FENCE_HEADER], "0:0/1");
        assert_eq!(body["metadata"]["uid"], "u1");
        assert_eq!(body["metadata"]["resourceVersion"], "5");
        assert_eq!(body["metadata"]["annotations"][FENCE_ANNOTATION], "0:0/1");
    }

    #[tokio::test]
    async fn status_and_patch_writes_carry_the_header_and_preconditions() {
        let (own, _drv, _) = owning();
        let permit = own.admit_shard(0).unwrap();
        let fence = permit.fence().unwrap();
        let (api, mut handle) = api();
        let server = tokio::spawn(async move {
            let a = next(&mut handle, reply()).await;
            let b = next(&mut handle, reply()).await;
            let c = next(&mut handle, reply()).await;
            (a, b, c)
        });
        api.replace_status(&fence, &cm("u1")).await.unwrap();
        api.patch(
            &fence,
            &cm("u1"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"data": {"k": "v"}})),
        )
        .await
        .unwrap();
        api.patch_status(
            &permit,
            &cm("u1"),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&json!({"status": {"ok": true}})),
        )
        .await
        .unwrap();
        let ((p1, b1), (p2, b2), (p3, b3)) = server.await.unwrap();
        assert_eq!(
            p1.uri.path(),
            "/api/v1/namespaces/default/configmaps/x/status"
        );
        assert_eq!(p1.headers[FENCE_HEADER], "0:0/1");
        assert_eq!(b1["metadata"]["resourceVersion"], "5");
        assert_eq!(p2.method, http::Method::PATCH);
        assert_eq!(p2.headers["content-type"], "application/merge-patch+json");
        assert_eq!(p2.headers[FENCE_HEADER], "0:0/1");
        assert_eq!(b2["metadata"]["uid"], "u1");
        assert_eq!(b2["metadata"]["resourceVersion"], "5");
        assert_eq!(b2["metadata"]["annotations"][FENCE_ANNOTATION], "0:0/1");
        assert_eq!(b2["data"]["k"], "v");
        assert_eq!(
            p3.uri.path(),
            "/api/v1/namespaces/default/configmaps/x/status"
        );
        assert_eq!(p3.headers[FENCE_HEADER], "0:0/1");
        assert_eq!(b3["metadata"]["resourceVersion"], "5");
        assert!(b3["metadata"].get("annotations").is_none());
    }

    #[tokio::test]
    async fn delete_sends_preconditions() {
        let (own, _drv, _) = owning();
        let permit = own.admit_shard(0).unwrap();
        let fence = permit.fence().unwrap();
        let (api, mut handle) = api();
        let server = tokio::spawn(async move {
            next(
                &mut handle,
                json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}),
            )
            .await
        });
        let out = api.delete(&fence, &cm("u1")).await.unwrap();
        assert!(matches!(out, Deleted::Gone(_)));
        let (parts, body) = server.await.unwrap();
        assert_eq!(parts.method, http::Method::DELETE);
        assert_eq!(parts.headers[FENCE_HEADER], "0:0/1");
        assert_eq!(body["preconditions"]["uid"], "u1");
        assert_eq!(body["preconditions"]["resourceVersion"], "5");
    }

    #[tokio::test]
    async fn apply_and_json_patch_carry_preconditions_and_the_fence() {
        let (own, _drv, _) = owning();
        let permit = own.admit_shard(0).unwrap();
        let (api, mut handle) = api();
        let server = tokio::spawn(async move {
            let a = next(&mut handle, reply()).await;
            let b = next(&mut handle, reply()).await;
            let c = next(&mut handle, reply()).await;
            (a, b, c)
        });
        let pp = kube::api::PatchParams::apply("tests").force();
        let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"}});
        let applied = kube::api::Patch::Apply(applied);
        api.patch(&permit, &cm("u1"), &pp, &applied).await.unwrap();
        api.patch_status(&permit, &cm("u1"), &pp, &applied)
            .await
            .unwrap();
        let ops: json_patch::Patch =
            serde_json::from_value(json!([{"op": "add", "path": "/data", "value": {"k": "v"}}]))
                .unwrap();
        let ops = kube::api::Patch::<()>::Json(ops);
        api.patch(&permit, &cm("u1"), &Default::default(), &ops)
            .await
            .unwrap();
        let ((p1, b1), (p2, b2), (p3, b3)) = server.await.unwrap();
        assert_eq!(p1.headers["content-type"], "application/apply-patch+yaml");
        assert!(p1.uri.query().unwrap().contains("fieldManager=tests"));
        assert!(p1.uri.query().unwrap().contains("force=true"));
        assert_eq!(p1.headers[FENCE_HEADER], "0:0/1");
        assert_eq!(b1["metadata"]["uid"], "u1");
        assert_eq!(b1["metadata"]["resourceVersion"], "5");
        assert_eq!(b1["metadata"]["annotations"][FENCE_ANNOTATION], "0:0/1");
        assert_eq!(b1["data"]["k"], "v");
        assert_eq!(
            p2.uri.path(),
            "/api/v1/namespaces/default/configmaps/x/status"
        );
        assert_eq!(p2.headers[FENCE_HEADER], "0:0/1");
        assert_eq!(b2["metadata"]["uid"], "u1");
        assert_eq!(b2["metadata"]["resourceVersion"], "5");
        assert_eq!(p3.headers["content-type"], "application/json-patch+json");
        assert_eq!(p3.headers[FENCE_HEADER], "0:0/1");
        assert_eq!(
            b3,
            json!([
                {"op": "test", "path": "/metadata/uid", "value": "u1"},
                {"op": "test", "path": "/metadata/resourceVersion", "value": "5"},
                {"op": "add", "path": "/data", "value": {"k": "v"}},
                {"op": "add", "path": "/metadata/annotations", "value": {FENCE_ANNOTATION: "0:0/1"}},
            ])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_expired_fence_sends_nothing() {
        let (own, _drv, _) = owning();
        let permit = own.admit_shard(0).unwrap();
        let fence = permit.fence().unwrap();
        let (api, mut handle) = api();
        tokio::time::advance(Duration::from_secs(9)).await;
        let err = api.replace(&fence, &cm("u1")).await.unwrap_err();
        assert!(
            matches!(err, Error::Fence(FenceError::Expired { .. })),
            "{err:?}"
        );
        drop(api);
        assert!(handle.next_request().await.is_none(), "nothing may be sent");
    }

    #[tokio::test]
    async fn a_write_without_preconditions_is_refused_before_sending() {
        let (own, _drv, _) = owning();
        let permit = own.admit_shard(0).unwrap();
        let fence = permit.fence().unwrap();
        let (api, mut handle) = api();
        let mut obj = (*cm("u1")).clone();
        obj.metadata.resource_version = None;
        let err = api.replace(&fence, &obj).await.unwrap_err();
        assert!(matches!(
            err,
            Error::MissingPrecondition {
                field: "resourceVersion",
                ..
            }
        ));
        // a merge patch too: every update, patch and apply needs both preconditions
        let err = api
            .patch(
                &permit,
                &obj,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&json!({"data": {}})),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, Error::MissingPrecondition { .. }), "{err:?}");
        drop(api);
        assert!(handle.next_request().await.is_none());
    }

    /// A server that takes one request and never answers it.
    fn silent(mut handle: Handle) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let (_req, _send) = handle.next_request().await.expect("a request");
            std::future::pending::<()>().await;
        })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    /// A fenced request sent while Owned runs until its fence's validity (1.8 s here); a drain whose
    /// deadline (1 s) comes first must not release the shard while that request is in flight.
    #[tokio::test(start_paused = true)]
    async fn drain_waits_for_a_fenced_request_sent_while_owned() {
        let (own, drv, _) = owning_with(fence_outlives_drain(), me());
        let permit = own.admit_shard(0).unwrap();
        let fence = permit.fence().unwrap();
        let (api, handle) = api();
        let server = silent(handle);
        let write = tokio::spawn(async move { api.replace(&fence, &cm("u1")).await });
        settle().await;
        drop(permit);
        drv.apply(&draining_view(2));
        tokio::time::advance(Duration::from_millis(1_100)).await;
        settle().await;
        assert!(
            matches!(own.shard_state(0), Some(ShardState::Outgoing { .. })),
            "released at the drain deadline while a fenced request sent while Owned is in flight: {:?}",
            own.shard_state(0)
        );
        assert!(
            crate::testing::member_state(&own).acks().is_empty(),
            "no released ack yet"
        );
        // the request times out with its fence (1.8 s after it was sent); then the shard is released
        let err = write.await.unwrap().unwrap_err();
        assert!(
            matches!(err, Error::Timeout(d) if d == Duration::from_millis(1_800)),
            "{err:?}"
        );
        settle().await;
        assert_eq!(own.shard_state(0), None);
        assert_eq!(
            crate::testing::member_state(&own).acks(),
            vec![Ack::Released {
                shard: 0,
                move_id: 9
            }]
        );
        server.abort();
    }

    /// The handoff of `drain_waits_for_a_fenced_request_sent_while_owned` with two members, recorded by the
    /// fence oracle: `a` sends a fenced write of `u1` while Owned that is never answered, shard 0 moves to
    /// `b`, which fences and writes `u1` as soon as `a` has released. Returns what the recorder saw once
    /// `a`'s request has ended.
    pub(crate) async fn handoff_history() -> crate::testing::oracles::fences::FenceHistory {
        let recorder = crate::testing::oracles::fences::FenceRecorder::new();
        let (a, drv_a, _) = owning_with(fence_outlives_drain(), me());
        crate::testing::observe_fences(&a, recorder.clone());
        let (clock, _) = manual_clock();
        let (b, drv_b) = testing::driver_with_clock(fence_outlives_drain(), other(), clock);
        crate::testing::observe_fences(&b, recorder.clone());
        drv_b.renew();

        let permit = a.admit_shard(0).unwrap();
        let fence = permit.fence().unwrap();
        let (api_a, handle) = api();
        let server = silent(handle);
        let write = tokio::spawn(async move { api_a.replace(&fence, &cm("u1")).await });
        settle().await;
        drop(permit);
        drv_a.apply(&draining_view(2));
        while a.shard_state(0).is_some() {
            tokio::time::advance(Duration::from_millis(50)).await;
            settle().await;
        }
        // the coordinator grants shard 0 to b; b activates, fences and writes u1
        drv_b.renew();
        drv_b.apply(&AssignmentView::new(3).with(0, ShardAssignment::owned(other(), 3)));
        drv_b.activate(0, 3);
        let permit_b = b.admit_shard(0).unwrap();
        let fence_b = permit_b.fence().unwrap();
        let (api_b, mut handle_b) = api();
        let server_b = tokio::spawn(async move { next(&mut handle_b, reply()).await });
        api_b.replace(&fence_b, &cm("u1")).await.unwrap();
        server_b.await.unwrap();
        drop((fence_b, permit_b));
        let _ = write.await.unwrap();
        server.abort();
        recorder.history()
    }

    #[tokio::test(start_paused = true)]
    async fn the_request_times_out_with_the_fence() {
        let (own, _drv, _) = owning();
        let permit = own.admit_shard(0).unwrap();
        let fence = permit.fence().unwrap();
        let (api, mut handle) = api();
        let server = tokio::spawn(async move {
            let (_req, _send) = handle.next_request().await.unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
        });
        let err = api.replace(&fence, &cm("u1")).await.unwrap_err();
        assert!(
            matches!(err, Error::Timeout(d) if d == Duration::from_secs(9)),
            "{err:?}"
        );
        server.abort();
    }
}

/// HA.md "HA in a shard group": the HA gate is its own hold bit. Before it was, the hold was one value
/// that each gate overwrote, and the legacy gate lifting cleared the HA Standby's hold.
#[tokio::test(start_paused = true)]
async fn a_gate_clears_only_its_own_hold_bit() {
    let (own, _drv, _) = owning();
    let mut tr = own.transitions();
    own.set_hold(crate::ownership::inner::Hold::Term, true);
    own.set_hold(crate::ownership::inner::Hold::LegacyLeader, true);
    own.set_hold(crate::ownership::inner::Hold::LegacyLeader, false);
    assert_eq!(
        own.admission_hold(),
        Some("this cluster is not the active HA cluster")
    );
    assert!(matches!(own.admit_shard(0), Err(AdmitError::Held { .. })));
    assert!(
        tr.try_next_transition().is_none(),
        "no re-enqueue while held"
    );
    own.set_hold(crate::ownership::inner::Hold::Term, false);
    assert_eq!(own.admission_hold(), None);
    let t = tr.next_transition().await.unwrap();
    assert_eq!((t.shard, t.admitted), (0, Some(AdmitCause::Unfenced)));
    assert!(own.admit_shard(0).is_ok());
}
