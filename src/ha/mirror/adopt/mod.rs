//! Adoption (HA.md "Promotion and adoption"; `review-ha.md` H15, H16, H18): what turns the mirror's
//! copies into the new Active's own objects at promotion, and the old Active's objects back into copies
//! at failback.
//!
//! - [`plan`] (pure): the promotion plan: the copies' recorded finalizers, owner references remapped to
//!   the copies' uids (owners first), the recomputed shard label and fence, then the deletes of copies
//!   whose source was terminating.
//! - [`pairing`] (pure): failback pairing by name and recorded source uid: label, update, divergent.
//! - `run`: [`Adoption`], the promotion hook: the [`HaHandle`](crate::ha::HaHandle) keeps admission
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
//! [`HaHandle::require_adoption`]: crate::ha::HaHandle::require_adoption

pub mod pairing;
pub mod plan;

mod checks;
mod duty;
mod failback;
mod io;
mod metrics;
mod run;
mod target;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use checks::{check_promotion, Checked, Overrides, PromotionChecks, PromotionPath};
pub use duty::{DutyStatus, MirrorDuty, WAS_ACTIVE_KEY};
pub use failback::{
    divergent_objects, promotable, Failback, FailbackOptions, FailbackReport, NotPromotable,
};
pub use metrics::MirrorMetrics;
pub use pairing::{Divergent, Pairing};
pub use plan::{ObjRef, Problem, ShardSpec};
pub use run::{AdoptStatus, Adoption};
pub use target::{
    check_target, hold_state, mirror_report, KindPosition, KindReport, MirrorReport, TargetRefused,
    DUTY_KEY,
};

use super::MirrorConfig;

/// What adoption adopts: the copies the mirror of `mirror` made (its kinds, its source cluster).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AdoptConfig {
    /// The mirror's configuration (kinds, source cluster id, scope, own objects).
    pub mirror: MirrorConfig,
    /// The group's shard key and count, to recompute children's shard labels (`None`: copies that
    /// carried one are reported).
    pub shard: Option<ShardSpec>,
    /// The wait before retrying an adoption that failed on a request.
    pub retry: Duration,
    /// PLANTED BUG for the tests: admission opened before adoption runs.
    #[doc(hidden)]
    pub planted_open_first: bool,
}

impl AdoptConfig {
    /// Adopt the copies of `mirror`; a 1 s retry.
    #[must_use]
    pub fn new(mirror: MirrorConfig) -> Self {
        AdoptConfig {
            mirror,
            shard: None,
            retry: Duration::from_secs(1),
            planted_open_first: false,
        }
    }

    /// Recompute shard labels under this key and count.
    #[must_use]
    pub fn shard(mut self, s: ShardSpec) -> Self {
        self.shard = Some(s);
        self
    }
}
