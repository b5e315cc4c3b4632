//! The shard-group control plane (`docs/control-plane.md`): membership, the coordinator, the
//! assignment planner, handoff, takeover and lifecycle.
//!
//! Start a member with [`ShardGroup::builder`]; its [`GroupHandle`] gives the [`Ownership`](crate::ownership::Ownership)
//! for the read path and the reconcile wrapper, status, health, metrics, a graceful leave, and
//! [`Leadership`] for singleton work on the coordinator Lease. The pure parts are public for tools and
//! tests: [`planner`] (the target assignment with the fewest moves, cold-start settle, join debounce),
//! [`assignment`] (the ConfigMap codec) and [`report`] (the member report in its Lease). See
//! `docs/control-plane.md`.

pub mod assignment;
mod config;
#[cfg(feature = "test-util")]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod coordinator;
#[cfg(not(feature = "test-util"))]
pub(crate) mod coordinator;
mod events;
mod metrics;
pub mod planner;
pub mod report;
mod runtime;
mod shard_group;
mod singleton;
mod status;
mod term_gate;

pub use config::{default_member_name, ConfigError, GroupConfig};
pub use metrics::{GroupMetrics, GroupSnapshot};
pub use runtime::next_stamp;
pub use runtime::GroupError;
pub use shard_group::{GroupHandle, ShardGroup, ShardGroupBuilder};
pub use singleton::{LeaderTerm, Leadership, NotLeader, SingletonGuard, TERM_ANNOTATION};
pub use status::{GroupStatus, Health};
