//! Admission: permits, in-flight counts and drains.
//!
//! Each held shard has a `Gate`: one atomic word holding the in-flight count (permits *and* live fences)
//! and a closed bit. Admission increments first and then checks (the closed bit in the same word, then the
//! ownership snapshot again), so there is no check-then-act race: once a drain has closed the gate and seen
//! the count at zero, no permit for that shard can ever be issued again. A shard that becomes Owned again
//! (cancel-back, new epoch) gets a fresh gate.

use std::{fmt, sync::Arc};

use super::{
    fence::{Fence, FenceError},
    inflight::Gate,
    inner::Inner,
    state::ShardState,
};

/// Proof that the member admitted work on one shard: Owned, unfenced, at an epoch.
///
/// Hold it for the whole reconcile; dropping it ends the in-flight count a drain waits for. Take a
/// [`Fence`] from it right before each side effect.
#[must_use = "a permit admits work only while it is held"]
pub struct Permit {
    pub(crate) inner: Arc<Inner>,
    pub(crate) shard: u32,
    pub(crate) epoch: u64,
    pub(crate) gate: Arc<Gate>,
    /// The failover epoch of the HA term it was admitted in (`None`: no HA).
    pub(crate) failover: Option<crate::token::FailoverEpoch>,
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("shard", &self.shard)
            .field("epoch", &self.epoch)
            .field("failover", &self.failover)
            .finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

impl Permit {
    /// The shard.
    #[must_use]
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// The epoch the shard was owned at when admitted.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The failover epoch of the cross-cluster HA term this permit was admitted in (`None` without HA).
    #[must_use]
    pub fn failover_epoch(&self) -> Option<crate::token::FailoverEpoch> {
        self.failover
    }

    /// A fence for a side effect now: valid only while the shard is still Owned at this epoch (or Outgoing,
    /// before the drain deadline), the member's last renewal is recent enough, on both clocks, and (with HA)
    /// the cluster's term at the permit's failover epoch still holds.
    pub fn fence(&self) -> Result<Fence, FenceError> {
        Fence::issue(
            &self.inner,
            self.shard,
            self.epoch,
            self.failover,
            &self.gate,
        )
    }
}

/// Why admission was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdmitError {
    /// Another member owns the shard (or nobody does): leave the object to it.
    #[error("shard {shard} is not owned by this member")]
    NotOwned {
        /// The shard.
        shard: u32,
    },
    /// This member holds the shard but may not act on it now (Incoming, Activating, Outgoing): retry soon.
    #[error("shard {shard} is held but not admitted now ({state:?})")]
    NotAdmitted {
        /// The shard.
        shard: u32,
        /// Its local state.
        state: ShardState,
    },
    /// The member is self-fenced (its last renewal is too old): retry soon.
    #[error("member is self-fenced: shard {shard} is not admitted until it renews")]
    SelfFenced {
        /// The shard.
        shard: u32,
    },
    /// Admission is held for the whole member: shadow mode, or a legacy leader-election Lease still has a
    /// live holder. Retry later (the hold lifting re-enqueues every owned shard).
    #[error("admission is held ({reason}): shard {shard} is not admitted")]
    Held {
        /// The shard.
        shard: u32,
        /// Why.
        reason: &'static str,
    },
    /// The object cannot be placed in a shard (for example it has no uid under the `uid` key).
    #[error("object cannot be placed in a shard: {0}")]
    Key(#[from] crate::hash::KeyError),
}

impl AdmitError {
    /// Whether the member holds the shard and should retry soon (requeue) rather than leave it to another.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            AdmitError::NotAdmitted { .. }
                | AdmitError::SelfFenced { .. }
                | AdmitError::Held { .. }
        )
    }
}

/// Admission on one shard: the race-free sequence. `Ok` holds one count on the gate.
pub(crate) fn admit(inner: &Arc<Inner>, shard: u32) -> Result<Permit, AdmitError> {
    let snap = inner.snapshot();
    let (epoch, gate, failover) = precheck(inner, &snap, shard)?;
    if !gate.try_enter() {
        return Err(refusal(&inner.snapshot(), shard));
    }
    // Re-check after the increment: a drain that closed the gate later waits for us; one that changed the
    // state earlier is visible now.
    let snap = inner.snapshot();
    match precheck(inner, &snap, shard) {
        Ok((e, g, f)) if e == epoch && f == failover && Arc::ptr_eq(&g, &gate) => Ok(Permit {
            inner: inner.clone(),
            shard,
            epoch,
            gate,
            failover,
        }),
        Ok(_) => {
            gate.leave();
            Err(refusal(&snap, shard))
        }
        Err(e) => {
            gate.leave();
            Err(e)
        }
    }
}

type Prechecked = (u64, Arc<Gate>, Option<crate::token::FailoverEpoch>);

fn precheck(
    inner: &Inner,
    snap: &super::inner::Snapshot,
    shard: u32,
) -> Result<Prechecked, AdmitError> {
    match snap.state.shard(shard) {
        Some(ShardState::Owned { epoch }) => {
            if let Some(reason) = inner.hold_reason() {
                return Err(AdmitError::Held { shard, reason });
            }
            // the term is read live (an atomic and a clock read), not only through the hold bit its
            // gate task sets: a term ends at its deadline even if no task runs
            let failover = match inner.gate.get() {
                None => None,
                Some(gate) => Some(gate.admit().ok_or(AdmitError::Held {
                    shard,
                    reason: super::inner::Hold::Term.reason_text(),
                })?),
            };
            if snap.state.is_fenced() || !inner.renewal_valid(snap) {
                return Err(AdmitError::SelfFenced { shard });
            }
            let gate = snap.gate(shard).ok_or(AdmitError::NotOwned { shard })?;
            Ok((epoch, gate, failover))
        }
        _ => Err(refusal(snap, shard)),
    }
}

fn refusal(snap: &super::inner::Snapshot, shard: u32) -> AdmitError {
    match snap.state.shard(shard) {
        None => AdmitError::NotOwned { shard },
        Some(ShardState::Owned { .. }) => AdmitError::SelfFenced { shard },
        Some(state) => AdmitError::NotAdmitted { shard, state },
    }
}
