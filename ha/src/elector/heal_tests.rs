//! The heal window `kshard-dev demo ha` found, driven step by step against two in-memory Leases: an Active cut
//! off from both clusters, a forced promotion of the peer meanwhile, and the heal before the old Active's
//! no-term step-down. Its own Lease still names it, so its first renewal succeeds; the term must not come
//! back before a read of the peer's Lease that started after the lapse (which shows the higher epoch).

use std::time::Duration;

use super::*;
use crate::config::Timings;
use crate::record::{HaState, Published, Record};

/// One Lease: its resourceVersion counter and record.
#[derive(Default)]
struct Store {
    rv: u64,
    record: Option<Record>,
}

impl Store {
    fn answer(&mut self, op: &Op) -> Answer {
        match op {
            Op::Read => match &self.record {
                None => Answer::NotFound,
                Some(r) => Answer::Found {
                    rv: self.rv.to_string(),
                    record: Some(r.clone()),
                },
            },
            Op::Create { record } => {
                if self.record.is_some() {
                    return Answer::AlreadyExists;
                }
                self.write(record)
            }
            Op::Update { rv, record } => {
                if self.record.is_none() {
                    return Answer::NotFound;
                }
                if *rv != self.rv.to_string() {
                    return Answer::Conflict;
                }
                self.write(record)
            }
        }
    }

    fn write(&mut self, record: &Record) -> Answer {
        self.rv += 1;
        self.record = Some(record.clone());
        Answer::Written {
            rv: self.rv.to_string(),
        }
    }
}

/// The old Active's elector and the two Leases it reaches (index 0: its own, 1: the peer's).
struct World {
    e: Elector,
    stores: [Store; 2],
    now: Duration,
    cut: bool,
    /// Peer reads in flight, answered only when their time comes (a slow read after the heal).
    slow_peer: Option<(Duration, Duration)>,
    /// The next write of the own Lease commits, but its answer is lost (a connection closed at the heal).
    lose_own_answer: bool,
    /// How long a peer read takes after the heal.
    peer_read_delay: Duration,
    admitted_after_heal: bool,
}

const STEP: Duration = Duration::from_millis(100);

impl World {
    fn new() -> World {
        let cfg = ElectorConfig::new("a", 1, false, Timings::default()).bootstrap_active(true);
        World {
            e: Elector::new(cfg, Duration::ZERO),
            stores: [Store::default(), Store::default()],
            now: Duration::ZERO,
            cut: false,
            slow_peer: None,
            lose_own_answer: false,
            peer_read_delay: Duration::from_secs(2),
            admitted_after_heal: false,
        }
    }

    /// Run for `d`: every request is answered at once (or fails while cut), except a slow peer read.
    fn run(&mut self, d: Duration, healed: bool) {
        let end = self.now + d;
        while self.now < end {
            self.now += STEP;
            if let Some((due, _)) = self.slow_peer {
                if self.now >= due {
                    self.slow_peer = None;
                    let a = self.stores[1].answer(&Op::Read);
                    self.e.on_answer(Slot::Peer, a, self.now);
                }
            }
            let (reqs, _) = self.e.poll(self.now);
            for r in reqs {
                let i = usize::from(r.slot != Slot::Own);
                if self.cut {
                    self.e.on_timeout(r.slot, self.now);
                } else if healed && r.slot == Slot::Peer && r.op == Op::Read {
                    self.slow_peer = Some((self.now + self.peer_read_delay, self.now));
                } else {
                    let a = self.stores[i].answer(&r.op);
                    let lost = r.slot == Slot::Own && r.op != Op::Read && self.lose_own_answer;
                    if lost {
                        self.lose_own_answer = false;
                        self.e.on_timeout(r.slot, self.now);
                    } else {
                        self.e.on_answer(r.slot, a, self.now);
                    }
                }
            }
            if healed && self.e.is_active(self.now).is_some() {
                self.admitted_after_heal = true;
            }
        }
    }
}

#[test]
fn a_term_regained_after_a_lapse_waits_for_a_fresh_read_of_the_peer() {
    heal(false);
}

/// The gap the real-cluster demo showed: at the heal the first renewal commits but its answer is lost, so
/// the next one gets a 409, the re-read shows this cluster's own record, and the write after it succeeds.
/// The conflict cleared the hold, so that write alone does not show the lapse: the term must still wait for
/// a fresh read of the peer.
#[test]
fn a_lost_renewal_answer_at_the_heal_does_not_hide_the_lapse() {
    heal(true);
}

fn heal(lose_first_renewal_answer: bool) {
    let mut w = World::new();
    w.run(Duration::from_secs(40), false);
    let e1 = w.e.is_active(w.now).expect("bootstrapped Active");
    // cut off from both clusters: the term lapses after renew_deadline
    w.cut = true;
    w.run(Duration::from_secs(12), false);
    assert!(w.e.is_active(w.now).is_none(), "lapsed");
    assert!(
        matches!(w.e.role(), HaRole::Leader { .. }),
        "still leader, no term"
    );
    // meanwhile the peer was promoted by force: its own Lease (this side's peer slot) names it higher
    let b = Record {
        cluster: "b".into(),
        epoch: e1.next(2).unwrap(),
        timings: Published {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            request_timeout: Duration::from_millis(2500),
        },
        state: HaState::default(),
        origin: None,
    };
    w.stores[1].write(&b);
    // the heal, before the no-term step-down (lease_duration after the lapse); peer reads take 2 s
    w.cut = false;
    w.lose_own_answer = lose_first_renewal_answer;
    if lose_first_renewal_answer {
        // slow enough that the 409, the re-read and the successful renewal all come before it
        w.peer_read_delay = Duration::from_secs(6);
    }
    w.run(Duration::from_secs(8), true);
    assert!(!w.lose_own_answer, "the lost answer was played");
    assert!(
        !w.admitted_after_heal,
        "the old Active regained its term before reading the peer's Lease"
    );
    assert_eq!(
        w.e.role(),
        HaRole::Standby,
        "it stepped down on the higher epoch"
    );
}
