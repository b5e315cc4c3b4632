//! Fences: proof, taken right before a side effect, that this member may act on a shard.
//!
//! A [`Fence`] is `(shard, epoch, valid_until)`, issued only while the shard is Owned at the permit's epoch
//! (or Outgoing at it, before the drain deadline) under the permit's gate, and the member is not
//! self-fenced. `valid_until` is the earliest of the last renewal start + `renew_deadline` − margin, the
//! drain deadline while Outgoing and, with cross-cluster HA, the end of the term at the permit's failover
//! epoch, on both the runtime and the boot clock; [`Fence::check`] re-checks all of it at send time. A
//! request sent in time may still commit later, so fenced writes carry uid and resourceVersion preconditions.
//!
//! See `docs/protocol.md#what-a-fence-guarantees-and-what-it-does-not`.

use std::{fmt, sync::Arc, time::Duration};

use super::{
    inflight::Gate,
    inner::{Inner, Snapshot},
    observe::{next_id, FenceEvent, Tracked},
    state::ShardState,
};
use crate::rt::Deadline;
use crate::token::FenceToken;

/// A fence: `(shard, epoch, valid_until)`. While it lives it counts as an outstanding fenced request, so a
/// drain of the shard waits for it (or for the drain deadline).
pub struct Fence {
    inner: Arc<Inner>,
    gate: Arc<Gate>,
    shard: u32,
    epoch: u64,
    token: FenceToken,
    valid_until: Deadline,
    /// The failover epoch whose HA term this fence needs (`None`: no HA).
    failover: Option<crate::token::FailoverEpoch>,
    /// Set only while an observer is installed: reports the drop of the last clone.
    tracked: Option<Arc<Tracked>>,
}

impl fmt::Debug for Fence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fence")
            .field("token", &self.token)
            .field("valid_until", &self.valid_until)
            .finish()
    }
}

impl Clone for Fence {
    fn clone(&self) -> Self {
        self.gate.enter_held();
        Fence {
            inner: self.inner.clone(),
            gate: self.gate.clone(),
            shard: self.shard,
            epoch: self.epoch,
            token: self.token,
            valid_until: self.valid_until,
            failover: self.failover,
            tracked: self.tracked.clone(),
        }
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        self.gate.leave();
    }
}

impl Fence {
    pub(crate) fn issue(
        inner: &Arc<Inner>,
        shard: u32,
        epoch: u64,
        failover: Option<crate::token::FailoverEpoch>,
        gate: &Arc<Gate>,
    ) -> Result<Fence, FenceError> {
        let snap = inner.snapshot();
        let valid_until = valid_until(inner, &snap, shard, epoch, failover, gate)?;
        if valid_until.remaining(inner.clock.now()).is_zero() {
            return Err(FenceError::Expired { shard, epoch });
        }
        gate.enter_held();
        gate.issued(valid_until.runtime);
        let tracked = inner.observer.get().map(|observer| {
            let id = next_id();
            observer.on_event(FenceEvent::Issued {
                fence: id,
                member: snap.state.me().clone(),
                shard,
                epoch,
                at: inner.clock.now(),
                valid_until,
            });
            Arc::new(Tracked {
                id,
                observer: observer.clone(),
                clock: inner.clock.clone(),
            })
        });
        Ok(Fence {
            inner: inner.clone(),
            gate: gate.clone(),
            shard,
            epoch,
            // without HA the failover epoch is 0 (HA.md "Fenced by the server")
            token: FenceToken::shard_token(failover.unwrap_or_default(), shard, epoch),
            valid_until,
            failover,
            tracked,
        })
    }

    /// The shard.
    #[must_use]
    pub fn shard(&self) -> u32 {
        self.shard_and_epoch().0
    }

    /// The epoch.
    #[must_use]
    pub fn epoch(&self) -> u64 {
        self.shard_and_epoch().1
    }

    fn shard_and_epoch(&self) -> (u32, u64) {
        (self.shard, self.epoch)
    }

    /// The failover epoch of the HA term this fence needs (`None` without HA).
    #[must_use]
    pub fn failover_epoch(&self) -> Option<crate::token::FailoverEpoch> {
        self.failover
    }

    /// The wire token `"<failover-epoch>:<shard>/<epoch>"` (failover epoch 0 without HA).
    #[must_use]
    pub fn token(&self) -> FenceToken {
        self.token
    }

    /// The observer's record of this fence, when one is installed.
    pub(crate) fn tracked(&self) -> Option<&Arc<Tracked>> {
        self.tracked.as_ref()
    }

    /// Re-check at send time: the time left (on the earlier of both clocks) if the fence is still valid.
    ///
    /// The shard must still be held at this epoch (Owned, or Outgoing before the drain deadline) under the
    /// same holding (its gate not retired by a cancel-back) and the renewal deadline not passed; the result
    /// is never more than what was issued.
    pub fn check(&self) -> Result<Duration, FenceError> {
        let snap = self.inner.snapshot();
        let (shard, epoch) = self.shard_and_epoch();
        let now_valid = valid_until(&self.inner, &snap, shard, epoch, self.failover, &self.gate)?
            .min(self.valid_until);
        let left = now_valid.remaining(self.inner.clock.now());
        if left.is_zero() {
            return Err(FenceError::Expired { shard, epoch });
        }
        Ok(left)
    }
}

fn valid_until(
    inner: &Inner,
    snap: &Snapshot,
    shard: u32,
    epoch: u64,
    failover: Option<crate::token::FailoverEpoch>,
    gate: &Arc<Gate>,
) -> Result<Deadline, FenceError> {
    if snap.state.is_fenced() {
        return Err(FenceError::SelfFenced { shard });
    }
    let renewal = snap.renewal.ok_or(FenceError::SelfFenced { shard })?;
    let until = match snap.state.shard(shard) {
        Some(ShardState::Owned { epoch: e }) if e == epoch => renewal,
        Some(ShardState::Outgoing { epoch: e, .. }) if e == epoch => {
            match snap.drain_deadline(shard) {
                Some(d) => renewal.min(d),
                None => return Err(FenceError::NotHeld { shard, epoch }),
            }
        }
        _ => return Err(FenceError::NotHeld { shard, epoch }),
    };
    // a permit or fence of a retired gate (the holding before a cancel-back at the same epoch) mints and
    // passes nothing: no later drain would count the requests sent with it
    if !snap.is_current_gate(shard, gate) {
        return Err(FenceError::NotHeld { shard, epoch });
    }
    match (inner.gate.get(), failover) {
        (None, _) => Ok(until),
        // HA.md "HA in a shard group": a fence needs the term of its permit's failover epoch, and ends
        // at the earliest of the renewal, the drain and the term's deadline
        (Some(gate), Some(f)) if gate.active_epoch() == Some(f) => {
            Ok(until.min(inner.clock.now().plus(gate.term_remaining())))
        }
        (Some(_), _) => Err(FenceError::TermEnded { shard, epoch }),
    }
}

/// Why a fence was refused or is no longer valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The shard is no longer held at this epoch (released, taken over, re-granted at a newer epoch), or no
    /// longer under the holding the permit was admitted in (a drain began, then was cancelled back).
    #[error("shard {shard} is no longer held at epoch {epoch}")]
    NotHeld {
        /// The shard.
        shard: u32,
        /// The epoch.
        epoch: u64,
    },
    /// The member is self-fenced.
    #[error("member is self-fenced: no fence for shard {shard}")]
    SelfFenced {
        /// The shard.
        shard: u32,
    },
    /// Behind a term gate (cross-cluster HA): the term at the permit's failover epoch has ended (no term now, or a
    /// new epoch).
    #[error("fence {shard}/{epoch}: the term it was issued under has ended")]
    TermEnded {
        /// The shard.
        shard: u32,
        /// The epoch.
        epoch: u64,
    },
    /// The renewal deadline or the drain deadline passed on one of the clocks.
    #[error("fence {shard}/{epoch} expired")]
    Expired {
        /// The shard.
        shard: u32,
        /// The epoch.
        epoch: u64,
    },
}
