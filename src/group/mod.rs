//! The shard-group control plane (`docs/control-plane.md`): membership, the coordinator, the
//! assignment planner, handoff, takeover and lifecycle.
//!
//! Start a member with [`ShardGroup::builder`]; its [`GroupHandle`] gives the [`Ownership`](crate::ownership::Ownership)
//! for the read path and the reconcile wrapper, status, health, metrics, a graceful leave, and
//! [`Leadership`] for singleton work on the coordinator Lease. The two formats are public for tools:
//! [`assignment`] (the ConfigMap codec) and [`report`] (the member report in its Lease); and the least
//! number of shards a membership change must move, [`optimal_moves`]. See `docs/control-plane.md`.

pub mod admin;
pub mod assignment;
mod builder;
mod config;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod coordinator;
mod events;
mod handle;
mod metrics;
mod moves;
mod permission;
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod planner;
pub mod report;
mod runtime;
mod shard_group;
mod singleton;
mod status;
mod term_gate;
mod wiring;

pub use builder::ShardGroupBuilder;
pub use config::{default_member_name, ConfigError, GroupConfig, PodRef};
pub use handle::GroupHandle;
pub use metrics::{GroupMetrics, GroupSnapshot};
pub use moves::optimal_moves;
pub use permission::{PermissionError, PERMISSION_ERROR};
pub use runtime::next_stamp;
pub use runtime::GroupError;
pub use shard_group::ShardGroup;
pub use singleton::{LeaderTerm, Leadership, NotLeader, SingletonGuard, TERM_ANNOTATION};
pub use status::{GroupStatus, Health};
