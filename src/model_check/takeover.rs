//! Model (ii): takeover and self-fencing. N = 2 names, S = 1 shard; time as inequalities.
//!
//! Drives the real [`MemberState::apply`], and the real `coordinator::step` for the reassignment of a gone
//! owner's shard (`Reassign`). Modelled: renewals as a request start and a conditional update, takeover by a
//! conditional write on the observed resourceVersion, crashes, restarts under the same name, pauses past
//! the renew deadline, delayed views, late commits and, in [`rewrite_model`], an older assignment written
//! back. `fresh(p)` ⇔ now < start of p's last successful renewal + RD′; the coordinator judges a lease
//! stale only LD after the renewal it observed, so a takeover CAS succeeds only on a holder not fresh.
//!
//! See `docs/protocol.md#modelling-details` and "The models" above it.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::group::assignment::{Assignment, AssignmentView, ShardAssignment};
use crate::group::report::MemberReport;
use crate::ownership::state::{Event, Input, MemberId, MemberState, ShardState};
use crate::testing::coordinator::{self, Observed, StepInput};
use crate::{ShardCount, ShardKey, ShardSet};
use stateright::{Model, Property};

use super::{check_liveness, check_safety, deep, find_violation, plant, Plant};

const NAMES: [&str; 3] = ["a", "b", "c"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Lease {
    holder: u8,
    rv: u8,
    taken: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    name: u8,
    inc: u8,
    started: bool,
    /// It has held its name's lease (a fresh incarnation has not, until it claims it).
    joined: bool,
    alive: bool,
    st: MemberState,
    fresh: bool,
    /// A renewal request in flight: the lease resourceVersion it read.
    renewing: Option<u8>,
    queued: bool,
}

/// A process's report besides liveness (read by the coordinator as of its pass): the generation it
/// applied, and whether it reports the shard `kept` (it holds it; the view names another owner at or below
/// its epoch) or `stale` (the view names it at an epoch it is past).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Rep {
    applied: u64,
    kept: bool,
    stale: bool,
}

impl Rep {
    fn of(st: &MemberState) -> Rep {
        Rep {
            applied: st.generation(),
            kept: st.kept().next().is_some(),
            stale: st.stale().next().is_some(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Asg {
    gen: u64,
    owner: (u8, u8),
    epoch: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Write {
    proc_: u8,
    epoch: u64,
    rv: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Obs {
    rv: u8,
    stale: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct St {
    leases: Vec<Lease>,
    procs: Vec<Proc>,
    obs: Vec<Obs>,
    asg: Asg,
    prev: Option<Asg>,
    obj_rv: u8,
    obj_epoch: u64,
    writes: Vec<Write>,
    dirty: bool,
    max_fence: u64,
    faults: u8,
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
    /// `rolled_back`): nothing is planned until every live member reports it applied.
    rebuild: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Act {
    RenewStart(u8),
    RenewCommit(u8),
    Expire(u8),
    Crash(u8),
    Start(u8),
    StartTwin(u8),
    Claim(u8),
    Observe(u8),
    ObserveStale(u8),
    Takeover(u8),
    Reassign(u8),
    /// Apply the current assignment (`false`) or the previous, stale one (`true`), late.
    Apply(u8, bool),
    Activate(u8),
    StartWrite(u8),
    Commit(usize),
    NewWork,
    Reconcile(u8),
    /// The environment saves the current assignment (a backup, a manifest committed to git).
    Backup,
    /// The environment writes saved assignment `k` again: above every generation written (`true`) or at
    /// its old generation (`false`).
    Rewrite(u8, bool),
    /// A fresh coordinator reads an older view written back at its old generation (the runtime's
    /// `rolled_back`): below a generation a live member reports applied, it writes the same content again
    /// above every generation written and holds (`St::rebuild`); else it plans from it.
    Recover,
}

#[derive(Clone, Debug)]
pub(crate) struct Takeover {
    names: u8,
    max_faults: u8,
    max_rv: u8,
    /// Older views written again at most (0: the action is off; `Reassign` observes only the gone owner
    /// and its successor, without reports).
    rewrites: u8,
    /// Assignments saved for rewriting at most.
    backups: u8,
    /// Older views are written back under the conditions the library's rules are made for (see
    /// [`rewrite_model`]); else the environment may also write one above every generation, into a group
    /// still taking up the last write, and faults and lagging observations go on after it.
    calm: bool,
    /// A planted bug, switched on wherever the model steps the library.
    plant: Plant,
}

fn id(name: u8, inc: u8) -> MemberId {
    MemberId::new(NAMES[name as usize], inc.to_string())
}

/// The real coordinator's reassignment (`crate::testing::coordinator::step`): the owner is gone (its
/// takeover write succeeded, or another incarnation holds its name's lease), the chosen holder `to` is the
/// only live member, so the planner gives it the orphaned shard at the new generation. `None` if the step
/// decides anything else.
fn real_reassign(asg: &Asg, to: (u8, u8)) -> Option<Asg> {
    let mut cur = Assignment::empty(ShardCount::new(1).unwrap(), ShardKey::Uid);
    cur.view = AssignmentView::new(asg.gen).with(
        0,
        ShardAssignment::owned(id(asg.owner.0, asg.owner.1), asg.epoch),
    );
    let observed = |who: (u8, u8), alive: bool, gone: bool| {
        let report = MemberReport {
            weight: 1,
            ..MemberReport::default()
        };
        Observed {
            id: id(who.0, who.1),
            alive,
            expired: false,
            gone,
            report: Some(report),
            joined: u64::from(who.0),
            joining: false,
        }
    };
    let mut members = vec![observed(asg.owner, false, true)];
    if to != asg.owner {
        members.push(observed(to, true, false));
    }
    let ages = BTreeMap::new();
    let out = coordinator::step(&StepInput {
        current: &cur,
        members: &members,
        now_ms: 0,
        ready_to_plan: true,
        may_take_over: false,
        takeover_budget: 0,
        move_ages: &ages,
        move_timeout: Duration::from_secs(60),
        drain_stall_timeout: Duration::from_secs(60),
        max_concurrent_moves: 64,
        rebuilding: false,
    });
    let next = out.assignment?;
    let e = next.view.shards.get(&0)?;
    (e.owner == id(to.0, to.1)).then_some(Asg {
        gen: next.view.generation,
        owner: to,
        epoch: e.epoch,
    })
}

/// The members the coordinator observes: the process holding each name's lease (live unless its lease is
/// taken over or the coordinator judged it stale; gone once taken over), with its report as of the pass,
/// and the assignment's owner, gone when another incarnation holds its name's lease.
fn observed(st: &St, planned: u8) -> Vec<Observed> {
    let mut members: Vec<Observed> = (0..st.leases.len() as u8)
        .filter_map(|n| {
            let p = &st.procs[st.holder(n)?];
            let l = st.leases[n as usize];
            let rep = Rep::of(&p.st);
            let mut report = MemberReport {
                weight: 1,
                applied_generation: rep.applied,
                seen_generation: rep.applied,
                ..MemberReport::default()
            };
            let mut one = ShardSet::new();
            one.insert(0);
            if rep.kept {
                report.kept = one.clone();
            }
            if rep.stale {
                report.stale = one;
            }
            Some(Observed {
                id: id(n, p.inc),
                alive: !l.taken && !st.obs[n as usize].stale,
                expired: false,
                gone: l.taken,
                report: Some(report),
                joined: u64::from(n),
                // only `planned` is a candidate for an orphan: the model lets the coordinator pick anyone
                joining: n != planned,
            })
        })
        .collect();
    let owner = id(st.asg.owner.0, st.asg.owner.1);
    if !members.iter().any(|m| m.id == owner) {
        members.push(Observed {
            id: owner,
            alive: false,
            expired: false,
            gone: true,
            report: None,
            joined: u64::from(st.asg.owner.0),
            joining: false,
        });
    }
    members
}

/// Calm: every process holding its name's lease is renewing (fresh) and has applied the current
/// assignment, and the coordinator's observation of its lease is current.
fn calm(st: &St) -> bool {
    (0..st.leases.len() as u8).all(|n| {
        st.holder(n).is_none_or(|i| {
            let p = &st.procs[i];
            p.alive
                && p.fresh
                && p.st.generation() == st.asg.gen
                && st.obs[n as usize].rv == st.leases[n as usize].rv
                && !st.obs[n as usize].stale
        })
    })
}

/// A rebuild holds: some live member has not reported the coordinator's rewrite of a rolled-back view
/// applied.
fn rebuilding(st: &St) -> bool {
    st.rebuild.is_some_and(|g| {
        observed(st, 0)
            .iter()
            .filter(|m| m.live())
            .any(|m| m.report.as_ref().is_none_or(|r| r.applied_generation < g))
    })
}

/// The real coordinator's pass (`crate::testing::coordinator::step`) over every member it observes
/// ([`observed`]), with `planned` the candidate for an orphan, writing above every generation written
/// (`now_ms`: generations follow the wall clock). `None` if the step leaves the shard as it is.
fn real_coordinate(st: &St, planned: u8) -> Option<Asg> {
    let mut cur = Assignment::empty(ShardCount::new(1).unwrap(), ShardKey::Uid);
    cur.view = AssignmentView::new(st.asg.gen).with(
        0,
        ShardAssignment::owned(id(st.asg.owner.0, st.asg.owner.1), st.asg.epoch),
    );
    let members = observed(st, planned);
    let ages = BTreeMap::new();
    let out = coordinator::step(&StepInput {
        current: &cur,
        members: &members,
        now_ms: st.top + 1,
        ready_to_plan: true,
        may_take_over: false,
        takeover_budget: 0,
        move_ages: &ages,
        move_timeout: Duration::from_secs(60),
        drain_stall_timeout: Duration::from_secs(60),
        max_concurrent_moves: 64,
        rebuilding: rebuilding(st),
    });
    let next = out.assignment?;
    let e = next.view.shards.get(&0)?;
    let name = NAMES.iter().position(|n| **n == *e.owner.name)? as u8;
    let inc: u8 = e.owner.incarnation.parse().ok()?;
    Some(Asg {
        gen: next.view.generation,
        owner: (name, inc),
        epoch: e.epoch,
    })
}

fn fenceable(p: &Proc) -> Option<u64> {
    if !p.alive || !p.fresh || p.st.is_fenced() {
        return None;
    }
    match p.st.shard(0) {
        Some(ShardState::Owned { epoch } | ShardState::Outgoing { epoch, .. }) => Some(epoch),
        _ => None,
    }
}

impl St {
    /// The process holding `name`'s lease now, if started.
    fn holder(&self, name: u8) -> Option<usize> {
        let l = self.leases[name as usize];
        self.procs
            .iter()
            .position(|p| p.name == name && p.inc == l.holder && p.started)
    }
}

impl Takeover {
    fn step(&self, st: &mut St, p: usize, input: Input) {
        let out = st.procs[p].st.apply(&input);
        if out.transitions.iter().any(|t| t.is_reenqueue()) {
            st.procs[p].queued = true;
        }
    }

    fn exit(&self, st: &mut St, p: usize) {
        self.step(st, p, Input::Event(Event::SelfFenced));
        let pr = &mut st.procs[p];
        pr.alive = false;
        pr.fresh = false;
        pr.renewing = None;
    }
}

impl Model for Takeover {
    type State = St;
    type Action = Act;

    fn init_states(&self) -> Vec<St> {
        // processes: one per name with incarnation 1, plus a second incarnation of "a" not yet started
        let mut procs: Vec<Proc> = (0..self.names)
            .map(|n| {
                let mut st = MemberState::new(id(n, 1));
                st.apply_event(Event::Unfenced);
                Proc {
                    name: n,
                    inc: 1,
                    started: true,
                    joined: true,
                    alive: true,
                    st,
                    fresh: true,
                    renewing: None,
                    queued: false,
                }
            })
            .collect();
        procs.push(Proc {
            name: 0,
            inc: 2,
            started: false,
            joined: false,
            alive: false,
            st: MemberState::new(id(0, 2)),
            fresh: false,
            renewing: None,
            queued: false,
        });
        vec![St {
            leases: (0..self.names)
                .map(|_| Lease {
                    holder: 1,
                    rv: 1,
                    taken: false,
                })
                .collect(),
            procs,
            obs: (0..self.names)
                .map(|_| Obs {
                    rv: 1,
                    stale: false,
                })
                .collect(),
            asg: Asg {
                gen: 1,
                owner: (0, 1),
                epoch: 1,
            },
            prev: None,
            obj_rv: 0,
            obj_epoch: 0,
            writes: Vec::new(),
            dirty: false,
            max_fence: 0,
            faults: 0,
            violation: None,
            backups: Vec::new(),
            rewrites: 0,
            top: 1,
            restored: false,
            rebuild: None,
        }]
    }

    fn actions(&self, st: &St, out: &mut Vec<Act>) {
        if st.violation.is_some() {
            return;
        }
        let can_fault = st.faults < self.max_faults && !(self.calm && st.rewrites > 0);
        for (i, p) in st.procs.iter().enumerate() {
            let i = i as u8;
            let lease = st.leases[p.name as usize];
            if !p.started {
                // a restart after the old process is gone is recovery (the pod comes back), not a fault; a
                // second process under a live one's name (identity collision) is a fault
                let twin_alive = st.procs.iter().any(|q| q.name == p.name && q.alive);
                if !twin_alive {
                    out.push(Act::Start(i));
                } else if can_fault {
                    out.push(Act::StartTwin(i));
                }
                continue;
            }
            if !p.alive {
                continue;
            }
            let holds_lease = lease.holder == p.inc;
            if !holds_lease && !p.joined {
                // a new incarnation: unready until it claims its name's lease
                out.push(Act::Claim(i));
            } else if !holds_lease {
                // its lease was claimed by a newer incarnation: the next renewal finds out
                if p.renewing.is_none() {
                    out.push(Act::RenewStart(i));
                }
                if p.renewing.is_some() {
                    out.push(Act::RenewCommit(i));
                }
            } else {
                if p.renewing.is_none() && (!p.fresh || p.st.is_fenced()) && lease.rv < self.max_rv
                {
                    out.push(Act::RenewStart(i));
                }
                if p.renewing.is_some() {
                    out.push(Act::RenewCommit(i));
                }
            }
            if p.fresh && can_fault {
                out.push(Act::Expire(i));
            }
            // at most one crash: after faults stop, some member must be alive to own the shard
            if can_fault && st.procs.iter().all(|q| !q.started || q.alive) {
                out.push(Act::Crash(i));
            }
            if p.st.generation() < st.asg.gen {
                out.push(Act::Apply(i, false));
            }
            if st.prev.is_some_and(|v| p.st.generation() < v.gen) {
                out.push(Act::Apply(i, true));
            }
            if matches!(p.st.shard(0), Some(ShardState::Activating { .. })) {
                out.push(Act::Activate(i));
            }
            if fenceable(p).is_some() && st.obj_rv < 2 && !st.writes.iter().any(|w| w.proc_ == i) {
                out.push(Act::StartWrite(i));
            }
            if p.queued {
                out.push(Act::Reconcile(i));
            }
        }
        for n in 0..self.names {
            let (l, o) = (st.leases[n as usize], st.obs[n as usize]);
            if o.rv != l.rv {
                out.push(Act::Observe(n));
            }
            let holder_fresh = st.holder(n).is_some_and(|p| st.procs[p].fresh);
            // now ≥ o + LD > t_s + RD′: only if the holder is not fresh or has renewed since the observation
            // (calm after a write-back: the coordinator's observations are current, so only if not fresh)
            let current = l.rv == o.rv || (self.calm && st.rewrites > 0);
            let holder_may_be_fresh = current && holder_fresh;
            if !o.stale && !l.taken && !holder_may_be_fresh {
                out.push(Act::ObserveStale(n));
            }
            if o.stale && o.rv == l.rv && !l.taken && l.rv < self.max_rv {
                out.push(Act::Takeover(n));
            }
        }
        let (on, oi) = st.asg.owner;
        let owner_lease = st.leases[on as usize];
        if self.rewrites > 0 {
            // the coordinator's pass may write whatever the reports call for (a kept holder, a stale owner)
            if !st.restored {
                for n in 0..self.names {
                    if !st.leases[n as usize].taken
                        && !st.obs[n as usize].stale
                        && st.holder(n).is_some()
                    {
                        out.push(Act::Reassign(n));
                    }
                }
            }
        } else if owner_lease.taken || owner_lease.holder != oi {
            for n in 0..self.names {
                let l = st.leases[n as usize];
                if !l.taken
                    && !st.obs[n as usize].stale
                    && st.holder(n).is_some()
                    && (n, l.holder) != st.asg.owner
                {
                    out.push(Act::Reassign(n));
                }
            }
        }
        for i in 0..st.writes.len() {
            out.push(Act::Commit(i));
        }
        if !st.dirty {
            out.push(Act::NewWork);
        }
        if self.rewrites > 0 {
            if st.rewrites < self.rewrites && st.backups.len() < usize::from(self.backups) {
                out.push(Act::Backup);
            }
            if st.rewrites < self.rewrites && (!self.calm || calm(st)) {
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
            Act::RenewStart(i) => {
                let p = &st.procs[i as usize];
                let l = st.leases[p.name as usize];
                if l.taken || l.holder != p.inc {
                    self.exit(&mut st, i as usize); // taken over: self-fence, rejoin as a new incarnation
                } else {
                    st.procs[i as usize].renewing = Some(l.rv);
                }
            }
            Act::RenewCommit(i) => {
                let p = &st.procs[i as usize];
                let read = p.renewing?;
                let name = p.name as usize;
                let l = st.leases[name];
                if l.rv == read && l.holder == p.inc && !l.taken {
                    st.leases[name].rv += 1;
                    let pr = &mut st.procs[i as usize];
                    pr.renewing = None;
                    pr.fresh = true;
                    if pr.st.is_fenced() {
                        self.step(&mut st, i as usize, Input::Event(Event::Unfenced));
                    }
                } else if l.taken || l.holder != p.inc {
                    self.exit(&mut st, i as usize);
                } else {
                    st.procs[i as usize].renewing = None;
                }
            }
            Act::Expire(i) => {
                st.faults += 1;
                st.procs[i as usize].fresh = false;
                self.step(&mut st, i as usize, Input::Event(Event::SelfFenced));
            }
            Act::Crash(i) => {
                st.faults += 1;
                let p = &mut st.procs[i as usize];
                p.alive = false;
                p.fresh = false;
                p.renewing = None;
                p.queued = false;
            }
            Act::StartTwin(i) => {
                st.faults += 1;
                let p = &mut st.procs[i as usize];
                p.started = true;
                p.alive = true;
            }
            Act::Start(i) => {
                let p = &mut st.procs[i as usize];
                p.started = true;
                p.alive = true;
            }
            Act::Claim(i) => {
                let name = st.procs[i as usize].name;
                if st.holder(name).is_some_and(|h| st.procs[h].fresh) {
                    return None; // it has not seen the holder's renewals stop for LD + grace
                }
                let l = &mut st.leases[name as usize];
                *l = Lease {
                    holder: st.procs[i as usize].inc,
                    rv: l.rv + 1,
                    taken: false,
                };
                st.procs[i as usize].fresh = true; // the claim is its first renewal
                st.procs[i as usize].joined = true;
                self.step(&mut st, i as usize, Input::Event(Event::Unfenced));
            }
            Act::Observe(n) => {
                st.obs[n as usize] = Obs {
                    rv: st.leases[n as usize].rv,
                    stale: false,
                };
            }
            Act::ObserveStale(n) => st.obs[n as usize].stale = true,
            Act::Takeover(n) => {
                let l = &mut st.leases[n as usize];
                l.taken = true;
                l.rv += 1;
                st.obs[n as usize] = Obs {
                    rv: l.rv,
                    stale: false,
                };
            }
            Act::Reassign(n) if self.rewrites > 0 => {
                let next = real_coordinate(&st, n)?;
                assert!(next.gen > st.top, "the step writes above every generation");
                st.prev = Some(st.asg);
                st.asg = next;
                st.top = next.gen;
            }
            Act::Reassign(n) => {
                let holder = st.leases[n as usize].holder;
                st.prev = Some(st.asg);
                st.asg = real_reassign(&st.asg, (n, holder))?;
                st.top = st.asg.gen;
            }
            Act::Apply(i, stale) => {
                let v = if stale { st.prev? } else { st.asg };
                let view = AssignmentView::new(v.gen)
                    .with(0, ShardAssignment::owned(id(v.owner.0, v.owner.1), v.epoch));
                self.step(&mut st, i as usize, Input::View(view));
            }
            Act::Activate(i) => {
                let Some(ShardState::Activating { epoch }) = st.procs[i as usize].st.shard(0)
                else {
                    return None;
                };
                self.step(
                    &mut st,
                    i as usize,
                    Input::Event(Event::Activated { shard: 0, epoch }),
                );
            }
            Act::StartWrite(i) => {
                let epoch = fenceable(&st.procs[i as usize])?;
                if epoch < st.max_fence {
                    st.violation = Some("fence epoch decreased");
                }
                st.max_fence = st.max_fence.max(epoch);
                st.writes.push(Write {
                    proc_: i,
                    epoch,
                    rv: st.obj_rv,
                });
                st.writes.sort();
            }
            Act::Commit(w) => {
                let w = st.writes.remove(w);
                if st.obj_rv == w.rv {
                    if w.epoch < st.obj_epoch {
                        st.violation = Some("commit out of fence order");
                    }
                    st.obj_rv += 1;
                    st.obj_epoch = w.epoch;
                }
            }
            Act::NewWork => {
                st.dirty = true;
                for p in &mut st.procs {
                    if p.alive && p.st.shard(0).and_then(ShardState::epoch).is_some() {
                        p.queued = true;
                    }
                }
            }
            Act::Reconcile(i) => {
                let p = &mut st.procs[i as usize];
                if fenceable(p).is_some() && p.st.is_admitted(0) {
                    st.dirty = false;
                    p.queued = false;
                } else if p.st.shard(0).is_some() {
                    return None;
                } else {
                    p.queued = false;
                }
            }
            Act::Backup => st.backups.push(st.asg),
            Act::Rewrite(k, higher) => {
                let old = *st.backups.get(usize::from(k))?;
                st.rewrites += 1;
                st.prev = Some(st.asg);
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
                let applied = observed(&st, 0)
                    .iter()
                    .filter(|m| m.live())
                    .filter_map(|m| m.report.as_ref().map(|r| r.applied_generation))
                    .max();
                if applied.is_some_and(|g| st.asg.gen < g) {
                    st.prev = Some(st.asg);
                    st.top += 1;
                    st.asg.gen = st.top;
                    st.rebuild = Some(st.top);
                }
            }
        }
        if !rebuilding(&st) {
            st.rebuild = None;
        }
        Some(st)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut props = vec![
            Property::always("exclusive fences", |_, st: &St| {
                st.procs.iter().filter(|p| fenceable(p).is_some()).count() <= 1
            }),
            Property::always(
                "fence epochs only increase and commits follow them",
                |_, st: &St| st.violation.is_none(),
            ),
            Property::sometimes("a takeover moves the shard", |_, st: &St| {
                st.asg.gen > 1 && st.procs.iter().any(|p| p.name != 0 && p.st.is_admitted(0))
            }),
            Property::sometimes("a restarted incarnation owns the shard", |_, st: &St| {
                st.procs.iter().any(|p| p.inc == 2 && p.st.is_admitted(0))
            }),
            Property::sometimes("a self-fenced owner un-fences", |_, st: &St| {
                st.procs[0].st.is_admitted(0) && st.leases[0].rv > 1 && st.asg.gen == 1
            }),
        ];
        if self.rewrites > 0 {
            props.extend([
                Property::sometimes(
                    "a member keeps the shard a rewritten view names another owner of",
                    |_, st: &St| st.procs.iter().any(|p| p.st.kept().next().is_some()),
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

fn is_fault(a: &Act) -> bool {
    matches!(
        a,
        Act::Expire(_)
            | Act::Crash(_)
            | Act::StartTwin(_)
            | Act::NewWork
            | Act::StartWrite(_)
            | Act::Backup
            | Act::Rewrite(..)
    )
}

/// Settled: the shard is assigned to a live, renewed member whose lease is its own, that member has it
/// Owned and admitted at the assigned epoch, no other live process holds it, and no work is left.
fn settled(_: &Takeover, st: &St) -> bool {
    let (on, oi) = st.asg.owner;
    let l = st.leases[on as usize];
    !st.dirty
        && !l.taken
        && l.holder == oi
        && st.procs.iter().all(|p| {
            if (p.name, p.inc) == (on, oi) {
                p.alive
                    && p.fresh
                    && p.st.shard(0)
                        == Some(ShardState::Owned {
                            epoch: st.asg.epoch,
                        })
                    && p.st.is_admitted(0)
            } else {
                !p.alive || p.st.shard(0).is_none()
            }
        })
}

fn identity(st: &St) -> St {
    st.clone()
}

fn model() -> Takeover {
    if deep() {
        Takeover {
            names: 3,
            max_faults: 2,
            max_rv: 5,
            rewrites: 0,
            backups: 0,
            calm: false,
            plant: None,
        }
    } else {
        Takeover {
            names: 2,
            max_faults: 2,
            max_rv: 5,
            rewrites: 0,
            backups: 0,
            calm: false,
            plant: None,
        }
    }
}

#[test]
fn takeover_model_safety() {
    // No symmetry: the names are not interchangeable (only "a" owns at first and restarts).
    // default run: 494 926 unique states: the floor catches a shrinking model
    check_safety("takeover", model(), identity, 450_000);
}

#[test]
fn takeover_model_liveness_and_no_lost_work() {
    let start = std::time::Instant::now();
    let live = check_liveness(&model(), identity, is_fault, settled);
    eprintln!(
        "[takeover] liveness: {} states, {:.1?}",
        live.states,
        start.elapsed()
    );
    assert!(
        live.states >= 450_000,
        "the model shrank: {} states",
        live.states
    );
    if let Some((path, st)) = live.stuck {
        panic!("stuck after faults stop: {path:?}\n{st:#?}");
    }
}

/// The rewrite configuration. The environment saves the assignment at any time (`Backup`) and writes the
/// saved one back at its old generation (`Rewrite(k, false)`: a restore, a GitOps re-apply); a fresh
/// coordinator reads it (`Recover`) and, below a generation a live member reports applied, writes it again
/// above every generation and holds until every live member reports that applied. Members apply it with
/// the library's rules and the real step (`Reassign`, now a whole pass over every lease holder and its
/// report) names holders again, re-grants stale shards and grants orphans. Calm, as those rules need: the
/// write-back finds every lease holder renewing with the current assignment applied and its lease
/// observed as it is, and no fault or lagging observation follows it (without these, see
/// `an_older_view_written_back_anyhow_never_overlaps`). One fault before it (`deep`: two).
fn rewrite_model() -> Takeover {
    Takeover {
        names: 2,
        max_faults: if deep() { 2 } else { 1 },
        max_rv: 5,
        rewrites: 1,
        backups: 1,
        calm: true,
        plant: None,
    }
}

#[test]
fn an_older_view_rewritten_higher_never_overlaps() {
    // default run: 62 067 unique states (deep: 1 807 399): the floor catches a shrinking model
    check_safety("takeover+rewrite", rewrite_model(), identity, 55_000);
}

#[test]
fn an_older_view_rewritten_higher_settles() {
    let start = std::time::Instant::now();
    let live = check_liveness(&rewrite_model(), identity, is_fault, settled);
    eprintln!(
        "[takeover+rewrite] liveness: {} states, {:.1?}",
        live.states,
        start.elapsed()
    );
    if let Some((path, st)) = live.stuck {
        panic!("stuck after faults stop: {path:?}\n{st:#?}");
    }
}

/// Open: the rules do not cover an older view written back without the calm of [`rewrite_model`]. Each
/// of these lets the coordinator act on an older view's entry before the process holding the shard has
/// applied it and reported it `kept`, and grant the orphaned shard of a gone incarnation the older view
/// names to another member: a writer other than the coordinator writes it above every generation (nothing
/// holds); the write-back overwrites an assignment not every member has applied yet (its check sees nobody
/// past the older view, then a member applies the overwritten one); the coordinator judges the holder not
/// live (a paused holder that renews later, a lease watch lagging: its hold and its check count live
/// members only). Prints a shortest counterexample.
#[test]
#[ignore = "open: an older view written back without calm overlaps (see the doc comment)"]
fn an_older_view_written_back_anyhow_never_overlaps() {
    let anyhow = Takeover {
        max_faults: 2,
        calm: false,
        ..rewrite_model()
    };
    if let Some((name, path)) = find_violation("takeover+rewrite anyhow", anyhow, identity) {
        panic!("{name}, {} steps: {path:?}", path.len());
    }
}

/// The coordinator with its check of `kept` reports removed (`grant-over-kept-holder`): the owner's
/// process is replaced and its shard reassigned; an older view written back names the old incarnation,
/// gone, so once every live member applied the coordinator's rewrite of it the shard is an orphan again, and
/// the coordinator grants it to another member while the holder keeps it.
#[test]
fn planted_grant_over_a_kept_holder_is_caught() {
    use crate::testing::faults::GRANT_OVER_KEPT_HOLDER;
    let model = rewrite_model();
    if let Some((name, path)) = find_violation("takeover: baseline", model.clone(), identity) {
        panic!("fails without the bug: {name}: {path:?}");
    }
    let planted = Takeover {
        plant: Some(GRANT_OVER_KEPT_HOLDER),
        ..model
    };
    let (name, path) = find_violation("takeover: grant-over-kept-holder", planted, identity)
        .expect("the planted bug must be caught");
    eprintln!(
        "[takeover] counterexample (kept holder ignored), {} steps: {name}: {path:?}",
        path.len()
    );
    assert_eq!(name, "exclusive fences");
    assert!(
        path.iter().any(|a| matches!(a, Act::Rewrite(..))),
        "{path:?}"
    );
}
