//! # kube-shard
//!
//! Active-active sharding for [kube-rs](https://kube.rs) operators. Instead of one leader doing all the
//! work while standbys idle, every replica reconciles its own share of the objects: stable logical shards
//! of the 64-bit FNV-1a hash space, owned under a live assignment that moves safely when replicas join,
//! leave, pause or die, and read through Kubernetes KEP-5866 server-side `shardSelector` list/watch (with
//! a local hash filter whenever the server does not filter).
//!
//! The crate is layered as `docs/DESIGN.md` describes; the data flows down this list:
//!
//! - [`hash`]: FNV-1a 64 exactly as kube-apiserver computes it, and [`hash::ShardKey`] (`uid` or
//!   `namespace`) extraction from any object.
//! - [`range`]: hash ranges `[start, end)` up to 2^64 and normalised range sets.
//! - [`shard`]: `S` logical shards, `shard_of`, `range_of`, and minimal range sets of shard sets.
//! - [`selector`]: the KEP-5866 selector in the server's canonical form, and a strict parser that refuses
//!   everything the server refuses (so we never send a selector that earns an HTTP 500).
//!
//! - [`token`]: the `"<failover-epoch>:<shard>/<epoch>"` fence token fenced writes carry (header and annotation names).
//!
//! Everything listed so far is pure: no I/O, no async.
//!
//! - [`ownership`]: the per-member ownership state machine (pure core, model-checked), permits and fences
//!   on two clocks, re-enqueue signals, the reconcile wrapper for `Controller::run`, fenced writes, static mode.
//! - [`group`]: the shard-group control plane; so far its pure, deterministic assignment planner (movement
//!   first, contiguity as the tie-break, weights, pins, succession) and the cold-start settle / join debounce.
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

pub use ownership::{Fence, Ownership, OwnershipConfig, Permit};
pub use watcher::{
    dependent_reflector, dependent_watcher, metadata_watcher, reflector, watcher, ShardedWatcher,
};
