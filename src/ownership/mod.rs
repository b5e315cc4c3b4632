//! Ownership: the per-member state machine, admission (permits), fences, re-enqueue signals, the reconcile
//! wrapper, fenced writes and static mode.
//!
//! Data flows as `docs/protocol.md` describes:
//!
//! - [`state`]: the pure transition function ([`MemberState::apply`]), driven by assignment views in strictly
//!   increasing generation and local events. Model-checked (`tests/it/model_*.rs`).
//! - [`Ownership`] ([`handle`]): the cheap-to-clone handle; arc-swap snapshots, change notifications, the
//!   [`Transitions`] stream (re-enqueue signals).
//! - `readers`: the member's registered read streams; a shard is warm (activated) only once every one of
//!   them synced it (passed its activation barrier).
//! - [`admission`]: [`Permit`]s, in-flight counts, drains; `gates`: a shard's gates across holdings
//!   (a drain waits for every one still in flight). [`fence`]: [`Fence`]s checked on both [`clock`]s.
//! - [`reconcile`]: the wrapper for `Controller::run`. [`fenced_write`]: uid/resourceVersion-preconditioned,
//!   fence-stamped writes. [`static_mode`]: member *i* of *n*, no membership.
//!
//! The safety contract, what a fence does and does not guarantee, and the assumptions are in
//! `docs/protocol.md`.

pub mod admission;
pub mod clock;
pub mod fence;
pub mod fenced_write;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod gates;
#[cfg(not(feature = "test-util"))]
pub(crate) mod gates;
pub mod handle;
pub mod observe;
#[cfg(feature = "planted-bugs")]
#[doc(hidden)]
pub mod planted;
pub mod random;
pub(crate) mod readers;
pub mod reconcile;
pub mod spawn;
pub mod state;
pub mod static_mode;
pub mod term_gate;

#[cfg(test)]
pub(crate) mod handle_tests;
#[cfg(test)]
mod state_tests;

#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;

use std::time::Duration;

pub use admission::{AdmitError, Permit};
pub use fence::{Fence, FenceError};
pub use handle::{Hold, Ownership, Snapshot, Transitions};
pub use state::{
    Ack, AdmitCause, AssignmentView, Handoff, MemberId, MemberState, MoveId, ShardAssignment,
    ShardState, ShardTransition,
};
pub use term_gate::TermGate;

use crate::{hash::ShardKey, shard::ShardCount};

/// Ownership settings. Defaults as in `docs/control-plane.md`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnershipConfig {
    /// `S`, the number of logical shards of the group.
    pub shards: ShardCount,
    /// The key objects are placed by.
    pub key: ShardKey,
    /// A member whose last successful renewal *started* longer ago than this is self-fenced (default 10 s).
    pub renew_deadline: Duration,
    /// Fences end this much before the renew deadline (default 1 s): covers clock-rate error and the time
    /// between the fence check and the request reaching the server.
    pub fence_margin: Duration,
    /// How long an Outgoing shard waits for in-flight work before it is released anyway (default 10 s; fences
    /// issued while Outgoing expire by then).
    pub drain_timeout: Duration,
    /// The requeue delay for an object held but not admitted now (default 2 s, jittered ±20 %).
    pub not_admitted_requeue: Duration,
}

impl Default for OwnershipConfig {
    fn default() -> Self {
        OwnershipConfig {
            shards: ShardCount::DEFAULT,
            key: ShardKey::Uid,
            renew_deadline: Duration::from_secs(10),
            fence_margin: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(10),
            not_admitted_requeue: Duration::from_secs(2),
        }
    }
}

impl OwnershipConfig {
    /// The defaults for `S` shards placed by `key`.
    ///
    /// ```
    /// use kube_shard::{ownership::OwnershipConfig, ShardCount, ShardKey};
    /// let c = OwnershipConfig::new(ShardCount::new(16).unwrap(), ShardKey::Namespace);
    /// assert_eq!(c.renew_deadline.as_secs(), 10);
    /// ```
    #[must_use]
    pub fn new(shards: ShardCount, key: ShardKey) -> Self {
        OwnershipConfig {
            shards,
            key,
            ..OwnershipConfig::default()
        }
    }
}

/// `d` jittered by up to ±20 %: spreads requeues and re-enqueues of many objects so they do not arrive as one
/// burst. The read path paces re-enqueue `ObjectRef`s with it.
///
/// ```
/// use std::time::Duration;
/// let d = kube_shard::ownership::jitter(Duration::from_secs(10));
/// assert!(d >= Duration::from_secs(8) && d <= Duration::from_secs(12));
/// ```
#[must_use]
pub fn jitter(d: Duration) -> Duration {
    let r = random::next_u64() % 4001; // 0..=4000 → factor 0.8..=1.2
    d.mul_f64(0.8 + r as f64 / 10_000.0)
}
