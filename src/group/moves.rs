//! The least number of shards a membership change must move: the planner's quotas applied to the owners.

use std::collections::BTreeSet;

use super::planner::{Member, PlanInput};
use crate::ownership::MemberId;
use crate::shard::ShardCount;

/// The fewest shards any plan must move to take the current `owners` (shard → owner; a shard not listed
/// has none) to the `members` with their weights (≥ 1): every shard without an owner among `members`, plus,
/// for each member, what it holds beyond its quota. Quotas are the planner's own (by weight, largest
/// remainder, the extra shards to the largest holders), so the planner moves exactly this many when no pin
/// or succession constrains it. `None` for an input the planner refuses (an owner's shard out of range, a
/// member listed twice, a weight of 0); `Some(0)` with no member (nothing can move).
///
/// ```
/// use kube_shard::{group::optimal_moves, ownership::MemberId, ShardCount};
/// let (a, b) = (MemberId::new("a", "1"), MemberId::new("b", "1"));
/// let s = ShardCount::new(8).unwrap();
/// let owners: Vec<(u32, &MemberId)> = (0..8).map(|i| (i, &a)).collect();
/// // b joins: a keeps 4, 4 move
/// assert_eq!(optimal_moves(s, owners.iter().copied(), [(&a, 1), (&b, 1)]), Some(4));
/// // a leaves: all 8 move to b
/// assert_eq!(optimal_moves(s, owners.iter().copied(), [(&b, 1)]), Some(8));
/// ```
#[must_use]
pub fn optimal_moves<'a>(
    shards: ShardCount,
    owners: impl IntoIterator<Item = (u32, &'a MemberId)>,
    members: impl IntoIterator<Item = (&'a MemberId, u32)>,
) -> Option<u64> {
    let owners: Vec<(u32, &MemberId)> = owners.into_iter().collect();
    let members: Vec<(&MemberId, u32)> = members.into_iter().collect();
    if members.is_empty() {
        return Some(0);
    }
    let planned: BTreeSet<&MemberId> = members.iter().map(|(m, _)| *m).collect();
    let input = PlanInput::new(shards)
        .with_owners(owners.iter().copied())
        .with_members(
            members
                .iter()
                .map(|(m, w)| Member::new((*m).clone()).with_weight(*w)),
        );
    let plan = input.plan().ok()?;
    let owned: BTreeSet<u32> = owners.iter().map(|(s, _)| *s).collect();
    let orphans = owners.iter().filter(|(_, o)| !planned.contains(o)).count()
        + (shards.get() as usize).saturating_sub(owned.len());
    let over: u64 = plan
        .report()
        .members
        .iter()
        .filter(|m| planned.contains(&m.id))
        .map(|m| u64::from(m.held.saturating_sub(m.quota)))
        .sum();
    Some(orphans as u64 + over)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: &str) -> MemberId {
        MemberId::new(n, "1")
    }

    #[test]
    fn the_planner_moves_exactly_the_optimum_without_pins() {
        let s = ShardCount::new(16).unwrap();
        let (a, b, c) = (id("a"), id("b"), id("c"));
        // a holds 10, b holds 5, shard 15 has no owner; c joins with weight 2
        let owners: Vec<(u32, &MemberId)> =
            (0..15).map(|i| (i, if i < 10 { &a } else { &b })).collect();
        let members = [(&a, 1), (&b, 1), (&c, 2)];
        let optimum = optimal_moves(s, owners.iter().copied(), members).unwrap();
        let plan = PlanInput::new(s)
            .with_owners(owners.iter().copied())
            .with_members(
                members
                    .iter()
                    .map(|(m, w)| Member::new((*m).clone()).with_weight(*w)),
            )
            .plan()
            .unwrap();
        // quotas 4/4/8: a gives 6, b gives 1, and the unowned shard moves
        assert_eq!(optimum, 8);
        assert_eq!(
            plan.moves().len() as u64,
            optimum,
            "the unowned shard is one of the moves"
        );
    }

    #[test]
    fn refused_inputs_have_no_optimum() {
        let s = ShardCount::new(4).unwrap();
        let a = id("a");
        assert_eq!(optimal_moves(s, [(9, &a)], [(&a, 1)]), None);
        assert_eq!(optimal_moves(s, [(0, &a)], [(&a, 0)]), None);
        assert_eq!(optimal_moves(s, [(0, &a)], []), Some(0));
    }
}
