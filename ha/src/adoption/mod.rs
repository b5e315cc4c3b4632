//! Adoption (HA.md "Promotion and adoption"): what turns the mirror's copies into the new Active's own
//! objects at promotion.
//!
//! - [`plan`] (pure): the promotion plan: the copies' recorded finalizers, owner references remapped to
//!   the copies' uids (owners first), the recomputed shard label and fence, then the deletes of copies
//!   whose source was terminating.
//! - [`pairing`] (pure): failback pairing by name and recorded source uid: label, update, divergent
//!   ([`crate::failback`] runs it).
//! - `run`: [`Adoption`], the promotion hook: the [`HaHandle`](crate::HaHandle) keeps admission
//!   closed at a new epoch until adoption finished ([`HaHandle::require_adoption`]); the task stops the
//!   mirror and waits for its requests, runs the plan, opens admission, and relabels the copies as owned
//!   in the background.
//! - `io`: the dynamic API of one kind, and the plan's steps executed on it.
//!
//! [`HaHandle::require_adoption`]: crate::HaHandle::require_adoption

pub mod pairing;
pub mod plan;

mod config;
pub(crate) mod io;
pub(crate) mod run;
#[cfg(test)]
mod tests;

pub use config::AdoptConfig;
pub use pairing::{Divergent, Pairing};
pub use plan::{ObjRef, Problem, ShardSpec};
pub use run::{AdoptStatus, Adoption};
