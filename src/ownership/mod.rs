//! Ownership: the per-member state machine, admission (permits), fences, re-enqueue signals, the reconcile
//! wrapper, fenced writes and static mode.
//!
//! `state` is the pure transition function (`MemberState::apply`), model-checked in `src/model_check`.
//! [`Ownership`] is the cheap-to-clone handle: snapshots, change notifications and the [`Transitions`]
//! stream of re-enqueue signals. It issues [`Permit`]s and [`Fence`]s (checked on both clocks of
//! [`Clock`](crate::rt::Clock)); [`reconcile`] wraps `Controller::run`, [`fenced_write`] carries the fence on
//! writes, and [`static_shards`] is static mode: member *i* of *n*, no membership.
//!
//! See `docs/protocol.md` for the safety contract, what a fence guarantees, and the assumptions.

mod admission;
mod config;
pub(crate) mod current;
mod fence;
pub mod fenced_write;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub, dead_code))]
pub(crate) mod gates;
pub(crate) mod handle;
mod inflight;
pub(crate) mod inner;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod observe;
pub(crate) mod readers;
pub mod reconcile;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod state;
mod static_mode;
pub(crate) mod term_gate;

pub use admission::{AdmitError, Permit};
pub use config::OwnershipConfig;
pub use current::Current;
pub use fence::{Fence, FenceError};
pub use handle::{Ownership, Transitions};
pub use state::{AdmitCause, MemberId, MoveId, ShardState, ShardTransition};
pub use static_mode::{static_shards, StaticError};
pub use term_gate::TermGate;
