//! Model (ii): takeover and self-fencing. N = 2 names, S = 1 shard; time as inequalities.
//!
//! Drives the real [`MemberState::apply`], and the real `coordinator::step` for the reassignment of a gone
//! owner's shard (`Reassign`). Modelled: one lease per member name holding (incarnation,
//! resourceVersion, taken-over mark); renewals as a request *start* (reads the lease) and a conditional
//! update (CAS on the resourceVersion read); the coordinator's observations of each lease on its own clock;
//! takeover by a conditional write with the last observed resourceVersion; crashes; a restart under the same
//! name as a new incarnation that claims the lease only once the holder's renewals stopped; pauses past the
//! renew deadline; delayed views; fenced writes whose commits are delayed arbitrarily (resourceVersion
//! preconditions).
//!
//! Time is the inequalities between renewal start `t_s`, renew deadline `RD'` (= renew_deadline − margin),
//! observation `o` and lease duration `LD > RD'` (stalls are bounded by `LD − RD'`):
//!
//! - `fresh(p)` ⇔ now < t_s(last successful renewal of p) + RD'. It becomes false at any time (`Expire`,
//!   time passing or a pause) and true only by a successful renewal.
//! - The coordinator may judge a lease stale only when now ≥ o + LD, where o ≥ t_s of the renewal it
//!   observed; so if that renewal is still the holder's latest (lease rv = observed rv), the holder is not
//!   fresh. If the holder renewed since, the takeover's CAS on the observed rv fails. A new incarnation's claim
//!   of its name's lease obeys the same inequality (it saw the holder's renewals stop for LD + grace).
//!
//! Checked: at most one process can fence the shard at any time; fence epochs never decrease; commits land in
//! fence order; from every reachable state, once faults (crashes, expiries/pauses, restarts, new work, new
//! writes) stop, a path leads to the shard Owned by exactly one live member with no work lost.

use std::collections::BTreeMap;
use std::time::Duration;

use kube_shard::group::assignment::Assignment;
use kube_shard::group::coordinator::{self, Observed, StepInput};
use kube_shard::group::report::MemberReport;
use kube_shard::ownership::{
    state::{Event, Input},
    AssignmentView, MemberId, MemberState, ShardAssignment, ShardState,
};
use kube_shard::{ShardCount, ShardKey};
use stateright::{Model, Property};

use crate::model_common::{check_liveness, check_safety, deep};

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
pub struct St {
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
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
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
}

#[derive(Clone, Debug)]
pub struct Takeover {
    names: u8,
    max_faults: u8,
    max_rv: u8,
}

fn id(name: u8, inc: u8) -> MemberId {
    MemberId::new(NAMES[name as usize], inc.to_string())
}

/// The real coordinator's reassignment (`kube_shard::group::coordinator::step`): the owner is gone (its
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
        let mut report = MemberReport::default();
        report.weight = 1;
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
        }]
    }

    fn actions(&self, st: &St, out: &mut Vec<Act>) {
        if st.violation.is_some() {
            return;
        }
        let can_fault = st.faults < self.max_faults;
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
            let holder_may_be_fresh = l.rv == o.rv && holder_fresh;
            if !o.stale && !l.taken && !holder_may_be_fresh {
                out.push(Act::ObserveStale(n));
            }
            if o.stale && o.rv == l.rv && !l.taken && l.rv < self.max_rv {
                out.push(Act::Takeover(n));
            }
        }
        let (on, oi) = st.asg.owner;
        let owner_lease = st.leases[on as usize];
        if owner_lease.taken || owner_lease.holder != oi {
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
    }

    fn next_state(&self, st: &St, a: Act) -> Option<St> {
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
            Act::Reassign(n) => {
                let holder = st.leases[n as usize].holder;
                st.prev = Some(st.asg);
                st.asg = real_reassign(&st.asg, (n, holder))?;
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
        }
        Some(st)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
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
        ]
    }
}

fn is_fault(a: &Act) -> bool {
    matches!(
        a,
        Act::Expire(_) | Act::Crash(_) | Act::StartTwin(_) | Act::NewWork | Act::StartWrite(_)
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
        }
    } else {
        Takeover {
            names: 2,
            max_faults: 2,
            max_rv: 5,
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
