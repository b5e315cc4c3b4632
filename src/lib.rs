//! # kube-shard
//!
//! Active-active sharding for [kube-rs](https://kube.rs) operators: every replica reconciles its own share of
//! the objects, by logical shards of the FNV-1a hash space, read through KEP-5866 `shardSelector` list/watch.
//!
//! ## Start here
//! - [`Controller`]: kube-runtime's controller over this member's shards, everything wired (the quickstart).
//! - [`ShardGroup::builder`] → [`ShardGroupBuilder`] → [`ShardGroup::start`] → [`GroupHandle`]: join a group.
//! - [`watcher()`], [`metadata_watcher()`], [`reflector()`], [`ShardedWatcher`]: read only the member's shards
//!   (each returns its re-enqueue stream too); [`gained()`] for admission only.
//! - [`reconcile::wrap`], [`wrap_fenced`](reconcile::wrap_fenced): admit by ownership ([`Permit`], [`AdmitError`]).
//! - [`Fence`], [`FencedApi`]: writes a deposed owner can no longer make ([`FenceError`]).
//! - [`Leadership`] / [`SingletonGuard`]: work that runs once per group.
//! - [`ShardGroupBuilder::term_gate`]: attach cross-cluster Active/Standby (the `kube-shard-ha` crate).
//!
//! ## Layers
//! Data flows down this list; the first five are pure. `docs/architecture.md` maps each to its doc.
//! - [`hash`]: FNV-1a 64 exactly as kube-apiserver computes it; [`hash::ShardKey`] (`uid` or `namespace`).
//! - [`range`]: hash ranges `[start, end)` up to 2^64 and normalised range sets.
//! - [`shard`]: `S` logical shards, `shard_of`, `range_of`, minimal range sets of shard sets.
//! - [`selector`]: the KEP-5866 selector in canonical form, and a parser as strict as the server.
//! - [`token`]: the `"<failover-epoch>:<shard>/<epoch>"` fence token fenced writes carry.
//! - [`fence_policy`]: admission policies with which the API server itself refuses stale fence tokens.
//! - [`rt`]: what every layer runs on: the clock (runtime, boot, wall), the spawner, seedable randomness.
//! - [`ownership`]: the per-member state machine, permits, fences, the reconcile wrapper, fenced writes.
//! - [`watcher`](mod@watcher): the sharded read path, the activation barrier, re-enqueues, secondary caches.
//! - [`group`]: the control plane: membership, coordinator, planner, handoff, takeover, singleton work.
//! - `testing` (feature `test-util`, unstable): oracles, drivers, fault points, the engines for tests.
//!
//! ```
//! use kube_shard::{hash::{fnv1a64, ShardKey}, selector::ShardSelector, shard::{ShardCount, ShardSet}};
//!
//! let s = ShardCount::new(256).unwrap();
//! let uid = "f47ac10b-58cc-4372-a567-0e02b2c3d479";
//! let shard = s.shard_of(fnv1a64(uid.as_bytes()));
//! assert_eq!(shard, 0x70);
//!
//! let owned = ShardSet::parse("0-127", s).unwrap();
//! let sel = ShardSelector::for_shards(ShardKey::Uid, s, &owned).unwrap();
//! assert_eq!(
//!     sel.to_string(),
//!     "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
//! );
//! ```
#![forbid(unsafe_code)]
// docs.rs (nightly, `--cfg docsrs`) marks the items behind a feature
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

/// Whether the core fault point `$fault` (`testing::faults`) is planted on this thread: always `false`, and
/// compiled away, without `test-util`.
macro_rules! planted {
    ($fault:ident) => {{
        #[cfg(any(test, feature = "test-util"))]
        let on = $crate::testing::faults::on($crate::testing::faults::$fault);
        #[cfg(not(any(test, feature = "test-util")))]
        let on = false;
        on
    }};
}

pub mod hash;
pub mod range;
pub mod selector;
pub mod shard;
pub mod token;

pub mod fence_policy;
mod yaml;

pub mod rt;

pub mod controller;
pub mod group;
pub mod ownership;
pub mod watcher;

#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod testing;

#[cfg(test)]
mod model_check;

pub use hash::{fnv1a64, KeyError, ShardKey};
pub use range::{HashRange, RangeError, RangeSet};
pub use selector::{SelectorError, ShardSelector};
pub use shard::{ShardCount, ShardError, ShardSet};
pub use token::{FenceToken, TokenError};

pub use rt::jitter;

pub use controller::Controller;
pub use group::{
    GroupError, GroupHandle, Leadership, ShardGroup, ShardGroupBuilder, SingletonGuard,
};
pub use ownership::fenced_write::FencedApi;
#[doc(inline)]
pub use ownership::{fenced_write, reconcile};
pub use ownership::{AdmitError, Current, Fence, FenceError, Ownership, OwnershipConfig, Permit};
pub use watcher::{
    dependent_reflector, dependent_watcher, gained, metadata_watcher, reflector, watcher,
    ShardedWatcher,
};
