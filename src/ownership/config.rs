//! [`OwnershipConfig`]: the member's ownership settings.

use std::time::Duration;

use crate::{hash::ShardKey, shard::ShardCount};

/// Ownership settings. Defaults as in `docs/control-plane.md`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnershipConfig {
    /// `S`, the number of logical shards of the group.
    pub shards: ShardCount,
    /// The key objects are placed by.
    pub key: ShardKey,
    /// A member whose last successful renewal *started* longer ago than this is self-fenced (default 10 s).
    pub renew_deadline: Duration,
    /// Fences end this much before the renew deadline (default 1 s): covers clock-rate error and the time
    /// between the fence check and the request reaching the server.
    pub fence_margin: Duration,
    /// How long an Outgoing shard waits for in-flight work before it is released anyway (default 10 s; fences
    /// issued while Outgoing expire by then).
    pub drain_timeout: Duration,
    /// The requeue delay for an object held but not admitted now (default 2 s, jittered ±20 %).
    pub not_admitted_requeue: Duration,
}

impl Default for OwnershipConfig {
    fn default() -> Self {
        OwnershipConfig {
            shards: ShardCount::DEFAULT,
            key: ShardKey::Uid,
            renew_deadline: Duration::from_secs(10),
            fence_margin: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(10),
            not_admitted_requeue: Duration::from_secs(2),
        }
    }
}

impl OwnershipConfig {
    /// The defaults for `S` shards placed by `key`.
    ///
    /// ```
    /// use kube_shard::{ownership::OwnershipConfig, ShardCount, ShardKey};
    /// let c = OwnershipConfig::new(ShardCount::new(16).unwrap(), ShardKey::Namespace);
    /// assert_eq!(c.renew_deadline.as_secs(), 10);
    /// ```
    #[must_use]
    pub fn new(shards: ShardCount, key: ShardKey) -> Self {
        OwnershipConfig {
            shards,
            key,
            ..OwnershipConfig::default()
        }
    }
}
