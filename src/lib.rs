//! # kube-shard
//!
//! Active-active sharding for [kube-rs](https://kube.rs) operators. Instead of one leader doing all the
//! work while standbys idle, every replica reconciles its own share of the objects: stable logical shards
//! of the 64-bit FNV-1a hash space, owned under a live assignment that moves safely when replicas join,
//! leave, pause or die, and read through Kubernetes KEP-5866 server-side `shardSelector` list/watch (with
//! a local hash filter whenever the server does not filter).
//!
//! ## Start here
//!
//! A replica joins a shard group, reads only the objects of its shards, and reconciles each one only while
//! it owns it:
//!
//! - [`ShardGroup::builder`] → [`ShardGroupBuilder`] → [`ShardGroup::start`] → [`GroupHandle`]: membership,
//!   the live assignment, drain-before-activate handoff, failure takeover, status and health.
//! - [`watcher()`], [`metadata_watcher()`], [`reflector()`]: drop-ins for `kube_runtime`'s, driving the
//!   KEP-5866 `shardSelector` (or a local filter) for the member's [`Ownership`]; [`ShardedWatcher`] for
//!   re-enqueues and secondary caches.
//! - [`ownership::reconcile::wrap`] / [`wrap_fenced`](ownership::reconcile::wrap_fenced): the reconcile
//!   wrapper for `Controller::run`, admitting by ownership ([`Permit`], [`AdmitError`]); [`Fence`] and
//!   [`FencedApi`]: writes a deposed owner can no longer make ([`FenceError`]).
//! - [`Leadership`] / [`SingletonGuard`]: work that runs once per group.
//!
//! Cross-cluster Active/Standby is the `kube-shard-ha` crate, attached to a group through
//! [`ShardGroupBuilder::term_gate`].
//!
//! ## Layers
//!
//! The data flows down this list; the repository's `docs/` explain each (`docs/architecture.md` is the map,
//! `docs/protocol.md` the ownership and handoff rules, `docs/control-plane.md` the group, `docs/read-path.md`
//! the watchers):
//!
//! - [`hash`]: FNV-1a 64 exactly as kube-apiserver computes it, and [`hash::ShardKey`] (`uid` or
//!   `namespace`) extraction from any object.
//! - [`range`]: hash ranges `[start, end)` up to 2^64 and normalised range sets.
//! - [`shard`]: `S` logical shards, `shard_of`, `range_of`, and minimal range sets of shard sets.
//! - [`selector`]: the KEP-5866 selector in the server's canonical form, and a strict parser that refuses
//!   everything the server refuses (so we never send a selector that earns an HTTP 500).
//! - [`token`]: the `"<failover-epoch>:<shard>/<epoch>"` fence token fenced writes carry.
//!
//! Everything listed so far is pure: no I/O, no async.
//!
//! - [`fence_policy`]: the ValidatingAdmissionPolicies with which the API server itself refuses stale
//!   fence tokens.
//! - [`ownership`]: the per-member ownership state machine (pure core, model-checked), permits and fences
//!   on two clocks, re-enqueue signals, the reconcile wrapper, fenced writes, static mode, the term gate.
//! - [`watcher`](mod@watcher): the sharded read path: server-side or local filtering, the activation barrier,
//!   re-enqueues, dependent (secondary) caches.
//! - [`group`]: the shard-group control plane: membership Leases, the coordinator and its pure planner
//!   (movement first, contiguity as the tie-break, weights, pins, succession), handoff and takeover, the
//!   singleton leadership.
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
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod hash;
pub mod range;
pub mod selector;
pub mod shard;
pub mod token;

pub mod fence_policy;
mod yaml;

pub mod rt;

pub mod group;
pub mod ownership;
pub mod watcher;

#[cfg(any(test, feature = "test-util"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
pub mod oracles;

pub use hash::{fnv1a64, KeyError, ShardKey};
pub use range::{HashRange, RangeError, RangeSet};
pub use selector::{SelectorError, ShardSelector};
pub use shard::{ShardCount, ShardError, ShardSet};
pub use token::{FenceToken, TokenError};

pub use rt::jitter;

pub use group::{
    GroupError, GroupHandle, Leadership, ShardGroup, ShardGroupBuilder, SingletonGuard,
};
pub use ownership::fenced_write::FencedApi;
pub use ownership::{AdmitError, Fence, FenceError, Ownership, OwnershipConfig, Permit};
pub use watcher::{
    dependent_reflector, dependent_watcher, metadata_watcher, reflector, watcher, ShardedWatcher,
};
