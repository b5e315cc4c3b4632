//! The ownership-history oracle on a clean handoff and takeover, and on hand-built violations derived from
//! the review's F1 (a coordinator that could not decode the assignment re-plans from scratch) and F2 (an
//! owner not yet observed counts as gone) interleavings.

use std::collections::BTreeMap;

use super::history::*;

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
                    },
                )
            })
            .collect(),
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

/// F2 (review): the coordinator has not observed b's Lease yet, counts b as gone and gives its shard to c
/// with no release and no takeover.
#[test]
fn f02_an_unobserved_owner_given_away_is_flagged() {
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

/// F1 (review): the assignment is deleted (or cannot be decoded); a coordinator re-plans from scratch: the
/// shards' previous owner is still the last known one through the deletion.
#[test]
fn f01_a_replan_from_scratch_after_a_deletion_is_flagged() {
    let (a, b) = (h("a", "1"), h("b", "1"));
    let hist = OwnershipHistory {
        assignments: vec![
            version(10, &[(0, a.clone(), None), (1, a.clone(), None)]),
            version(20, &[]), // deleted
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
