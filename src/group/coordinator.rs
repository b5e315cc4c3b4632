//! The coordinator's decision step: from the current assignment and what it observes of the members, the
//! next assignment and the takeovers to attempt.
//!
//! Every transition is justified by a fact that cannot be revoked: an ack for this move id in the member's
//! own Lease, or a successful takeover write. Two coordinators at once are harmless: the assignment is
//! written with a resourceVersion precondition. Pure: no I/O, no async, no clocks (ages are passed in).
//! Its I/O pass is `runtime/coordinator_pass.rs`; the models (`src/model_check`) step it directly, other
//! crates through `testing::coordinator`.
//!
//! See `docs/control-plane.md#coordinator` for the transition table.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::assignment::{Assignment, MAX_GENERATION_STEP};
use super::planner::{self, PlanInput};
use super::report::MemberReport;
use crate::ownership::state::{Handoff, ShardAssignment};
use crate::ownership::{MemberId, MoveId};

/// What the coordinator knows of one member (from its Lease, on its own clock).
#[derive(Clone, Debug)]
pub struct Observed {
    /// The member (name and incarnation).
    pub id: MemberId,
    /// Its renewals were seen to change within `lease_duration`.
    pub alive: bool,
    /// Its renewals were not seen to change for `lease_duration + grace` (a takeover candidate).
    pub expired: bool,
    /// A takeover of this incarnation succeeded (or its Lease is gone and expired): it acts no more.
    pub gone: bool,
    /// Its last decodable report.
    pub report: Option<MemberReport>,
    /// When it was first seen (ms, for the planner's join order).
    pub joined: u64,
    /// Its join is still debounced.
    pub joining: bool,
}

impl Observed {
    /// Seen renewing, and not gone.
    pub fn live(&self) -> bool {
        self.alive && !self.gone
    }

    /// Its report says it is leaving.
    pub fn leaving(&self) -> bool {
        self.report.as_ref().is_some_and(|r| r.leaving)
    }
}

/// One coordinator pass.
#[derive(Debug)]
pub struct StepInput<'a> {
    /// The assignment the pass starts from.
    pub current: &'a Assignment,
    /// Every member this coordinator observes.
    pub members: &'a [Observed],
    /// The wall clock (ms since the epoch): the next generation is `max(prev + 1, now_ms)`.
    pub now_ms: u64,
    /// The cold-start settle passed: unowned shards may be assigned and moves planned.
    pub ready_to_plan: bool,
    /// This coordinator renewed continuously for `lease_duration`, so its observations may justify a
    /// takeover.
    pub may_take_over: bool,
    /// Takeovers still allowed in this lease period.
    pub takeover_budget: usize,
    /// Age of each move in flight in its current phase (from when this coordinator first saw it `Moving`,
    /// or `Draining`).
    pub move_ages: &'a BTreeMap<MoveId, Duration>,
    /// A `Moving` handoff older than this is cancelled.
    pub move_timeout: Duration,
    /// A `Draining` handoff older than this is cancelled, the source re-granted at a new epoch (a
    /// source that never applies `Draining`, its assignment watch stuck, must not stall the shard's move
    /// — nor count against `max_concurrent_moves` — forever).
    pub drain_stall_timeout: Duration,
    /// Moves in flight at most (a leaver's set is exempt).
    pub max_concurrent_moves: usize,
    /// The assignment was just rebuilt (re-created blind, or written again over a rolled-back one) and
    /// not every live member has applied it, or the fences they held before may still be valid: only
    /// members holding shards against it are named again; nothing else changes (no handoff advances, no
    /// re-grant, no orphan is granted), since a member's report of what it holds may not be in yet.
    pub rebuilding: bool,
}

/// What one pass decided.
#[derive(Debug, Default)]
pub struct StepOutput {
    /// The next assignment, when anything changed.
    pub assignment: Option<Assignment>,
    /// Members to take over (a conditional write to their Lease).
    pub takeovers: Vec<MemberId>,
    /// What happened, for Events and logs.
    pub notes: Vec<String>,
    /// Moves completed in this pass.
    pub completed: usize,
}

/// One coordinator pass: advance or cancel handoffs, pick takeover candidates, plan.
pub fn step(input: &StepInput<'_>) -> StepOutput {
    let cur = input.current;
    let ctx = Ctx {
        input,
        gen: step_generation(
            input.current.view.generation,
            stale_floor(input),
            input.now_ms,
        ),
        by_id: input.members.iter().map(|m| (&m.id, m)).collect(),
    };
    let mut pass = Pass {
        next: cur.clone(),
        notes: Vec::new(),
        changed: false,
        completed: 0,
        // shards that need an owner chosen now (their owner is gone, or they have none)
        orphans: (0..cur.shards.get())
            .filter(|s| !cur.view.shards.contains_key(s))
            .collect(),
    };

    // 1. advance or cancel handoffs; orphan shards of gone owners
    for (&shard, a) in &cur.view.shards {
        match holder_against(&ctx, shard, a) {
            Claim::None => {}
            Claim::One(holder) => {
                pass.notes.push(format!(
                    "shard {shard}: {holder} holds it above the epoch {} of {} (a rolled-back assignment): named its owner again",
                    a.epoch, a.owner
                ));
                pass.decide(
                    shard,
                    Decided::Set(ShardAssignment::owned(holder.clone(), ctx.gen)),
                );
                continue;
            }
            Claim::Unresolved => {
                pass.notes.push(format!(
                    "shard {shard}: held against the assignment by a member that is not live, or by several: granted to nobody until they are gone"
                ));
                continue;
            }
        }
        if input.rebuilding {
            continue;
        }
        if let Some(e) = stale_regrant(&ctx, shard, a) {
            pass.notes.push(format!(
                "shard {shard}: {} holds or released it past epoch {} (a rolled-back assignment): re-granted at a new epoch",
                a.owner, a.epoch
            ));
            pass.decide(shard, Decided::Set(e));
            continue;
        }
        let decided = match &a.handoff {
            Handoff::Stable => on_stable(&ctx, a),
            Handoff::Moving { id, to } => on_moving(&ctx, &mut pass, shard, a, *id, to),
            Handoff::Draining { id, to } => on_draining(&ctx, &mut pass, shard, a, *id, to),
        };
        pass.decide(shard, decided);
    }

    // 2. takeover candidates: expired, not yet gone, holding or receiving something
    let takeovers = takeover_candidates(input);

    // any owner in limbo (neither live nor gone) holds its shards and blocks nothing else: the shards
    // of gone owners are granted at once (nobody serves them meanwhile), but no rebalancing move starts
    // until the limbo ends (a quota computed without it would be undone when it comes back)
    let limbo = pass
        .next
        .view
        .shards
        .values()
        .any(|a| !ctx.live(&a.owner) && !ctx.gone(&a.owner));

    // 3. plan: owners for orphans, and rebalancing moves
    if input.ready_to_plan && !input.rebuilding {
        plan(&ctx, &mut pass, !limbo);
    }

    let Pass {
        mut next,
        notes,
        changed,
        completed,
        ..
    } = pass;
    if changed {
        next.view.generation = ctx.gen;
    }
    StepOutput {
        assignment: changed.then_some(next),
        takeovers,
        notes,
        completed,
    }
}

/// What one pass reads: its input, the generation it would write, and the members by id.
struct Ctx<'a> {
    input: &'a StepInput<'a>,
    gen: u64,
    by_id: BTreeMap<&'a MemberId, &'a Observed>,
}

impl Ctx<'_> {
    fn live(&self, id: &MemberId) -> bool {
        self.by_id.get(id).is_some_and(|m| m.live())
    }

    /// Gone only by evidence: a member absent from the observations is unknown, never gone.
    fn gone(&self, id: &MemberId) -> bool {
        if planted!(UNOBSERVED_IS_GONE) {
            return self.by_id.get(id).is_none_or(|m| m.gone);
        }
        self.by_id.get(id).is_some_and(|m| m.gone)
    }

    fn report(&self, id: &MemberId) -> Option<&MemberReport> {
        self.by_id.get(id).and_then(|m| m.report.as_ref())
    }

    fn leaving(&self, id: &MemberId) -> bool {
        self.by_id.get(id).is_some_and(|m| m.leaving())
    }

    /// Move `id` has been in its current phase for `limit` or longer.
    fn aged(&self, id: MoveId, limit: Duration) -> bool {
        self.input
            .move_ages
            .get(&id)
            .is_some_and(|age| *age >= limit)
    }
}

/// What one pass has decided so far.
struct Pass {
    next: Assignment,
    notes: Vec<String>,
    changed: bool,
    completed: usize,
    orphans: BTreeSet<u32>,
}

/// One shard's decision in step 1.
enum Decided {
    /// Nothing changes.
    Keep,
    /// The shard needs a new owner from the planner (unassigned until then).
    Orphan,
    /// The shard's next entry.
    Set(ShardAssignment),
}

impl Pass {
    fn decide(&mut self, shard: u32, decided: Decided) {
        match decided {
            Decided::Keep => {}
            Decided::Orphan => {
                self.changed = true;
                self.orphans.insert(shard);
                self.next.view.shards.remove(&shard);
            }
            Decided::Set(e) => {
                self.changed = true;
                self.next.view.shards.insert(shard, e);
            }
        }
    }
}

/// The generation to write above: the current one, or, when a live owner reports a shard named to it at
/// an epoch it is past, that owner's highest seen generation — its held epoch is at most that, and the
/// re-grant must be above it. Never more than [`MAX_GENERATION_STEP`] above the current generation
/// (members refuse a generation further than that above what they accepted): a report whose seen
/// generation the step cannot pass is not followed ([`reachable`]), so one hostile report cannot push
/// generations out of reach.
fn stale_floor(input: &StepInput<'_>) -> u64 {
    let cur = input.current.view.generation;
    input
        .members
        .iter()
        .filter(|m| m.live())
        .filter_map(|m| m.report.as_ref())
        .filter(|r| !r.stale.is_empty() && reachable(cur, r.seen_generation, input.now_ms))
        .map(|r| r.seen_generation)
        .fold(cur, u64::max)
}

/// The highest generation a step from `cur` may write: at most [`MAX_GENERATION_STEP`] above `cur` *and*
/// above the wall clock — a member that just started accepts no more than its clock plus that step, so
/// steps that each stayed within a day of the last must not add up to more — and never below `cur + 1`.
pub(crate) fn generation_cap(cur: u64, now_ms: u64) -> u64 {
    cur.saturating_add(MAX_GENERATION_STEP)
        .min(now_ms.saturating_add(MAX_GENERATION_STEP))
        .max(cur.saturating_add(1))
}

/// The generation one step writes above `floor`, within [`generation_cap`].
fn step_generation(cur: u64, floor: u64, now_ms: u64) -> u64 {
    Assignment::next_generation(floor, now_ms)
        .min(generation_cap(cur, now_ms))
        .max(cur.saturating_add(1))
}

/// A generation one step from `cur` can still exceed (see [`generation_cap`]).
pub(crate) fn reachable(cur: u64, seen: u64, now_ms: u64) -> bool {
    seen < generation_cap(cur, now_ms)
}

/// Who holds a shard against its entry: members that report it `kept` (they hold it at an epoch at or
/// above the entry's, which names another owner: a rolled-back assignment, see
/// [`MemberState::kept`](crate::ownership::state::MemberState::kept)), on a report made from a view at least as
/// new as the entry.
enum Claim<'a> {
    None,
    /// One live member: it is named the owner again (it holds the shard; nobody else activates it).
    One(&'a MemberId),
    /// Several, or one that is not live: nobody is granted the shard until they are gone.
    Unresolved,
}

fn holder_against<'a>(ctx: &Ctx<'a>, shard: u32, a: &ShardAssignment) -> Claim<'a> {
    // planted: `kept` reports are ignored, so a held shard is granted on as if nobody held it
    if planted!(GRANT_OVER_KEPT_HOLDER) {
        return Claim::None;
    }
    let mut claims = ctx.input.members.iter().filter(|m| {
        !m.gone
            && m.id != a.owner
            && m.report
                .as_ref()
                .is_some_and(|r| r.kept.contains(shard) && r.applied_generation >= a.epoch)
    });
    match (claims.next(), claims.next()) {
        (None, _) => Claim::None,
        (Some(m), None) if m.live() => Claim::One(&m.id),
        _ => Claim::Unresolved,
    }
}

/// The owner of `shard` reports the entry's epoch stale (a rolled-back assignment, see
/// [`MemberState::stale`](crate::ownership::state::MemberState::stale)): the same owner at this pass's epoch,
/// any handoff cancelled (its target never admitted; the owner never drained at an epoch it is past).
/// Only on a report made from a view at least as new as the entry's epoch (an older one may predate an
/// earlier re-grant), only when this pass's epoch is above the owner's seen generation (else the owner
/// would ignore it), and only once every member not gone applied the current assignment: a member that
/// holds the shard at a higher epoch reports it `kept` on that view, and the shard goes back to it instead
/// ([`holder_against`]).
fn stale_regrant(ctx: &Ctx<'_>, shard: u32, a: &ShardAssignment) -> Option<ShardAssignment> {
    if !ctx.live(&a.owner) {
        return None;
    }
    let r = ctx.report(&a.owner)?;
    let cur = ctx.input.current.view.generation;
    let all_applied = ctx.input.members.iter().filter(|m| !m.gone).all(|m| {
        m.report
            .as_ref()
            .is_some_and(|r| r.applied_generation >= cur)
    });
    (r.stale.contains(shard)
        && r.applied_generation >= a.epoch
        && r.seen_generation < ctx.gen
        && all_applied)
        .then(|| ShardAssignment::owned(a.owner.clone(), ctx.gen))
}

/// `Stable`: only a gone owner changes anything (its shard becomes an orphan).
fn on_stable(ctx: &Ctx<'_>, a: &ShardAssignment) -> Decided {
    if ctx.gone(&a.owner) {
        Decided::Orphan
    } else {
        Decided::Keep
    }
}

/// `Moving(id → to)`: advance on the target's warm ack; cancel before release (old epoch) when the target
/// is not live or the move timed out; a gone owner hands the shard to a live target.
fn on_moving(
    ctx: &Ctx<'_>,
    pass: &mut Pass,
    shard: u32,
    a: &ShardAssignment,
    id: MoveId,
    to: &MemberId,
) -> Decided {
    let owner = &a.owner;
    let timed_out = ctx.aged(id, ctx.input.move_timeout);
    if ctx.gone(owner) {
        to_target_or_orphan(ctx, pass, shard, owner, to)
    } else if !ctx.live(to) || timed_out {
        pass.notes.push(format!(
            "shard {shard}: move {id} to {to} cancelled before release ({})",
            if timed_out {
                "timed out"
            } else {
                "target not live"
            }
        ));
        Decided::Set(ShardAssignment::owned(owner.clone(), a.epoch))
    } else if ctx.report(to).is_some_and(|r| r.warm(shard, id)) {
        Decided::Set(
            ShardAssignment::owned(owner.clone(), a.epoch)
                .with_handoff(Handoff::Draining { id, to: to.clone() }),
        )
    } else {
        Decided::Keep
    }
}

/// The owner of a moving shard is gone: a live target takes it at a new epoch, else the planner chooses.
fn to_target_or_orphan(
    ctx: &Ctx<'_>,
    pass: &mut Pass,
    shard: u32,
    owner: &MemberId,
    to: &MemberId,
) -> Decided {
    if ctx.live(to) {
        pass.notes.push(format!(
            "shard {shard}: owner {owner} gone, target {to} takes it"
        ));
        Decided::Set(ShardAssignment::owned(to.clone(), ctx.gen))
    } else {
        Decided::Orphan
    }
}

/// `Draining(id → to)`: complete on the owner's release ack; every cancel re-grants at a new epoch.
fn on_draining(
    ctx: &Ctx<'_>,
    pass: &mut Pass,
    shard: u32,
    a: &ShardAssignment,
    id: MoveId,
    to: &MemberId,
) -> Decided {
    let owner = &a.owner;
    let owner_gone = ctx.gone(owner);
    let released = ctx.report(owner).is_some_and(|r| r.released(shard, id));
    let stalled = ctx.aged(id, ctx.input.drain_stall_timeout);
    if released && ctx.live(to) {
        pass.completed += 1;
        pass.notes.push(format!(
            "shard {shard}: move {id} {owner} -> {to} completed"
        ));
        Decided::Set(ShardAssignment::owned(to.clone(), ctx.gen))
    } else if released && !owner_gone {
        pass.notes.push(format!(
            "shard {shard}: move {id} cancelled after release: {owner} re-activated"
        ));
        Decided::Set(ShardAssignment::owned(owner.clone(), ctx.gen))
    } else if owner_gone {
        to_target_or_orphan(ctx, pass, shard, owner, to)
    } else if !ctx.live(to) || stalled {
        // The model found that "before release" cannot be known: the source may have released
        // already, and a released shard stays released at its old epoch. A cancel from Draining
        // therefore always re-grants the source at a new epoch (docs/protocol.md).
        pass.notes.push(format!(
            "shard {shard}: move {id} to {to} cancelled while draining ({}): {owner} re-granted at a new epoch",
            if stalled {
                "no release in time"
            } else {
                "target not live"
            }
        ));
        Decided::Set(ShardAssignment::owned(owner.clone(), ctx.gen))
    } else {
        Decided::Keep
    }
}

/// Members to take over: expired, not yet gone, holding or receiving something, within the budget.
fn takeover_candidates(input: &StepInput<'_>) -> Vec<MemberId> {
    let mut takeovers = Vec::new();
    if !input.may_take_over {
        return takeovers;
    }
    let involved: BTreeSet<&MemberId> = input
        .current
        .view
        .shards
        .values()
        .flat_map(|a| {
            let to = match &a.handoff {
                Handoff::Moving { to, .. } | Handoff::Draining { to, .. } => Some(to),
                Handoff::Stable => None,
            };
            std::iter::once(&a.owner).chain(to)
        })
        .collect();
    for m in input.members {
        if takeovers.len() >= input.takeover_budget {
            break;
        }
        if m.expired && !m.gone && involved.contains(&m.id) {
            takeovers.push(m.id.clone());
        }
    }
    takeovers
}

/// Step 3: run the planner over the live members; assign the orphans and start rebalancing moves.
fn plan(ctx: &Ctx<'_>, pass: &mut Pass, may_move: bool) {
    let cur = ctx.input.current;
    let candidates: Vec<planner::Member> = ctx
        .input
        .members
        .iter()
        .filter(|m| m.live())
        .map(|m| {
            planner::Member::new(m.id.clone())
                .with_weight(m.report.as_ref().map_or(1, |r| r.weight.max(1)))
                .with_joined(m.joined)
                // a drained member is planned like a leaving one: quota 0, its set moves away
                .with_leaving(m.leaving() || cur.drained.contains(&*m.id.name))
                .with_joining(m.joining)
        })
        .collect();
    if candidates.is_empty() {
        return;
    }
    // a moving shard is planned where it is going: the planner must not undo it
    let owners = pass.next.view.shards.iter().map(|(s, a)| {
        let holder = match &a.handoff {
            Handoff::Moving { to, .. } | Handoff::Draining { to, .. } => to.clone(),
            Handoff::Stable => a.owner.clone(),
        };
        (*s, holder)
    });
    let mut plan_input = PlanInput::new(cur.shards).with_members(candidates);
    for (s, owner) in owners {
        plan_input = plan_input.with_owner(s, owner);
    }
    for (s, name) in &cur.pins {
        plan_input = plan_input.with_pin(*s, Arc::<str>::from(name.as_str()));
    }
    match plan_input.plan() {
        Ok(plan) => {
            for pin in &plan.report().ignored_pins {
                pass.notes.push(format!(
                    "pin of shard {} to {} ignored ({:?})",
                    pin.shard, pin.name, pin.reason
                ));
            }
            assign_orphans(ctx, pass, &plan);
            // rebalancing moves, bounded (a leaver's set is exempt), not while paused or in limbo
            if !cur.paused && may_move {
                start_moves(ctx, pass, &plan);
            }
        }
        Err(err) => pass.notes.push(format!("planner refused the input: {err}")),
    }
}

/// Move ids are taken from the generation: the first move of generation `g` is `g · 2¹⁶` (S ≤ 2¹⁶
/// moves per write), so ids are never reused, even by an assignment re-created from scratch — a member's
/// `released(shard, id)` ack of an earlier move can never complete a later one.
fn first_move_id(gen: u64) -> MoveId {
    gen.saturating_mul(1 << 16)
}

/// Orphans are assigned directly at the new generation: nobody can release them.
fn assign_orphans(ctx: &Ctx<'_>, pass: &mut Pass, plan: &planner::Plan) {
    for shard in &pass.orphans {
        if let Some(owner) = plan.owner_of(*shard) {
            pass.next
                .view
                .shards
                .insert(*shard, ShardAssignment::owned(owner.clone(), ctx.gen));
            pass.changed = true;
        }
    }
}

/// Start the planner's moves of `Stable` shards, under `max_concurrent_moves` (a leaver's set is exempt).
fn start_moves(ctx: &Ctx<'_>, pass: &mut Pass, plan: &planner::Plan) {
    let mut in_flight = pass
        .next
        .view
        .shards
        .values()
        .filter(|a| a.handoff != Handoff::Stable)
        .count();
    let mut started = 0usize;
    for mv in plan.moves() {
        let Some(from) = &mv.from else { continue };
        if pass.orphans.contains(&mv.shard) {
            continue;
        }
        let Some(entry) = pass.next.view.shards.get(&mv.shard) else {
            continue;
        };
        if entry.handoff != Handoff::Stable || &entry.owner != from || mv.to == *from {
            continue;
        }
        if !ctx.leaving(from) && in_flight >= ctx.input.max_concurrent_moves {
            continue;
        }
        let id = pass.next.next_move_id.max(first_move_id(ctx.gen));
        pass.next.next_move_id = id.saturating_add(1);
        let moved = entry.clone().with_handoff(Handoff::Moving {
            id,
            to: mv.to.clone(),
        });
        pass.next.view.shards.insert(mv.shard, moved);
        in_flight += 1;
        started += 1;
        pass.changed = true;
    }
    if started > 0 {
        pass.notes.push(format!("started {started} moves"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::ShardKey;
    use crate::ownership::state::Ack;
    use crate::shard::ShardCount;

    fn id(n: &str) -> MemberId {
        MemberId::new(n, "i")
    }

    fn obs(n: &str) -> Observed {
        Observed {
            id: id(n),
            alive: true,
            expired: false,
            gone: false,
            report: Some(MemberReport {
                weight: 1,
                ..MemberReport::default()
            }),
            joined: 0,
            joining: false,
        }
    }

    fn input<'a>(
        cur: &'a Assignment,
        members: &'a [Observed],
        ages: &'a BTreeMap<MoveId, Duration>,
    ) -> StepInput<'a> {
        StepInput {
            current: cur,
            members,
            now_ms: 1_000,
            ready_to_plan: true,
            may_take_over: true,
            takeover_budget: 1,
            move_ages: ages,
            move_timeout: Duration::from_secs(60),
            drain_stall_timeout: Duration::from_secs(60),
            max_concurrent_moves: 64,
            rebuilding: false,
        }
    }

    fn s() -> ShardCount {
        ShardCount::new(8).unwrap()
    }

    fn owners(a: &Assignment) -> Vec<(u32, String, u64, String)> {
        a.view
            .shards
            .iter()
            .map(|(s, e)| {
                (
                    *s,
                    e.owner.name.to_string(),
                    e.epoch,
                    match &e.handoff {
                        Handoff::Stable => "stable".into(),
                        Handoff::Moving { id, to } => format!("moving {id} {}", to.name),
                        Handoff::Draining { id, to } => format!("draining {id} {}", to.name),
                    },
                )
            })
            .collect()
    }

    /// A restored backup: `a`'s shards named at epochs below the one `a` holds. `a` reports them stale;
    /// the coordinator re-grants each to `a` above `a`'s seen generation, cancelling the move the backup
    /// carried — not after `drain_stall_timeout`, which is what waiting for `a`'s release would take.
    #[test]
    fn a_shard_its_owner_reports_stale_is_re_granted_to_it_above_its_seen_generation() {
        let mut cur = settled(&["a", "b"]);
        let mine: Vec<u32> = cur.owned_by(&id("a")).iter().collect();
        let moving = mine[0];
        let e = cur.view.shards.get_mut(&moving).unwrap();
        e.handoff = Handoff::Draining { id: 7, to: id("b") };
        let mut members = [obs("a"), obs("b")];
        let r = members[0].report.as_mut().unwrap();
        r.stale = mine.iter().copied().collect();
        r.applied_generation = cur.view.generation;
        r.seen_generation = 5_000;
        let ages = BTreeMap::new();
        // not before every member applied the assignment (b might hold a shard against it)
        let out = step(&input(&cur, &members, &ages));
        assert!(out.assignment.is_none(), "{:?}", out.notes);
        members[1].report.as_mut().unwrap().applied_generation = cur.view.generation;
        let next = step(&input(&cur, &members, &ages)).assignment.unwrap();
        assert!(next.view.generation > 5_000, "above a's seen generation");
        for s in &mine {
            let e = &next.view.shards[s];
            assert_eq!(
                (&*e.owner.name, e.epoch, &e.handoff),
                ("a", next.view.generation, &Handoff::Stable),
                "shard {s}"
            );
        }
        // a report from before the entry was written (an earlier re-grant) changes nothing
        let mut again = [obs("a"), obs("b")];
        let r = again[0].report.as_mut().unwrap();
        r.stale = mine.iter().copied().collect();
        r.applied_generation = next.view.generation - 1;
        let out = step(&input(&next, &again, &ages));
        assert!(out.assignment.is_none(), "{:?}", out.notes);
        // an owner not seen renewing is not re-granted anything
        let mut dead = [obs("a"), obs("b")];
        dead[0].alive = false;
        let r = dead[0].report.as_mut().unwrap();
        r.stale = mine.iter().copied().collect();
        r.applied_generation = cur.view.generation;
        let out = step(&input(&cur, &dead, &ages));
        assert!(out
            .assignment
            .is_none_or(|n| mine.iter().all(|s| n.view.shards[s].epoch < 5_000)));
    }

    /// A hostile report cannot push generations out of reach: a seen generation no step can pass is not
    /// followed, and a step above a reachable one stays within one bounded step of the current generation
    /// — which every member that accepted the current one accepts.
    #[test]
    fn a_generation_step_never_exceeds_the_bound_on_the_stale_path() {
        let step_max = crate::group::assignment::MAX_GENERATION_STEP;
        let cur = settled(&["a", "b"]);
        let g = cur.view.generation;
        let ages = BTreeMap::new();
        let stale_members = |seen: u64| {
            let mut members = [obs("a"), obs("b")];
            for m in &mut members {
                m.report.as_mut().unwrap().applied_generation = g;
            }
            let r = members[0].report.as_mut().unwrap();
            r.stale = cur.owned_by(&id("a"));
            r.seen_generation = seen;
            members
        };
        // out of reach: not followed
        for seen in [u64::MAX, g + step_max, g + 3 * step_max] {
            let out = step(&input(&cur, &stale_members(seen), &ages));
            assert!(out.assignment.is_none(), "seen {seen}: {:?}", out.notes);
        }
        // within reach: above it, and at most one bounded step above the current generation
        let seen = g + step_max - 1;
        let next = step(&input(&cur, &stale_members(seen), &ages))
            .assignment
            .unwrap();
        assert!(next.view.generation > seen);
        assert!(
            next.view.generation <= g + step_max,
            "{}",
            next.view.generation
        );
        for s in cur.owned_by(&id("a")).iter() {
            assert_eq!(next.view.shards[&s].epoch, next.view.generation);
        }
    }

    /// A rolled-back assignment names `a` for a shard `b` holds at a higher epoch (`b` reports it kept):
    /// the shard goes back to `b`, whatever `a` reports — never to `a`, which would let both admit it.
    /// Several holders, or one not seen renewing: nobody is granted it.
    #[test]
    fn a_shard_a_member_holds_against_the_assignment_is_named_to_it_again() {
        let cur = settled(&["a", "b"]);
        let shard = cur.owned_by(&id("a")).iter().next().unwrap();
        let ages = BTreeMap::new();
        let mut members = [obs("a"), obs("b"), obs("c")];
        for m in &mut members {
            m.report.as_mut().unwrap().applied_generation = cur.view.generation;
        }
        // a released it long ago and says so; b holds it above the entry's epoch
        members[0].report.as_mut().unwrap().stale.insert(shard);
        members[1].report.as_mut().unwrap().kept.insert(shard);
        let next = step(&no_plan(input(&cur, &members, &ages)))
            .assignment
            .unwrap();
        let e = &next.view.shards[&shard];
        assert_eq!((&*e.owner.name, e.epoch), ("b", next.view.generation));
        // while rebuilding, only that
        let mut i = no_plan(input(&cur, &members, &ages));
        i.rebuilding = true;
        let next = step(&i).assignment.unwrap();
        assert_eq!(&*next.view.shards[&shard].owner.name, "b");
        // two claim it: nobody gets it
        members[2].report.as_mut().unwrap().kept.insert(shard);
        let out = step(&no_plan(input(&cur, &members, &ages)));
        assert!(out
            .assignment
            .is_none_or(|n| n.view.shards[&shard] == cur.view.shards[&shard]));
        // one claims it but is not seen renewing: nobody gets it
        members[2].report.as_mut().unwrap().kept = Default::default();
        members[1].alive = false;
        let out = step(&no_plan(input(&cur, &members, &ages)));
        assert!(out
            .assignment
            .is_none_or(|n| n.view.shards[&shard] == cur.view.shards[&shard]));
    }

    #[test]
    fn cold_start_assigns_everything_once_ready() {
        let cur = Assignment::empty(s(), ShardKey::Uid);
        let members = [obs("a"), obs("b")];
        let ages = BTreeMap::new();
        let mut i = input(&cur, &members, &ages);
        i.ready_to_plan = false;
        assert!(step(&i).assignment.is_none(), "nothing before the settle");
        i.ready_to_plan = true;
        let next = step(&i).assignment.unwrap();
        assert_eq!(next.view.generation, 1_000);
        assert!(next.unowned().is_empty());
        assert_eq!(next.owned_by(&id("a")).len(), 4);
        assert!(next
            .view
            .shards
            .values()
            .all(|a| a.epoch == 1_000 && a.handoff == Handoff::Stable));
    }

    /// No planning: only step 1 (handoffs, re-grants, holders).
    fn no_plan(mut i: StepInput<'_>) -> StepInput<'_> {
        i.ready_to_plan = false;
        i
    }

    fn settled(members: &[&str]) -> Assignment {
        let cur = Assignment::empty(s(), ShardKey::Uid);
        let obs: Vec<Observed> = members.iter().map(|m| obs(m)).collect();
        let ages = BTreeMap::new();
        step(&input(&cur, &obs, &ages)).assignment.unwrap()
    }

    #[test]
    fn a_join_starts_moves_then_acks_advance_them() {
        let cur = settled(&["a", "b"]);
        let mut members = vec![obs("a"), obs("b"), obs("c")];
        let ages = BTreeMap::new();
        let moving = step(&input(&cur, &members, &ages)).assignment.unwrap();
        let moves: Vec<_> = owners(&moving)
            .into_iter()
            .filter(|o| o.3.starts_with("moving"))
            .collect();
        assert_eq!(
            moves.len(),
            2,
            "8 shards over 3 members: c takes 2 (the surplus of a and b)"
        );
        // no ack yet: nothing changes
        assert!(step(&input(&moving, &members, &ages)).assignment.is_none());
        // c acks warm for those shards
        let warm: Vec<Ack> = moving
            .view
            .shards
            .iter()
            .filter_map(|(s, a)| match &a.handoff {
                Handoff::Moving { id, .. } => Some(Ack::Warm {
                    shard: *s,
                    move_id: *id,
                }),
                _ => None,
            })
            .collect();
        members[2].report.as_mut().unwrap().acks = warm;
        let draining = step(&input(&moving, &members, &ages)).assignment.unwrap();
        assert_eq!(
            owners(&draining)
                .iter()
                .filter(|o| o.3.starts_with("draining"))
                .count(),
            2
        );
        // the owners release
        for m in &mut members[..2] {
            let me = m.id.clone();
            m.report.as_mut().unwrap().acks = draining
                .view
                .shards
                .iter()
                .filter(|(_, a)| a.owner == me)
                .filter_map(|(s, a)| match &a.handoff {
                    Handoff::Draining { id, .. } => Some(Ack::Released {
                        shard: *s,
                        move_id: *id,
                    }),
                    _ => None,
                })
                .collect();
        }
        let mut i = input(&draining, &members, &ages);
        i.now_ms = 2_000;
        let done = step(&i).assignment.unwrap();
        assert_eq!(done.owned_by(&id("c")).len(), 2);
        assert!(done
            .view
            .shards
            .values()
            .all(|a| a.handoff == Handoff::Stable));
        assert!(done
            .owned_by(&id("c"))
            .iter()
            .all(|s| done.view.shards[&s].epoch == done.view.generation));
    }

    #[test]
    fn cancels_before_and_after_release() {
        let cur = settled(&["a", "b"]);
        let members = vec![obs("a"), obs("b"), obs("c")];
        let ages = BTreeMap::new();
        let moving = step(&input(&cur, &members, &ages)).assignment.unwrap();
        // c dies before warming: cancel, owners keep their epochs
        let mut dead_c = members.clone();
        dead_c[2].alive = false;
        let back = step(&input(&moving, &dead_c, &ages)).assignment.unwrap();
        assert_eq!(back.owned_by(&id("a")), cur.owned_by(&id("a")));
        assert!(back
            .view
            .shards
            .iter()
            .all(|(s, a)| a.epoch == cur.view.shards[s].epoch));
        // after release: c dies, the owner is re-activated at a new epoch
        let mut draining = moving.clone();
        let mut released = Vec::new();
        for (s, a) in draining.view.shards.iter_mut() {
            if let Handoff::Moving { id, to } = a.handoff.clone() {
                a.handoff = Handoff::Draining { id, to };
                released.push((
                    a.owner.clone(),
                    Ack::Released {
                        shard: *s,
                        move_id: id,
                    },
                ));
            }
        }
        let mut m2 = dead_c.clone();
        for (owner, ack) in released {
            let m = m2.iter_mut().find(|m| m.id == owner).unwrap();
            m.report.as_mut().unwrap().acks.push(ack);
        }
        let mut i = input(&draining, &m2, &ages);
        i.now_ms = 5_000;
        let re = step(&i).assignment.unwrap();
        let re_activated: Vec<_> = re
            .view
            .shards
            .values()
            .filter(|a| a.epoch == re.view.generation)
            .collect();
        assert_eq!(
            re_activated.len(),
            2,
            "released shards come back at a new epoch"
        );
        assert!(re.owned_by(&id("c")).is_empty());
    }

    #[test]
    fn takeover_then_reassignment() {
        let cur = settled(&["a", "b"]);
        let mut members = vec![obs("a"), obs("b")];
        members[1].alive = false;
        members[1].expired = true;
        let ages = BTreeMap::new();
        let mut i = input(&cur, &members, &ages);
        i.may_take_over = false;
        let out = step(&i);
        assert!(
            out.takeovers.is_empty(),
            "no takeover without continuous renewals"
        );
        assert!(
            out.assignment.is_none(),
            "b is in limbo: nothing is planned around it"
        );
        let out = step(&input(&cur, &members, &ages));
        assert_eq!(out.takeovers, vec![id("b")]);
        // the takeover write succeeded: b is gone, its shards go to a at a new epoch
        members[1].gone = true;
        let mut i = input(&cur, &members, &ages);
        i.now_ms = 9_000;
        let next = step(&i).assignment.unwrap();
        assert_eq!(next.owned_by(&id("a")).len(), 8);
        assert!(next
            .owned_by(&id("a"))
            .iter()
            .filter(|s| cur.view.shards[s].owner == id("b"))
            .all(|s| next.view.shards[&s].epoch == 9_000));
    }

    /// Limbo blocks nothing but the limbo owner's own shards: a gone owner's shards are granted at once
    /// (held back a whole takeover-budget period before), while no rebalancing move starts.
    #[test]
    fn a_gone_owners_shards_are_granted_while_another_owner_is_in_limbo() {
        let cur = settled(&["a", "b", "c"]);
        let mut members = vec![obs("a"), obs("b"), obs("c"), obs("d")];
        // b was taken over; c expired but is still waiting for the takeover budget
        members[1].alive = false;
        members[1].gone = true;
        members[2].alive = false;
        members[2].expired = true;
        let ages = BTreeMap::new();
        let mut i = input(&cur, &members, &ages);
        i.takeover_budget = 0;
        i.now_ms = 9_000;
        let out = step(&i);
        assert!(out.takeovers.is_empty(), "no budget left");
        let next = out.assignment.expect("b's shards must be granted now");
        for (s, e) in &cur.view.shards {
            let now = &next.view.shards[s];
            if e.owner == id("b") {
                assert!(now.owner == id("a") || now.owner == id("d"), "{s}: {now:?}");
                assert_eq!(now.epoch, 9_000, "a new epoch for a gone owner's shard");
            } else {
                assert_eq!(
                    now, e,
                    "shard {s} must not change (c is in limbo, a is live)"
                );
            }
        }
        assert_eq!(
            next.moves_in_flight(),
            0,
            "no rebalancing move while c is in limbo"
        );
    }

    #[test]
    fn the_move_bound_holds_except_for_leavers() {
        let cur = settled(&["a"]);
        let members = vec![obs("a"), obs("b")];
        let ages = BTreeMap::new();
        let mut i = input(&cur, &members, &ages);
        i.max_concurrent_moves = 1;
        let next = step(&i).assignment.unwrap();
        assert_eq!(next.moves_in_flight(), 1);
        // a leaver's whole set moves at once
        let mut leaving = members.clone();
        leaving[0].report.as_mut().unwrap().leaving = true;
        let mut i = input(&cur, &leaving, &ages);
        i.max_concurrent_moves = 1;
        let next = step(&i).assignment.unwrap();
        assert_eq!(next.moves_in_flight(), 8);
    }

    #[test]
    fn paused_starts_no_moves_but_advances_handoffs() {
        let mut cur = settled(&["a"]);
        cur.paused = true;
        let members = vec![obs("a"), obs("b")];
        let ages = BTreeMap::new();
        assert!(step(&input(&cur, &members, &ages)).assignment.is_none());
    }

    #[test]
    fn a_drained_member_gives_its_set_away_but_keeps_it_when_nobody_else_is_live() {
        let mut cur = settled(&["a", "b"]);
        cur.drained.insert("a".into());
        let held = cur.owned_by(&id("a")).len();
        assert!(held > 0);
        let ages = BTreeMap::new();
        // a (drained) and b live: every shard of a moves to b, under the ordinary move bound
        let members = vec![obs("a"), obs("b")];
        let mut i = input(&cur, &members, &ages);
        i.max_concurrent_moves = 2;
        let next = step(&i).assignment.unwrap();
        assert_eq!(
            next.moves_in_flight(),
            2,
            "a drain is not exempt from the bound"
        );
        i.max_concurrent_moves = 64;
        let next = step(&i).assignment.unwrap();
        assert_eq!(next.moves_in_flight(), held);
        assert!(next
            .view
            .shards
            .values()
            .filter(|a| a.owner == id("a"))
            .all(|a| matches!(&a.handoff, Handoff::Moving { to, .. } if *to == id("b"))));
        // a pin to a drained member is ignored
        let mut pinned = cur.clone();
        let b_shard = pinned.owned_by(&id("b")).iter().next().unwrap();
        pinned.pins.insert(b_shard, "a".into());
        let out = step(&input(&pinned, &members, &ages));
        assert!(
            out.notes.iter().any(|n| n.contains("ignored")),
            "{:?}",
            out.notes
        );
        let next = out.assignment.unwrap();
        assert_eq!(next.view.shards[&b_shard].handoff, Handoff::Stable);
        // only the drained member is live: it keeps everything (a drain never orphans a shard)
        let alone = vec![obs("a")];
        let mut only_a = Assignment::empty(cur.shards, cur.key);
        for s in 0..cur.shards.get() {
            only_a
                .view
                .shards
                .insert(s, ShardAssignment::owned(id("a"), 1));
        }
        only_a.view.generation = 1;
        only_a.drained.insert("a".into());
        assert!(step(&input(&only_a, &alone, &ages)).assignment.is_none());
    }

    /// The race the handoff model found: the coordinator cancels a Draining move on a read of the source's
    /// Lease from before its release ack. Re-granting at the old epoch would leave the shard owned by
    /// nobody (released stays released); a new epoch makes the source activate it again.
    #[test]
    fn cancel_from_draining_regrants_at_a_new_epoch() {
        let cur = settled(&["a", "b"]);
        let mut draining = cur.clone();
        let shard = *draining
            .owned_by(&id("a"))
            .iter()
            .collect::<Vec<_>>()
            .first()
            .unwrap();
        let old_epoch = draining.view.shards[&shard].epoch;
        draining.view.shards.get_mut(&shard).unwrap().handoff =
            Handoff::Draining { id: 1, to: id("c") };
        draining.next_move_id = 2;
        // c (the target) is gone and a's release is not (yet) visible
        let members = vec![obs("a"), obs("b")];
        let ages = BTreeMap::new();
        let mut i = input(&draining, &members, &ages);
        i.now_ms = 50_000;
        let next = step(&i).assignment.unwrap();
        let e = &next.view.shards[&shard];
        assert_eq!(e.owner, id("a"));
        assert_eq!(e.handoff, Handoff::Stable);
        assert!(e.epoch > old_epoch, "a new epoch, never the old one");
        assert_eq!(e.epoch, next.view.generation);
    }

    /// A source that never releases (its assignment watch stuck: it never applied `Draining`) while
    /// the target is live and warm. Before the fix the move stayed `Draining` forever. After
    /// `drain_stall_timeout` in that phase it is cancelled: the source re-granted at a new epoch.
    #[test]
    fn a_draining_move_without_release_is_cancelled_after_the_stall_timeout() {
        let cur = settled(&["a", "b"]);
        let mut draining = cur.clone();
        let shard = draining.owned_by(&id("a")).iter().next().unwrap();
        let old_epoch = draining.view.shards[&shard].epoch;
        draining.view.shards.get_mut(&shard).unwrap().handoff =
            Handoff::Draining { id: 7, to: id("b") };
        draining.next_move_id = 8;
        let mut members = vec![obs("a"), obs("b")];
        members[1]
            .report
            .as_mut()
            .unwrap()
            .acks
            .push(Ack::Warm { shard, move_id: 7 });
        let mut ages = BTreeMap::from([(7, Duration::from_secs(59))]);
        let mut i = input(&draining, &members, &ages);
        i.now_ms = 50_000;
        assert!(
            step(&i).assignment.is_none(),
            "within the stall timeout the move waits for the release"
        );
        ages.insert(7, Duration::from_secs(60));
        let mut i = input(&draining, &members, &ages);
        i.now_ms = 50_000;
        let next = step(&i).assignment.expect("the stalled move is cancelled");
        let e = &next.view.shards[&shard];
        assert_eq!(e.owner, id("a"));
        assert_eq!(e.handoff, Handoff::Stable);
        assert!(e.epoch > old_epoch, "a new epoch, never the old one");
    }

    /// An owner the coordinator has not observed is unknown (limbo), never gone: its shards stay, and
    /// nothing is planned around it.
    #[test]
    fn an_unobserved_owner_keeps_its_shards() {
        let cur = settled(&["a", "b"]);
        let members = vec![obs("a")];
        let ages = BTreeMap::new();
        let out = step(&input(&cur, &members, &ages));
        assert!(
            out.assignment.is_none(),
            "b's shards must stay with b: {:?}",
            out.assignment.map(|a| owners(&a))
        );
        assert!(out.takeovers.is_empty());
        // the runtime passes it as not live and not gone: the same
        let mut b = obs("b");
        b.alive = false;
        let members = vec![obs("a"), b];
        assert!(step(&input(&cur, &members, &ages)).assignment.is_none());
    }

    /// Move ids come from the generation, so an assignment re-created from scratch (next id 1) never
    /// reuses the id of an earlier move.
    #[test]
    fn move_ids_are_never_reused_after_a_fresh_assignment() {
        let cur = settled(&["a"]);
        let members = vec![obs("a"), obs("b")];
        let ages = BTreeMap::new();
        let mut i = input(&cur, &members, &ages);
        i.now_ms = 2_000;
        let first = step(&i).assignment.unwrap();
        let ids = |a: &Assignment| -> BTreeSet<MoveId> {
            a.view
                .shards
                .values()
                .filter_map(|e| match &e.handoff {
                    Handoff::Moving { id, .. } => Some(*id),
                    _ => None,
                })
                .collect()
        };
        let old = ids(&first);
        assert!(!old.is_empty());
        // the same owners, re-created: next_move_id starts at 1 again
        let mut fresh = Assignment::empty(cur.shards, cur.key);
        fresh.view = cur.view.clone();
        fresh.view.generation = first.view.generation;
        let mut i = input(&fresh, &members, &ages);
        i.now_ms = 3_000;
        let again = step(&i).assignment.unwrap();
        let new = ids(&again);
        assert!(!new.is_empty());
        assert!(old.is_disjoint(&new), "move ids reused: {old:?} / {new:?}");
    }
}
