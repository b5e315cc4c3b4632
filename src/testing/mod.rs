//! Test support (feature `test-util`), **unstable**: what the workspace's own tests, simulator, fuzzers and
//! benchmarks reach beyond the public API. Never enable the feature in production builds.
//!
//! - [`faults`]: the one fault-injection mechanism (fault points each crate declares, planted per thread or
//!   per instance).
//! - [`oracles`]: checkers that take a recorded history and return the violations of the safety contract.
//! - [`driver`]: grant shards to an [`Ownership`] without a control plane; [`observe_fences`] feeds the
//!   fence oracle.
//! - The engines, stepped directly: [`member`] (the per-member state machine), [`coordinator`] (one
//!   coordination step), [`planner`] (the target assignment), [`fence_messages`] (the API server's refusals).

use std::sync::Arc;

use crate::ownership::Ownership;

mod driver;
pub mod faults;
pub mod fence_log;
pub mod oracles;

pub use crate::ownership::current::admit_all_on_this_thread;
pub use crate::ownership::observe::{FenceEvent, FenceObserver, RequestOutcome};
pub use crate::rt::clock::{Deadline, Now};
pub use driver::{driver, driver_with_clock, TestDriver};

/// The per-member state machine and a shard's gates across holdings.
pub mod member {
    pub use crate::ownership::gates::ShardGates;
    pub use crate::ownership::state::*;
}

/// One coordination step, pure.
pub mod coordinator {
    pub use crate::group::coordinator::*;
}

/// The planner: the target assignment with the fewest moves.
pub mod planner {
    pub use crate::group::planner::*;
}

/// The messages with which the API server refuses a stale fence token (the fence policies' text).
pub mod fence_messages {
    pub use crate::fence_policy::messages::*;
}

/// Report every fence `ownership` issues and every fenced request to `observer` (the fence oracle); `false`
/// if an observer was installed already.
pub fn observe_fences(ownership: &Ownership, observer: Arc<dyn FenceObserver>) -> bool {
    ownership.observe_fences(observer)
}

/// The member state machine behind `ownership`, as of now.
#[must_use]
pub fn member_state(ownership: &Ownership) -> member::MemberState {
    ownership.snapshot().state().clone()
}
