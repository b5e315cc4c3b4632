//! Ownership: the per-member state machine, admission (permits), fences, re-enqueue signals, the reconcile
//! wrapper, fenced writes and static mode.
//!
//! Data flows as `docs/protocol.md` describes:
//!
//! - [`state`]: the pure transition function ([`MemberState::apply`]), driven by assignment views in strictly
//!   increasing generation and local events. Model-checked (`tests/it/model_*.rs`).
//! - [`Ownership`]: the cheap-to-clone handle; arc-swap snapshots, change notifications, the
//!   [`Transitions`] stream (re-enqueue signals).
//! - `readers`: the member's registered read streams; a shard is warm (activated) only once every one of
//!   them synced it (passed its activation barrier).
//! - Admission: [`Permit`]s, in-flight counts, drains; `gates`: a shard's gates across holdings
//!   (a drain waits for every one still in flight). [`Fence`]s, checked on both clocks of [`Clock`](crate::rt::Clock).
//! - [`reconcile`]: the wrapper for `Controller::run`. [`fenced_write`]: uid/resourceVersion-preconditioned,
//!   fence-stamped writes. Static mode ([`static_shards`]): member *i* of *n*, no membership.
//!
//! The safety contract, what a fence does and does not guarantee, and the assumptions are in
//! `docs/protocol.md`.

mod admission;
mod config;
mod fence;
pub mod fenced_write;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod gates;
#[cfg(not(feature = "test-util"))]
pub(crate) mod gates;
mod handle;
mod inflight;
mod inner;
pub mod observe;
#[cfg(feature = "planted-bugs")]
#[doc(hidden)]
pub mod planted;
pub(crate) mod readers;
pub mod reconcile;
pub mod state;
mod static_mode;
pub(crate) mod term_gate;

#[cfg(test)]
pub(crate) mod handle_tests;
#[cfg(test)]
mod state_tests;

#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;

pub use admission::{AdmitError, Permit};
pub use config::OwnershipConfig;
pub use fence::{Fence, FenceError};
pub use handle::{Ownership, Transitions};
pub use inner::{Hold, Snapshot};
pub use state::{
    Ack, AdmitCause, AssignmentView, Handoff, MemberId, MemberState, MoveId, ShardAssignment,
    ShardState, ShardTransition,
};
pub use static_mode::{static_shards, StaticError};
pub use term_gate::TermGate;
