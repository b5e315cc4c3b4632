//! Model (i): handoff and cancellation. N = 2 members, S = 2 shards, untimed.
//!
//! Drives the real [`MemberState::apply`] and, for the protocol as implemented ([`CancelRule::NewEpoch`]),
//! the real `coordinator::step` for every advance, completion and cancel (`Act::Coordinate`); only move
//! starts (`StartMove`) and the old rule kept as a regression ([`CancelRule::AsDesigned`]) are
//! hand-written. Assignment writes are CAS steps justified by acks; views, acks and fenced commits come
//! late; a drain waits for the gates [`ShardGates`] keeps; [`rewrite_model`] writes older assignments back.
//! Symmetry: the two members swap, so labels in counterexample paths may swap between steps.
//!
//! See `docs/protocol.md#modelling-details` and "The models" above it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::group::assignment::{Assignment, AssignmentView, Handoff, ShardAssignment};
use crate::group::report::{Ack, MemberReport};
use crate::ownership::state::{Event, Input, MemberId, MemberState, ShardState};
use crate::testing::coordinator::{self, Observed, StepInput};
use crate::testing::member::ShardGates;
use crate::{ShardCount, ShardKey, ShardSet};
use stateright::{Model, Property};

use super::first_violation;
use super::{check_liveness, check_safety, deep, find_violation, plant, representative, Plant};

const S: usize = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum H {
    Stable,
    Moving(u64, u8),
    Draining(u64, u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Sh {
    owner: u8,
    epoch: u64,
    h: H,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Asg {
    gen: u64,
    shards: [Sh; S],
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Mem {
    st: MemberState,
    /// Acks published in the member's lease: facts that only accumulate.
    published: BTreeSet<Ack>,
    queued: [bool; S],
    /// Per shard, the gates the library keeps (current and retired), numbered canonically by
    /// [`normalize`]: their order in the drain set.
    gates: [ShardGates<u8>; S],
    /// The rest of its report as last published (only outside a calm rewrite configuration: published by
    /// `Renew`, so the coordinator may act on an older one).
    rep: Rep,
}

/// A member's report besides its acks: the generation it applied, and the shards it reports `kept` (it
/// holds them; the view names another owner at or below its epoch) and `stale` (the view names it at an
/// epoch it is past).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Rep {
    applied: u64,
    kept: [bool; S],
    stale: [bool; S],
}

impl Rep {
    fn of(st: &MemberState) -> Rep {
        let mut r = Rep {
            applied: st.generation(),
            ..Rep::default()
        };
        for s in st.kept() {
            r.kept[s as usize] = true;
        }
        for s in st.stale() {
            r.stale[s as usize] = true;
        }
        r
    }
}

/// The gate of a write whose gate the shard no longer keeps (or a write no longer in flight).
const NO_GATE: u8 = u8::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Write {
    member: u8,
    shard: u8,
    epoch: u64,
    rv: u8,
    /// The client still waits for it (a drain waits for it); `false`: timed out, the server may still commit.
    waiting: bool,
    /// The gate it was admitted under, in its member's numbering for the shard (while waiting).
    gate: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct St {
    asg: Asg,
    /// The assignment before the last write: a member may still read (or apply late) this stale version.
    prev: Option<Asg>,
    moves: u64,
    members: Vec<Mem>,
    obj_rv: [u8; S],
    obj_epoch: [u64; S],
    writes: Vec<Write>,
    dirty: [bool; S],
    max_fence: [u64; S],
    /// Set when a fence was issued below an earlier one, or a commit landed out of fence order.
    violation: Option<&'static str>,
    /// Assignments saved earlier (a backup, a manifest in git): what a rewrite writes again.
    backups: Vec<Asg>,
    /// Older views written again so far.
    rewrites: u8,
    /// The highest generation ever written: a coordinator writes above it (generations follow the wall
    /// clock), only an older view written back at its old generation is below.
    top: u64,
    /// An older view was written back at its old generation and no coordinator has read it yet.
    restored: bool,
    /// A coordinator wrote a rolled-back view again above every generation a member applied (the runtime's
    /// `rolled_back`): nothing is planned and no handoff advances until every member reports it applied.
    rebuild: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Act {
    /// Apply the current assignment (`false`) or the previous, stale one (`true`).
    Apply(u8, bool),
    Warm(u8, u8),
    Activate(u8, u8),
    Drain(u8, u8),
    StartMove(u8, u8),
    Advance(u8),
    Complete(u8),
    CancelMoving(u8),
    CancelDraining(u8),
    /// [`CancelRule::AsDesigned`] only: a cancel decided on a read of the source's lease that predates its
    /// release ack.
    CancelDrainingStale(u8),
    /// [`CancelRule::NewEpoch`]: the real `coordinator::step` decides shard `s`, observing the move's target
    /// live (`true`: advance or complete on its acks) or not (`false`: cancel).
    Coordinate(u8, bool),
    StartWrite(u8, u8),
    TimeOut(usize),
    Commit(usize),
    NewWork(u8),
    Reconcile(u8, u8),
    /// The environment saves the current assignment (a backup, a manifest committed to git).
    Backup,
    /// The environment writes saved assignment `k` again: above every generation written (`true`: a restore
    /// that bumps the generation, a re-applied manifest) or at its old generation (`false`).
    Rewrite(u8, bool),
    /// A fresh coordinator reads an older view written back at its old generation (the runtime's
    /// `rolled_back`): below a generation a member reports applied, it writes the same content again above
    /// every generation written and holds (`St::rebuild`); else it plans from it.
    Recover,
    /// Member `m` renews: its report (applied generation, kept, stale) is published.
    Renew(u8),
}

/// The protocol variant under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CancelRule {
    /// DESIGN.md as first written: a cancel from Draining returns the shard at its old epoch unless the
    /// coordinator has seen the release ack ("cancel before release"). Loses the shard when the release races
    /// the cancel (kept as a regression test).
    AsDesigned,
    /// docs/protocol.md: a cancel from Draining always re-grants the source at a new epoch.
    NewEpoch,
}

#[derive(Clone, Debug)]
pub(crate) struct Handoff2 {
    n: u8,
    /// Fenced writes happen on shards `0..write_shards` (1 by default: the object-order property needs two
    /// concurrent writes on one shard, not on both).
    write_shards: u8,
    /// Object events (and so lost-work checks) on shards `0..work_shards`.
    work_shards: u8,
    max_moves: u64,
    max_rv: u8,
    rule: CancelRule,
    /// Older views written again at most (0: the action is off, and reports carry acks only).
    rewrites: u8,
    /// Assignments saved for rewriting at most.
    backups: u8,
    /// Older views are written back under the conditions the library's rules are made for (see
    /// [`rewrite_model`]); else the environment may also write one above every generation, the coordinator
    /// may judge a member not live, a view a write-back overwrote may still reach a member, and reports are
    /// published late.
    calm: bool,
    /// A planted bug, switched on wherever the model steps the library.
    plant: Plant,
}

fn id(m: u8) -> MemberId {
    MemberId::new(["a", "b", "c"][m as usize], "1")
}

fn view(a: &Asg) -> AssignmentView {
    let mut v = AssignmentView::new(a.gen);
    for (s, sh) in a.shards.iter().enumerate() {
        let handoff = match sh.h {
            H::Stable => Handoff::Stable,
            H::Moving(id_, to) => Handoff::Moving {
                id: id_,
                to: id(to),
            },
            H::Draining(id_, to) => Handoff::Draining {
                id: id_,
                to: id(to),
            },
        };
        v = v.with(
            s as u32,
            ShardAssignment::owned(id(sh.owner), sh.epoch).with_handoff(handoff),
        );
    }
    v
}

fn fenceable(st: &MemberState, s: u8) -> Option<u64> {
    if st.is_fenced() {
        return None;
    }
    match st.shard(u32::from(s)) {
        Some(ShardState::Owned { epoch } | ShardState::Outgoing { epoch, .. }) => Some(epoch),
        _ => None,
    }
}

impl Handoff2 {
    fn step(&self, st: &mut St, m: u8, input: Input) {
        let mem = &mut st.members[m as usize];
        let out = mem.st.apply(&input);
        for t in out.transitions {
            if t.is_reenqueue() {
                mem.queued[t.shard as usize] = true;
            }
            let gates = &mut mem.gates[t.shard as usize];
            let fresh = gates.drain_set().max().map_or(0, |g| g + 1);
            gates.follow(t.from, t.to, || fresh);
        }
        // acks are published with the next renewal; a delay is the coordinator not acting yet
        let acks = mem.st.acks();
        mem.published.extend(acks);
    }
}

impl Model for Handoff2 {
    type State = St;
    type Action = Act;

    fn init_states(&self) -> Vec<St> {
        let members: Vec<Mem> = (0..self.n)
            .map(|m| {
                let mut st = MemberState::new(id(m));
                st.apply_event(Event::Unfenced);
                Mem {
                    st,
                    published: BTreeSet::new(),
                    queued: [false; S],
                    gates: std::array::from_fn(|_| ShardGates::default()),
                    rep: Rep::default(),
                }
            })
            .collect();
        // both placements, so that swapping members is a symmetry of the initial states
        [(0, 1), (1, 0)]
            .map(|(o0, o1)| St {
                asg: Asg {
                    gen: 1,
                    shards: [
                        Sh {
                            owner: o0,
                            epoch: 1,
                            h: H::Stable,
                        },
                        Sh {
                            owner: o1,
                            epoch: 1,
                            h: H::Stable,
                        },
                    ],
                },
                prev: None,
                moves: 0,
                members: members.clone(),
                obj_rv: [0; S],
                obj_epoch: [0; S],
                writes: Vec::new(),
                dirty: [false; S],
                max_fence: [0; S],
                violation: None,
                backups: Vec::new(),
                rewrites: 0,
                top: 1,
                restored: false,
                rebuild: None,
            })
            .to_vec()
    }

    fn actions(&self, st: &St, out: &mut Vec<Act>) {
        if st.violation.is_some() {
            return;
        }
        for m in 0..self.n {
            let mem = &st.members[m as usize];
            if mem.st.generation() < st.asg.gen {
                out.push(Act::Apply(m, false));
            }
            if st
                .prev
                .as_ref()
                .is_some_and(|p| mem.st.generation() < p.gen)
            {
                out.push(Act::Apply(m, true));
            }
            for s in 0..S as u8 {
                match mem.st.shard(u32::from(s)) {
                    Some(ShardState::Incoming { warm: false, .. }) => out.push(Act::Warm(m, s)),
                    Some(ShardState::Activating { .. }) => out.push(Act::Activate(m, s)),
                    Some(ShardState::Outgoing { .. }) if drained(st, m, s) => {
                        out.push(Act::Drain(m, s))
                    }
                    _ => {}
                }
                if s < self.write_shards
                    && fenceable(&mem.st, s).is_some()
                    && st.obj_rv[s as usize] < self.max_rv
                    && !st.writes.iter().any(|w| w.member == m && w.shard == s)
                {
                    out.push(Act::StartWrite(m, s));
                }
                if mem.queued[s as usize] {
                    out.push(Act::Reconcile(m, s));
                }
            }
        }
        // a fresh coordinator reads an older view written back first; a rebuild plans nothing
        let planning = !st.restored && st.rebuild.is_none();
        for s in 0..S as u8 {
            let sh = st.asg.shards[s as usize];
            match sh.h {
                _ if st.restored => {}
                H::Stable if self.rewrites > 0 => {
                    // a kept or stale report may make the coordinator write any shard
                    out.push(Act::Coordinate(s, true));
                    if planning && st.moves < self.max_moves {
                        for to in 0..self.n {
                            if to != sh.owner {
                                out.push(Act::StartMove(s, to));
                            }
                        }
                    }
                }
                H::Stable if st.moves < self.max_moves => {
                    for to in 0..self.n {
                        if to != sh.owner {
                            out.push(Act::StartMove(s, to));
                        }
                    }
                }
                H::Moving(..) | H::Draining(..) if self.rule == CancelRule::NewEpoch => {
                    out.push(Act::Coordinate(s, true));
                    if self.rewrites == 0 || !self.calm {
                        out.push(Act::Coordinate(s, false));
                    }
                }
                H::Moving(..) => {
                    out.push(Act::Advance(s));
                    out.push(Act::CancelMoving(s));
                }
                H::Draining(..) => {
                    out.push(Act::Complete(s));
                    out.push(Act::CancelDraining(s));
                    out.push(Act::CancelDrainingStale(s));
                }
                _ => {}
            }
            if s < self.work_shards && !st.dirty[s as usize] {
                out.push(Act::NewWork(s));
            }
        }
        for (i, w) in st.writes.iter().enumerate() {
            out.push(Act::Commit(i));
            if w.waiting {
                out.push(Act::TimeOut(i));
            }
        }
        if self.rewrites > 0 && !self.calm {
            for m in 0..self.n {
                let mem = &st.members[m as usize];
                if mem.rep != Rep::of(&mem.st) {
                    out.push(Act::Renew(m));
                }
            }
        }
        if self.rewrites > 0 {
            if st.rewrites < self.rewrites && st.backups.len() < usize::from(self.backups) {
                out.push(Act::Backup);
            }
            if st.rewrites < self.rewrites {
                for (k, b) in st.backups.iter().enumerate() {
                    if !self.calm {
                        out.push(Act::Rewrite(k as u8, true));
                    }
                    if b.gen < st.asg.gen {
                        out.push(Act::Rewrite(k as u8, false));
                    }
                }
            }
            if st.restored {
                out.push(Act::Recover);
            }
        }
    }

    fn next_state(&self, st: &St, a: Act) -> Option<St> {
        plant(self.plant);
        let mut st = st.clone();
        match a {
            Act::Apply(m, stale) => {
                let v = if stale {
                    st.prev.clone()?
                } else {
                    st.asg.clone()
                };
                self.step(&mut st, m, Input::View(view(&v)));
            }
            Act::Warm(m, s) => {
                let Some(ShardState::Incoming { move_id, .. }) =
                    st.members[m as usize].st.shard(u32::from(s))
                else {
                    return None;
                };
                self.step(
                    &mut st,
                    m,
                    Input::Event(Event::Warm {
                        shard: u32::from(s),
                        move_id,
                    }),
                );
            }
            Act::Activate(m, s) => {
                let Some(ShardState::Activating { epoch }) =
                    st.members[m as usize].st.shard(u32::from(s))
                else {
                    return None;
                };
                self.step(
                    &mut st,
                    m,
                    Input::Event(Event::Activated {
                        shard: u32::from(s),
                        epoch,
                    }),
                );
            }
            Act::Drain(m, s) => {
                let Some(ShardState::Outgoing { move_id, .. }) =
                    st.members[m as usize].st.shard(u32::from(s))
                else {
                    return None;
                };
                self.step(
                    &mut st,
                    m,
                    Input::Event(Event::Drained {
                        shard: u32::from(s),
                        move_id,
                    }),
                );
            }
            Act::StartMove(s, to) => {
                st.moves += 1;
                let id_ = st.moves;
                self.write(&mut st, s, |sh, _| sh.h = H::Moving(id_, to));
            }
            Act::Advance(s) => {
                let sh = st.asg.shards[s as usize];
                let H::Moving(m, to) = sh.h else { return None };
                if !st.members[to as usize].published.contains(&Ack::Warm {
                    shard: u32::from(s),
                    move_id: m,
                }) {
                    return None;
                }
                self.write(&mut st, s, |sh, _| sh.h = H::Draining(m, to));
            }
            Act::Complete(s) => {
                let sh = st.asg.shards[s as usize];
                let H::Draining(m, to) = sh.h else {
                    return None;
                };
                if !st.members[sh.owner as usize]
                    .published
                    .contains(&Ack::Released {
                        shard: u32::from(s),
                        move_id: m,
                    })
                {
                    return None;
                }
                self.write(&mut st, s, |sh, gen| {
                    *sh = Sh {
                        owner: to,
                        epoch: gen,
                        h: H::Stable,
                    }
                });
            }
            Act::Coordinate(s, target_live) => {
                let reps = (self.rewrites > 0).then(|| self.reports(&st));
                let next = real_step(&st, s, target_live, reps.as_deref())?;
                assert!(next.gen > st.top, "the step writes above every generation");
                st.prev = Some(st.asg.clone());
                st.asg.gen = next.gen;
                st.top = next.gen;
                st.asg.shards[s as usize] = next.shards[s as usize];
            }
            Act::CancelMoving(s) => self.write(&mut st, s, |sh, _| sh.h = H::Stable),
            Act::CancelDraining(s) | Act::CancelDrainingStale(s) => {
                let sh = st.asg.shards[s as usize];
                let H::Draining(m, _) = sh.h else { return None };
                let released = st.members[sh.owner as usize]
                    .published
                    .contains(&Ack::Released {
                        shard: u32::from(s),
                        move_id: m,
                    });
                let new_epoch = match self.rule {
                    CancelRule::AsDesigned => released && !matches!(a, Act::CancelDrainingStale(_)),
                    CancelRule::NewEpoch => true,
                };
                self.write(&mut st, s, |sh, gen| {
                    sh.h = H::Stable;
                    if new_epoch {
                        sh.epoch = gen;
                    }
                });
            }
            Act::StartWrite(m, s) => {
                let epoch = fenceable(&st.members[m as usize].st, s)?;
                let gate = *st.members[m as usize].gates[s as usize].current()?;
                if epoch < st.max_fence[s as usize] {
                    st.violation = Some("fence epoch decreased");
                }
                st.max_fence[s as usize] = st.max_fence[s as usize].max(epoch);
                st.writes.push(Write {
                    member: m,
                    shard: s,
                    epoch,
                    rv: st.obj_rv[s as usize],
                    waiting: true,
                    gate,
                });
            }
            Act::TimeOut(i) => st.writes[i].waiting = false,
            Act::Commit(i) => {
                let w = st.writes.remove(i);
                let s = w.shard as usize;
                if st.obj_rv[s] == w.rv {
                    if w.epoch < st.obj_epoch[s] {
                        st.violation = Some("commit out of fence order");
                    }
                    st.obj_rv[s] += 1;
                    st.obj_epoch[s] = w.epoch;
                } // else: 409 Conflict on the resourceVersion precondition
            }
            Act::NewWork(s) => {
                st.dirty[s as usize] = true;
                for mem in &mut st.members {
                    if mem
                        .st
                        .shard(u32::from(s))
                        .and_then(ShardState::epoch)
                        .is_some()
                    {
                        mem.queued[s as usize] = true;
                    }
                }
            }
            Act::Reconcile(m, s) => {
                let mem = &mut st.members[m as usize];
                if mem.st.is_admitted(u32::from(s)) {
                    st.dirty[s as usize] = false;
                    mem.queued[s as usize] = false;
                } else if mem.st.shard(u32::from(s)).is_some() {
                    return None; // requeue: nothing changes
                } else {
                    mem.queued[s as usize] = false; // await_change: left to the owner
                }
            }
            Act::Backup => st.backups.push(st.asg.clone()),
            Act::Rewrite(k, higher) => {
                let old = st.backups.get(usize::from(k))?.clone();
                st.rewrites += 1;
                // calm: the view written over never reaches a member any more (its watch jumps to the newest)
                st.prev = (!self.calm).then(|| st.asg.clone());
                if higher {
                    st.top += 1;
                    st.asg = Asg { gen: st.top, ..old };
                } else {
                    st.asg = old;
                    st.restored = true;
                }
            }
            Act::Recover => {
                // a fresh process: no hold of an earlier coordinator's rewrite (the runtime keeps it in
                // the process that wrote it)
                st.restored = false;
                st.rebuild = None;
                let applied = self.reports(&st).iter().map(|r| r.applied).max();
                if applied.is_some_and(|g| st.asg.gen < g) {
                    st.prev = Some(st.asg.clone());
                    st.top += 1;
                    st.asg.gen = st.top;
                    st.rebuild = Some(st.top);
                }
            }
            Act::Renew(m) => {
                let mem = &mut st.members[m as usize];
                mem.rep = Rep::of(&mem.st);
            }
        }
        if st
            .rebuild
            .is_some_and(|g| self.reports(&st).iter().all(|r| r.applied >= g))
        {
            st.rebuild = None;
        }
        normalize(&mut st);
        Some(st)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut props = vec![
            Property::always("exclusive fences", |_, st: &St| {
                (0..S as u8).all(|s| {
                    st.members
                        .iter()
                        .filter(|m| fenceable(&m.st, s).is_some())
                        .count()
                        <= 1
                })
            }),
            Property::always(
                "no member fences while another member's fenced request is in flight",
                |_, st: &St| (0..S as u8).all(|s| in_flight_or_fenceable(st, s) <= 1),
            ),
            Property::always(
                "fence epochs only increase and commits follow them",
                |_, st: &St| st.violation.is_none(),
            ),
            Property::sometimes("a move completes", |_, st: &St| {
                st.asg
                    .shards
                    .iter()
                    .any(|sh| sh.h == H::Stable && sh.epoch > 1)
                    && st
                        .members
                        .iter()
                        .any(|m| m.st.shard(0).is_some_and(|x| x.epoch() > Some(1)))
            }),
            Property::sometimes("a cancelled move comes back", |_, st: &St| {
                st.members.iter().any(|m| {
                    m.st.released(0).is_some()
                        && m.st
                            .shard(0)
                            .is_some_and(|x| matches!(x, ShardState::Owned { .. }))
                })
            }),
        ];
        if self.rewrites > 0 {
            // the rewrite reaches both verdicts, and the coordinator's rewrite over a view written back
            props.extend([
                Property::sometimes(
                    "a member keeps a shard a rewritten view names another owner of",
                    |_, st: &St| st.members.iter().any(|m| m.st.kept().next().is_some()),
                ),
                Property::sometimes(
                    "a rewritten view names a member at an epoch it is past",
                    |_, st: &St| st.members.iter().any(|m| m.st.stale().next().is_some()),
                ),
                Property::sometimes(
                    "a view written back at its old generation is written again above",
                    |_, st: &St| st.rebuild.is_some(),
                ),
            ]);
        }
        props
    }
}

/// The members that can fence shard `s` or have a fenced request on it in flight.
fn in_flight_or_fenceable(st: &St, s: u8) -> usize {
    (0..st.members.len() as u8)
        .filter(|&m| {
            fenceable(&st.members[m as usize].st, s).is_some()
                || st
                    .writes
                    .iter()
                    .any(|w| w.member == m && w.shard == s && w.waiting)
        })
        .count()
}

/// The library's drain guard: member `m` may release shard `s` once no fenced request is in flight on any
/// gate its [`ShardGates`] keeps for `s` (the one it drains and every retired one).
fn drained(st: &St, m: u8, s: u8) -> bool {
    let gates = &st.members[m as usize].gates[s as usize];
    !st.writes.iter().any(|w| {
        w.member == m && w.shard == s && w.waiting && gates.drain_set().any(|g| *g == w.gate)
    })
}

/// Forget the retired gates with no request in flight (the library forgets them once nothing is in flight
/// and their fences expired: a write that timed out did so with its fence), and renumber every member's
/// gates by their order in the drain set, so that equal situations are equal states.
fn normalize(st: &mut St) {
    for (m, mem) in st.members.iter_mut().enumerate() {
        for (s, gates) in mem.gates.iter_mut().enumerate() {
            let in_flight = |g: &u8| {
                st.writes.iter().any(|w| {
                    w.member as usize == m && w.shard as usize == s && w.waiting && w.gate == *g
                })
            };
            gates.prune(|g| !in_flight(g));
            let order: Vec<u8> = gates.drain_set().copied().collect();
            let number = |g: &u8| {
                order
                    .iter()
                    .position(|x| x == g)
                    .map_or(NO_GATE, |i| i as u8)
            };
            for w in &mut st.writes {
                if w.member as usize == m && w.shard as usize == s {
                    w.gate = if w.waiting { number(&w.gate) } else { NO_GATE };
                }
            }
            *gates = gates.map(number);
        }
    }
    st.writes.sort();
}

impl Handoff2 {
    fn write(&self, st: &mut St, s: u8, f: impl FnOnce(&mut Sh, u64)) {
        st.prev = Some(st.asg.clone());
        st.top += 1;
        st.asg.gen = st.top;
        let gen = st.asg.gen;
        f(&mut st.asg.shards[s as usize], gen);
    }
}

impl Handoff2 {
    /// Every member's report as the coordinator reads it.
    fn reports(&self, st: &St) -> Vec<Rep> {
        st.members
            .iter()
            .map(|m| if self.calm { Rep::of(&m.st) } else { m.rep })
            .collect()
    }
}

/// The real coordinator's decision for shard `s` (`crate::testing::coordinator::step`), from the current
/// assignment and the members' published acks (and, with `reports`, their published applied generation,
/// `kept` and `stale` shards), with the move's target observed live or not (every other member live,
/// nobody gone, no planning: moves are the model's `StartMove`). Only shard `s`'s entry is taken, so one
/// write still changes one shard (a coordinator whose reads of the other shard's acks lag, or two
/// coordinators interleaving). It writes above every generation written (`now_ms`: generations follow the
/// wall clock). `None` when the step leaves shard `s` as it is.
fn real_step(st: &St, s: u8, target_live: bool, reports: Option<&[Rep]>) -> Option<Asg> {
    let to = match st.asg.shards[s as usize].h {
        H::Moving(_, to) | H::Draining(_, to) => Some(to),
        H::Stable if reports.is_some() => None,
        H::Stable => return None,
    };
    let mut cur = Assignment::empty(ShardCount::new(S as u32).unwrap(), ShardKey::Uid);
    cur.view = view(&st.asg);
    cur.next_move_id = st.moves + 1;
    let members: Vec<Observed> = st
        .members
        .iter()
        .enumerate()
        .map(|(m, mem)| {
            let mut report = MemberReport {
                weight: 1,
                acks: mem.published.iter().cloned().collect(),
                ..MemberReport::default()
            };
            if let Some(r) = reports.map(|r| r[m]) {
                report.applied_generation = r.applied;
                report.seen_generation = r.applied;
                report.kept = shard_set(&r.kept);
                report.stale = shard_set(&r.stale);
            }
            Observed {
                id: id(m as u8),
                alive: Some(m as u8) != to || target_live,
                expired: false,
                gone: false,
                report: Some(report),
                joined: m as u64,
                joining: false,
            }
        })
        .collect();
    let ages = BTreeMap::new();
    let out = coordinator::step(&StepInput {
        current: &cur,
        members: &members,
        now_ms: st.top + 1,
        ready_to_plan: false,
        may_take_over: false,
        takeover_budget: 0,
        move_ages: &ages,
        move_timeout: Duration::from_secs(60),
        drain_stall_timeout: Duration::from_secs(60),
        max_concurrent_moves: 64,
        // the runtime's hold counts the members it observes live
        rebuilding: st.rebuild.is_some_and(|g| {
            members
                .iter()
                .any(|o| o.live() && o.report.as_ref().is_some_and(|r| r.applied_generation < g))
        }),
    });
    let next = out.assignment?;
    let e = next.view.shards.get(&u32::from(s))?;
    if *e == cur.view.shards[&u32::from(s)] {
        return None;
    }
    let member = |m: &MemberId| (0..3u8).find(|i| id(*i) == *m);
    let mut asg = st.asg.clone();
    asg.gen = next.view.generation;
    asg.shards[s as usize] = Sh {
        owner: member(&e.owner)?,
        epoch: e.epoch,
        h: match &e.handoff {
            Handoff::Stable => H::Stable,
            Handoff::Moving { id, to } => H::Moving(*id, member(to)?),
            Handoff::Draining { id, to } => H::Draining(*id, member(to)?),
        },
    };
    Some(asg)
}

fn shard_set(flags: &[bool; S]) -> ShardSet {
    let mut set = ShardSet::new();
    for (s, _) in flags.iter().enumerate().filter(|(_, f)| **f) {
        set.insert(s as u32);
    }
    set
}

fn is_fault(a: &Act) -> bool {
    matches!(
        a,
        Act::Backup
            | Act::Rewrite(..)
            | Act::StartMove(..)
            | Act::CancelMoving(_)
            | Act::CancelDraining(_)
            | Act::CancelDrainingStale(_)
            | Act::Coordinate(_, false)
            | Act::NewWork(_)
            | Act::StartWrite(..)
            | Act::TimeOut(_)
    )
}

/// Settled: every shard Stable, Owned (admitted) by its assigned member at the assigned epoch, held by no
/// other member, and no work left.
fn settled(_: &Handoff2, st: &St) -> bool {
    st.dirty.iter().all(|d| !d)
        && st.asg.shards.iter().enumerate().all(|(s, sh)| {
            sh.h == H::Stable
                && st.members.iter().enumerate().all(|(m, mem)| {
                    let state = mem.st.shard(s as u32);
                    if m as u8 == sh.owner {
                        state == Some(ShardState::Owned { epoch: sh.epoch })
                            && mem.st.is_admitted(s as u32)
                    } else {
                        state.is_none()
                    }
                })
        })
}

/// Swap members 0 ↔ 1 (the set of initial states is invariant under it).
fn swapped(st: &St) -> St {
    let pm = |m: u8| match m {
        0 => 1,
        1 => 0,
        x => x,
    };
    let ps = |s: u32| s;
    let pid = |m: &MemberId| {
        id(pm(
            ["a", "b", "c"].iter().position(|n| **n == *m.name).unwrap() as u8,
        ))
    };
    let sh = |x: &Sh| Sh {
        owner: pm(x.owner),
        epoch: x.epoch,
        h: match x.h {
            H::Stable => H::Stable,
            H::Moving(i, t) => H::Moving(i, pm(t)),
            H::Draining(i, t) => H::Draining(i, pm(t)),
        },
    };
    let asg = |a: &Asg| Asg {
        gen: a.gen,
        shards: [sh(&a.shards[0]), sh(&a.shards[1])],
    };
    let ack = |a: &Ack| match *a {
        Ack::Warm { shard, move_id } => Ack::Warm {
            shard: ps(shard),
            move_id,
        },
        Ack::Released { shard, move_id } => Ack::Released {
            shard: ps(shard),
            move_id,
        },
    };
    let mut members: Vec<Mem> = st
        .members
        .iter()
        .map(|m| Mem {
            st: m.st.relabeled(pid, ps),
            published: m.published.iter().map(ack).collect(),
            queued: m.queued,
            gates: m.gates.clone(),
            rep: m.rep,
        })
        .collect();
    members.swap(0, 1);
    let mut writes: Vec<Write> = st
        .writes
        .iter()
        .map(|w| Write {
            member: pm(w.member),
            ..*w
        })
        .collect();
    writes.sort();
    St {
        asg: asg(&st.asg),
        prev: st.prev.as_ref().map(asg),
        moves: st.moves,
        members,
        obj_rv: st.obj_rv,
        obj_epoch: st.obj_epoch,
        writes,
        dirty: st.dirty,
        max_fence: st.max_fence,
        violation: st.violation,
        backups: st.backups.iter().map(asg).collect(),
        rewrites: st.rewrites,
        top: st.top,
        restored: st.restored,
        rebuild: st.rebuild,
    }
}

fn canon(st: &St) -> St {
    representative(&[st.clone(), swapped(st)])
}

fn model(rule: CancelRule) -> Handoff2 {
    if deep() {
        Handoff2 {
            // a third member that any move may target; writes are covered by the default run
            n: 3,
            write_shards: 0,
            work_shards: 1,
            max_moves: 2,
            max_rv: 0,
            rule,
            rewrites: 0,
            backups: 0,
            calm: true,
            plant: None,
        }
    } else {
        Handoff2 {
            n: 2,
            write_shards: 1,
            work_shards: 1,
            max_moves: 2,
            max_rv: 2,
            rule,
            rewrites: 0,
            backups: 0,
            calm: true,
            plant: None,
        }
    }
}

/// The rewrite configurations. The environment saves the assignment at any time (`Backup`) and writes a
/// saved one back at its old generation (`Rewrite(k, false)`: a restore, a GitOps re-apply), also while
/// the last write is still reaching the members; a fresh coordinator reads it (`Recover`) and, below a
/// generation a member reports applied, writes it again above every generation and holds until every
/// member reports that applied. Members apply it with the library's rules (they keep what they hold,
/// `kept`; refuse grants at or below a generation applied before, `stale`) and the real step names
/// holders again and re-grants stale shards. Calm, as those rules need: every member is observed live, a
/// view a write-back overwrote never reaches a member any more (its watch jumps to the newest), and the
/// coordinator reads each member's report as of its pass (without these, see
/// `an_older_view_written_back_anyhow_never_overlaps`). One move; `twice`: two saved assignments written
/// back, else one; `writes`: fenced writes and work on shard 0.
fn rewrite_model(twice: bool, writes: bool) -> Handoff2 {
    Handoff2 {
        n: 2,
        write_shards: u8::from(writes),
        work_shards: u8::from(writes),
        max_moves: 1,
        max_rv: u8::from(writes),
        rule: CancelRule::NewEpoch,
        rewrites: if twice { 2 } else { 1 },
        backups: if twice { 2 } else { 1 },
        calm: true,
        plant: None,
    }
}

#[test]
fn handoff_model_safety() {
    // default run: 1 457 344 unique states (stateright's count): the floor catches a shrinking model
    let floor = 1_300_000;
    check_safety("handoff", model(CancelRule::NewEpoch), canon, floor);
}

#[test]
fn handoff_model_liveness_and_no_lost_work() {
    let start = std::time::Instant::now();
    let live = check_liveness(&model(CancelRule::NewEpoch), canon, is_fault, settled);
    eprintln!(
        "[handoff] liveness: {} states, {:.1?}",
        live.states,
        start.elapsed()
    );
    assert!(
        live.states >= 650_000, // default run: 728 672 states after symmetry reduction
        "the model shrank: {} states",
        live.states
    );
    if let Some((path, st)) = live.stuck {
        panic!("stuck after faults stop: {path:?}\n{st:#?}");
    }
}

/// Regression: DESIGN.md's "cancel before release" at the old epoch, chosen by a coordinator that has not
/// yet seen the release ack, races the source's release: the source stays released (as it must) and the
/// shard is assigned to it at an epoch it will never re-activate — owned by nobody, its work lost.
#[test]
fn regression_cancel_racing_release_loses_the_shard() {
    let small = Handoff2 {
        n: 2,
        write_shards: 0,
        work_shards: 0,
        max_moves: 1,
        max_rv: 0,
        rule: CancelRule::AsDesigned,
        rewrites: 0,
        backups: 0,
        calm: true,
        plant: None,
    };
    let live = check_liveness(&small, canon, is_fault, settled);
    let (path, st) = live.stuck.expect("the old cancel rule must be caught");
    eprintln!("[handoff] counterexample (old cancel rule): {path:?}");
    assert!(
        path.iter()
            .any(|a| matches!(a, Act::CancelDrainingStale(_))),
        "{path:?}"
    );
    assert!(st
        .members
        .iter()
        .any(|m| m.st.released(0).is_some() || m.st.released(1).is_some()));
}

/// The library's drain guard with the old forgetting planted back (`forget-retired-gates`: a re-grant drops
/// the shard's gate with the requests in flight under it): a re-granted source drains only its new gate,
/// releases while its write of the old holding waits, and the target fences. Runs with
/// (the fault is planted per thread, so the search runs on the test thread).
#[test]
fn planted_forget_retired_gates_is_caught() {
    use crate::testing::faults::{set, FORGET_RETIRED_GATES};
    let small = Handoff2 {
        n: 2,
        write_shards: 1,
        work_shards: 0,
        max_moves: 2,
        max_rv: 1,
        rule: CancelRule::NewEpoch,
        rewrites: 0,
        backups: 0,
        calm: true,
        plant: None,
    };
    assert!(
        first_violation(&small, canon).is_none(),
        "fails without the bug"
    );
    set(FORGET_RETIRED_GATES, true);
    let found = first_violation(&small, canon);
    set(FORGET_RETIRED_GATES, false);
    let (name, path) = found.expect("the planted bug must be caught");
    eprintln!("[handoff] counterexample (retired gates forgotten): {name}: {path:?}");
    assert_eq!(
        name,
        "no member fences while another member's fenced request is in flight"
    );
}

#[test]
fn an_older_view_rewritten_higher_never_overlaps() {
    // default run: 92 632 and 355 468 unique states: the floors catch a shrinking model
    check_safety("handoff+rewrite", rewrite_model(false, true), canon, 85_000);
    check_safety(
        "handoff+rewrite twice",
        rewrite_model(true, false),
        canon,
        320_000,
    );
    if deep() {
        // both: 3 545 372 unique states
        check_safety(
            "handoff+rewrite twice, writes",
            rewrite_model(true, true),
            canon,
            3_000_000,
        );
    }
}

#[test]
fn an_older_view_rewritten_higher_settles() {
    for twice in [false, true] {
        let start = std::time::Instant::now();
        let live = check_liveness(&rewrite_model(twice, !twice), canon, is_fault, settled);
        eprintln!(
            "[handoff+rewrite{}] liveness: {} states, {:.1?}",
            if twice { " twice" } else { "" },
            live.states,
            start.elapsed()
        );
        if let Some((path, st)) = live.stuck {
            panic!("stuck after faults stop: {path:?}\n{st:#?}");
        }
    }
}

/// Open: the rules above do not cover an older view written back without the calm of [`rewrite_model`].
/// Each of these lets the coordinator act on an older view's entry before the member that holds the
/// shard has applied it and reported it `kept`, so the shard is granted over it: a writer other than the
/// coordinator writes it above every generation (nothing holds: the step completes an old `Draining` on
/// its release ack); the coordinator judges the holder not live (a lease watch lagging); a view the
/// write-back overwrote reaches a member after the coordinator planned (its check saw nobody past the
/// older view); a report published late. Prints a shortest counterexample.
#[test]
#[ignore = "open: an older view written back without calm overlaps (see the doc comment)"]
fn an_older_view_written_back_anyhow_never_overlaps() {
    let anyhow = Handoff2 {
        calm: false,
        ..rewrite_model(false, false)
    };
    if let Some((name, path)) = find_violation("handoff+rewrite anyhow", anyhow, canon) {
        panic!("{name}, {} steps: {path:?}", path.len());
    }
}

/// A violation the model finds with `bug` planted (breadth first, so among the shortest), after checking
/// that it finds none without it (else the catch proves nothing).
fn caught_with(
    name: &str,
    model: Handoff2,
    bug: crate::testing::faults::Fault,
) -> (&'static str, Vec<Act>) {
    if let Some((p, path)) = find_violation(name, model.clone(), canon) {
        panic!("fails without the bug: {p}: {path:?}");
    }
    let planted = Handoff2 {
        plant: Some(bug),
        ..model
    };
    find_violation(name, planted, canon).expect("the planted bug must be caught")
}

/// The coordinator with its check of `kept` reports removed (`grant-over-kept-holder`): an older view
/// written back names the shard's former owner, which released it; the current holder keeps it and
/// reports it `kept`, the former owner reports it `stale`, and the coordinator re-grants it to the former
/// owner, which activates while the holder still has it.
#[test]
fn planted_grant_over_a_kept_holder_is_caught() {
    let (name, path) = caught_with(
        "handoff: grant-over-kept-holder",
        rewrite_model(true, false),
        crate::testing::faults::GRANT_OVER_KEPT_HOLDER,
    );
    eprintln!(
        "[handoff] counterexample (kept holder ignored), {} steps: {name}: {path:?}",
        path.len()
    );
    assert_eq!(name, "exclusive fences");
    assert!(
        path.iter().any(|a| matches!(a, Act::Rewrite(..))),
        "{path:?}"
    );
}

/// A member with its refusal of rolled-back grants removed (`activate-rolled-back-grant`): an older view
/// written back overtakes the view granting a member a shard (it never holds it, nor releases it); a
/// second older view names it the owner at that grant's epoch, below a generation it applied, and it
/// activates while the shard's holder has it at a higher epoch.
#[test]
fn planted_activate_a_rolled_back_grant_is_caught() {
    let (name, path) = caught_with(
        "handoff: activate-rolled-back-grant",
        rewrite_model(true, false),
        crate::testing::faults::ACTIVATE_ROLLED_BACK_GRANT,
    );
    eprintln!(
        "[handoff] counterexample (rolled-back grant activated), {} steps: {name}: {path:?}",
        path.len()
    );
    assert_eq!(name, "exclusive fences");
    assert!(
        path.iter().any(|a| matches!(a, Act::Rewrite(..))),
        "{path:?}"
    );
}
