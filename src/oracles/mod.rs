//! Safety oracles for tests (feature `test-util`): checkers that read what a run did and assert the safety
//! contract of `docs/protocol.md` on it, instead of sampling states.
//!
//! - [`fences`]: exclusive fences, including requests in flight — per shard and per object uid, labelled
//!   `name/incarnation`. Fed by the [`FenceObserver`](crate::ownership::observe::FenceObserver) hook of
//!   [`Ownership`](crate::ownership::Ownership) and [`FencedApi`](crate::ownership::fenced_write::FencedApi).
//! - [`history`]: every owner change in the assignment's committed history is justified by the previous
//!   owner's `released` ack for that move or a takeover mark on its Lease, committed before the change.
//! - [`quiescence`]: committed fence epochs per uid never go back, and after quiescence every object's latest
//!   generation was reconciled by its owner.
//!
//! Each checker is pure: it takes a recorded history and returns the violations it finds. Histories are
//! serializable, so a violation recorded once (for example from a reproduction before a fix) stays a test
//! fixture of the checker.

pub mod fences;
pub mod history;
pub mod quiescence;

#[cfg(test)]
mod fences_tests;
#[cfg(test)]
mod history_tests;
#[cfg(test)]
mod quiescence_tests;
