//! Safety oracles for tests (feature `test-util`): checkers that read what a run did and assert the safety
//! contract of `docs/DESIGN.md` on it, instead of sampling states.
//!
//! - [`fences`]: exclusive fences, including requests in flight — per shard and per object uid, labelled
//!   `name/incarnation`. Fed by the [`FenceObserver`](crate::ownership::observe::FenceObserver) hook of
//!   [`Ownership`](crate::ownership::Ownership) and [`FencedApi`](crate::ownership::fenced_write::FencedApi).
//!
//! Each checker is pure: it takes a recorded history and returns the violations it finds. Histories are
//! serializable, so a violation recorded once (for example from a reproduction before a fix) stays a test
//! fixture of the checker.

pub mod fences;

#[cfg(test)]
mod fences_tests;
