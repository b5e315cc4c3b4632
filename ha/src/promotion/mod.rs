//! Promotion's checks (HA.md "Promotion and adoption"): what every promotion path runs before it writes
//! anything.
//!
//! - `checks`: [`check_promotion`], the checks every promotion path runs (forced, token, automatic), with
//!   the mirror read from the Standby's checkpoint, and their [`Overrides`].
//! - `target`: [`check_target`], whether this cluster is a valid promotion target (its mirror's positions
//!   and synced kinds, no divergent objects), and the per-kind rows of `kshard ha status --kind`
//!   ([`mirror_report`]).

mod checks;
mod target;

pub use checks::{check_promotion, Checked, Overrides, PromotionChecks, PromotionPath};
pub use target::{
    check_target, hold_state, mirror_report, KindPosition, MirrorKindReport, MirrorReport,
    TargetRefused,
};
