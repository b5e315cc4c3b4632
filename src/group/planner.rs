//! The assignment planner: pure and deterministic (no I/O, no async, no clocks, no randomness).
//!
//! [`plan`] takes `S`, the current owner of every shard, the live members (weight, join order, `leaving`,
//! `joining`) and the pins, and returns the target assignment, the [`Move`]s that reach it and a
//! [`PlanReport`]. It moves no more shards than the quotas require, uses contiguity only as the tie-break,
//! honours weights and pins, and hands a leaver's whole set to a freshly joined empty member. Pass a shard
//! in mid-handoff with its *target* as owner: the planner plans end states. [`Settle`] computes the
//! `joining` flag and the cold-start decision.
//!
//! See `docs/control-plane.md#planner-rules`.
//!
//! ```
//! use kube_shard::testing::planner::{plan, Member, PlanInput};
//! use kube_shard::ownership::MemberId;
//! use kube_shard::shard::ShardCount;
//!
//! let s = ShardCount::new(256).unwrap();
//! let ids: Vec<MemberId> = (0..4).map(|i| MemberId::new(format!("pod-{i}"), "a")).collect();
//!
//! // Cold start: three members, nothing owned yet.
//! let input = PlanInput::new(s).with_members(ids[..3].iter().cloned().map(Member::new));
//! let first = plan(&input).unwrap();
//! assert_eq!(first.moves().len(), 256);
//! assert!(first.report().members.iter().all(|m| m.ranges == 1));
//!
//! // Scale to four: only the fourth member's share moves (256 / 4 = 64 shards).
//! let input = input.with_owners(first.assignments()).with_member(Member::new(ids[3].clone()));
//! let second = plan(&input).unwrap();
//! assert_eq!(second.moves().len(), 64);
//! assert_eq!(second.shards_of(&ids[3]).len(), 64);
//! ```

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use crate::{ownership::MemberId, shard::ShardCount, shard::ShardSet};

/// One live member as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Member {
    /// The identity (name, incarnation).
    pub id: MemberId,
    /// The relative weight (≥ 1; default 1): quotas are proportional to it.
    pub weight: u32,
    /// Join order or age: smaller joined earlier (a sequence number or an observation time in ms). Only
    /// used to pick among several fresh members for a leaver's set.
    pub joined: u64,
    /// The member is leaving (SIGTERM): quota 0, its set moves away (to a fresh successor when there is one).
    pub leaving: bool,
    /// The member joined recently and its join is still being debounced (see [`Settle::is_joining`]): while
    /// it holds nothing it is not planned, except as a leaver's successor. Ignored for members that hold
    /// shards.
    pub joining: bool,
}

impl Member {
    /// A member of weight 1, joined at 0, neither leaving nor joining.
    #[must_use]
    pub fn new(id: MemberId) -> Self {
        Member {
            id,
            weight: 1,
            joined: 0,
            leaving: false,
            joining: false,
        }
    }

    /// Set the weight (must be ≥ 1; [`plan`] refuses 0).
    #[must_use]
    pub fn with_weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Set the join order (smaller = earlier).
    #[must_use]
    pub fn with_joined(mut self, joined: u64) -> Self {
        self.joined = joined;
        self
    }

    /// Mark the member leaving (or not).
    #[must_use]
    pub fn with_leaving(mut self, leaving: bool) -> Self {
        self.leaving = leaving;
        self
    }

    /// Mark the member's join as still being debounced (or not).
    #[must_use]
    pub fn with_joining(mut self, joining: bool) -> Self {
        self.joining = joining;
        self
    }
}

/// Everything [`plan`] needs. Build it with [`PlanInput::new`] and the `with_*` methods, or fill the public
/// fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PlanInput {
    /// `S`.
    pub shards: ShardCount,
    /// The current owner of each owned shard (the target of a move in flight). Owners that are not among
    /// [`members`](Self::members) are absent (dead, taken over): their shards are reassigned.
    pub current: BTreeMap<u32, MemberId>,
    /// The live members, in any order.
    pub members: Vec<Member>,
    /// Pins: shard → member *name*.
    pub pins: BTreeMap<u32, Arc<str>>,
}

impl PlanInput {
    /// No owners, no members, no pins.
    #[must_use]
    pub fn new(shards: ShardCount) -> Self {
        PlanInput {
            shards,
            current: BTreeMap::new(),
            members: Vec::new(),
            pins: BTreeMap::new(),
        }
    }

    /// Set the current owner of one shard.
    #[must_use]
    pub fn with_owner(mut self, shard: u32, owner: MemberId) -> Self {
        self.current.insert(shard, owner);
        self
    }

    /// Replace all current owners (e.g. with [`Plan::assignments`] of the previous plan).
    #[must_use]
    pub fn with_owners<'a, I>(mut self, owners: I) -> Self
    where
        I: IntoIterator<Item = (u32, &'a MemberId)>,
    {
        self.current = owners.into_iter().map(|(s, m)| (s, m.clone())).collect();
        self
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Add (or replace, by id) one member.
    #[must_use]
    pub fn with_member(mut self, member: Member) -> Self {
        self.members.retain(|m| m.id != member.id);
        self.members.push(member);
        self
    }

    /// Replace all members.
    #[must_use]
    pub fn with_members<I: IntoIterator<Item = Member>>(mut self, members: I) -> Self {
        self.members = members.into_iter().collect();
        self
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Remove a member (it becomes absent: its shards are reassigned).
    #[must_use]
    pub fn without_member(mut self, id: &MemberId) -> Self {
        self.members.retain(|m| &m.id != id);
        self
    }

    /// Pin a shard to a member name.
    #[must_use]
    pub fn with_pin(mut self, shard: u32, name: impl Into<Arc<str>>) -> Self {
        self.pins.insert(shard, name.into());
        self
    }

    /// Plan; see [`plan`].
    pub fn plan(&self) -> Result<Plan, PlanError> {
        plan(self)
    }
}

/// Why a shard moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum MoveReason {
    /// The shard has no owner, or its owner is absent: an initial assignment or a takeover (no handoff from
    /// a live source).
    Unowned,
    /// The owner is leaving: part of its one batch (exempt from the bound on concurrent moves).
    Leaving,
    /// The shard is pinned to another member.
    Pinned,
    /// The owner is above its quota.
    Rebalance,
}

/// One shard to move.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Move {
    /// The shard.
    pub shard: u32,
    /// The current owner (`None` if unowned); may be absent.
    pub from: Option<MemberId>,
    /// The target owner.
    pub to: MemberId,
    /// Why.
    pub reason: MoveReason,
}

/// A member's part in a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PlanRole {
    /// Planned normally: it ends at its quota.
    Balanced,
    /// Leaving: quota 0 (it keeps its shards only when no planned member exists).
    Leaving,
    /// Its join is still being debounced: not planned this round.
    Joining,
    /// A fresh member taking a leaver's (or its absent namesake's) whole set; never gives any of it away
    /// this round.
    Successor,
}

/// Per member: quota, current and target counts, ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberPlan {
    /// The member.
    pub id: MemberId,
    /// Its part in this plan.
    pub role: PlanRole,
    /// Its weight.
    pub weight: u32,
    /// Its quota: the target count of a planned member; for a member not planned (leaving, joining) the
    /// count it is left with (0 unless nobody is planned).
    pub quota: u32,
    /// Shards it holds now.
    pub held: u32,
    /// Shards it holds in the target.
    pub target: u32,
    /// Ranges (maximal runs of adjacent shards) it holds now.
    pub ranges_before: u32,
    /// Ranges it holds in the target: the number of selector terms it will watch with.
    pub ranges: u32,
}

/// Why a pin was not honoured this round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PinIgnored {
    /// No live member has that name.
    Absent,
    /// The member of that name is leaving.
    Leaving,
    /// The member of that name is still joining (debounce); the pin applies once it is planned.
    Joining,
}

/// A pin that was not honoured.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IgnoredPin {
    /// The pinned shard.
    pub shard: u32,
    /// The member name it is pinned to.
    pub name: Arc<str>,
    /// Why it was ignored.
    pub reason: PinIgnored,
}

/// A departed member's set handed whole to a fresh member.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Succession {
    /// The leaving (or absent) member.
    pub from: MemberId,
    /// The fresh member.
    pub to: MemberId,
    /// The shards handed over.
    pub shards: ShardSet,
}

/// What a plan found and did besides the moves.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct PlanReport {
    /// Every input member, in [`MemberId`] order.
    pub members: Vec<MemberPlan>,
    /// Pins not honoured, in shard order.
    pub ignored_pins: Vec<IgnoredPin>,
    /// Leaver → fresh member handovers.
    pub successions: Vec<Succession>,
    /// Shards nobody can take (no member is planned): kept by their leaving owner if it is live, else
    /// unowned.
    pub unassigned: ShardSet,
}

impl PlanReport {
    #[cfg(any(test, feature = "test-util"))]
    /// Members that hold more than their quota now (they give shards up in this plan).
    pub fn over_quota(&self) -> impl Iterator<Item = &MemberPlan> + '_ {
        self.members.iter().filter(|m| m.held > m.quota)
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Members that hold fewer than their quota now (they receive shards in this plan).
    pub fn under_quota(&self) -> impl Iterator<Item = &MemberPlan> + '_ {
        self.members.iter().filter(|m| m.held < m.quota)
    }

    #[cfg(any(test, feature = "test-util"))]
    /// The report of one member.
    #[must_use]
    pub fn member(&self, id: &MemberId) -> Option<&MemberPlan> {
        self.members
            .binary_search_by(|m| m.id.cmp(id))
            .ok()
            .map(|i| &self.members[i])
    }
}

/// A target assignment, the moves that reach it, and the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    shards: ShardCount,
    target: Vec<Option<MemberId>>,
    moves: Vec<Move>,
    report: PlanReport,
}

impl Plan {
    #[cfg(any(test, feature = "test-util"))]
    /// `S`.
    #[must_use]
    pub fn shards(&self) -> ShardCount {
        self.shards
    }

    #[cfg(any(test, feature = "test-util"))]
    /// The target owner of every shard (index = shard); `None` only for [`PlanReport::unassigned`] shards.
    #[must_use]
    pub fn target(&self) -> &[Option<MemberId>] {
        &self.target
    }

    /// The target owner of one shard.
    #[must_use]
    pub fn owner_of(&self, shard: u32) -> Option<&MemberId> {
        self.target.get(shard as usize).and_then(Option::as_ref)
    }

    #[cfg(any(test, feature = "test-util"))]
    /// The target (shard, owner) pairs in shard order.
    pub fn assignments(&self) -> impl Iterator<Item = (u32, &MemberId)> + '_ {
        self.target
            .iter()
            .enumerate()
            .filter_map(|(s, m)| m.as_ref().map(|m| (s as u32, m)))
    }

    #[cfg(any(test, feature = "test-util"))]
    /// The shards a member holds in the target.
    #[must_use]
    pub fn shards_of(&self, member: &MemberId) -> ShardSet {
        self.assignments()
            .filter(|(_, m)| *m == member)
            .map(|(s, _)| s)
            .collect()
    }

    /// The moves, in shard order.
    #[must_use]
    pub fn moves(&self) -> &[Move] {
        &self.moves
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Whether nothing moves.
    #[must_use]
    pub fn is_noop(&self) -> bool {
        self.moves.is_empty()
    }

    /// The report.
    #[must_use]
    pub fn report(&self) -> &PlanReport {
        &self.report
    }
}

/// Why an input was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A current owner or a pin names a shard that does not exist.
    #[error("{what} for shard {shard}, but there are only {count} shards")]
    ShardOutOfRange {
        /// `"owner"` or `"pin"`.
        what: &'static str,
        /// The shard.
        shard: u32,
        /// `S`.
        count: u32,
    },
    /// The same member is listed twice.
    #[error("member {member} is listed twice")]
    DuplicateMember {
        /// The member.
        member: MemberId,
    },
    /// A member has weight 0.
    #[error("member {member} has weight 0; weights must be at least 1")]
    ZeroWeight {
        /// The member.
        member: MemberId,
    },
}

/// Plan the target assignment; see `docs/control-plane.md#planner-rules` for the rules.
///
/// Errors only on malformed input (shard out of range, duplicate member, weight 0); any membership,
/// including none at all, yields a plan.
pub fn plan(input: &PlanInput) -> Result<Plan, PlanError> {
    Ok(Planner::new(input)?.run())
}

/// Working state of one planning run. Members are indexed in `MemberId` order.
struct Planner<'a> {
    input: &'a PlanInput,
    s: usize,
    members: Vec<&'a Member>,
    /// Current owner per shard, as an index when live.
    cur: Vec<Option<usize>>,
    held: Vec<u32>,
    /// Shards whose target is decided by a pin or a succession.
    fixed: Vec<Option<usize>>,
    pinned: Vec<bool>,
    ignored_pins: Vec<IgnoredPin>,
    successions: Vec<(MemberId, usize, Vec<u32>)>,
    successor: Vec<bool>,
}

impl<'a> Planner<'a> {
    fn new(input: &'a PlanInput) -> Result<Self, PlanError> {
        let count = input.shards.get();
        let s = count as usize;
        let mut members: Vec<&Member> = input.members.iter().collect();
        members.sort_by(|a, b| a.id.cmp(&b.id));
        if let Some(w) = members.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(PlanError::DuplicateMember {
                member: w[0].id.clone(),
            });
        }
        if let Some(m) = members.iter().find(|m| m.weight == 0) {
            return Err(PlanError::ZeroWeight {
                member: m.id.clone(),
            });
        }
        let check = |what, shard: u32| {
            if shard < count {
                Ok(())
            } else {
                Err(PlanError::ShardOutOfRange { what, shard, count })
            }
        };
        for &shard in input.current.keys() {
            check("owner", shard)?;
        }
        for &shard in input.pins.keys() {
            check("pin", shard)?;
        }
        let n = members.len();
        let mut cur = vec![None; s];
        let mut held = vec![0u32; n];
        for (&shard, id) in &input.current {
            if let Ok(i) = members.binary_search_by(|m| m.id.cmp(id)) {
                cur[shard as usize] = Some(i);
                held[i] += 1;
            }
        }
        Ok(Planner {
            input,
            s,
            members,
            cur,
            held,
            fixed: vec![None; s],
            pinned: vec![false; s],
            ignored_pins: Vec::new(),
            successions: Vec::new(),
            successor: vec![false; n],
        })
    }

    /// Whether a member is planned in its own right (not leaving, and not an empty member still joining).
    fn settled(&self, i: usize) -> bool {
        let m = self.members[i];
        !(m.leaving || (m.joining && self.held[i] == 0))
    }

    fn run(mut self) -> Plan {
        self.resolve_pins();
        self.pair_successors();
        let n = self.members.len();
        let planned: Vec<bool> = (0..n)
            .map(|i| self.settled(i) || self.successor[i])
            .collect();
        let mut target: Vec<Option<usize>> = vec![None; self.s];
        let mut quota = vec![0u32; n];
        if planned.iter().any(|&p| p) {
            quota = self.quotas(&planned);
            self.assign(&planned, &quota, &mut target);
        } else {
            // Nobody can take anything: leavers keep what they hold, the rest stays unowned.
            target.clone_from(&self.cur);
        }
        self.finish(&planned, &quota, &target)
    }

    fn resolve_pins(&mut self) {
        for (&shard, name) in &self.input.pins {
            let named: Vec<usize> = (0..self.members.len())
                .filter(|&i| *self.members[i].id.name == **name)
                .collect();
            let chosen = named
                .iter()
                .copied()
                .filter(|&i| self.settled(i))
                .min_by_key(|&i| (self.members[i].joined, i));
            let reason = match chosen {
                Some(i) => {
                    self.fixed[shard as usize] = Some(i);
                    self.pinned[shard as usize] = true;
                    continue;
                }
                None if named.is_empty() => PinIgnored::Absent,
                None if named.iter().all(|&i| self.members[i].leaving) => PinIgnored::Leaving,
                None => PinIgnored::Joining,
            };
            self.ignored_pins.push(IgnoredPin {
                shard,
                name: name.clone(),
                reason,
            });
        }
    }

    /// Rule 4: a departed member's unpinned set goes whole to a fresh (empty, not leaving) member.
    fn pair_successors(&mut self) {
        let n = self.members.len();
        // Departed sets: leavers (by join order), then absent owners (by id).
        let mut leavers: BTreeMap<(u64, usize), Vec<u32>> = BTreeMap::new();
        let mut absent: BTreeMap<&MemberId, Vec<u32>> = BTreeMap::new();
        for (&shard, id) in &self.input.current {
            if self.pinned[shard as usize] {
                continue;
            }
            match self.cur[shard as usize] {
                Some(i) if self.members[i].leaving => leavers
                    .entry((self.members[i].joined, i))
                    .or_default()
                    .push(shard),
                Some(_) => {}
                None => absent.entry(id).or_default().push(shard),
            }
        }
        let mut fresh: Vec<usize> = (0..n)
            .filter(|&i| !self.members[i].leaving && self.held[i] == 0)
            .collect();
        fresh.sort_by_key(|&i| (self.members[i].joined, i));
        let mut departed: Vec<(MemberId, bool, Vec<u32>)> = leavers
            .into_iter()
            .map(|((_, i), set)| (self.members[i].id.clone(), true, set))
            .chain(absent.into_iter().map(|(id, set)| (id.clone(), false, set)))
            .collect();
        let mut claimed = vec![false; n];
        let mut paired = vec![None; departed.len()];
        // Pass 1: a member restarted (or replaced) under the same name.
        for (d, (id, _, _)) in departed.iter().enumerate() {
            if let Some(&j) = fresh
                .iter()
                .find(|&&j| !claimed[j] && self.members[j].id.name == id.name)
            {
                claimed[j] = true;
                paired[d] = Some(j);
            }
        }
        // Pass 2: leavers take the earliest-joined remaining fresh member.
        for (d, (_, leaving, _)) in departed.iter().enumerate() {
            if paired[d].is_some() || !leaving {
                continue;
            }
            if let Some(&j) = fresh.iter().find(|&&j| !claimed[j]) {
                claimed[j] = true;
                paired[d] = Some(j);
            }
        }
        for (d, (id, _, set)) in departed.drain(..).enumerate() {
            if let Some(j) = paired[d] {
                for &shard in &set {
                    self.fixed[shard as usize] = Some(j);
                }
                self.successor[j] = true;
                self.successions.push((id, j, set));
            }
        }
    }

    /// Rule 1: quotas by weight (largest remainder), pins and successions counted first, ceilings to the
    /// members that would otherwise give a shard up.
    fn quotas(&self, planned: &[bool]) -> Vec<u32> {
        let n = self.members.len();
        let mut fixed = vec![0u128; n];
        let mut keepable = vec![0u128; n];
        for shard in 0..self.s {
            match (self.fixed[shard], self.cur[shard]) {
                (Some(i), _) => {
                    fixed[i] += 1;
                    keepable[i] += 1;
                }
                (None, Some(i)) if planned[i] => keepable[i] += 1,
                _ => {}
            }
        }
        let mut quota = vec![0u32; n];
        let mut active: Vec<usize> = (0..n).filter(|&i| planned[i]).collect();
        let mut total = self.s as u128;
        // Members whose fixed shards reach their share keep exactly those; the rest share what is left.
        loop {
            let weights: u128 = active
                .iter()
                .map(|&i| u128::from(self.members[i].weight))
                .sum();
            let (capped, rest): (Vec<usize>, Vec<usize>) = active
                .iter()
                .partition(|&&i| fixed[i] * weights >= total * u128::from(self.members[i].weight));
            if capped.is_empty() {
                break;
            }
            for &i in &capped {
                quota[i] = fixed[i] as u32;
                total -= fixed[i];
            }
            active = rest;
            if active.is_empty() {
                break;
            }
        }
        if active.is_empty() {
            return quota;
        }
        let weights: u128 = active
            .iter()
            .map(|&i| u128::from(self.members[i].weight))
            .sum();
        let mut remainder = total;
        let mut frac = vec![0u128; n];
        for &i in &active {
            let share = total * u128::from(self.members[i].weight);
            quota[i] = (share / weights) as u32;
            frac[i] = share % weights;
            remainder -= u128::from(quota[i]);
        }
        // Largest remainder; among members with a fractional share, those that would otherwise give a shard
        // up come first (movement first), then the larger fraction, then the larger holder, then the id.
        let mut candidates: Vec<usize> = active.into_iter().filter(|&i| frac[i] > 0).collect();
        candidates.sort_by(|&a, &b| {
            let over = |i: usize| keepable[i] > u128::from(quota[i]);
            over(b)
                .cmp(&over(a))
                .then(frac[b].cmp(&frac[a]))
                .then(keepable[b].cmp(&keepable[a]))
                .then(a.cmp(&b))
        });
        for &i in candidates.iter().take(remainder as usize) {
            quota[i] += 1;
        }
        quota
    }

    /// Rules 1 and 2: keep what fits the quota, release the rest at run edges, fill the deficits.
    fn assign(&self, planned: &[bool], quota: &[u32], target: &mut [Option<usize>]) {
        let n = self.members.len();
        let s = self.s;
        let mut count = vec![0u32; n];
        for (shard, slot) in target.iter_mut().enumerate() {
            *slot = match (self.fixed[shard], self.cur[shard]) {
                (Some(i), _) => Some(i),
                (None, Some(i)) if planned[i] => Some(i),
                _ => None,
            };
            if let Some(i) = *slot {
                count[i] += 1;
            }
        }
        // Surplus (unpinned shards to give up) and need, per member.
        let mut surplus: Vec<u32> = (0..n).map(|i| count[i].saturating_sub(quota[i])).collect();
        let mut need: Vec<u32> = (0..n).map(|i| quota[i].saturating_sub(count[i])).collect();

        // Release: members in order of their lowest held shard.
        let mut order: Vec<(usize, usize)> = (0..n)
            .filter(|&i| surplus[i] > 0)
            .map(|i| {
                let first = (0..s).find(|&x| target[x] == Some(i)).unwrap_or(s);
                (first, i)
            })
            .collect();
        order.sort_unstable();
        // What receivers still need, less what releases next to them already give them.
        let mut promised = need.clone();
        for (_, i) in order {
            self.release(i, surplus[i], target, &mut promised, &surplus);
            surplus[i] = 0;
        }

        // Fill: gaps between a member's own runs, then whole segments by neighbours, then extensions.
        for pass in 0..3 {
            for (a, b) in segments(target) {
                let left = if a > 0 { target[a - 1] } else { None };
                let right = if b < s { target[b] } else { None };
                let len = (b - a) as u32;
                let need_of = |m: Option<usize>, need: &[u32]| m.map_or(0, |i| need[i]);
                match pass {
                    0 => {
                        if let (Some(l), Some(r)) = (left, right) {
                            if l == r && need[l] >= len {
                                fill(target, a, b, l, &mut need);
                            }
                        }
                    }
                    _ => {
                        let (nl, nr) = (need_of(left, &need), need_of(right, &need));
                        let together = if left == right { nl } else { nl + nr };
                        if pass == 1 && together < len {
                            continue;
                        }
                        let take_l = nl.min(len) as usize;
                        if let Some(l) = left.filter(|_| take_l > 0) {
                            fill(target, a, a + take_l, l, &mut need);
                        }
                        let rest = b - (a + take_l);
                        let take_r = (need_of(right, &need) as usize).min(rest);
                        if let Some(r) = right.filter(|_| take_r > 0) {
                            fill(target, b - take_r, b, r, &mut need);
                        }
                    }
                }
            }
        }
        // New blocks: the largest needs first, each into the smallest segment that fits it whole, else the
        // largest segment.
        let mut takers: Vec<usize> = (0..n).filter(|&i| need[i] > 0).collect();
        takers.sort_by(|&a, &b| need[b].cmp(&need[a]).then(a.cmp(&b)));
        for i in takers {
            while need[i] > 0 {
                let segs = segments(target);
                let fit = segs
                    .iter()
                    .filter(|(a, b)| (b - a) as u32 >= need[i])
                    .min_by_key(|(a, b)| (b - a, *a));
                let (a, b) = match fit {
                    Some(&(a, _)) => (a, a + need[i] as usize),
                    None => match segs
                        .iter()
                        .max_by_key(|(a, b)| (b - a, std::cmp::Reverse(*a)))
                    {
                        Some(&seg) => seg,
                        None => break,
                    },
                };
                fill(target, a, b, i, &mut need);
            }
        }
    }

    /// Give up `count` unpinned shards of member `i`: whole smallest runs first (fewer ranges), then the
    /// best edge of a run (bordering a receiver, the pool, or another member that gives shards up).
    fn release(
        &self,
        i: usize,
        count: u32,
        target: &mut [Option<usize>],
        promised: &mut [u32],
        surplus: &[u32],
    ) {
        let s = self.s;
        let droppable =
            |x: usize, target: &[Option<usize>]| target[x] == Some(i) && self.fixed[x].is_none();
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut x = 0;
        while x < s {
            if droppable(x, target) {
                let a = x;
                while x < s && droppable(x, target) {
                    x += 1;
                }
                runs.push((a, x));
            } else {
                x += 1;
            }
        }
        let mut left = count as usize;
        let mut by_len = runs.clone();
        by_len.sort_by_key(|&(a, b)| (b - a, a));
        let mut dropped = BTreeSet::new();
        for &(a, b) in &by_len {
            if b - a > left {
                break;
            }
            left -= b - a;
            target[a..b].fill(None);
            dropped.insert(a);
        }
        if left == 0 {
            return;
        }
        // Then edges, best first: one bordering a receiver gives it what it still needs (it will extend
        // its run), else the pool (the released shards join a segment), else another member that gives
        // shards up. Every run left is longer than `left` (greedy above), so no run is used up.
        let mut runs: Vec<(usize, usize)> = runs
            .into_iter()
            .filter(|(a, _)| !dropped.contains(a))
            .collect();
        let score = |nb: Option<usize>, target: &[Option<usize>], promised: &[u32]| match nb
            .map(|x| target[x])
        {
            None => (0, None),
            Some(None) => (2, None),
            Some(Some(j)) if j == i => (-1, None),
            Some(Some(j)) if promised[j] > 0 => (3, Some(j)),
            Some(Some(j)) if surplus[j] > 0 => (1, None),
            Some(Some(_)) => (0, None),
        };
        while left > 0 {
            // (score, run length, prefer the right edge, earlier run).
            let best = runs
                .iter()
                .enumerate()
                .flat_map(|(k, &(a, b))| {
                    let l = score(a.checked_sub(1), target, promised);
                    let r = score((b < s).then_some(b), target, promised);
                    [(l.0, b - a, false, k, l.1), (r.0, b - a, true, k, r.1)]
                })
                .max_by(|x, y| {
                    x.0.cmp(&y.0)
                        .then(x.1.cmp(&y.1))
                        .then(x.2.cmp(&y.2))
                        .then(y.3.cmp(&x.3))
                });
            let Some((_, _, right, k, receiver)) = best else {
                break;
            };
            let amount = receiver.map_or(left, |j| (promised[j] as usize).min(left));
            let (a, b) = runs[k];
            if right {
                target[b - amount..b].fill(None);
                runs[k].1 -= amount;
            } else {
                target[a..a + amount].fill(None);
                runs[k].0 += amount;
            }
            if let Some(j) = receiver {
                promised[j] -= amount as u32;
            }
            left -= amount;
        }
    }

    fn finish(&self, planned: &[bool], quota: &[u32], target: &[Option<usize>]) -> Plan {
        let n = self.members.len();
        let mut moves = Vec::new();
        let mut unassigned = ShardSet::new();
        for (shard, &slot) in target.iter().enumerate() {
            let from = self.input.current.get(&(shard as u32));
            let Some(to) = slot else {
                unassigned.insert(shard as u32);
                continue;
            };
            if self.cur[shard] == Some(to) {
                continue;
            }
            let reason = match self.cur[shard] {
                None => MoveReason::Unowned,
                Some(i) if self.members[i].leaving => MoveReason::Leaving,
                Some(_) if self.pinned[shard] => MoveReason::Pinned,
                Some(_) => MoveReason::Rebalance,
            };
            moves.push(Move {
                shard: shard as u32,
                from: from.cloned(),
                to: self.members[to].id.clone(),
                reason,
            });
        }
        if !planned.iter().any(|&p| p) {
            // Leavers keep what they hold, but nobody is planned to take it.
            unassigned = (0..self.s as u32).collect();
        }
        let members = (0..n)
            .map(|i| {
                let m = self.members[i];
                let role = if self.successor[i] {
                    PlanRole::Successor
                } else if m.leaving {
                    PlanRole::Leaving
                } else if !planned[i] {
                    PlanRole::Joining
                } else {
                    PlanRole::Balanced
                };
                let tgt = target.iter().filter(|&&t| t == Some(i)).count() as u32;
                MemberPlan {
                    id: m.id.clone(),
                    role,
                    weight: m.weight,
                    quota: if planned[i] { quota[i] } else { tgt },
                    held: self.held[i],
                    target: tgt,
                    ranges_before: runs_of(&self.cur, i),
                    ranges: runs_of(target, i),
                }
            })
            .collect();
        let successions = self
            .successions
            .iter()
            .map(|(from, j, set)| Succession {
                from: from.clone(),
                to: self.members[*j].id.clone(),
                shards: set.iter().copied().collect(),
            })
            .collect();
        Plan {
            shards: self.input.shards,
            target: target
                .iter()
                .map(|t| t.map(|i| self.members[i].id.clone()))
                .collect(),
            moves,
            report: PlanReport {
                members,
                ignored_pins: self.ignored_pins.clone(),
                successions,
                unassigned,
            },
        }
    }
}

/// Maximal runs of unassigned shards, `[a, b)`, in shard order.
fn segments(target: &[Option<usize>]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut x = 0;
    while x < target.len() {
        if target[x].is_none() {
            let a = x;
            while x < target.len() && target[x].is_none() {
                x += 1;
            }
            out.push((a, x));
        } else {
            x += 1;
        }
    }
    out
}

fn fill(target: &mut [Option<usize>], a: usize, b: usize, i: usize, need: &mut [u32]) {
    target[a..b].fill(Some(i));
    need[i] -= (b - a) as u32;
}

/// Maximal runs of adjacent shards held by `i`.
fn runs_of(owners: &[Option<usize>], i: usize) -> u32 {
    let mut runs = 0;
    let mut prev = false;
    for &o in owners {
        let here = o == Some(i);
        if here && !prev {
            runs += 1;
        }
        prev = here;
    }
    runs
}

// The cold-start settle and join debounce as a helper of their own: the runtime keeps the same rules in
// its coordinator pass (`runtime/coordinator_pass.rs`); tests and the `testing` room use this one.
#[cfg(any(test, feature = "test-util"))]
mod settle;
#[cfg(any(test, feature = "test-util"))]
pub use settle::{Settle, SettleConfig};

#[cfg(test)]
mod tests;
