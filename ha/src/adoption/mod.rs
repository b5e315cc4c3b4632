//! Adoption: at promotion, the mirror's copies become the new Active's own objects.
//!
//! - [`plan`] (pure): the copies' finalizers and owner references restored (owners first), the shard
//!   label and fence recomputed, then the deletes of copies whose source was terminating.
//! - [`pairing`] (pure): failback's pairing by name and recorded source uid ([`crate::failback`] runs it).
//! - `run`: [`Adoption`], the promotion hook: admission stays closed at a new epoch until adoption has
//!   finished ([`HaHandle::require_adoption`](crate::HaHandle::require_adoption)).
//! - `io`: the dynamic API of one kind, and the plan's steps run on it.
//!
//! See `docs/ha.md#adoption-and-failback-kube_shard_haadoption-failback-duty`.

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
