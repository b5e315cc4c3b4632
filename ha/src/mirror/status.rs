//! [`KindStatus`]: what `kshard ha status` and the tests read of each mirrored kind.

use std::time::Duration;

use super::checkpoint::Synced;
use super::queue::Failed;

/// One mirrored kind's state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KindStatus {
    /// `<plural>.<group>`.
    pub kind: String,
    /// The low watermark (`None`: nothing delivered yet).
    pub position: Option<u64>,
    /// The position last written to the checkpoint.
    pub checkpointed: Option<u64>,
    /// Keys pending (queued, in flight, retrying or failed).
    pub pending: usize,
    /// Applies in flight (at most [`super::MirrorConfig::workers`]).
    pub in_flight: usize,
    /// The failed (poison) objects.
    pub failed: Vec<Failed>,
    /// The local-clock time of the latest probe the watermark has passed.
    pub confirmed_at: Option<Duration>,
    /// The latest probe's resourceVersion of the source collection.
    pub probed_rv: Option<u64>,
    /// Full LISTs (at start without a checkpoint, and after 410).
    pub lists: u64,
    /// Catch-ups to a token (one consistent LIST each).
    pub catchups: u64,
    /// Watches opened from a version.
    pub resumes: u64,
    /// The last full LIST: local-clock time and item count.
    pub last_list: Option<(Duration, usize)>,
    /// Copies written or deleted.
    pub writes: u64,
    /// Copies the prune backstop handed to the worker (their source absent at two sweeps a grace apart).
    pub prunes: u64,
    /// Copies the reverse sweep queued again: missing on the Standby, holding another version than the
    /// source's, or changed there since the mirror's own last write.
    pub repairs: u64,
    /// Failed attempts by operation (`read_source`, `read_copy`, `plan`, `conflict`, `create`, `update`,
    /// `update_status`, `delete`, `worker`): retried or put on the failed list.
    pub errors: std::collections::BTreeMap<&'static str, u64>,
    /// Copies found out of scope at the last LIST (reported, never deleted).
    pub out_of_scope: usize,
    /// Why the kind stopped (an unparseable version, a regression).
    pub stopped: Option<String>,
    /// The initial full LIST this run applied (`None`: not yet, or it was recorded before this run).
    pub synced: Option<Synced>,
}

impl KindStatus {
    /// The lag at local-clock time `now` (`None`: never confirmed).
    #[must_use]
    pub fn lag(&self, now: Duration) -> Option<Duration> {
        self.confirmed_at.map(|c| now.saturating_sub(c))
    }
}
