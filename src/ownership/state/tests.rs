//! Unit and property tests of the pure state machine.

use proptest::prelude::*;

use super::*;

fn a() -> MemberId {
    MemberId::new("a", "1")
}
fn b() -> MemberId {
    MemberId::new("b", "1")
}

fn view(generation: u64, shards: &[(u32, ShardAssignment)]) -> AssignmentView {
    let mut v = AssignmentView::new(generation);
    for (s, sa) in shards {
        v = v.with(*s, sa.clone());
    }
    v
}

fn owned(m: MemberId, e: u64) -> ShardAssignment {
    ShardAssignment::owned(m, e)
}
fn moving(m: MemberId, e: u64, id: MoveId, to: MemberId) -> ShardAssignment {
    ShardAssignment::owned(m, e).with_handoff(Handoff::Moving { id, to })
}
fn draining(m: MemberId, e: u64, id: MoveId, to: MemberId) -> ShardAssignment {
    ShardAssignment::owned(m, e).with_handoff(Handoff::Draining { id, to })
}

fn unfenced(me: MemberId) -> MemberState {
    let mut st = MemberState::new(me);
    st.apply_event(Event::Unfenced);
    st
}

#[test]
fn grant_activates_then_owns_and_signals_activation() {
    let mut st = unfenced(a());
    let out = st.apply_view(&view(5, &[(0, owned(a(), 5))]));
    assert_eq!(st.shard(0), Some(ShardState::Activating { epoch: 5 }));
    assert!(!st.is_admitted(0));
    assert!(out.transitions.iter().all(|t| !t.is_reenqueue()));
    let out = st.apply_event(Event::Activated { shard: 0, epoch: 5 });
    assert_eq!(st.shard(0), Some(ShardState::Owned { epoch: 5 }));
    assert!(st.is_admitted(0));
    assert_eq!(out.transitions[0].admitted, Some(AdmitCause::Activation));
}

#[test]
fn older_or_equal_generations_are_ignored_and_counted() {
    let mut st = unfenced(a());
    st.apply_view(&view(5, &[(0, owned(a(), 5))]));
    let out = st.apply_view(&view(5, &[]));
    assert!(out.ignored);
    let out = st.apply_view(&view(3, &[]));
    assert!(out.ignored);
    assert_eq!(st.ignored_views(), 2);
    assert_eq!(st.generation(), 5);
    assert_eq!(st.shard(0), Some(ShardState::Activating { epoch: 5 }));
}

#[test]
fn activation_of_a_wrong_epoch_is_ignored() {
    let mut st = unfenced(a());
    st.apply_view(&view(5, &[(0, owned(a(), 5))]));
    assert!(
        st.apply_event(Event::Activated { shard: 0, epoch: 4 })
            .ignored
    );
    assert!(
        st.apply_event(Event::Activated { shard: 1, epoch: 5 })
            .ignored
    );
    assert_eq!(st.shard(0), Some(ShardState::Activating { epoch: 5 }));
}

/// The whole handoff table, from both sides.
#[test]
fn handoff_source_and_target() {
    let mut src = unfenced(a());
    let mut dst = unfenced(b());
    let g1 = view(1, &[(0, owned(a(), 1))]);
    src.apply_view(&g1);
    dst.apply_view(&g1);
    src.apply_event(Event::Activated { shard: 0, epoch: 1 });
    assert_eq!(dst.shard(0), None);

    let g2 = view(2, &[(0, moving(a(), 1, 7, b()))]);
    src.apply_view(&g2);
    dst.apply_view(&g2);
    assert_eq!(src.shard(0), Some(ShardState::Owned { epoch: 1 }));
    assert_eq!(
        dst.shard(0),
        Some(ShardState::Incoming {
            move_id: 7,
            warm: false
        })
    );
    dst.apply_event(Event::Warm {
        shard: 0,
        move_id: 7,
    });
    assert_eq!(
        dst.acks(),
        vec![Ack::Warm {
            shard: 0,
            move_id: 7
        }]
    );

    let g3 = view(3, &[(0, draining(a(), 1, 7, b()))]);
    src.apply_view(&g3);
    dst.apply_view(&g3);
    assert_eq!(
        src.shard(0),
        Some(ShardState::Outgoing {
            epoch: 1,
            move_id: 7
        })
    );
    assert!(!src.is_admitted(0));
    assert_eq!(
        dst.shard(0),
        Some(ShardState::Incoming {
            move_id: 7,
            warm: true
        })
    );
    src.apply_event(Event::Drained {
        shard: 0,
        move_id: 7,
    });
    assert_eq!(src.shard(0), None);
    assert_eq!(
        src.acks(),
        vec![Ack::Released {
            shard: 0,
            move_id: 7
        }]
    );

    let g4 = view(4, &[(0, owned(b(), 4))]);
    src.apply_view(&g4);
    dst.apply_view(&g4);
    assert_eq!(src.shard(0), None);
    assert_eq!(dst.shard(0), Some(ShardState::Activating { epoch: 4 }));
    let out = dst.apply_event(Event::Activated { shard: 0, epoch: 4 });
    assert_eq!(out.transitions[0].admitted, Some(AdmitCause::Activation));
}

#[test]
fn cancel_before_release_returns_the_shard_and_signals() {
    let mut src = unfenced(a());
    src.apply_view(&view(1, &[(0, owned(a(), 1))]));
    src.apply_event(Event::Activated { shard: 0, epoch: 1 });
    src.apply_view(&view(2, &[(0, draining(a(), 1, 7, b()))]));
    let out = src.apply_view(&view(3, &[(0, owned(a(), 1))]));
    assert_eq!(src.shard(0), Some(ShardState::Owned { epoch: 1 }));
    assert_eq!(out.transitions[0].admitted, Some(AdmitCause::CancelBack));
    // the late drain completion of the cancelled move is ignored
    assert!(
        src.apply_event(Event::Drained {
            shard: 0,
            move_id: 7
        })
        .ignored
    );
    assert!(src.is_admitted(0));
}

#[test]
fn cancel_before_release_drops_incoming_on_the_target() {
    let mut dst = unfenced(b());
    dst.apply_view(&view(2, &[(0, moving(a(), 1, 7, b()))]));
    let out = dst.apply_view(&view(3, &[(0, owned(a(), 1))]));
    assert_eq!(dst.shard(0), None);
    assert_eq!(out.transitions[0].to, None);
}

#[test]
fn released_stays_released_until_granted_at_a_newer_epoch() {
    let mut src = unfenced(a());
    src.apply_view(&view(1, &[(0, owned(a(), 1))]));
    src.apply_event(Event::Activated { shard: 0, epoch: 1 });
    src.apply_view(&view(2, &[(0, draining(a(), 1, 7, b()))]));
    src.apply_event(Event::Drained {
        shard: 0,
        move_id: 7,
    });
    // a coordinator's cancel written as "back to A at the old epoch" (or a stale view) must not revive it
    src.apply_view(&view(3, &[(0, owned(a(), 1))]));
    assert_eq!(src.shard(0), None);
    src.apply_view(&view(4, &[(0, draining(a(), 1, 7, b()))]));
    assert_eq!(src.shard(0), None);
    // cancel after release: re-activated at a new epoch
    src.apply_view(&view(5, &[(0, owned(a(), 5))]));
    assert_eq!(src.shard(0), Some(ShardState::Activating { epoch: 5 }));
    let out = src.apply_event(Event::Activated { shard: 0, epoch: 5 });
    assert_eq!(out.transitions[0].admitted, Some(AdmitCause::Activation));
}

#[test]
fn takeover_drops_the_shard_without_a_signal() {
    let mut st = unfenced(a());
    st.apply_view(&view(1, &[(0, owned(a(), 1))]));
    st.apply_event(Event::Activated { shard: 0, epoch: 1 });
    let out = st.apply_view(&view(2, &[(0, owned(b(), 2))]));
    assert_eq!(st.shard(0), None);
    assert!(!out.transitions[0].is_reenqueue());
}

#[test]
fn a_new_incarnation_does_not_inherit() {
    let old = MemberId::new("a", "1");
    let new = MemberId::new("a", "2");
    let mut st = unfenced(new);
    st.apply_view(&view(1, &[(0, owned(old, 1))]));
    assert_eq!(st.shard(0), None);
}

#[test]
fn self_fencing_blocks_admission_and_unfencing_signals_owned_shards() {
    let mut st = unfenced(a());
    st.apply_view(&view(
        1,
        &[(0, owned(a(), 1)), (1, owned(a(), 1)), (2, owned(b(), 1))],
    ));
    st.apply_event(Event::Activated { shard: 0, epoch: 1 });
    st.apply_event(Event::SelfFenced);
    assert!(!st.is_admitted(0));
    // activation while fenced: owned but not signalled (the un-fencing signals it)
    let out = st.apply_event(Event::Activated { shard: 1, epoch: 1 });
    assert_eq!(out.transitions[0].admitted, None);
    let out = st.apply_event(Event::Unfenced);
    let shards: Vec<u32> = out.transitions.iter().map(|t| t.shard).collect();
    assert_eq!(shards, vec![0, 1]);
    assert!(out
        .transitions
        .iter()
        .all(|t| t.admitted == Some(AdmitCause::Unfenced)));
    assert!(st.apply_event(Event::Unfenced).ignored);
}

#[test]
fn a_new_member_starts_fenced() {
    let st = MemberState::new(a());
    assert!(st.is_fenced());
}

#[test]
fn draining_a_grant_never_activated_releases_at_once() {
    // generations skipped: the grant and the drain arrive as one view
    let mut st = unfenced(a());
    st.apply_view(&view(3, &[(0, draining(a(), 2, 9, b()))]));
    assert_eq!(
        st.shard(0),
        Some(ShardState::Outgoing {
            epoch: 2,
            move_id: 9
        })
    );
    st.apply_event(Event::Drained {
        shard: 0,
        move_id: 9,
    });
    assert_eq!(st.released(0), Some((2, 9)));
}

#[test]
fn an_older_epoch_for_a_held_shard_is_not_followed() {
    let mut st = unfenced(a());
    st.apply_view(&view(5, &[(0, owned(a(), 5))]));
    st.apply_event(Event::Activated { shard: 0, epoch: 5 });
    st.apply_view(&view(6, &[(0, owned(a(), 3))]));
    assert_eq!(st.shard(0), Some(ShardState::Owned { epoch: 5 }));
}

#[test]
fn a_newer_epoch_for_a_held_shard_reactivates() {
    let mut st = unfenced(a());
    st.apply_view(&view(5, &[(0, owned(a(), 5))]));
    st.apply_event(Event::Activated { shard: 0, epoch: 5 });
    st.apply_view(&view(6, &[(0, owned(a(), 6))]));
    assert_eq!(st.shard(0), Some(ShardState::Activating { epoch: 6 }));
}

#[test]
fn illegal_events_are_ignored() {
    let mut st = unfenced(a());
    assert!(
        st.apply_event(Event::Warm {
            shard: 0,
            move_id: 1
        })
        .ignored
    );
    assert!(
        st.apply_event(Event::Drained {
            shard: 0,
            move_id: 1
        })
        .ignored
    );
    assert!(
        st.apply_event(Event::Activated { shard: 0, epoch: 1 })
            .ignored
    );
    st.apply_view(&view(1, &[(0, owned(a(), 1))]));
    // warm/drain on an Activating shard
    assert!(
        st.apply_event(Event::Warm {
            shard: 0,
            move_id: 1
        })
        .ignored
    );
    assert!(
        st.apply_event(Event::Drained {
            shard: 0,
            move_id: 1
        })
        .ignored
    );
    st.apply_event(Event::Activated { shard: 0, epoch: 1 });
    // activation of an Owned shard, drain of an Owned shard
    assert!(
        st.apply_event(Event::Activated { shard: 0, epoch: 1 })
            .ignored
    );
    assert!(
        st.apply_event(Event::Drained {
            shard: 0,
            move_id: 1
        })
        .ignored
    );
    assert_eq!(st.shard(0), Some(ShardState::Owned { epoch: 1 }));
}

// === property tests ===

fn member() -> impl Strategy<Value = MemberId> {
    prop_oneof![Just(a()), Just(b()), Just(MemberId::new("a", "2"))]
}

fn assignment() -> impl Strategy<Value = ShardAssignment> {
    (member(), 1u64..8, 0u8..3, 1u64..4, member()).prop_map(|(owner, epoch, h, id, to)| {
        let handoff = match h {
            0 => Handoff::Stable,
            1 => Handoff::Moving { id, to },
            _ => Handoff::Draining { id, to },
        };
        ShardAssignment::owned(owner, epoch).with_handoff(handoff)
    })
}

fn input() -> impl Strategy<Value = Input> {
    let v = (
        1u64..12,
        proptest::collection::vec((0u32..3, assignment()), 0..4),
    )
        .prop_map(|(g, sh)| {
            let mut v = AssignmentView::new(g);
            for (s, a) in sh {
                v = v.with(s, a);
            }
            Input::View(v)
        });
    let e = prop_oneof![
        (0u32..3, 1u64..4).prop_map(|(shard, move_id)| Event::Warm { shard, move_id }),
        (0u32..3, 1u64..8).prop_map(|(shard, epoch)| Event::Activated { shard, epoch }),
        (0u32..3, 1u64..4).prop_map(|(shard, move_id)| Event::Drained { shard, move_id }),
        Just(Event::SelfFenced),
        Just(Event::Unfenced),
    ]
    .prop_map(Input::Event);
    prop_oneof![v, e]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Generations only increase; an older or equal view changes nothing.
    #[test]
    fn generations_are_monotonic(inputs in proptest::collection::vec(input(), 0..40)) {
        let mut st = MemberState::new(a());
        for i in &inputs {
            let before = st.clone();
            let out = st.apply(i);
            prop_assert!(st.generation() >= before.generation());
            if let Input::View(v) = i {
                if v.generation <= before.generation() {
                    prop_assert!(out.ignored);
                    prop_assert_eq!(st.shards().collect::<Vec<_>>(), before.shards().collect::<Vec<_>>());
                    prop_assert_eq!(st.ignored_views(), before.ignored_views() + 1);
                }
            }
        }
    }

    /// A released shard is never held again at an epoch ≤ the released one; held epochs never decrease
    /// while held; Owned is only reached from Activating (by the barrier) or Outgoing (cancel-back), and
    /// every transition into admitted carries a re-enqueue signal.
    #[test]
    fn transition_invariants(inputs in proptest::collection::vec(input(), 0..40)) {
        let mut st = MemberState::new(a());
        for i in &inputs {
            let before = st.clone();
            let out = st.apply(i);
            for s in 0..3 {
                if let (Some((r, _)), Some(e)) = (st.released(s), st.shard(s).and_then(ShardState::epoch)) {
                    prop_assert!(e > r, "shard {s} held at {e} after release at {r}");
                }
                if let (Some(e0), Some(e1)) = (
                    before.shard(s).and_then(ShardState::epoch),
                    st.shard(s).and_then(ShardState::epoch),
                ) {
                    prop_assert!(e1 >= e0);
                }
                let was = before.is_admitted(s);
                let now = st.is_admitted(s);
                if now && !was {
                    prop_assert!(
                        out.transitions.iter().any(|t| t.shard == s && t.is_reenqueue()),
                        "shard {s} became admitted without a signal: {i:?}"
                    );
                }
            }
            for t in &out.transitions {
                if let Some(ShardState::Owned { .. }) = t.to {
                    prop_assert!(matches!(
                        t.from,
                        Some(ShardState::Activating { .. } | ShardState::Outgoing { .. } | ShardState::Owned { .. })
                    ), "illegal transition {t:?}");
                }
                if t.to.is_none() {
                    prop_assert!(t.admitted.is_none());
                }
            }
        }
    }
}

/// docs/protocol.md: a cancel from Draining re-grants the source at a new epoch. Whether or not the source had
/// released when it sees the cancel, it ends Owned at the new epoch with an activation re-enqueue.
#[test]
fn cancel_from_draining_at_a_new_epoch_reactivates_whether_or_not_released() {
    for released_first in [false, true] {
        let mut src = unfenced(a());
        src.apply_view(&view(1, &[(0, owned(a(), 1))]));
        src.apply_event(Event::Activated { shard: 0, epoch: 1 });
        src.apply_view(&view(3, &[(0, draining(a(), 1, 7, b()))]));
        if released_first {
            src.apply_event(Event::Drained {
                shard: 0,
                move_id: 7,
            });
        }
        src.apply_view(&view(4, &[(0, owned(a(), 4))]));
        assert_eq!(src.shard(0), Some(ShardState::Activating { epoch: 4 }));
        // the drain of the cancelled move, if it completes late, changes nothing
        assert!(
            src.apply_event(Event::Drained {
                shard: 0,
                move_id: 7
            })
            .ignored
        );
        let out = src.apply_event(Event::Activated { shard: 0, epoch: 4 });
        assert_eq!(out.transitions[0].admitted, Some(AdmitCause::Activation));
        assert!(src.is_admitted(0));
    }
}

/// The counterexample the handoff model found for the old rule, replayed on one member: a cancel at the old
/// epoch after the release leaves the shard released (as it must), so the coordinator must not write it.
#[test]
fn regression_cancel_at_the_old_epoch_after_release_is_not_revived() {
    let mut src = unfenced(a());
    src.apply_view(&view(1, &[(0, owned(a(), 1))]));
    src.apply_event(Event::Activated { shard: 0, epoch: 1 });
    src.apply_view(&view(3, &[(0, draining(a(), 1, 7, b()))]));
    src.apply_event(Event::Drained {
        shard: 0,
        move_id: 7,
    });
    src.apply_view(&view(4, &[(0, owned(a(), 1))]));
    assert_eq!(src.shard(0), None);
    assert!(!src.is_admitted(0));
}

/// A rolled-back assignment names us at epochs we are past: held higher (kept, not followed), or released
/// at that epoch outside its own Draining. Both are reported stale; the Draining of the release itself,
/// a grant above what we hold, and shards named to others are not.
#[test]
fn shards_named_to_us_at_an_epoch_we_are_past_are_reported_stale() {
    let mut st = unfenced(a());
    st.apply_view(&view(
        10,
        &[
            (0, owned(a(), 10)),
            (1, owned(a(), 10)),
            (2, draining(a(), 10, 7, b())),
        ],
    ));
    for s in [0, 1] {
        st.apply_event(Event::Activated {
            shard: s,
            epoch: 10,
        });
    }
    st.apply_event(Event::Drained {
        shard: 2,
        move_id: 7,
    });
    assert_eq!(st.stale().count(), 0, "the Draining of our own release");
    // the backup: every epoch one lower, at a higher generation
    st.apply_view(&view(
        11,
        &[
            (0, owned(a(), 9)),
            (1, moving(a(), 9, 8, b())),
            (2, owned(a(), 9)),
            (3, owned(b(), 9)),
        ],
    ));
    assert_eq!(st.shard(0), Some(ShardState::Owned { epoch: 10 }), "kept");
    assert_eq!(st.stale().collect::<Vec<_>>(), vec![0, 1, 2]);
    // the coordinator re-grants above: nothing stale any more
    st.apply_view(&view(
        12,
        &[
            (0, owned(a(), 12)),
            (1, owned(a(), 12)),
            (2, owned(a(), 12)),
        ],
    ));
    assert_eq!(st.stale().count(), 0);
    assert_eq!(st.shard(2), Some(ShardState::Activating { epoch: 12 }));
}

/// A rolled-back assignment names another owner, at an epoch at or below ours, for a shard we hold: the
/// shard is kept (never dropped on an older fact) and reported `kept`; a view that names the other owner
/// above our epoch (a completed move, a takeover) is followed.
#[test]
fn a_shard_named_to_another_owner_below_our_epoch_is_kept_and_reported() {
    let mut st = unfenced(a());
    st.apply_view(&view(20, &[(0, owned(a(), 20)), (1, owned(a(), 20))]));
    for s in [0, 1] {
        st.apply_event(Event::Activated {
            shard: s,
            epoch: 20,
        });
    }
    // the backup names b at epochs 5 and 20: both at or below ours
    st.apply_view(&view(30, &[(0, owned(b(), 5)), (1, owned(b(), 20))]));
    assert_eq!(st.shard(0), Some(ShardState::Owned { epoch: 20 }));
    assert_eq!(st.shard(1), Some(ShardState::Owned { epoch: 20 }));
    assert!(st.is_admitted(0) && st.is_admitted(1));
    assert_eq!(st.kept().collect::<Vec<_>>(), vec![0, 1]);
    assert_eq!(st.stale().count(), 0);
    // the coordinator names us again: nothing kept any more
    st.apply_view(&view(31, &[(0, owned(a(), 31)), (1, owned(b(), 31))]));
    assert_eq!(st.kept().count(), 0);
    assert_eq!(st.shard(0), Some(ShardState::Activating { epoch: 31 }));
    // a grant to b above our epoch is followed: shard 1 is gone
    assert_eq!(st.shard(1), None);
}

/// Every legitimate grant's epoch is the generation of the write that made it, above everything applied
/// before: a grant at or below a generation we applied (one we skipped, named to us by a rolled-back
/// assignment) is never activated, nor drained, and is reported `stale`.
#[test]
fn a_grant_at_or_below_a_generation_applied_before_is_never_activated() {
    let mut st = unfenced(a());
    st.apply_view(&view(40, &[(0, owned(b(), 40))]));
    st.apply_view(&view(
        50,
        &[(0, owned(a(), 35)), (1, draining(a(), 40, 3, b()))],
    ));
    assert_eq!(st.shard(0), None, "never activated");
    assert_eq!(st.shard(1), None, "never drained: it was never ours");
    assert_eq!(st.stale().collect::<Vec<_>>(), vec![0, 1]);
    assert!(st.acks().is_empty(), "no release of a shard never held");
    // a grant above: activated
    st.apply_view(&view(51, &[(0, owned(a(), 51))]));
    assert_eq!(st.shard(0), Some(ShardState::Activating { epoch: 51 }));
    assert_eq!(st.stale().count(), 0);
}
