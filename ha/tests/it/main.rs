//! The HA crate's tests in one binary: the elector on two (and three) testservers, HA in a shard group,
//! the mirror, promotion and failback, planned switchover, the minimum-epoch fence, and the model check.

// The core's shard-group harness, shared by path (it is test code of the core crate, not an API).
#[allow(dead_code)]
#[path = "../../../tests/it/harness.rs"]
mod harness;

mod elector;
mod group;
mod mirror;
mod promotion;
