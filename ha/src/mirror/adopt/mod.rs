//! Adoption (HA.md "Promotion and adoption"; `review-ha.md` H15, H16, H18): what turns the mirror's
//! copies into the new Active's own objects at promotion, and the old Active's objects back into copies
//! at failback.
//!
//! - [`plan`] (pure): the promotion plan: the copies' recorded finalizers, owner references remapped to
//!   the copies' uids (owners first), the recomputed shard label and fence, then the deletes of copies
//!   whose source was terminating.
//! - [`pairing`] (pure): failback pairing by name and recorded source uid: label, update, divergent.
//! - `run`: [`Adoption`], the promotion hook: the [`HaHandle`](crate::HaHandle) keeps admission
//!   closed at a new epoch until adoption finished ([`HaHandle::require_adoption`]); the task stops the
//!   mirror and waits for its requests, runs the plan, opens admission, and relabels the copies as owned
//!   in the background.
//! - `duty`: [`MirrorDuty`], what an HA operator process runs: the mirror while the peer is Active
//!   (after failback if this cluster was Active), adoption at each new epoch, nothing while Active.
//! - `checks`: [`check_promotion`], the checks every promotion path runs, with the mirror read from
//!   the Standby's checkpoint, and their [`Overrides`].
//! - `failback`: [`Failback`] (the old Active's pairing pass, the prune grace, `keep_divergent`) and
//!   [`divergent_objects`] / [`promotable`]: a Standby with divergent objects is not a valid promotion
//!   target.
//!
//! [`HaHandle::require_adoption`]: crate::HaHandle::require_adoption

pub mod pairing;
pub mod plan;

mod checks;
mod config;
mod duty;
mod failback;
mod io;
mod metrics;
mod run;
mod status;
mod target;
#[cfg(test)]
mod tests;

pub use crate::checkpoint::{DUTY_KEY, WAS_ACTIVE_KEY};
pub use checks::{check_promotion, Checked, Overrides, PromotionChecks, PromotionPath};
pub use config::AdoptConfig;
pub use duty::MirrorDuty;
pub use failback::{
    divergent_objects, promotable, Failback, FailbackOptions, FailbackReport, NotPromotable,
};
pub use metrics::MirrorMetrics;
pub use pairing::{Divergent, Pairing};
pub use plan::{ObjRef, Problem, ShardSpec};
pub use run::{AdoptStatus, Adoption};
pub use status::DutyStatus;
pub use target::{
    check_target, hold_state, mirror_report, KindPosition, KindReport, MirrorReport, TargetRefused,
};
