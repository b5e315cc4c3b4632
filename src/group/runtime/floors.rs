//! What this coordinator last read (or wrote) of the fence parameter ConfigMap ([`Floors`]).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use tokio::time::Instant;

/// What this coordinator last read (or wrote) of the parameter ConfigMap. Keys only rise, so a cached
/// value is never above the stored one.
#[derive(Debug, Default)]
pub(super) struct Floors {
    /// shard → published epoch.
    pub(super) by_shard: BTreeMap<u32, u64>,
    /// When read last (on our clock); `None`: never.
    pub(super) read_at: Option<Instant>,
    /// Keys out of reach of any re-grant, alarmed once each: (shard, key).
    pub(super) alarmed: BTreeSet<(u32, u64)>,
    /// The object this pass's repair read, for the publish of the same pass: one read fewer on the path
    /// to the assignment write. Safe however old: the write is conditional on its resourceVersion.
    pub(super) this_pass: Option<Option<ConfigMap>>,
}

impl Floors {
    /// What the stored ConfigMap says now, as read: it replaces the cache (an admin may have corrected a
    /// key this coordinator alarmed about; the library itself never lowers one).
    pub(super) fn read(&mut self, data: &BTreeMap<String, String>) {
        self.by_shard.clear();
        self.learn(data);
    }

    /// Keys we just raised.
    pub(super) fn learn(&mut self, data: &BTreeMap<String, String>) {
        for (k, v) in data {
            if let (Ok(s), Ok(e)) = (k.parse::<u32>(), v.parse::<u64>()) {
                let f = self.by_shard.entry(s).or_insert(e);
                *f = (*f).max(e);
            }
        }
    }
}
