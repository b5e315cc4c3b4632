//! Work that must run once per group: a singleton on the coordinator Lease, with a fencing term.
//!
//! The member that holds the group's coordinator Lease (`<group>-coordinator`) leads. Each acquisition
//! writes a new **term** into the Lease's `kube-shard.io/term` annotation with a resourceVersion
//! precondition: `max(previous term + 1, Unix ms)`, so terms strictly increase across acquisitions (also
//! when the Lease is deleted and re-created, as long as wall clocks do not step back by more than the age
//! of the old term). A leader's term is valid until `renew_deadline − fence_margin` after the start of its
//! last successful renewal, on its own monotonic clock; another member may acquire the Lease only after it
//! has not seen it change for `lease_duration` (> `renew_deadline`), so two valid terms never overlap in
//! time on clocks that run at the same rate.
//!
//! A leader that lets its term lapse (a stall, a failed renewal) and renews again starts a **new** term: each
//! run of singleton work has its own term. A member that leaves gracefully releases the Lease at once (its
//! term ends first), so the next coordinator does not wait for it to expire.
//!
//! What the term does not cover: work already sent when the term ends (an HTTP request in flight completes
//! on the server after the work is cancelled). Stamp the term into what the work writes and have the
//! receiver refuse lower terms, or re-check [`SingletonGuard::check`] right before each side effect; the
//! remaining window is a stall between the check and the write, as for shard fences (`docs/protocol.md`).

use std::future::Future;

use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, info_span, Instrument};

/// The Lease annotation that carries the leader's term.
pub const TERM_ANNOTATION: &str = "kube-shard.io/term";

/// One term of leadership: its number and how long it is valid without another renewal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaderTerm {
    /// The fencing term: strictly increasing across acquisitions of the coordinator Lease.
    pub term: u64,
    /// Valid until this instant (extended by every successful renewal of the Lease).
    pub valid_until: Instant,
}

impl LeaderTerm {
    pub(crate) fn new(term: u64, valid_until: Instant) -> Self {
        LeaderTerm { term, valid_until }
    }

    /// Whether the term is still valid now.
    #[must_use]
    pub fn is_valid(&self) -> bool {
        Instant::now() < self.valid_until
    }
}

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
}

impl Leadership {
    pub(crate) fn new(rx: watch::Receiver<Option<LeaderTerm>>) -> Self {
        Leadership { rx }
    }

    /// The current term, when this member leads and the term is valid now.
    #[must_use]
    pub fn current(&self) -> Option<LeaderTerm> {
        (*self.rx.borrow()).filter(LeaderTerm::is_valid)
    }

    /// Wait until this member leads (returns at once when it does). `None` when the member has stopped.
    pub async fn acquired(&mut self) -> Option<LeaderTerm> {
        loop {
            let cur = *self.rx.borrow_and_update();
            if let Some(t) = cur {
                if t.is_valid() {
                    return Some(t);
                }
                // lapsed: wait for a renewal (a new term) or a change
            }
            self.rx.changed().await.ok()?;
        }
    }

    /// A guard for the current term, when this member leads now.
    #[must_use]
    pub fn guard(&self) -> Option<SingletonGuard> {
        self.current().map(|t| SingletonGuard {
            rx: self.rx.clone(),
            term: t.term,
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
            if !t.is_valid() {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(t.valid_until) => {}
                r = rx.changed() => if r.is_err() { return },
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
            let guard = SingletonGuard {
                rx: self.rx.clone(),
                term: t.term,
            };
            let span = info_span!("singleton", name, term = t.term);
            info!(parent: &span, "term began: starting the singleton");
            let ended = self.ended(t.term);
            let fut = work(guard).instrument(span.clone());
            tokio::select! {
                () = fut => {
                    info!(parent: &span, "the singleton returned; waiting for the next term");
                    self.ended(t.term).await;
                }
                () = ended => info!(parent: &span, "term ended: the singleton was cancelled"),
            }
            // never start twice in one term
            while self.rx.borrow().is_some_and(|c| c.term == t.term) {
                if self.rx.changed().await.is_err() {
                    return;
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
}

impl SingletonGuard {
    /// The term: a fencing token to stamp into what the work writes.
    #[must_use]
    pub fn term(&self) -> u64 {
        self.term
    }

    /// `Ok(term)` while this member still leads in this term and the term is valid now.
    pub fn check(&self) -> Result<u64, NotLeader> {
        match *self.rx.borrow() {
            Some(t) if t.term == self.term && t.is_valid() => Ok(self.term),
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
}
