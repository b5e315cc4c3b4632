//! The coordinator's decision step: from the current assignment and what it observes of the members, the
//! next assignment and the takeovers to attempt.
//!
//! Every transition is justified by a fact that cannot be revoked (`docs/DESIGN.md` §3): an ack for this
//! move id in the member's own Lease, or a successful takeover write. The leader Lease only decides who
//! computes; two coordinators at once are harmless, because the assignment is written with a
//! resourceVersion precondition.
//!
//! | shard | observed | next |
//! |---|---|---|
//! | `Moving(m → B)` | B acked `warm(s, m)` | `Draining(m → B)` |
//! | `Moving(m → B)` | B gone, not live, or the move timed out | cancel before release: `Stable` (owner keeps its epoch) |
//! | `Draining(m → B)` | owner acked `released(s, m)`, B live | `Owned(B, epoch = generation)` |
//! | `Draining(m → B)` | owner acked `released(s, m)`, B not live | cancel after release: `Owned(owner, epoch = generation)` |
//! | `Draining(m → B)` | B not live, no release seen | cancel: `Owned(owner, epoch = generation)` — a release may have happened unseen, so always a new epoch |
//! | any | owner taken over | `Owned(B or planner's choice, epoch = generation)` |
//! | unowned | planning allowed | `Owned(planner's choice, epoch = generation)` |
//! | `Stable` | planner moves it, under the move bound | `Moving(new id → target)` |
//!
//! Pure: no I/O, no async, no clocks (ages are passed in).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::assignment::Assignment;
use super::planner::{self, PlanInput};
use super::report::MemberReport;
use crate::ownership::{Handoff, MemberId, MoveId, ShardAssignment};

/// What the coordinator knows of one member (from its Lease, on its own clock).
#[derive(Clone, Debug)]
pub(crate) struct Observed {
    pub(crate) id: MemberId,
    /// Its renewals were seen to change within `lease_duration`.
    pub(crate) alive: bool,
    /// Its renewals were not seen to change for `lease_duration + grace` (a takeover candidate).
    pub(crate) expired: bool,
    /// A takeover of this incarnation succeeded (or its Lease is gone and expired): it acts no more.
    pub(crate) gone: bool,
    /// Its last decodable report.
    pub(crate) report: Option<MemberReport>,
    /// When it was first seen (ms, for the planner's join order).
    pub(crate) joined: u64,
    /// Its join is still debounced.
    pub(crate) joining: bool,
}

impl Observed {
    pub(crate) fn live(&self) -> bool {
        self.alive && !self.gone
    }

    pub(crate) fn leaving(&self) -> bool {
        self.report.as_ref().is_some_and(|r| r.leaving)
    }
}

/// One coordinator pass.
pub(crate) struct StepInput<'a> {
    pub(crate) current: &'a Assignment,
    pub(crate) members: &'a [Observed],
    pub(crate) now_ms: u64,
    /// The cold-start settle passed: unowned shards may be assigned and moves planned.
    pub(crate) ready_to_plan: bool,
    /// This coordinator renewed continuously for `lease_duration`, so its observations may justify a
    /// takeover.
    pub(crate) may_take_over: bool,
    /// Takeovers still allowed in this lease period.
    pub(crate) takeover_budget: usize,
    /// Age of each move in flight (from when this coordinator first saw it).
    pub(crate) move_ages: &'a BTreeMap<MoveId, Duration>,
    pub(crate) move_timeout: Duration,
    pub(crate) max_concurrent_moves: usize,
}

/// What one pass decided.
#[derive(Debug, Default)]
pub(crate) struct StepOutput {
    /// The next assignment, when anything changed.
    pub(crate) assignment: Option<Assignment>,
    /// Members to take over (a conditional write to their Lease).
    pub(crate) takeovers: Vec<MemberId>,
    /// What happened, for Events and logs.
    pub(crate) notes: Vec<String>,
    /// Moves completed in this pass.
    pub(crate) completed: usize,
}

pub(crate) fn step(input: &StepInput<'_>) -> StepOutput {
    let cur = input.current;
    let gen = Assignment::next_generation(cur.view.generation, input.now_ms);
    let by_id: BTreeMap<&MemberId, &Observed> = input.members.iter().map(|m| (&m.id, m)).collect();
    let live = |id: &MemberId| by_id.get(id).is_some_and(|m| m.live());
    let gone = |id: &MemberId| by_id.get(id).is_none_or(|m| m.gone);
    let report = |id: &MemberId| by_id.get(id).and_then(|m| m.report.as_ref());

    let mut next = cur.clone();
    let mut notes = Vec::new();
    let mut changed = false;
    let mut completed = 0usize;
    // shards that need an owner chosen now (their owner is gone, or they have none)
    let mut orphans: BTreeSet<u32> = (0..cur.shards.get())
        .filter(|s| !cur.view.shards.contains_key(s))
        .collect();

    // 1. advance or cancel handoffs; orphan shards of gone owners
    for (&shard, a) in &cur.view.shards {
        let owner = &a.owner;
        let owner_gone = gone(owner);
        let new_entry: Option<Option<ShardAssignment>> = match &a.handoff {
            Handoff::Stable => {
                if owner_gone {
                    orphans.insert(shard);
                    Some(None)
                } else {
                    None
                }
            }
            Handoff::Moving { id, to } => {
                let timed_out = input
                    .move_ages
                    .get(id)
                    .is_some_and(|age| *age >= input.move_timeout);
                if owner_gone {
                    if live(to) {
                        notes.push(format!(
                            "shard {shard}: owner {owner} gone, target {to} takes it"
                        ));
                        Some(Some(ShardAssignment::owned(to.clone(), gen)))
                    } else {
                        orphans.insert(shard);
                        Some(None)
                    }
                } else if !live(to) || timed_out {
                    notes.push(format!(
                        "shard {shard}: move {id} to {to} cancelled before release ({})",
                        if timed_out {
                            "timed out"
                        } else {
                            "target not live"
                        }
                    ));
                    Some(Some(ShardAssignment::owned(owner.clone(), a.epoch)))
                } else if report(to).is_some_and(|r| r.warm(shard, *id)) {
                    Some(Some(
                        ShardAssignment::owned(owner.clone(), a.epoch).with_handoff(
                            Handoff::Draining {
                                id: *id,
                                to: to.clone(),
                            },
                        ),
                    ))
                } else {
                    None
                }
            }
            Handoff::Draining { id, to } => {
                let released = report(owner).is_some_and(|r| r.released(shard, *id));
                if released && live(to) {
                    completed += 1;
                    notes.push(format!(
                        "shard {shard}: move {id} {owner} -> {to} completed"
                    ));
                    Some(Some(ShardAssignment::owned(to.clone(), gen)))
                } else if released && !owner_gone {
                    notes.push(format!(
                        "shard {shard}: move {id} cancelled after release: {owner} re-activated"
                    ));
                    Some(Some(ShardAssignment::owned(owner.clone(), gen)))
                } else if owner_gone {
                    if live(to) {
                        notes.push(format!(
                            "shard {shard}: owner {owner} gone while draining, {to} takes it"
                        ));
                        Some(Some(ShardAssignment::owned(to.clone(), gen)))
                    } else {
                        orphans.insert(shard);
                        Some(None)
                    }
                } else if !live(to) {
                    // The model found that "before release" cannot be known: the source may have released
                    // already, and a released shard stays released at its old epoch. A cancel from Draining
                    // therefore always re-grants the source at a new epoch (docs/protocol.md).
                    notes.push(format!(
                        "shard {shard}: move {id} to {to} cancelled while draining: {owner} re-granted at a new epoch"
                    ));
                    Some(Some(ShardAssignment::owned(owner.clone(), gen)))
                } else {
                    None
                }
            }
        };
        if let Some(entry) = new_entry {
            changed = true;
            match entry {
                Some(e) => {
                    next.view.shards.insert(shard, e);
                }
                None => {
                    next.view.shards.remove(&shard);
                }
            }
        }
    }

    // 2. takeover candidates: expired, not yet gone, holding or receiving something
    let involved: BTreeSet<&MemberId> = cur
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
    let mut takeovers = Vec::new();
    if input.may_take_over {
        for m in input.members {
            if takeovers.len() >= input.takeover_budget {
                break;
            }
            if m.expired && !m.gone && involved.contains(&m.id) {
                takeovers.push(m.id.clone());
            }
        }
    }

    // any owner in limbo (neither live nor gone) holds its shards; do not plan around it this pass
    let limbo = next
        .view
        .shards
        .values()
        .any(|a| !live(&a.owner) && !gone(&a.owner));

    // 3. plan: owners for orphans, and rebalancing moves
    if input.ready_to_plan && !limbo {
        let candidates: Vec<planner::Member> = input
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
        if !candidates.is_empty() {
            // a moving shard is planned where it is going: the planner must not undo it
            let owners = next.view.shards.iter().map(|(s, a)| {
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
                        notes.push(format!(
                            "pin of shard {} to {} ignored ({:?})",
                            pin.shard, pin.name, pin.reason
                        ));
                    }
                    // orphans: assign directly, nobody can release them
                    for shard in &orphans {
                        if let Some(owner) = plan.owner_of(*shard) {
                            next.view
                                .shards
                                .insert(*shard, ShardAssignment::owned(owner.clone(), gen));
                            changed = true;
                        }
                    }
                    // rebalancing moves, bounded (a leaver's set is exempt), not while paused
                    if !cur.paused {
                        let mut in_flight = next
                            .view
                            .shards
                            .values()
                            .filter(|a| a.handoff != Handoff::Stable)
                            .count();
                        let mut started = 0usize;
                        for mv in plan.moves() {
                            let Some(from) = &mv.from else { continue };
                            if orphans.contains(&mv.shard) {
                                continue;
                            }
                            let Some(entry) = next.view.shards.get(&mv.shard) else {
                                continue;
                            };
                            if entry.handoff != Handoff::Stable
                                || &entry.owner != from
                                || mv.to == *from
                            {
                                continue;
                            }
                            let exempt = by_id.get(from).is_some_and(|m| m.leaving());
                            if !exempt && in_flight >= input.max_concurrent_moves {
                                continue;
                            }
                            let id = next.next_move_id;
                            next.next_move_id += 1;
                            let moved = entry.clone().with_handoff(Handoff::Moving {
                                id,
                                to: mv.to.clone(),
                            });
                            next.view.shards.insert(mv.shard, moved);
                            in_flight += 1;
                            started += 1;
                            changed = true;
                        }
                        if started > 0 {
                            notes.push(format!("started {started} moves"));
                        }
                    }
                }
                Err(err) => notes.push(format!("planner refused the input: {err}")),
            }
        }
    }

    if changed {
        next.view.generation = gen;
    }
    StepOutput {
        assignment: changed.then_some(next),
        takeovers,
        notes,
        completed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::ShardKey;
    use crate::ownership::Ack;
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
            max_concurrent_moves: 64,
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
}
