//! A gate in front of admission that grants terms: the seam cross-cluster HA (the `kube-shard-ha` crate) plugs
//! into, so the ownership layer does not depend on it (DESIGN: HA is "a gate in front of the group's
//! admission").
//!
//! Installed once per member ([`Ownership`](super::Ownership)): every admission then needs a term, and
//! takes its failover epoch into the permit; a fence lives no longer than the term of its permit's
//! epoch. The member-wide hold bit [`Hold::Term`](super::Hold::Term) mirrors the gate (kept in step by
//! whoever installs it), so lifting it re-enqueues the owned shards; the gate itself is read live, so a
//! term ends at its deadline even if nothing keeps the bit in step.

use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::watch;

use crate::token::FailoverEpoch;

/// A source of terms. Implementations are cheap to call (an atomic and a clock read): admission and
/// every fence check call them.
pub trait TermGate: Send + Sync + Debug + 'static {
    /// The failover epoch of the term this process may admit under now (`None`: no term; the gate may
    /// count it as a refusal).
    fn admit(&self) -> Option<FailoverEpoch>;
    /// The epoch acting now, without counting anything.
    fn active_epoch(&self) -> Option<FailoverEpoch>;
    /// The time the current term has left (zero without one).
    fn term_remaining(&self) -> Duration;
    /// A counter that changes with the term (for a task that follows it: it also waits for the term's
    /// deadline, since a term ends then without a change).
    fn term_changes(&self) -> watch::Receiver<u64>;
    /// The epoch whose term the gate asks the member to drain (`None`: no request): nothing more is
    /// admitted under it, and the member acknowledges once everything it admitted has ended.
    fn drain_requests(&self) -> watch::Receiver<Option<FailoverEpoch>>;
    /// Resolves at the next change of the term (granted, ended, another epoch), or when the current
    /// term's deadline passes: [`term_changes`](Self::term_changes) and
    /// [`term_remaining`](Self::term_remaining) read once, now.
    fn changed(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let mut rx = self.term_changes();
        let remaining = self.term_remaining();
        Box::pin(async move {
            if remaining.is_zero() {
                let _ = rx.changed().await;
            } else {
                tokio::select! {
                    biased; // a change first; either ends the wait
                    _ = rx.changed() => {}
                    () = tokio::time::sleep(remaining) => {}
                }
            }
        })
    }
}

/// A gate a unit test sets by hand: a term at an epoch until a deadline on tokio's clock.
#[cfg(test)]
pub(crate) mod manual {
    use std::sync::{Arc, Mutex};

    use tokio::time::Instant;

    use super::*;

    #[derive(Debug)]
    pub(crate) struct ManualGate {
        term: Mutex<Option<(FailoverEpoch, Instant)>>,
        changes: watch::Sender<u64>,
        drain: watch::Sender<Option<FailoverEpoch>>,
    }

    impl ManualGate {
        pub(crate) fn new() -> Arc<Self> {
            Arc::new(ManualGate {
                term: Mutex::new(None),
                changes: watch::channel(0).0,
                drain: watch::channel(None).0,
            })
        }

        /// A term at `epoch` for `d` from now (`None`: no term).
        pub(crate) fn set(&self, term: Option<(FailoverEpoch, Duration)>) {
            *self.term.lock().unwrap() = term.map(|(e, d)| (e, Instant::now() + d));
            self.changes.send_modify(|n| *n += 1);
        }

        fn live(&self) -> Option<(FailoverEpoch, Instant)> {
            let t = *self.term.lock().unwrap();
            t.filter(|(_, deadline)| Instant::now() < *deadline)
        }
    }

    impl TermGate for ManualGate {
        fn admit(&self) -> Option<FailoverEpoch> {
            self.active_epoch()
        }

        fn active_epoch(&self) -> Option<FailoverEpoch> {
            self.live().map(|(e, _)| e)
        }

        fn term_remaining(&self) -> Duration {
            self.live()
                .map_or(Duration::ZERO, |(_, d)| d - Instant::now())
        }

        fn term_changes(&self) -> watch::Receiver<u64> {
            self.changes.subscribe()
        }

        fn drain_requests(&self) -> watch::Receiver<Option<FailoverEpoch>> {
            self.drain.subscribe()
        }
    }
}
