//! # kube-shard-ha
//!
//! Cross-cluster Active/Standby for [`kube_shard`] operators (HA.md): one cluster's operator acts, the
//! other stands by mirroring its resources, and a witness cluster may decide promotions automatically.
//! A shard group gets it with [`attach()`]: the member's elector becomes the group's term gate
//! ([`kube_shard::ownership::TermGate`]), so admission and fences need this cluster's term.
//!
//! - [`attach()`]: HA for a shard group ([`Attach`] for options), and what it returns ([`GroupHa`]).
//!
//! - [`epoch`]: the failover epoch (n, rank), one integer on the wire: the core's [`kube_shard::token::FailoverEpoch`].
//! - [`config`]: [`HaMode`] and [`HaConfig`], validated at build time.
//! - [`record`]: the HA Lease codec (`<cluster-id>/<epoch>`, published timings).
//! - [`elector`]: the pure elector step (no I/O), model-checked by `tests/it/model_ha.rs`.
//!
//! Everything above is pure.
//!
//! - [`driver`]: the I/O driver on `kube::Api<Lease>` ([`spawn`]), its [`HaControl`] commands and
//!   [`HaStatus`].
//! - [`handle`]: [`HaHandle`], the admission guard (`is_active`, `admit`, `permit`, `await_change`; with
//!   `require_adoption`, a new epoch admits only once `adopted`): the seam a
//!   shard group's HA gate will consult.
//! - [`permit`]: [`HaPermit`] ([`HaHandle::permit`]), what a reconcile without a shard group writes
//!   under: checked before each write, it fails once the term it was taken in has ended.
//! - [`metrics`]: [`HaMetrics`]. `events`: Kubernetes Events on the HA Lease.
//! - [`check`]: `kshard ha check`, both sides' settings compared in one table.
//! - [`identity`]: each side's published identity (`<name>-ha-identity`), compared by the electors.
//! - [`floor`]: the highest epoch surviving outside the Leases, read before the elector starts.
//! - [`min_epoch`]: the minimum-failover-epoch parameter a promotion sets on the old Active's cluster.
//! - [`checkpoint`] (pure): the checkpoint ConfigMap's protocol, shared by the mirror and the switchover:
//!   covered kinds, the demotion token, keys, positions ([`checkpoint::edit`] writes it).
//! - [`mirror`]: the Standby's copy of the Active's mirrored kinds.
//! - The HA phases, each on the checkpoint and the mirror: [`promotion`] (the checks every promotion
//!   path runs), [`adoption`] (the copies become the new Active's own), [`failback`] (a returning Active's
//!   objects become copies again), and [`duty`] (what an operator process runs: mirror, adoption,
//!   failback).
//! - [`status`]: the engine of `kshard ha status`; [`failover`]: of `kshard ha promote --force`.
//! - [`switchover`]: planned switchover: `kshard ha demote` (the mark, the members' `ha-drained` acks,
//!   the freeze, the demotion token), `promote --token` (the token table), `demote --cancel`.

#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

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
pub mod overlap;

pub use attach::{attach, Attach, GroupHa};
#[cfg(any(test, feature = "test-util"))]
pub use driver::spawn_with_flaws;
pub use driver::{spawn, HaClients, HaControl, HaStatus};
pub use events::reason;
pub use handle::{HaHandle, LocalClock, NotActive};
pub use metrics::{HaMetrics, HaSnapshot};
pub use permit::{HaPermit, SendError, TermEnded};

pub use config::{HaConfig, HaConfigBuilder, HaConfigError, HaMode, Timings};
pub use elector::{Elector, ElectorConfig, HaRole, Slot, TokenTakeover};
pub use epoch::FailoverEpoch;
pub use record::{HaState, Origin, Record};
