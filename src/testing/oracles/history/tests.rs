//! The ownership-history oracle on a clean handoff and takeover, on hand-built violations derived from
//! two interleavings (a coordinator that could not decode the assignment re-plans from scratch; an owner
//! not yet observed counts as gone), and on both histories recorded before the fixes (`fixtures/`,
//! recorded at 886ae0b by `fixtures/record_at_886ae0b.rs.txt`).

use std::collections::BTreeMap;

use super::*;

fn h(name: &str, inc: &str) -> Holder {
    Holder {
        name: name.into(),
        incarnation: inc.into(),
    }
}

fn version(rv: u64, shards: &[(u32, Holder, Option<u64>)]) -> AssignmentVersion {
    AssignmentVersion {
        rv,
        shards: shards
            .iter()
            .map(|(s, o, m)| {
                (
                    *s,
                    ShardOwner {
                        owner: o.clone(),
                        move_id: *m,
                        epoch: 0,
                    },
                )
            })
            .collect(),
        deleted: false,
    }
}

fn lease(
    rv: u64,
    name: &str,
    inc: &str,
    released: &[(u64, &[u32])],
    taken: Option<&str>,
) -> LeaseVersion {
    LeaseVersion {
        rv,
        name: name.into(),
        incarnation: Some(inc.into()),
        released: released
            .iter()
            .map(|(m, s)| (*m, s.to_vec()))
            .collect::<BTreeMap<_, _>>(),
        taken_over: taken.map(str::to_owned),
        deleted: false,
    }
}

/// Cold start a:{0,1}; move 7 of shard 1 to b, released by a at rv 12, applied at rv 13; a is taken over
/// at rv 20, b gets shard 0 at rv 21.
fn clean() -> OwnershipHistory {
    let (a, b) = (h("a", "1"), h("b", "1"));
    OwnershipHistory {
        assignments: vec![
            version(10, &[(0, a.clone(), None), (1, a.clone(), None)]),
            version(11, &[(0, a.clone(), None), (1, a.clone(), Some(7))]),
            version(13, &[(0, a.clone(), None), (1, b.clone(), None)]),
            version(21, &[(0, b.clone(), None), (1, b.clone(), None)]),
        ],
        leases: vec![
            lease(5, "a", "1", &[], None),
            lease(12, "a", "1", &[(7, &[1])], None),
            lease(20, "a", "1", &[(7, &[1])], Some("1")),
        ],
    }
}

#[test]
fn a_released_move_and_a_takeover_justify_their_changes() {
    assert_eq!(check(&clean()), vec![]);
    assert_eq!(
        owner_changes(&clean()),
        2,
        "shard 1 by move 7, shard 0 by takeover"
    );
    assert_justified(&clean());
}

#[test]
fn a_release_committed_after_the_change_does_not_count() {
    let mut hist = clean();
    hist.leases[1].rv = 14;
    let v = check(&hist);
    assert!(
        matches!(
            &v[..],
            [Violation::Unjustified {
                shard: 1,
                rv: 13,
                move_id: Some(7),
                ..
            }]
        ),
        "{v:?}"
    );
}

#[test]
fn a_release_of_another_move_shard_or_incarnation_does_not_count() {
    for (moved, shards, inc) in [(8, vec![1], "1"), (7, vec![0], "1"), (7, vec![1], "2")] {
        let mut hist = clean();
        hist.leases[1] = LeaseVersion {
            incarnation: Some(inc.into()),
            released: [(moved, shards)].into_iter().collect(),
            ..hist.leases[1].clone()
        };
        let v = check(&hist);
        assert!(
            v.iter()
                .any(|v| matches!(v, Violation::Unjustified { shard: 1, .. })),
            "{v:?}"
        );
    }
}

#[test]
fn a_takeover_mark_of_another_incarnation_does_not_count() {
    let mut hist = clean();
    hist.leases[2].taken_over = Some("0".into());
    let v = check(&hist);
    assert!(
        matches!(
            &v[..],
            [Violation::Unjustified {
                shard: 0,
                rv: 21,
                ..
            }]
        ),
        "{v:?}"
    );
    assert!(v[0].to_string().contains("a/1 -> b/1"), "{}", v[0]);
}

/// The coordinator has not observed b's Lease yet, counts b as gone and gives its shard to c with no
/// release and no takeover.
#[test]
fn an_unobserved_owner_given_away_is_flagged() {
    let (b, c) = (h("b", "1"), h("c", "1"));
    let hist = OwnershipHistory {
        assignments: vec![
            version(10, &[(3, b.clone(), None)]),
            version(30, &[(3, c.clone(), None)]),
        ],
        leases: vec![
            lease(9, "b", "1", &[], None),
            lease(29, "b", "1", &[], None),
        ],
    };
    let v = check(&hist);
    assert_eq!(
        v,
        vec![Violation::Unjustified {
            shard: 3,
            rv: 30,
            from: b,
            to: c,
            move_id: None
        }]
    );
    let panic = std::panic::catch_unwind(|| assert_justified(&hist)).unwrap_err();
    let msg = panic.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains("ownership history oracle: 1 violation"),
        "{msg}"
    );
}

/// The assignment is deleted (or cannot be decoded); a coordinator re-plans from scratch: the shards'
/// previous owner is still the last known one through the deletion.
#[test]
fn a_replan_from_scratch_after_a_deletion_is_flagged() {
    let (a, b) = (h("a", "1"), h("b", "1"));
    let hist = OwnershipHistory {
        assignments: vec![
            version(10, &[(0, a.clone(), None), (1, a.clone(), None)]),
            AssignmentVersion::deletion(20),
            version(21, &[(0, a.clone(), None), (1, b.clone(), None)]),
        ],
        leases: vec![lease(9, "a", "1", &[], None)],
    };
    let v = check(&hist);
    assert!(
        matches!(
            &v[..],
            [Violation::Unjustified {
                shard: 1,
                rv: 21,
                ..
            }]
        ),
        "{v:?}"
    );
}

#[test]
fn histories_round_trip_through_json() {
    let hist = clean();
    let text = serde_json::to_string(&hist).unwrap();
    assert_eq!(
        serde_json::from_str::<OwnershipHistory>(&text).unwrap(),
        hist
    );
}

/// The panic message of [`assert_justified`] on `hist`.
fn failure(hist: &OwnershipHistory) -> String {
    let panic = std::panic::catch_unwind(|| assert_justified(hist)).unwrap_err();
    panic.downcast_ref::<String>().unwrap().clone()
}

/// The settled version (the last one naming every shard before `rv`).
fn settled_before(hist: &OwnershipHistory, rv: u64) -> &AssignmentVersion {
    hist.assignments
        .iter()
        .filter(|v| v.rv < rv && v.shards.len() == 16)
        .max_by_key(|v| v.rv)
        .expect("a settled version")
}

/// A deleted assignment, recorded before the fix (`record_deleted_assignment`): `a`, `b`, `c` settled; the
/// coordinator Lease and then the assignment were deleted; a fresh `d`, with no view, led and re-created the
/// assignment from scratch: first empty (every shard dropped from its live owner), then planned over `a`–`d`.
const DELETED_ASSIGNMENT_BEFORE_FIX: &str =
    include_str!("../fixtures/deleted_assignment_history_before_fix.json");

#[test]
fn the_oracle_flags_the_deleted_assignment_history_recorded_before_the_fix() {
    let hist: OwnershipHistory = serde_json::from_str(DELETED_ASSIGNMENT_BEFORE_FIX).unwrap();
    let deleted = hist
        .assignments
        .iter()
        .find(|v| v.deleted)
        .expect("the deletion")
        .rv;
    let settled = settled_before(&hist, deleted);
    let recreated = hist
        .assignments
        .iter()
        .filter(|v| v.rv > deleted)
        .map(|v| v.rv)
        .min()
        .expect("a re-created assignment");
    let v = check(&hist);
    assert_eq!(v.len(), 16, "{v:?}");
    for (shard, e) in &settled.shards {
        assert!(
            v.contains(&Violation::Dropped {
                shard: *shard,
                rv: recreated,
                from: e.owner.clone(),
                move_id: None,
            }),
            "shard {shard} not flagged as dropped at rv {recreated}: {v:?}"
        );
    }
    let msg = failure(&hist);
    eprintln!("{msg}");
    assert!(
        msg.contains("ownership history oracle: 16 violation(s)"),
        "{msg}"
    );
}

/// Without the drop: the same recording with the empty re-creation left out (as if `d` had planned in
/// its first write). The owner changes of the plan from scratch are flagged on their own.
#[test]
fn the_plan_from_scratch_recorded_before_the_fix_is_flagged_on_its_own() {
    let mut hist: OwnershipHistory = serde_json::from_str(DELETED_ASSIGNMENT_BEFORE_FIX).unwrap();
    let deleted = hist
        .assignments
        .iter()
        .find(|v| v.deleted)
        .expect("the deletion")
        .rv;
    hist.assignments
        .retain(|v| v.rv <= deleted || v.shards.len() == 16);
    let v = check(&hist);
    assert!(!v.is_empty(), "the plan from scratch moved no shard");
    assert!(
        v.iter()
            .all(|v| matches!(v, Violation::Unjustified { move_id: None, .. })),
        "{v:?}"
    );
    eprintln!("{}", failure(&hist));
}

/// An unobserved owner, recorded before the fix (`record_unobserved_owner`): `a`, `b`, `c` settled; the
/// coordinator Lease was deleted and a fresh `d` whose lease watch never listed led: it saw no owner alive
/// and wrote an assignment without any shard, dropping all 16 from their live owners.
const UNOBSERVED_OWNER_BEFORE_FIX: &str =
    include_str!("../fixtures/unobserved_owner_history_before_fix.json");

#[test]
fn the_oracle_flags_the_unobserved_owner_history_recorded_before_the_fix() {
    let hist: OwnershipHistory = serde_json::from_str(UNOBSERVED_OWNER_BEFORE_FIX).unwrap();
    assert!(
        hist.assignments.iter().all(|v| !v.deleted),
        "nobody deleted it"
    );
    let last = hist.assignments.iter().map(|v| v.rv).max().unwrap();
    let settled = settled_before(&hist, last);
    let v = check(&hist);
    let expected: Vec<Violation> = settled
        .shards
        .iter()
        .map(|(shard, e)| Violation::Dropped {
            shard: *shard,
            rv: last,
            from: e.owner.clone(),
            move_id: None,
        })
        .collect();
    assert_eq!(v, expected);
    let msg = failure(&hist);
    eprintln!("{msg}");
    assert!(
        msg.contains("ownership history oracle: 16 violation(s)"),
        "{msg}"
    );
    assert!(msg.contains("dropped from its owner"), "{msg}");
}

#[test]
fn a_drop_after_a_release_or_a_takeover_is_justified_and_a_deletion_drops_nothing() {
    let (a, b) = (h("a", "1"), h("b", "1"));
    let hist = OwnershipHistory {
        assignments: vec![
            version(
                10,
                &[
                    (0, a.clone(), None),
                    (1, a.clone(), Some(7)),
                    (2, b.clone(), None),
                ],
            ),
            AssignmentVersion::deletion(11),
            version(
                12,
                &[
                    (0, a.clone(), None),
                    (1, a.clone(), Some(7)),
                    (2, b.clone(), None),
                ],
            ),
            version(14, &[(0, a.clone(), None)]),
        ],
        leases: vec![
            lease(13, "a", "1", &[(7, &[1])], None),
            lease(13, "b", "1", &[], Some("1")),
        ],
    };
    assert_eq!(check(&hist), vec![]);
    assert_eq!(owner_changes(&hist), 2, "two drops judged");
    let mut late = hist.clone();
    late.leases[1].rv = 15;
    assert_eq!(
        check(&late),
        vec![Violation::Dropped {
            shard: 2,
            rv: 14,
            from: b,
            move_id: None
        }]
    );
}

/// A same-name restart (the simulator's finding): a/1 owns shard 0; a second process a/2 claims the Lease
/// of name a at rv 15; the coordinator gives shard 0 to a/2 at rv 20 without a move.
fn same_name_restart(claim_rv: u64) -> OwnershipHistory {
    let (a1, a2) = (h("a", "1"), h("a", "2"));
    OwnershipHistory {
        assignments: vec![
            version(10, &[(0, a1.clone(), None)]),
            version(20, &[(0, a2.clone(), None)]),
        ],
        leases: vec![
            lease(5, "a", "1", &[], None),
            lease(8, "a", "1", &[], None),
            lease(claim_rv, "a", "2", &[], None),
        ],
    }
}

#[test]
fn a_displaced_incarnation_justifies_the_change_once_its_lease_is_claimed_or_deleted() {
    assert_eq!(check(&same_name_restart(15)), vec![]);
    // the Lease deleted (an admin, or the member's own leave) instead of claimed
    let mut deleted = same_name_restart(15);
    deleted.leases[2] = LeaseVersion::deletion(15, "a");
    assert_eq!(check(&deleted), vec![]);
}

#[test]
fn a_change_to_a_new_incarnation_without_a_displacement_before_it_is_caught() {
    // the claim committed after the assignment gave a/1's shard away
    let v = check(&same_name_restart(25));
    assert!(
        matches!(
            &v[..],
            [Violation::Unjustified {
                shard: 0,
                rv: 20,
                ..
            }]
        ),
        "{v:?}"
    );
    assert!(v[0].to_string().contains("a/1 -> a/2"), "{}", v[0]);
    // no other incarnation ever held the Lease: a/1 was live and renewing
    let mut live = same_name_restart(15);
    live.leases.pop();
    assert_eq!(check(&live).len(), 1);
    // a/1 renewed after the other version: it was not displaced (that version proves nothing)
    let mut renewed = same_name_restart(15);
    renewed.leases.push(lease(17, "a", "1", &[], None));
    assert_eq!(check(&renewed).len(), 1);
    // another member's Lease changing proves nothing about a/1
    let mut other = same_name_restart(15);
    other.leases[2].name = "b".into();
    assert_eq!(check(&other).len(), 1);
}

/// `version` with epochs: (shard, owner, epoch).
fn version_at(rv: u64, shards: &[(u32, Holder, u64)]) -> AssignmentVersion {
    let mut v = version(rv, &[]);
    for (shard, owner, epoch) in shards {
        v.shards.insert(
            *shard,
            ShardOwner {
                owner: owner.clone(),
                move_id: None,
                epoch: *epoch,
            },
        );
    }
    v
}

/// An older assignment written back names the previous owner at its old epoch: nobody follows it, so it
/// moves nothing; a later version that gives the shard to that previous owner at a new epoch is an owner
/// change like any other, and needs the holder's release or takeover.
#[test]
fn an_older_assignment_written_back_moves_nothing_until_a_new_epoch_does() {
    let (a, b) = (h("a", "1"), h("b", "1"));
    let history = OwnershipHistory {
        assignments: vec![
            version_at(10, &[(7, a.clone(), 10)]),
            // b takes it over from a (a's takeover mark at rv 11)
            version_at(12, &[(7, b.clone(), 12)]),
            // the backup of rv 10 written back: a at epoch 10, below b's 12
            version_at(20, &[(7, a.clone(), 10)]),
            // b named again above: no change
            version_at(21, &[(7, b.clone(), 21)]),
        ],
        leases: vec![lease(11, "a", "1", &[], Some("1"))],
    };
    let flagged: Vec<String> = check(&history).iter().map(ToString::to_string).collect();
    assert!(flagged.is_empty(), "{flagged:?}");
    // a re-grant to a at a new epoch, with no release by b: flagged
    let mut regrant = history.clone();
    regrant.assignments[3] = version_at(21, &[(7, a.clone(), 21)]);
    let flagged: Vec<String> = check(&regrant).iter().map(ToString::to_string).collect();
    assert!(
        flagged
            .iter()
            .any(|v| v.contains("owner b/1 -> a/1 at rv 21")),
        "{flagged:?}"
    );
}
