//! The HA state handle: the cheap admission guard an operator (and, in a later slice, a shard group's HA
//! gate) consults in every reconcile.
//!
//! [`HaHandle::is_active`] is an atomic read of the term the driver published, checked against the local
//! clock *now*: a term ends at its deadline even if the driver is stalled (self-fencing at the renew
//! deadline needs no task to run). [`HaHandle::await_change`] resolves when the role or epoch changes, so a
//! Standby's reconciler waits instead of requeueing every 2 s.
//!
//! Writes go under an [`HaPermit`](crate::HaPermit) ([`HaHandle::permit`]), checked before each: [`HaHandle::admit`] is the
//! decision to reconcile now, and a reconcile admitted late in a term would otherwise write after it.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::epoch::FailoverEpoch;
use super::metrics::HaMetrics;
use kube_shard::rt::Clock;

/// A published term: admission is open at `epoch` until `deadline` on the local clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// The failover epoch of the term.
    pub epoch: FailoverEpoch,
    /// The local-clock time the term ends unless renewed.
    pub deadline: Duration,
}

/// Admission refused: this cluster is not active.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this cluster is not the active HA cluster")]
#[non_exhaustive]
pub struct NotActive;

struct Shared {
    clock: Clock,
    term: ArcSwap<Option<Term>>,
    changes: watch::Sender<u64>,
    /// How many times the live term changed (a new epoch, a step-down, a lapse, a lapsed term regained):
    /// a permit holds only while this count is the one it was taken at.
    terms: AtomicU64,
    /// The epoch this cluster leads in the state `demoting`, as this process's elector read it.
    demoting: watch::Sender<Option<FailoverEpoch>>,
    refused: AtomicU64,
    metrics: HaMetrics,
    standalone: bool,
    /// Admission waits for adoption ([`HaHandle::require_adoption`]).
    adoption_required: AtomicBool,
    /// The highest epoch (wire form) whose adoption finished ([`HaHandle::adopted`]).
    adopted: AtomicU64,
}

/// The HA state handle. Cheap to clone.
#[derive(Clone)]
pub struct HaHandle {
    shared: Arc<Shared>,
}

impl fmt::Debug for HaHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HaHandle")
            .field("term", &**self.shared.term.load())
            .field("standalone", &self.shared.standalone)
            .finish_non_exhaustive()
    }
}

impl HaHandle {
    pub(crate) fn new(clock: Clock, metrics: HaMetrics, standalone: bool) -> Self {
        HaHandle {
            shared: Arc::new(Shared {
                clock,
                term: ArcSwap::from_pointee(None),
                changes: watch::channel(0).0,
                terms: AtomicU64::new(0),
                demoting: watch::channel(None).0,
                refused: AtomicU64::new(0),
                metrics,
                standalone,
                adoption_required: AtomicBool::new(false),
                adopted: AtomicU64::new(0),
            }),
        }
    }

    /// A handle for standalone mode: always active, no epoch (today's behaviour).
    #[must_use]
    pub fn standalone() -> Self {
        HaHandle::new(Clock::system(), HaMetrics::default(), true)
    }

    /// The epoch this cluster acts under now, if it is active (an atomic read and a clock read). With
    /// [`require_adoption`](Self::require_adoption), a term counts only once its epoch is
    /// [`adopted`](Self::adopted).
    #[must_use]
    pub fn active_epoch(&self) -> Option<FailoverEpoch> {
        self.leading_epoch().filter(|e| self.admits_at(*e))
    }

    /// Whether admission at `e` is open as far as adoption goes.
    fn admits_at(&self, e: FailoverEpoch) -> bool {
        self.shared.standalone
            || !self.shared.adoption_required.load(Ordering::Acquire)
            || self.shared.adopted.load(Ordering::Acquire) >= e.wire()
    }

    /// The epoch of the term this cluster holds now, whether or not admission is open (adoption runs
    /// between the two: HA.md "Promotion and adoption").
    #[must_use]
    pub fn leading_epoch(&self) -> Option<FailoverEpoch> {
        if self.shared.standalone {
            return Some(FailoverEpoch::default());
        }
        let term = (**self.shared.term.load())?;
        (self.shared.clock.elapsed() < term.deadline).then_some(term.epoch)
    }

    /// From now on, admission at an epoch opens only once [`adopted`](Self::adopted) was called for
    /// it (the adoption at promotion restores what the mirror kept aside first). A term already live
    /// is not closed retroactively: its epoch counts as adopted.
    pub fn require_adoption(&self) {
        if let Some(e) = self.leading_epoch() {
            self.shared.adopted.fetch_max(e.wire(), Ordering::AcqRel);
        }
        self.shared.adoption_required.store(true, Ordering::Release);
    }

    /// Whether admission waits for adoption.
    #[must_use]
    pub fn adoption_required(&self) -> bool {
        self.shared.adoption_required.load(Ordering::Acquire)
    }

    /// The highest epoch whose adoption finished (wire form; 0: none).
    #[must_use]
    pub fn adopted_epoch(&self) -> u64 {
        self.shared.adopted.load(Ordering::Acquire)
    }

    /// Adoption at `e` finished: admission opens at `e` (and wakes [`await_change`](Self::await_change)
    /// and the shard group's HA gate).
    pub fn adopted(&self, e: FailoverEpoch) {
        let old = self.shared.adopted.fetch_max(e.wire(), Ordering::AcqRel);
        if old < e.wire() {
            self.shared.changes.send_modify(|n| *n += 1);
        }
    }

    /// Whether this cluster acts now.
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.active_epoch().is_some()
    }

    /// The admission decision: the epoch this cluster acts under now, or [`NotActive`] (counted in
    /// `kube_shard_ha_refused_admissions`).
    ///
    /// For the decision only: the epoch says nothing about later. A reconcile that writes takes a
    /// [`permit`](Self::permit) instead and checks it before each write; otherwise a reconcile admitted
    /// late in a term keeps writing after the term ended, while the other cluster acts.
    pub fn admit(&self) -> Result<FailoverEpoch, NotActive> {
        self.active_epoch().ok_or_else(|| {
            let n = self.shared.refused.fetch_add(1, Ordering::Relaxed) + 1;
            self.shared.metrics.update_refused(n);
            NotActive
        })
    }

    /// How many times the live term changed (a permit holds only while this count is the one it was
    /// taken at).
    pub(crate) fn term_count(&self) -> u64 {
        self.shared.terms.load(Ordering::Acquire)
    }

    /// Whether this handle is standalone (always active, no term).
    pub(crate) fn is_standalone(&self) -> bool {
        self.shared.standalone
    }

    /// The time left in the live term at `epoch`, if the term is still the one counted `seq` (standalone:
    /// `Duration::MAX`).
    pub(super) fn left_in_term(&self, epoch: FailoverEpoch, seq: u64) -> Option<Duration> {
        if self.shared.standalone {
            return Some(Duration::MAX);
        }
        let term = (**self.shared.term.load())?;
        let left = term.deadline.saturating_sub(self.shared.clock.elapsed());
        // the term before the count: a change published in between is seen in the count
        let same = term.epoch == epoch
            && self.shared.terms.load(Ordering::Acquire) == seq
            && self.admits_at(epoch);
        (same && !left.is_zero()).then_some(left)
    }

    /// The published term, whether or not its deadline has passed.
    #[must_use]
    pub fn term(&self) -> Option<Term> {
        **self.shared.term.load()
    }

    /// Time left in the term now (zero when not active).
    #[must_use]
    pub fn term_remaining(&self) -> Duration {
        self.term().map_or(Duration::ZERO, |t| {
            t.deadline.saturating_sub(self.shared.clock.elapsed())
        })
    }

    /// Resolves at the next change of the published term's epoch or presence (a promotion, a step-down,
    /// a lost term). A Standby's reconciler awaits this instead of requeueing. Also resolves when the
    /// current term's deadline passes, since that ends admission without the driver.
    pub async fn await_change(&self) {
        kube_shard::ownership::TermGate::changed(self).await;
    }

    /// The epoch whose term this process's elector leads in the state `demoting` (a planned switchover:
    /// nothing is admitted, and a shard group's member acknowledges `ha-drained` once its work under
    /// that epoch has finished).
    #[must_use]
    pub fn demoting(&self) -> Option<FailoverEpoch> {
        *self.shared.demoting.borrow()
    }

    pub(crate) fn watch_demoting(&self) -> watch::Receiver<Option<FailoverEpoch>> {
        self.shared.demoting.subscribe()
    }

    pub(crate) fn publish_demoting(&self, d: Option<FailoverEpoch>) {
        self.shared.demoting.send_if_modified(|old| {
            let changed = *old != d;
            *old = d;
            changed
        });
    }

    /// The local clock this handle reads.
    #[must_use]
    pub fn clock(&self) -> Clock {
        self.shared.clock.clone()
    }

    pub(crate) fn publish(&self, term: Option<Term>) {
        let old = self.term();
        self.shared.term.store(Arc::new(term));
        // a change of the epoch acted under *now*: a term that lapsed at its deadline and is renewed again
        // at the same epoch is a change too (the gate waiting on it must wake)
        let now = self.shared.clock.elapsed();
        let live = |t: Option<Term>| t.filter(|t| now < t.deadline).map(|t| t.epoch);
        if live(old) != live(term) {
            self.shared.terms.fetch_add(1, Ordering::AcqRel);
            self.shared.changes.send_modify(|n| *n += 1);
        }
    }
}

impl HaMetrics {
    fn update_refused(&self, n: u64) {
        self.update_keep(|s| s.refused_admissions = n);
    }
}

/// The shard group's admission asks the HA term through the core's seam.
impl kube_shard::ownership::TermGate for HaHandle {
    fn admit(&self) -> Option<FailoverEpoch> {
        HaHandle::admit(self).ok()
    }

    fn active_epoch(&self) -> Option<FailoverEpoch> {
        HaHandle::active_epoch(self)
    }

    fn term_remaining(&self) -> Duration {
        HaHandle::term_remaining(self)
    }

    fn term_changes(&self) -> watch::Receiver<u64> {
        self.shared.changes.subscribe()
    }

    fn drain_requests(&self) -> watch::Receiver<Option<FailoverEpoch>> {
        self.watch_demoting()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_guard_closes_at_the_deadline_without_the_driver() {
        let h = HaHandle::new(Clock::system(), HaMetrics::default(), false);
        assert!(!h.is_active());
        assert_eq!(h.admit(), Err(NotActive));
        let e = FailoverEpoch::new(2, 1).unwrap();
        h.publish(Some(Term {
            epoch: e,
            deadline: h.clock().elapsed() + Duration::from_secs(10),
        }));
        assert_eq!(h.admit(), Ok(e));
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(h.is_active());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!h.is_active());
        assert_eq!(h.admit(), Err(NotActive));
        assert_eq!(h.shared.metrics.snapshot().refused_admissions, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn await_change_wakes_on_a_new_epoch() {
        let h = HaHandle::new(Clock::system(), HaMetrics::default(), false);
        let h2 = h.clone();
        let waiter = tokio::spawn(async move { h2.await_change().await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        h.publish(Some(Term {
            epoch: FailoverEpoch::new(1, 1).unwrap(),
            deadline: Duration::from_secs(100),
        }));
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken")
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn admission_waits_for_adoption_of_the_epoch() {
        let h = HaHandle::new(Clock::system(), HaMetrics::default(), false);
        h.require_adoption();
        let (e1, e2) = (
            FailoverEpoch::new(1, 1).unwrap(),
            FailoverEpoch::new(2, 1).unwrap(),
        );
        let term = |epoch| {
            Some(Term {
                epoch,
                deadline: Duration::from_secs(100),
            })
        };
        h.publish(term(e1));
        assert_eq!(h.leading_epoch(), Some(e1));
        assert_eq!(h.admit(), Err(NotActive));
        let h2 = h.clone();
        let waiter = tokio::spawn(async move { h2.await_change().await });
        tokio::task::yield_now().await;
        h.adopted(e1);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken by the adoption")
            .unwrap();
        assert_eq!(h.admit(), Ok(e1));
        // a higher epoch needs its own adoption
        h.publish(term(e2));
        assert_eq!(h.admit(), Err(NotActive));
        h.adopted(e2);
        assert_eq!(h.admit(), Ok(e2));
    }

    #[tokio::test(start_paused = true)]
    async fn requiring_adoption_does_not_close_a_live_term() {
        let h = HaHandle::new(Clock::system(), HaMetrics::default(), false);
        let e = FailoverEpoch::new(1, 1).unwrap();
        h.publish(Some(Term {
            epoch: e,
            deadline: Duration::from_secs(100),
        }));
        h.require_adoption();
        assert_eq!(h.admit(), Ok(e));
    }

    #[test]
    fn standalone_is_always_active() {
        assert!(HaHandle::standalone().is_active());
    }
}
