//! What every layer runs on: one [`Clock`] (the runtime clock, the boot clock that counts suspend, the wall
//! clock for stamps), the [`Spawner`] background tasks start through, and the library's randomness, which
//! a simulator seeds per thread ([`seed_thread`]) to replay a run exactly.
//!
//! A simulator or test injects its own clock and spawner through the builders
//! ([`ShardGroupBuilder::clock`](crate::ShardGroupBuilder::clock),
//! [`ShardGroupBuilder::spawner`](crate::ShardGroupBuilder::spawner)); an operator never needs to.

#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod clock;
mod random;
mod spawn;

pub use clock::Clock;
pub(crate) use clock::{Deadline, Now};
pub use random::{jitter, next_u64, seed_thread, unseed_thread};
pub use spawn::Spawner;
