//! The checks the demo and the end-to-end suite run on what replica processes leave behind, built on the
//! library's fence oracle (`kube_shard::testing::oracles::fences`): the replicas' fence log (one line
//! per committed fenced write, the example operator's `--fence-log`) becomes a fence history, one window
//! per write, and the oracle judges it — windows of different members never overlap on a shard, and
//! epochs never go back in start order. The per-shard commit order of the server's fence audit is
//! checked here too.

use std::collections::BTreeMap;

use kube_shard::testing::oracles::fences::{self, FenceHistory, FenceRecord, Violation};

/// One line of a fence log: `member<TAB>shard<TAB>epoch<TAB>start_ns<TAB>end_ns` (wall clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceLogRecord {
    /// `name/incarnation` as the writer logged itself.
    pub member: String,
    pub shard: u32,
    pub epoch: u64,
    /// When the write started (ns since the epoch).
    pub start: u128,
    /// When it ended.
    pub end: u128,
}

/// The records of a fence log's text; malformed lines (a torn last line of a killed process) are
/// skipped.
#[must_use]
pub fn parse_fence_log(text: &str) -> Vec<FenceLogRecord> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split('\t').collect();
            let [member, shard, epoch, start, end] = f.as_slice() else {
                return None;
            };
            Some(FenceLogRecord {
                member: (*member).to_owned(),
                shard: shard.parse().ok()?,
                epoch: epoch.parse().ok()?,
                start: start.parse().ok()?,
                end: end.parse().ok()?,
            })
        })
        .collect()
}

/// The records as the fence oracle's history: one fence per write, held by `member` (as attributed)
/// from its start to its end (µs since the earliest start).
#[must_use]
pub fn fence_history(records: &[FenceLogRecord]) -> FenceHistory {
    let origin = records.iter().map(|r| r.start).min().unwrap_or(0);
    let us = |ns: u128| u64::try_from((ns.saturating_sub(origin)) / 1000).unwrap_or(u64::MAX);
    let fences = records
        .iter()
        .enumerate()
        .map(|(i, r)| FenceRecord {
            id: i as u64,
            member: r.member.clone(),
            shard: r.shard,
            epoch: r.epoch,
            issued: us(r.start),
            valid_until: us(r.end.max(r.start)),
            dropped: us(r.end.max(r.start)),
        })
        .collect();
    FenceHistory {
        fences,
        requests: Vec::new(),
    }
}

/// What the fence oracle finds wrong in `records`.
#[must_use]
pub fn fence_log_violations(records: &[FenceLogRecord]) -> Vec<Violation> {
    fences::check(&fence_history(records))
}

/// Per shard, in commit order (`resourceVersion`): a fenced write never carries a lower epoch than one
/// committed before it, and one epoch belongs to one member. `commits`: `(shard, epoch, member, rv)`.
/// Returns the violations.
pub fn commit_order_violations<'a>(commits: impl Iterator<Item = (u32, u64, &'a str, u64)>) -> u64 {
    let mut per: BTreeMap<u32, Vec<(u64, u64, &'a str)>> = BTreeMap::new();
    for (shard, epoch, who, rv) in commits {
        per.entry(shard).or_default().push((rv, epoch, who));
    }
    let mut bad = 0;
    for v in per.values_mut() {
        v.sort_by_key(|c| c.0);
        let mut owner_of: BTreeMap<u64, &str> = BTreeMap::new();
        let mut highest = 0u64;
        for (_, epoch, who) in v.iter() {
            if *epoch < highest {
                bad += 1;
            }
            highest = highest.max(*epoch);
            match owner_of.get(epoch) {
                Some(o) if o != who => bad += 1,
                _ => {
                    owner_of.insert(*epoch, who);
                }
            }
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(member: &str, shard: u32, epoch: u64, start: u128, end: u128) -> String {
        format!("{member}\t{shard}\t{epoch}\t{start}\t{end}\n")
    }

    #[test]
    fn a_clean_log_has_no_violation_and_torn_lines_are_skipped() {
        let text = rec("a/1", 3, 5, 1_000_000, 2_000_000)
            + &rec("a/1", 3, 5, 2_500_000, 3_000_000)
            + &rec("b/1", 3, 7, 4_000_000, 5_000_000)
            + &rec("b/1", 4, 2, 1_000_000, 9_000_000)
            + "a/1\t3\t5\t6";
        let records = parse_fence_log(&text);
        assert_eq!(records.len(), 4);
        assert!(fence_log_violations(&records).is_empty());
    }

    /// Planted: two members writing one shard at once, and an epoch going back.
    #[test]
    fn overlapping_members_and_an_epoch_going_back_are_caught() {
        let overlap =
            rec("a/1", 3, 5, 1_000_000, 3_000_000) + &rec("b/1", 3, 7, 2_000_000, 4_000_000);
        let v = fence_log_violations(&parse_fence_log(&overlap));
        assert!(
            v.iter()
                .any(|v| matches!(v, Violation::ShardOverlap { shard: 3, .. })),
            "{v:?}"
        );
        let back = rec("b/1", 3, 7, 1_000_000, 2_000_000) + &rec("a/1", 3, 5, 3_000_000, 4_000_000);
        let v = fence_log_violations(&parse_fence_log(&back));
        assert!(
            v.iter()
                .any(|v| matches!(v, Violation::EpochBack { shard: 3, .. })),
            "{v:?}"
        );
    }

    #[test]
    fn commit_order() {
        let ok = [
            (1, 5, "a", 10),
            (1, 5, "a", 11),
            (1, 7, "b", 12),
            (2, 3, "b", 1),
        ];
        assert_eq!(commit_order_violations(ok.into_iter()), 0);
        let back = [(1, 5, "a", 10), (1, 7, "b", 12), (1, 5, "a", 13)];
        assert_eq!(commit_order_violations(back.into_iter()), 1);
        let shared = [(1, 5, "a", 10), (1, 5, "b", 11)];
        assert_eq!(commit_order_violations(shared.into_iter()), 1);
    }
}
