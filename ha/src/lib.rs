//! # kube-shard-ha
//!
//! Cross-cluster Active/Standby for [`kube_shard`] operators: one cluster's operator acts, the other
//! stands by and mirrors its resources, and an optional witness cluster lets the Standby promote itself.
//! [`attach()`] makes a shard group's admission and fences need this cluster's term (the group's
//! [`kube_shard::ownership::TermGate`]). See `docs/ha.md`.
//!
//! - [`adoption`]: at promotion, the mirror's copies become the new Active's own objects.
//! - [`attach`](mod@attach): HA for a shard group ([`Attach`] for options; returns [`GroupHa`]).
//! - [`check`]: `kshard ha check`, both sides' settings compared in one table.
//! - [`checkpoint`]: the checkpoint ConfigMap's protocol (covered kinds, demotion token, positions).
//! - [`config`]: [`HaMode`] and [`HaConfig`], validated at build time.
//! - [`driver`]: the elector's I/O loop ([`spawn`]), its [`HaControl`] commands and [`HaStatus`].
//! - [`duty`]: mirror, adoption and failback as one duty of an operator process.
//! - [`elector`] (pure): the elector step, model-checked by `ha/tests/it/elector/model.rs`.
//! - [`epoch`] (pure): the failover epoch (n, rank), one integer on the wire ([`FailoverEpoch`]).
//! - `events` (private): the Kubernetes Events posted on the HA Lease ([`reason`]).
//! - [`failback`]: a returning old Active's objects become copies of the new Active's again.
//! - [`failover`]: the engine of `kshard ha promote --force`.
//! - [`floor`]: the highest epoch surviving outside the Leases, read before the elector starts.
//! - [`handle`]: [`HaHandle`], the admission guard (`is_active`, `admit`, `permit`, `await_change`).
//! - [`identity`]: each side's published identity (`<name>-ha-identity`), compared by the electors.
//! - [`metrics`]: [`HaMetrics`], the elector's Prometheus metrics.
//! - [`min_epoch`]: the minimum-failover-epoch parameter a promotion sets on both clusters.
//! - [`mirror`]: the Standby's copy of the Active's mirrored kinds.
//! - [`permit`]: [`HaPermit`], what a reconcile without a shard group writes under.
//! - [`promotion`]: the checks every promotion path runs before it writes.
//! - [`record`] (pure): the HA Lease codec (`<cluster-id>/<epoch>`, published timings, state).
//! - [`status`]: the engine of `kshard ha status`.
//! - [`switchover`]: planned switchover (`kshard ha demote`, `promote --token`, `demote --cancel`).
//! - `faults` and `overlap` (feature `test-util`): fault points for tests, and the overlap checker.

#![forbid(unsafe_code)]
// docs.rs (nightly, `--cfg docsrs`) marks the items behind a feature
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

/// Whether the HA fault point `$fault` (`faults`) is planted: on the calling thread, or (with an
/// instance) in that instance's `faults` set. Always `false`, and compiled away, without `test-util`.
macro_rules! planted {
    ($fault:ident) => {{
        #[cfg(any(test, feature = "test-util"))]
        let on = kube_shard::testing::faults::on($crate::faults::$fault);
        #[cfg(not(any(test, feature = "test-util")))]
        let on = false;
        on
    }};
    ($instance:expr, $fault:ident) => {{
        #[cfg(any(test, feature = "test-util"))]
        let on = $instance.faults.on($crate::faults::$fault);
        #[cfg(not(any(test, feature = "test-util")))]
        let on = false;
        on
    }};
}

pub mod adoption;
pub mod attach;
pub mod check;
pub mod checkpoint;
pub mod config;
pub mod driver;
pub mod duty;
pub mod elector;
pub mod epoch;
mod events;
pub mod failback;
pub mod failover;
pub mod floor;
pub mod handle;
pub mod identity;
pub mod metrics;
pub mod min_epoch;
pub mod mirror;
pub mod permit;
pub mod promotion;
pub mod record;
pub mod status;
pub mod switchover;

#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod faults;
#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod overlap;

pub use attach::{attach, Attach, GroupHa};
#[cfg(any(test, feature = "test-util"))]
pub use driver::spawn_with_faults;
pub use driver::{spawn, HaClients, HaControl, HaStatus};
pub use events::reason;
pub use handle::{HaHandle, NotActive};
pub use metrics::{HaMetrics, HaSnapshot};
pub use permit::{HaPermit, SendError, TermEnded};

pub use config::{HaConfig, HaConfigBuilder, HaConfigError, HaMode, Timings};
pub use elector::{Elector, ElectorConfig, HaRole, Slot, TokenTakeover};
pub use epoch::FailoverEpoch;
pub use record::{HaState, Origin, Record};
