//! The quiescence oracle: fence epochs per uid, and latest generations reconciled by their owners; and the
//! epoch check on a shard count change recorded before the fix
//! (`fixtures/shard_count_change_commits_before_fix.json`).

use std::collections::BTreeMap;

use super::*;

fn commit(rv: u64, uid: &str, fence: Option<&str>) -> FencedCommit {
    FencedCommit {
        rv,
        uid: uid.into(),
        fence: fence.map(str::to_owned),
    }
}

#[test]
fn epochs_that_only_go_up_per_uid_pass_even_across_shard_counts() {
    let commits = [
        commit(1, "u1", Some("3/10")),
        commit(2, "u1", None), // an unfenced write (a user's edit) is skipped
        commit(3, "u1", Some("7/11")), // the same object under S = 32
        commit(4, "u2", Some("5/2")), // another uid has its own sequence
        commit(5, "u1", Some("7/11")),
    ];
    assert_eq!(check_epochs(&commits), vec![]);
}

/// A shard count change, as the issue reported it: the old generation's member (epoch 10) kept writing
/// a Widget after a member of the new group had committed epoch 11 for it.
#[test]
fn a_lower_epoch_committed_after_a_higher_one_is_flagged() {
    let commits = [
        commit(7, "w1", Some("3/10")),
        commit(8, "w1", Some("7/11")),
        commit(9, "w1", Some("3/10")),
        commit(10, "w1", Some("garbage")),
    ];
    let v = check_epochs(&commits);
    assert_eq!(
        v,
        vec![
            EpochViolation::Back {
                uid: "w1".into(),
                highest: (8, "7/11".into()),
                later: (9, "3/10".into()),
            },
            EpochViolation::Unparsable {
                uid: "w1".into(),
                rv: 10,
                raw: "garbage".into()
            }
        ]
    );
    assert!(v[0].to_string().contains("went back"), "{}", v[0]);
}

fn obj(key: &str, shard: u32, generation: u64) -> ObjectState {
    ObjectState {
        key: key.into(),
        shard,
        generation,
    }
}

fn rec(member: &str, key: &str, generation: u64) -> Reconcile {
    Reconcile {
        member: member.into(),
        key: key.into(),
        generation,
    }
}

#[test]
fn latest_generations_reconciled_by_their_owners_pass() {
    let owners: BTreeMap<u32, String> = [(0, "a".into()), (1, "b".into())].into();
    let objects = [obj("x", 0, 3), obj("y", 1, 2)];
    let reconciles = [rec("b", "x", 2), rec("a", "x", 3), rec("b", "y", 2)];
    assert_eq!(check_reconciled(&objects, &owners, &reconciles), vec![]);
    assert_quiescent(&[], &objects, &owners, &reconciles);
}

/// No lost work through `predicate_filter` (issue 14): the last generation was reconciled only by the
/// previous owner (whose reconcile failed while the shard moved), never by the new one.
#[test]
fn a_latest_generation_seen_only_by_the_previous_owner_is_flagged() {
    let owners: BTreeMap<u32, String> = [(0, "b".into())].into();
    let objects = [obj("x", 0, 4), obj("z", 9, 1)];
    let reconciles = [rec("a", "x", 4), rec("b", "x", 3)];
    let v = check_reconciled(&objects, &owners, &reconciles);
    assert_eq!(
        v,
        vec![
            ReconcileViolation::Missed {
                key: "x".into(),
                generation: 4,
                owner: "b".into(),
                owner_saw: Some(3)
            },
            ReconcileViolation::Unowned {
                key: "z".into(),
                shard: 9
            }
        ]
    );
    let panic = std::panic::catch_unwind(|| assert_quiescent(&[], &objects, &owners, &reconciles))
        .unwrap_err();
    let msg = panic.downcast_ref::<String>().unwrap();
    assert!(msg.contains("quiescence oracle: 2 violation(s)"), "{msg}");
}

/// A shard count change, recorded before the fix (`record_shard_count_change` in
/// `fixtures/record_at_886ae0b.rs.txt`, at 886ae0b): `a` at S = 16 and `c` at S = 32 in one group, each
/// patching every object it admits through `FencedApi` every 200 ms; `a` left, `c` led, could not decode the
/// S = 16 assignment and overwrote it with its own at a higher generation, while `a` (its leave never
/// finishing) kept writing at its old epochs. Every committed version of the 8 objects, with its
/// `kube-shard.io/fence` annotation.
const SHARD_COUNT_CHANGE_COMMITS_BEFORE_FIX: &str =
    include_str!("../fixtures/shard_count_change_commits_before_fix.json");

fn epoch(token: &str) -> u64 {
    token
        .parse::<crate::token::FenceToken>()
        .unwrap()
        .shard_epoch()
        .unwrap()
}

#[test]
fn the_oracle_flags_the_shard_count_change_commits_recorded_before_the_fix() {
    let commits: Vec<FencedCommit> =
        serde_json::from_str(SHARD_COUNT_CHANGE_COMMITS_BEFORE_FIX).unwrap();
    let v = check_epochs(&commits);
    assert!(!v.is_empty(), "no epoch went back");
    for v in &v {
        let EpochViolation::Back { highest, later, .. } = v else {
            panic!("{v}");
        };
        assert!(
            later.0 > highest.0 && epoch(&later.1) < epoch(&highest.1),
            "{v}"
        );
    }
    let uids: std::collections::BTreeSet<&str> = v
        .iter()
        .filter_map(|v| match v {
            EpochViolation::Back { uid, .. } => Some(uid.as_str()),
            _ => None,
        })
        .collect();
    let panic = std::panic::catch_unwind(|| assert_quiescent(&commits, &[], &BTreeMap::new(), &[]))
        .unwrap_err();
    let msg = panic.downcast_ref::<String>().unwrap();
    eprintln!(
        "{} of {} commits went back, on {} uids\n{}",
        v.len(),
        commits.len(),
        uids.len(),
        msg.lines().take(3).collect::<Vec<_>>().join("\n")
    );
    assert!(
        msg.contains(&format!("quiescence oracle: {} violation(s)", v.len())),
        "{msg}"
    );
}
