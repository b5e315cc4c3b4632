//! Static mode: member *i* of *n*, with no membership, no leases and no handoff — the JOSDK /
//! kube-state-metrics baseline.
//!
//! Member *i* owns the logical shards `s` with `⌊s·n/S⌋ = i` (a contiguous block), at epoch 0, and every fence
//! succeeds. **Unsafe under reconfiguration**: while replicas run with different `(i, n)` (a rolling update
//! that changes `n`, two pods with the same `i`), two of them can own one shard at once and nothing fences
//! either. Use it only where that is acceptable, or stop every replica before changing `n`.

use std::time::Duration;

use super::{
    state::{MemberId, MemberState},
    Ownership, OwnershipConfig,
};
use crate::rt::Clock;
use crate::shard::ShardSet;

/// How long static fences last: effectively forever (a fenced write's timeout is capped separately).
const FOREVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Why static mode refused its settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StaticError {
    /// `n` is zero or `i ≥ n`.
    #[error("invalid static member {index} of {count}: need 0 <= index < count")]
    InvalidIndex {
        /// `i`.
        index: u32,
        /// `n`.
        count: u32,
    },
    /// More members than logical shards: some would own nothing.
    #[error("{count} static members but only {shards} logical shards")]
    TooManyMembers {
        /// `n`.
        count: u32,
        /// `S`.
        shards: u32,
    },
}

/// The shards member `index` of `count` owns in static mode.
///
/// ```
/// use kube_shard::{ownership::static_shards, ShardCount};
/// let s = ShardCount::new(8).unwrap();
/// assert_eq!(static_shards(s, 1, 4).unwrap().to_string(), "2-3");
/// ```
pub fn static_shards(
    shards: crate::shard::ShardCount,
    index: u32,
    count: u32,
) -> Result<ShardSet, StaticError> {
    if count == 0 || index >= count {
        return Err(StaticError::InvalidIndex { index, count });
    }
    if count > shards.get() {
        return Err(StaticError::TooManyMembers {
            count,
            shards: shards.get(),
        });
    }
    let s = u64::from(shards.get());
    Ok((0..shards.get())
        .filter(|&shard| u64::from(shard) * u64::from(count) / s == u64::from(index))
        .collect())
}

impl Ownership {
    /// Static mode: member `index` of `count` owns its block of shards at epoch 0; every fence succeeds.
    /// Unsafe under reconfiguration (see [`static_shards`](super::static_shards)).
    ///
    /// ```
    /// use kube_shard::ownership::{Ownership, OwnershipConfig};
    /// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    /// # rt.block_on(async {
    /// let ownership = Ownership::new_static(OwnershipConfig::default(), 0, 2).unwrap();
    /// let permit = ownership.admit_shard(3).unwrap();
    /// assert_eq!(permit.fence().unwrap().epoch(), 0);
    /// assert!(ownership.admit_shard(200).is_err());
    /// # });
    /// ```
    pub fn new_static(
        config: OwnershipConfig,
        index: u32,
        count: u32,
    ) -> Result<Self, StaticError> {
        let shards = static_shards(config.shards, index, count)?;
        let me = MemberId::new(format!("static-{index}-of-{count}"), "static");
        let ownership = Ownership::new(config, me.clone(), Clock::system());
        let mut state = MemberState::new(me);
        state.set_static(shards.iter());
        ownership.install_static(state, FOREVER);
        Ok(ownership)
    }
}

impl super::Permit {
    /// A permit for `obj` for a unit test that calls a reconciler directly: from a member that owns every
    /// shard in static mode, so its fences never expire (epoch 0). `obj` needs a uid (the shard key).
    ///
    /// ```
    /// # let cm = k8s_openapi::api::core::v1::ConfigMap {
    /// #     metadata: kube::api::ObjectMeta { uid: Some("u1".into()), ..Default::default() }, ..Default::default() };
    /// let permit = kube_shard::Permit::for_test(&cm).unwrap();
    /// assert!(permit.fence().is_ok());
    /// ```
    ///
    /// # Errors
    /// The object cannot be placed in a shard (no uid).
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn for_test<K: kube::Resource>(obj: &K) -> Result<super::Permit, super::AdmitError> {
        let everything = Ownership::new_static(OwnershipConfig::default(), 0, 1)
            .expect("one static member of one is a valid static configuration");
        everything.admit(obj)
    }
}

impl super::Fence {
    /// A fence for `obj` for a unit test ([`Permit::for_test`](super::Permit::for_test)'s, taken at once): it
    /// never expires.
    ///
    /// # Errors
    /// The object cannot be placed in a shard (no uid).
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn for_test<K: kube::Resource>(obj: &K) -> Result<super::Fence, super::AdmitError> {
        let permit = super::Permit::for_test(obj)?;
        Ok(permit
            .fence()
            .expect("a static member's fence is always valid"))
    }
}
