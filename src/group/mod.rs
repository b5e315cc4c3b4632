//! The shard-group control plane (`docs/DESIGN.md` §2, §3, §7): membership, the coordinator, the
//! assignment planner, handoff, takeover and lifecycle.
//!
//! Only the pure part has landed so far: [`planner`], which turns membership and the current assignment
//! into a target assignment with the fewest moves, and decides when the first plan may be made (cold-start
//! settle) and when a join may be planned (join debounce). The Lease-driven membership, the coordinator and
//! the `ShardGroup` builder land in this module next to it.

pub mod assignment;
pub mod config;
pub(crate) mod coordinator;
mod events;
mod metrics;
pub mod planner;
pub mod report;
mod runtime;
mod shard_group;
pub mod status;

pub use config::{ConfigError, GroupConfig};
pub use metrics::{GroupMetrics, GroupSnapshot};
pub use runtime::GroupError;
pub use shard_group::{GroupHandle, ShardGroup, ShardGroupBuilder};
pub use status::{GroupStatus, Health};
