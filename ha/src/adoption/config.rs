//! What adoption adopts ([`AdoptConfig`]).

use std::time::Duration;

use super::plan::ShardSpec;
use crate::mirror::MirrorConfig;

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
}

impl AdoptConfig {
    /// Adopt the copies of `mirror`; a 1 s retry.
    #[must_use]
    pub fn new(mirror: MirrorConfig) -> Self {
        AdoptConfig {
            mirror,
            shard: None,
            retry: Duration::from_secs(1),
        }
    }

    /// Recompute shard labels under this key and count.
    #[must_use]
    pub fn shard(mut self, s: ShardSpec) -> Self {
        self.shard = Some(s);
        self
    }
}
