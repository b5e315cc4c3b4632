//! Safety oracles for tests (feature `test-util`): checkers that read what a run did and assert the safety
//! contract of `docs/protocol.md` on it, instead of sampling states.
//!
//! - [`fences`]: exclusive fences, including requests in flight, per shard and per object uid.
//! - [`history`]: every owner change in the assignment's committed history is justified.
//! - [`quiescence`]: fence epochs per uid never go back; after quiescence no work was lost.
//!
//! Each checker is pure: it takes a recorded, serializable history and returns the violations it finds,
//! so a violation recorded once stays a test fixture of the checker.

pub mod fences;
pub mod history;
pub mod quiescence;
