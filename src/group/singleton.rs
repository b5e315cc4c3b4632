//! Work that must run once per group: a singleton on the coordinator Lease, with a fencing term.
//!
//! The member that holds the group's coordinator Lease (`<group>-coordinator`) leads. Each acquisition
//! writes a new, strictly higher **term** into the Lease's `kube-shard.io/term` annotation. A term is valid
//! until `renew_deadline − fence_margin` after the start of the leader's last successful renewal, and
//! others acquire only after `lease_duration` without a change, so two valid terms never overlap; a lapsed
//! term renewed is a new term. Work already sent when a term ends still lands: stamp the term into what the
//! work writes, or re-check [`SingletonGuard::check`] right before each side effect.
//!
//! See `docs/control-plane.md#singleton-work-on-the-coordinator-lease`.

use std::future::Future;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, info_span, Instrument};

use crate::ownership::TermGate;
use crate::rt::{Clock, Deadline, Now};

/// The Lease annotation that carries the leader's term.
pub const TERM_ANNOTATION: &str = "kube-shard.io/term";

/// One term of leadership: its number and how long it is valid without another renewal.
///
/// Like a fence, a term is valid only while both the runtime clock and the boot clock (which counts suspend)
/// are before its deadline: a leader suspended past its term finds it ended on resume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderTerm {
    /// The fencing term: strictly increasing across acquisitions of the coordinator Lease.
    pub term: u64,
    /// Valid until this instant on the runtime clock (extended by every successful renewal of the Lease).
    pub valid_until: Instant,
    /// The same deadline on both clocks.
    deadline: Deadline,
}

impl LeaderTerm {
    /// A term valid until `valid_until` on the runtime clock, and for as long on the system boot clock.
    #[cfg(test)]
    pub(crate) fn new(term: u64, valid_until: Instant) -> Self {
        LeaderTerm::new_on(term, valid_until, &Clock::system())
    }

    /// A term that lasts `life` from `start`, read on both clocks when its renewal request was sent: a
    /// suspend while the request was in flight counts against the term, on the boot clock too.
    pub(crate) fn started(term: u64, start: Now, life: Duration) -> Self {
        let deadline = start.plus(life);
        LeaderTerm {
            term,
            valid_until: deadline.runtime,
            deadline,
        }
    }

    /// A term valid until `valid_until`, and for as long from now on `clock`'s boot clock.
    #[cfg(test)]
    pub(crate) fn new_on(term: u64, valid_until: Instant, clock: &Clock) -> Self {
        let now = clock.now();
        let deadline = now.plus(valid_until.saturating_duration_since(now.runtime));
        LeaderTerm {
            term,
            valid_until,
            deadline,
        }
    }

    /// Whether the term is still valid now, on both system clocks (with an injected clock,
    /// `ShardGroupBuilder::clock`, use the guard's checks instead: they read the group's clock).
    #[must_use]
    pub fn is_valid(&self) -> bool {
        self.is_valid_on(&Clock::system())
    }

    pub(crate) fn is_valid_on(&self, clock: &Clock) -> bool {
        !self.left_on(clock).is_zero()
    }

    /// The time left on the earlier of both clocks.
    fn left_on(&self, clock: &Clock) -> Duration {
        self.deadline.remaining(clock.now())
    }
}

/// How often a running singleton re-reads the boot clock: a suspend the runtime clock did not see ends the
/// term within this long after resume.
const BOOT_CHECK: Duration = Duration::from_millis(250);

/// This member no longer leads in the term a guard was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not the group's leader in term {term} any more")]
#[non_exhaustive]
pub struct NotLeader {
    /// The term that ended.
    pub term: u64,
}

/// The member's view of the coordinator Lease. Cheap to clone; get it from
/// [`GroupHandle::leadership`](super::GroupHandle::leadership).
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<Option<LeaderTerm>>,
    clock: Clock,
    /// A term gate (cross-cluster HA): a term counts only while the gate grants one.
    gate: Option<Arc<dyn TermGate>>,
}

impl Leadership {
    #[cfg(test)]
    pub(crate) fn new(rx: watch::Receiver<Option<LeaderTerm>>) -> Self {
        Leadership::with_clock(rx, Clock::system())
    }

    /// Terms judged on `clock` (tests: a boot clock moved by hand).
    pub(crate) fn with_clock(rx: watch::Receiver<Option<LeaderTerm>>, clock: Clock) -> Self {
        Leadership {
            rx,
            clock,
            gate: None,
        }
    }

    /// Terms count only while `gate` grants one (cross-cluster HA: a Standby runs no singleton).
    pub(crate) fn with_gate(mut self, gate: Option<Arc<dyn TermGate>>) -> Self {
        self.gate = gate;
        self
    }

    fn gate_active(&self) -> bool {
        self.gate
            .as_ref()
            .is_none_or(|g| g.active_epoch().is_some())
    }

    fn gate_epoch(&self) -> Option<crate::token::FailoverEpoch> {
        self.gate.as_ref().and_then(|g| g.active_epoch())
    }

    /// Resolves at the next change of the gate's term (never without a gate).
    async fn gate_changed(&self) {
        match &self.gate {
            Some(g) => g.changed().await,
            None => std::future::pending().await,
        }
    }

    /// The current term, when this member leads, the term is valid now, and (with cross-cluster HA) this
    /// cluster is the Active one.
    #[must_use]
    pub fn current(&self) -> Option<LeaderTerm> {
        (*self.rx.borrow()).filter(|t| t.is_valid_on(&self.clock) && self.gate_active())
    }

    /// Wait until this member leads (returns at once when it does). `None` when the member has stopped.
    pub async fn acquired(&mut self) -> Option<LeaderTerm> {
        loop {
            let cur = *self.rx.borrow_and_update();
            if let Some(t) = cur {
                if t.is_valid_on(&self.clock) && self.gate_active() {
                    return Some(t);
                }
                // lapsed (or a Standby): wait for a renewal (a new term), a change, or a promotion
            }
            let mut rx = self.rx.clone();
            tokio::select! {
                biased; // the member's stop (a closed channel) first; either ends the wait
                r = rx.changed() => r.ok()?,
                () = self.gate_changed() => {}
            }
        }
    }

    /// A guard for the current term, when this member leads now.
    #[must_use]
    pub fn guard(&self) -> Option<SingletonGuard> {
        self.current().map(|t| SingletonGuard {
            rx: self.rx.clone(),
            term: t.term,
            clock: self.clock.clone(),
            gate: self.gate.clone().map(|h| (h, self.gate_epoch())),
        })
    }

    /// Resolves when `term` is over for this member: another term, no leadership, or its validity lapsed.
    pub async fn ended(&self, term: u64) {
        let mut rx = self.rx.clone();
        loop {
            let cur = *rx.borrow_and_update();
            let Some(t) = cur.filter(|t| t.term == term) else {
                return;
            };
            let left = t.left_on(&self.clock);
            if left.is_zero() || !self.gate_active() {
                return;
            }
            tokio::select! {
                biased; // the member's stop (a closed channel) first; either ends the wait
                r = rx.changed() => if r.is_err() { return },
                () = tokio::time::sleep(left.min(BOOT_CHECK)) => {}
            }
        }
    }

    /// Run `work` while this member leads: started when a term begins, dropped (cancelled at its next
    /// `.await`) as soon as that term ends, and started again in a later term. Work that returns by itself
    /// is not restarted within the same term. Returns when the member has stopped.
    ///
    /// ```no_run
    /// # async fn run(handle: kube_shard::group::GroupHandle) {
    /// handle
    ///     .leadership()
    ///     .run_singleton("garbage-collector", |guard| async move {
    ///         loop {
    ///             // re-check right before a side effect, and stamp the term into what is written
    ///             let Ok(term) = guard.check() else { return };
    ///             tracing::info!(term, "collecting garbage");
    ///             tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    ///         }
    ///     })
    ///     .await;
    /// # }
    /// ```
    pub async fn run_singleton<F, Fut>(mut self, name: &str, mut work: F)
    where
        F: FnMut(SingletonGuard) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            let Some(t) = self.acquired().await else {
                return;
            };
            let epoch = self.gate_epoch();
            let guard = SingletonGuard {
                rx: self.rx.clone(),
                term: t.term,
                clock: self.clock.clone(),
                gate: self.gate.clone().map(|h| (h, epoch)),
            };
            let span = info_span!("singleton", name, term = t.term);
            info!(parent: &span, "term began: starting the singleton");
            let ended = self.ended(t.term);
            let fut = work(guard).instrument(span.clone());
            let cancelled = tokio::select! {
                biased; // the term's end first: never poll the work once it is over
                () = ended => {
                    info!(parent: &span, "term ended or lapsed: the singleton was cancelled");
                    true
                }
                () = fut => {
                    info!(parent: &span, "the singleton returned; waiting for the next term");
                    self.ended(t.term).await;
                    false
                }
            };
            if cancelled {
                if self.rx.has_changed().is_err() {
                    return; // the member stopped
                }
                // Start again as soon as this member leads: in a later term, or in this one when a
                // renewal revives it after a lapse (the holder never changed; the cancelled work is gone).
                // Waiting for another term here left a coordinator without its singleton for as long as
                // it kept the Lease (chaos seed 9: a latency burst lapsed the term, renewals resumed).
                continue;
            }
            // work that returned is never started twice in one term (of the group and, with HA, of the
            // cluster)
            while self
                .rx
                .borrow_and_update()
                .is_some_and(|c| c.term == t.term)
            {
                let promoted = self.gate_epoch().is_some_and(|e| Some(e) != epoch);
                if promoted {
                    break;
                }
                let mut rx = self.rx.clone();
                tokio::select! {
                    biased; // the member's stop (a closed channel) first; either ends the wait
                    r = rx.changed() => if r.is_err() { return },
                    () = self.gate_changed() => {}
                }
            }
        }
    }
}

/// Proof of leadership in one term, given to singleton work.
#[derive(Clone, Debug)]
pub struct SingletonGuard {
    rx: watch::Receiver<Option<LeaderTerm>>,
    term: u64,
    clock: Clock,
    /// Cross-cluster HA: the handle and the failover epoch the guard was given in.
    gate: Option<(Arc<dyn TermGate>, Option<crate::token::FailoverEpoch>)>,
}

impl SingletonGuard {
    /// The term: a fencing token to stamp into what the work writes.
    #[must_use]
    pub fn term(&self) -> u64 {
        self.term
    }

    /// `Ok(term)` while this member still leads in this term, the term is valid now, and (with
    /// cross-cluster HA) the cluster's term at the guard's failover epoch still holds.
    pub fn check(&self) -> Result<u64, NotLeader> {
        let ha_ok = self
            .gate
            .as_ref()
            .is_none_or(|(h, e)| e.is_some() && h.active_epoch() == *e);
        match *self.rx.borrow() {
            Some(t) if t.term == self.term && t.is_valid_on(&self.clock) && ha_ok => Ok(self.term),
            _ => Err(NotLeader { term: self.term }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn work_runs_only_within_valid_terms_and_once_per_term() {
        let (tx, rx) = watch::channel(None);
        let leadership = Leadership::new(rx);
        let starts = Arc::new(AtomicU32::new(0));
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s2, seen2) = (starts.clone(), seen.clone());
        let task = tokio::spawn(leadership.clone().run_singleton("t", move |g| {
            s2.fetch_add(1, Ordering::SeqCst);
            let seen = seen2.clone();
            async move {
                loop {
                    match g.check() {
                        Ok(term) => seen.lock().unwrap().push((term, Instant::now())),
                        Err(_) => return,
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            starts.load(Ordering::SeqCst),
            0,
            "not a leader: nothing runs"
        );
        // term 5, renewed every 500 ms for 3 s
        let t0 = Instant::now();
        for i in 0..6 {
            tx.send_replace(Some(LeaderTerm::new(
                5,
                t0 + Duration::from_millis(500 * i + 1000),
            )));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // the renewals stop: the term lapses at t0 + 3.5 s
        tokio::time::sleep(Duration::from_secs(2)).await;
        let lapsed_at = t0 + Duration::from_millis(3500);
        assert_eq!(starts.load(Ordering::SeqCst), 1, "one start per term");
        assert!(seen
            .lock()
            .unwrap()
            .iter()
            .all(|(term, at)| *term == 5 && *at < lapsed_at));
        assert!(leadership.current().is_none());
        // term 6 begins; then the leadership is lost outright
        tx.send_replace(Some(LeaderTerm::new(
            6,
            Instant::now() + Duration::from_secs(2),
        )));
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 2);
        assert_eq!(leadership.guard().map(|g| g.term()), Some(6));
        tx.send_replace(None);
        let lost_at = Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, at)| *at > lost_at)
            .count();
        assert_eq!(after, 0, "nothing runs after the loss");
        // the member stops: run_singleton returns
        drop(tx);
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("returns when the member stops")
            .unwrap();
    }

    /// A term's boot-clock deadline counts from its renewal's start, so a suspend while the request was in
    /// flight shortens it. Before, the term was built after the answer (`LeaderTerm::new(term, t0 + life)`)
    /// and its boot deadline counted from then.
    #[tokio::test(start_paused = true)]
    async fn a_suspend_during_the_renewal_request_counts_against_the_term() {
        let boot = Arc::new(std::sync::atomic::AtomicU64::new(1_000_000));
        let b = boot.clone();
        let clock = Clock::with_boot(move || Duration::from_millis(b.load(Ordering::SeqCst)));
        let start = clock.now();
        // the request is answered after a 9 s suspend the runtime clock did not see
        boot.fetch_add(9_000, Ordering::SeqCst);
        let term = LeaderTerm::started(7, start, Duration::from_secs(10));
        let (_tx, rx) = watch::channel(Some(term));
        let leadership = Leadership::with_clock(rx, clock);
        assert_eq!(leadership.current().map(|t| t.term), Some(7));
        boot.fetch_add(1_500, Ordering::SeqCst);
        assert_eq!(
            leadership.current(),
            None,
            "the term outlived start + life on the boot clock"
        );
    }

    /// A suspend that only the boot clock sees (the runtime clock stops while the machine sleeps) must end
    /// the term, as it expires fences.
    #[tokio::test(start_paused = true)]
    async fn singleton_term_ends_on_a_suspend_only_the_boot_clock_saw() {
        let boot = Arc::new(std::sync::atomic::AtomicU64::new(1_000_000));
        let b = boot.clone();
        let clock = Clock::with_boot(move || Duration::from_millis(b.load(Ordering::SeqCst)));
        let term = LeaderTerm::new_on(7, Instant::now() + Duration::from_secs(10), &clock);
        let (_tx, rx) = watch::channel(Some(term));
        let leadership = Leadership::with_clock(rx, clock);
        let guard = leadership.guard().expect("a valid term");
        assert_eq!(guard.check(), Ok(7));
        let ended = tokio::spawn({
            let l = leadership.clone();
            async move { l.ended(7).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!ended.is_finished());
        // suspended for 20 s: the runtime clock saw nothing
        boot.fetch_add(20_000, Ordering::SeqCst);
        assert_eq!(leadership.current(), None, "the term outlived a suspend");
        assert_eq!(guard.check(), Err(NotLeader { term: 7 }));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            ended.is_finished(),
            "the singleton is cancelled within a second"
        );
    }

    /// A term that lapses (renewals late) and is then renewed by the same holder is led again: the
    /// cancelled work starts again. Before, it waited for another term and a coordinator that kept its
    /// Lease ran no singleton at all (chaos seed 9: orphaned children were never collected).
    #[tokio::test(start_paused = true)]
    async fn cancelled_work_starts_again_when_a_lapsed_term_is_renewed() {
        let (tx, rx) = watch::channel(Some(LeaderTerm::new(
            3,
            Instant::now() + Duration::from_secs(1),
        )));
        let leadership = Leadership::new(rx);
        let starts = Arc::new(AtomicU32::new(0));
        let s2 = starts.clone();
        let task = tokio::spawn(leadership.clone().run_singleton("gc", move |g| {
            s2.fetch_add(1, Ordering::SeqCst);
            async move {
                while g.check().is_ok() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                std::future::pending::<()>().await;
            }
        }));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        assert!(leadership.current().is_none(), "the term lapsed");
        // the same holder renews: term 3 is valid again
        tx.send_replace(Some(LeaderTerm::new(
            3,
            Instant::now() + Duration::from_secs(10),
        )));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            starts.load(Ordering::SeqCst),
            2,
            "the singleton runs again in the revived term"
        );
        drop(tx);
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn returned_work_is_not_restarted_in_the_same_term() {
        let (tx, rx) = watch::channel(Some(LeaderTerm::new(
            1,
            Instant::now() + Duration::from_secs(60),
        )));
        let starts = Arc::new(AtomicU32::new(0));
        let s2 = starts.clone();
        let task = tokio::spawn(Leadership::new(rx).run_singleton("once", move |_| {
            s2.fetch_add(1, Ordering::SeqCst);
            async {}
        }));
        tokio::time::sleep(Duration::from_secs(5)).await;
        // a renewal in the same term
        tx.send_replace(Some(LeaderTerm::new(
            1,
            Instant::now() + Duration::from_secs(60),
        )));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        tx.send_replace(Some(LeaderTerm::new(
            2,
            Instant::now() + Duration::from_secs(60),
        )));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 2, "a new term runs it again");
        drop(tx);
        task.await.unwrap();
    }

    /// Behind a term gate (cross-cluster HA is one) the singleton runs only while the gate grants a term: not on a
    /// Standby's coordinator, cancelled when the HA term ends, started again at a promotion (same group
    /// term, new failover epoch).
    #[tokio::test(start_paused = true)]
    async fn behind_a_term_gate_the_singleton_runs_only_in_a_term() {
        use crate::ownership::term_gate::manual::ManualGate;
        use crate::token::FailoverEpoch;
        let ha = ManualGate::new();
        let (tx, rx) = watch::channel(Some(LeaderTerm::new(
            1,
            Instant::now() + Duration::from_secs(3600),
        )));
        let leadership = Leadership::new(rx).with_gate(Some(ha.clone()));
        let starts = Arc::new(AtomicU32::new(0));
        let running = Arc::new(AtomicU32::new(0));
        let (s2, r2) = (starts.clone(), running.clone());
        let task = tokio::spawn(leadership.clone().run_singleton("t", move |g| {
            s2.fetch_add(1, Ordering::SeqCst);
            let r = r2.clone();
            async move {
                while g.check().is_ok() {
                    r.store(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                r.store(0, Ordering::SeqCst);
            }
        }));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            starts.load(Ordering::SeqCst),
            0,
            "a Standby runs no singleton"
        );
        assert!(leadership.current().is_none());
        let term = |n| (FailoverEpoch::new(n, 1).unwrap(), Duration::from_secs(3600));
        ha.set(Some(term(1)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(starts.load(Ordering::SeqCst), 1, "runs once Active");
        assert_eq!(running.load(Ordering::SeqCst), 1);
        let guard = leadership.guard().unwrap();
        ha.set(None);
        assert!(guard.check().is_err(), "the guard ends with the HA term");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(task.is_finished() || starts.load(Ordering::SeqCst) == 1);
        ha.set(Some(term(2)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            starts.load(Ordering::SeqCst),
            2,
            "started again at the promotion, in the same group term"
        );
        drop(tx);
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
}
