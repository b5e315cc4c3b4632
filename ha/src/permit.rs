//! The HA permit: what a reconcile writes under without a shard group (HA.md contract 1).
//!
//! [`HaHandle::admit`] answers whether to reconcile *now*; an [`HaPermit`], taken once at the top of a
//! reconcile, guards each write: [`HaPermit::check`] fails for good once the term it was taken in has
//! ended, and [`HaPermit::send`] checks, then cuts the request at the term's end. A request the server
//! commits after the client gave up is safe only if the server finishes it within the request timeout.
//!
//! See `docs/ha.md#using-it` ("Why a permit, not `admit()`").

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tracing::{debug, debug_span, Instrument};

use super::epoch::FailoverEpoch;
use super::handle::{HaHandle, NotActive};

/// Proof that this cluster was active at [`epoch`](Self::epoch) when the reconcile began. Check it before
/// each write ([`check`](Self::check)) or send each write through it ([`send`](Self::send)).
#[derive(Clone)]
#[must_use = "a permit guards writes only when checked before each"]
pub struct HaPermit {
    ha: HaHandle,
    epoch: FailoverEpoch,
    /// The handle's term count when the permit was taken: any change of the live term ends the permit.
    seq: u64,
    deadline: Duration,
}

impl fmt::Debug for HaPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HaPermit")
            .field("epoch", &self.epoch)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl HaHandle {
    /// A permit for the term this cluster acts in now, or [`NotActive`] (counted like
    /// [`admit`](Self::admit)). Take it once per reconcile and [`check`](HaPermit::check) it before each
    /// write, or send each write through [`HaPermit::send`] (checked, and cut at the term's end): it
    /// fails for good once that term has ended.
    pub fn permit(&self) -> Result<HaPermit, NotActive> {
        // the count first: a change between the two reads ends the permit at its first check
        let seq = self.term_count();
        let epoch = self.admit()?;
        let deadline = if self.is_standalone() {
            Duration::MAX
        } else {
            self.term()
                .filter(|t| t.epoch == epoch)
                .map_or(Duration::ZERO, |t| t.deadline)
        };
        Ok(HaPermit::new(self.clone(), epoch, seq, deadline))
    }
}

impl HaPermit {
    pub(super) fn new(ha: HaHandle, epoch: FailoverEpoch, seq: u64, deadline: Duration) -> Self {
        HaPermit {
            ha,
            epoch,
            seq,
            deadline,
        }
    }

    /// The failover epoch of the term the permit was taken in (record it with what you write).
    #[must_use]
    pub fn epoch(&self) -> FailoverEpoch {
        self.epoch
    }

    /// The term's deadline on the handle's [local clock](HaHandle::clock) when the permit was taken
    /// (`Duration::MAX` standalone). Renewals move the term's end later: [`check`](Self::check) reads it
    /// live.
    #[must_use]
    pub fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Re-check before a write: the time the term has left now, or [`TermEnded`] once the term this
    /// permit was taken in has ended (for good: a lapse ends it even if the same epoch is regained).
    /// Standalone: always `Duration::MAX`.
    pub fn check(&self) -> Result<Duration, TermEnded> {
        self.ha
            .left_in_term(self.epoch, self.seq)
            .ok_or(TermEnded { epoch: self.epoch })
    }

    /// The time the term has left now (zero once it has ended): bound a request's timeout by it.
    #[must_use]
    pub fn remaining(&self) -> Duration {
        self.check().unwrap_or(Duration::ZERO)
    }

    /// Send one request under the permit: check first (nothing is sent, and `request` is not even called,
    /// once the term has ended), then run it with the term's remaining time as its timeout.
    ///
    /// ```no_run
    /// # use k8s_openapi::api::core::v1::ConfigMap;
    /// # use kube::{api::PostParams, Api};
    /// # async fn doc(ha: kube_shard_ha::HaHandle, api: Api<ConfigMap>, cm: ConfigMap) -> Result<(), Box<dyn std::error::Error>> {
    /// let permit = ha.permit()?; // once, at the top of the reconcile
    /// let pp = PostParams::default();
    /// let cm = permit.send(|| api.replace("cm", &pp, &cm)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn send<T, E, F, Fut>(&self, request: F) -> Result<T, SendError<E>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = debug_span!("ha_permit_send", epoch = %self.epoch);
        async {
            let left = self.check().map_err(SendError::TermEnded)?;
            debug!(?left, "sending under the HA permit");
            if left == Duration::MAX {
                return request().await.map_err(SendError::Request);
            }
            match tokio::time::timeout(left, request()).await {
                Ok(res) => res.map_err(SendError::Request),
                Err(_) => Err(SendError::OutlivedTerm(left)),
            }
        }
        .instrument(span)
        .await
    }
}

/// The term a permit was taken in has ended: this cluster may no longer write under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the HA term at epoch {epoch} has ended")]
#[non_exhaustive]
pub struct TermEnded {
    /// The permit's epoch.
    pub epoch: FailoverEpoch,
}

/// Why [`HaPermit::send`] did not return the request's answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SendError<E> {
    /// The term had ended: nothing was sent.
    #[error("not sent")]
    TermEnded(#[source] TermEnded),
    /// The request was still in flight at the term's end and was cut (the server may still commit it).
    #[error("the request outlived the HA term (cut after {0:?})")]
    OutlivedTerm(Duration),
    /// The request itself failed.
    #[error("the request failed")]
    Request(#[source] E),
}

impl<E> SendError<E> {
    /// The term ended (before or during the request): stop the reconcile and requeue, this cluster is no
    /// longer the active one at the permit's epoch. Not a reconcile error.
    #[must_use]
    pub fn is_term_ended(&self) -> bool {
        matches!(self, SendError::TermEnded(_) | SendError::OutlivedTerm(_))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::handle::Term;
    use crate::{HaMetrics, NotActive};
    use kube_shard::rt::Clock;

    fn e(n: u64) -> FailoverEpoch {
        FailoverEpoch::new(n, 1).unwrap()
    }

    /// A handle whose term at `epoch` ends `secs` from now.
    fn handle_with_term(epoch: FailoverEpoch, secs: u64) -> HaHandle {
        let h = HaHandle::new(Clock::system(), HaMetrics::default(), false);
        publish_for(&h, epoch, secs);
        h
    }

    fn publish_for(h: &HaHandle, epoch: FailoverEpoch, secs: u64) {
        h.publish(Some(Term {
            epoch,
            deadline: h.clock().elapsed() + Duration::from_secs(secs),
        }));
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_holds_while_its_term_is_renewed_and_ends_at_the_terms_deadline() {
        let h = handle_with_term(e(1), 10);
        let p = h.permit().unwrap();
        assert_eq!((p.epoch(), p.deadline()), (e(1), Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(p.check(), Ok(Duration::from_secs(4)));
        publish_for(&h, e(1), 10); // a renewal: the same term, a later end
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(p.check(), Ok(Duration::from_secs(4)));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(p.check(), Err(TermEnded { epoch: e(1) }));
        assert_eq!(p.remaining(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_permit_ends_with_a_step_down_or_a_new_epoch() {
        let h = handle_with_term(e(1), 10);
        let p = h.permit().unwrap();
        h.publish(None);
        assert!(p.check().is_err());
        publish_for(&h, e(2), 10);
        assert!(p.check().is_err(), "a permit of 1001 passed under 2001");
        assert_eq!(h.permit().unwrap().epoch(), e(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lapsed_term_regained_at_the_same_epoch_does_not_revive_a_permit() {
        let h = handle_with_term(e(1), 10);
        let p = h.permit().unwrap();
        tokio::time::advance(Duration::from_secs(11)).await;
        publish_for(&h, e(1), 10);
        assert!(h.is_active());
        assert!(p.check().is_err());
        assert!(h.permit().unwrap().check().is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_gets_no_permit_and_the_refusal_is_counted() {
        let m = HaMetrics::default();
        let h = HaHandle::new(Clock::system(), m.clone(), false);
        assert_eq!(h.permit().err(), Some(NotActive));
        h.require_adoption();
        publish_for(&h, e(1), 10);
        assert_eq!(h.permit().err(), Some(NotActive), "before its adoption");
        assert_eq!(m.snapshot().refused_admissions, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn send_sends_nothing_after_the_term() {
        let h = handle_with_term(e(1), 10);
        let p = h.permit().unwrap();
        tokio::time::advance(Duration::from_secs(10)).await;
        let called = Arc::new(AtomicBool::new(false));
        let c = called.clone();
        let res = p
            .send(|| async move {
                c.store(true, Ordering::SeqCst);
                Ok::<_, std::io::Error>(())
            })
            .await;
        assert!(matches!(res, Err(SendError::TermEnded(_))), "{res:?}");
        assert!(res.unwrap_err().is_term_ended());
        assert!(!called.load(Ordering::SeqCst), "the request was made");
    }

    #[tokio::test(start_paused = true)]
    async fn send_cuts_a_request_at_the_terms_end() {
        let h = handle_with_term(e(1), 10);
        let p = h.permit().unwrap();
        tokio::time::advance(Duration::from_secs(7)).await;
        let refused = p.send(|| async { Err::<(), _>("refused") }).await;
        assert!(matches!(refused, Err(SendError::Request("refused"))));
        let t0 = tokio::time::Instant::now();
        let res = p
            .send(std::future::pending::<Result<(), std::io::Error>>)
            .await;
        assert!(matches!(res, Err(SendError::OutlivedTerm(d)) if d == Duration::from_secs(3)));
        assert_eq!(t0.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn standalone_permits_are_unbounded() {
        let p = HaHandle::standalone().permit().unwrap();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(p.check(), Ok(Duration::MAX));
        assert_eq!(p.send(|| async { Ok::<_, ()>(7) }).await.unwrap(), 7);
    }
}
