//! Planning the sub-watches of one resource in server mode.
//!
//! Given the ranges the member must read and the running sub-watches, decide what to change: keep a
//! sub-watch whose ranges are all still wanted, **narrow** one that lost some (a re-watch with the smaller
//! selector from the last resourceVersion processed for it, no LIST), stop one that lost all, start a
//! **new** one for ranges nobody reads yet, **merge** synced ones above the cap, and split a range set whose
//! selector would exceed the server's size limit.
//!
//! Pure: no I/O, no async. See `docs/read-path.md#server-mode-and-fallback-mode`.

use super::subwatch::{Start, SubId};
use super::types::parse_rv;
use crate::hash::ShardKey;
use crate::range::RangeSet;
use crate::selector::ShardSelector;

/// What the planner knows of a running sub-watch.
#[derive(Debug, Clone)]
pub(crate) struct SubView {
    pub(crate) id: SubId,
    pub(crate) ranges: RangeSet,
    /// Once its initial list completed: the newest resourceVersion the manager processed for it (events,
    /// bookmarks, relists), where a re-watch of its ranges resumes without replaying older history.
    pub(crate) resume_rv: Option<String>,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Stop these sub-watches.
    Stop(Vec<SubId>),
    /// Start a sub-watch for `ranges`, replacing `replaces` (stopped first).
    Start {
        replaces: Vec<SubId>,
        ranges: RangeSet,
        start: Start,
    },
}

/// The changes that make `subs` read exactly `want`, with at most `cap` sub-watches where merging allows.
pub(crate) fn plan(key: ShardKey, want: &RangeSet, subs: &[SubView], cap: usize) -> Vec<Action> {
    let cap = cap.max(1);
    let mut actions = Vec::new();
    let mut stopped = Vec::new();
    // the sub-watches after narrowing: (replaces, ranges, synced rv); `replaces` empty = unchanged
    let mut after: Vec<(Vec<SubId>, RangeSet, Option<String>, bool)> = Vec::new();
    for sub in subs {
        let keep = sub.ranges.intersection(want);
        if keep.is_empty() {
            stopped.push(sub.id);
        } else if keep == sub.ranges {
            after.push((vec![sub.id], keep, sub.resume_rv.clone(), false));
        } else if sub.resume_rv.is_some() {
            after.push((vec![sub.id], keep, sub.resume_rv.clone(), true));
        } else {
            // still listing: drop it; its wanted ranges are listed again below
            stopped.push(sub.id);
        }
    }
    let covered = after
        .iter()
        .fold(RangeSet::new(), |acc, (_, r, _, _)| acc.union(r));
    let gained = want.difference(&covered);

    // merge synced sub-watches while above the cap
    let projected = after.len() + usize::from(!gained.is_empty());
    if projected > cap {
        let mut synced: Vec<usize> = (0..after.len())
            .filter(|i| {
                after[*i]
                    .2
                    .as_deref()
                    .and_then(|rv| parse_rv(Some(rv)))
                    .is_some()
            })
            .collect();
        // merge the smallest first: fewest replayed events
        synced.sort_by_key(|i| after[*i].1.size());
        let excess = projected - cap;
        if synced.len() >= 2 {
            let take = (excess + 1).min(synced.len());
            let mut chosen: Vec<usize> = synced[..take].to_vec();
            chosen.sort_unstable();
            let mut merged_ids = Vec::new();
            let mut merged_ranges = RangeSet::new();
            let mut oldest: Option<(u64, String)> = None;
            for i in chosen.iter().rev() {
                let (ids, ranges, rv, _) = after.remove(*i);
                merged_ids.extend(ids);
                merged_ranges = merged_ranges.union(&ranges);
                if let Some(rv) = rv {
                    let n = parse_rv(Some(&rv)).unwrap_or(u64::MAX);
                    if oldest.as_ref().is_none_or(|(o, _)| n < *o) {
                        oldest = Some((n, rv));
                    }
                }
            }
            merged_ids.sort_unstable();
            after.push((merged_ids, merged_ranges, oldest.map(|(_, rv)| rv), true));
        }
    }

    if !stopped.is_empty() {
        stopped.sort_unstable();
        actions.push(Action::Stop(stopped));
    }
    for (replaces, ranges, rv, changed) in after {
        if !changed {
            continue;
        }
        let rv = rv.unwrap_or_default();
        push_split(key, &mut actions, replaces, &ranges, Start::Watch(rv));
    }
    if !gained.is_empty() {
        push_split(key, &mut actions, Vec::new(), &gained, Start::List);
    }
    actions
}

/// Push a start for `ranges`, split into several when one selector would be too long.
fn push_split(
    key: ShardKey,
    actions: &mut Vec<Action>,
    replaces: Vec<SubId>,
    ranges: &RangeSet,
    start: Start,
) {
    for (i, chunk) in split(key, ranges).into_iter().enumerate() {
        actions.push(Action::Start {
            replaces: if i == 0 { replaces.clone() } else { Vec::new() },
            ranges: chunk,
            start: start.clone(),
        });
    }
}

/// `ranges` in pieces whose selectors fit the server's size limit.
pub(crate) fn split(key: ShardKey, ranges: &RangeSet) -> Vec<RangeSet> {
    if ShardSelector::new(key, ranges).is_ok() || ranges.is_empty() {
        return vec![ranges.clone()];
    }
    ranges
        .ranges()
        .chunks(ShardSelector::max_terms(key))
        .map(|c| c.iter().copied().collect())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::ShardCount;

    fn set(shards: impl IntoIterator<Item = u32>) -> RangeSet {
        ShardCount::new(16).unwrap().ranges_of(shards).unwrap()
    }

    fn sub(id: SubId, shards: impl IntoIterator<Item = u32>, rv: Option<&str>) -> SubView {
        SubView {
            id,
            ranges: set(shards),
            resume_rv: rv.map(Into::into),
        }
    }

    #[test]
    fn nothing_to_do_when_covered() {
        let subs = [sub(1, 0..4, Some("10")), sub(2, 4..8, None)];
        assert!(plan(ShardKey::Uid, &set(0..8), &subs, 4).is_empty());
    }

    #[test]
    fn gained_ranges_get_their_own_list_while_others_run() {
        let subs = [sub(1, 0..4, Some("10"))];
        let actions = plan(ShardKey::Uid, &set(0..6), &subs, 4);
        assert_eq!(
            actions,
            [Action::Start {
                replaces: vec![],
                ranges: set(4..6),
                start: Start::List
            }]
        );
    }

    #[test]
    fn narrowing_rewatches_from_the_current_version_without_a_list() {
        let subs = [sub(1, 0..8, Some("42"))];
        let actions = plan(ShardKey::Uid, &set(0..5), &subs, 4);
        assert_eq!(
            actions,
            [Action::Start {
                replaces: vec![1],
                ranges: set(0..5),
                start: Start::Watch("42".into())
            }]
        );
    }

    #[test]
    fn losing_everything_stops_and_unsynced_narrowing_relists() {
        let subs = [sub(1, 0..4, Some("1")), sub(2, 4..8, None)];
        let actions = plan(ShardKey::Uid, &set(5..8), &subs, 4);
        assert_eq!(
            actions,
            [
                Action::Stop(vec![1, 2]),
                Action::Start {
                    replaces: vec![],
                    ranges: set(5..8),
                    start: Start::List
                }
            ]
        );
        assert_eq!(
            plan(ShardKey::Uid, &RangeSet::new(), &subs, 4),
            [Action::Stop(vec![1, 2])]
        );
    }

    #[test]
    fn above_the_cap_synced_watches_merge_from_the_oldest_version() {
        let subs = [
            sub(1, [0], Some("30")),
            sub(2, [2], Some("20")),
            sub(3, [4], Some("25")),
            sub(4, [6], None),
        ];
        // wanting one more range would make 5 sub-watches with a cap of 4: merge two synced ones
        let want = set([0, 2, 4, 6, 8]);
        let actions = plan(ShardKey::Uid, &want, &subs, 4);
        assert_eq!(
            actions,
            [
                // equal sizes: the first two; the merged watch starts at the older version
                Action::Start {
                    replaces: vec![1, 2],
                    ranges: set([0, 2]),
                    start: Start::Watch("20".into())
                },
                Action::Start {
                    replaces: vec![],
                    ranges: set([8]),
                    start: Start::List
                }
            ]
        );
    }

    #[test]
    fn too_long_selectors_are_split() {
        let s = ShardCount::new(4096).unwrap();
        let alternating = s.ranges_of((0..4096).step_by(2)).unwrap();
        let pieces = split(ShardKey::Namespace, &alternating);
        assert!(pieces.len() >= 2);
        for p in &pieces {
            assert!(ShardSelector::new(ShardKey::Namespace, p).is_ok());
        }
        let union = pieces.iter().fold(RangeSet::new(), |a, p| a.union(p));
        assert_eq!(union, alternating);
    }
}
