//! [`WatcherStats`]: the live counters of one sharded watcher.

use std::fmt::{self, Debug};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use super::mode::ReadMode;

/// Live counters of one sharded watcher (cheap to clone).
#[derive(Clone, Default)]
pub struct WatcherStats(pub(crate) Arc<Stats>);

#[derive(Default, Debug)]
pub(crate) struct Stats {
    pub(crate) name: String,
    pub(crate) warm_latency_ms: AtomicU64,
    pub(crate) fallback: AtomicBool,
    pub(crate) initialized: AtomicBool,
    pub(crate) mode_flips: AtomicU64,
    pub(crate) invalid_selector_alarms: AtomicU64,
    pub(crate) subwatches: AtomicU64,
    pub(crate) subwatch_starts: AtomicU64,
    pub(crate) lists: AtomicU64,
    pub(crate) targeted_lists: AtomicU64,
    pub(crate) probes: AtomicU64,
    pub(crate) objects_received: AtomicU64,
    pub(crate) dropped_out_of_range: AtomicU64,
    pub(crate) objects_unwanted: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) warm_reports: AtomicU64,
    pub(crate) activations: AtomicU64,
    pub(crate) reenqueued: AtomicU64,
    pub(crate) indexed: AtomicU64,
    pub(crate) projected: AtomicU64,
    pub(crate) projected_shards: AtomicU64,
    pub(crate) handed_over: AtomicU64,
}

impl WatcherStats {
    fn get(a: &AtomicU64) -> u64 {
        a.load(Ordering::Relaxed)
    }

    /// How the resource is read now.
    #[must_use]
    pub fn mode(&self) -> ReadMode {
        if self.0.fallback.load(Ordering::Relaxed) {
            ReadMode::Fallback
        } else {
            ReadMode::Server
        }
    }

    /// Whether the initial `Init … InitDone` was emitted.
    #[must_use]
    pub fn initialized(&self) -> bool {
        self.0.initialized.load(Ordering::Relaxed)
    }

    /// Times the resource fell back to a full watch.
    #[must_use]
    pub fn mode_flips(&self) -> u64 {
        Self::get(&self.0.mode_flips)
    }

    /// Times the server refused a selector we consider valid (an alarm).
    #[must_use]
    pub fn invalid_selector_alarms(&self) -> u64 {
        Self::get(&self.0.invalid_selector_alarms)
    }

    /// Sub-watches running now.
    #[must_use]
    pub fn subwatches(&self) -> u64 {
        Self::get(&self.0.subwatches)
    }

    /// Sub-watches started so far (restarts included).
    #[must_use]
    pub fn subwatch_starts(&self) -> u64 {
        Self::get(&self.0.subwatch_starts)
    }

    /// Sub-watches started with a LIST (the rest resumed a watch without one).
    #[must_use]
    pub fn lists(&self) -> u64 {
        Self::get(&self.0.lists)
    }

    /// Targeted LISTs the activation barrier needed.
    #[must_use]
    pub fn targeted_lists(&self) -> u64 {
        Self::get(&self.0.targeted_lists)
    }

    /// Re-probes of server filtering.
    #[must_use]
    pub fn probes(&self) -> u64 {
        Self::get(&self.0.probes)
    }

    /// Objects received from LISTs and WATCH events.
    #[must_use]
    pub fn objects_received(&self) -> u64 {
        Self::get(&self.0.objects_received)
    }

    /// Objects outside the requested ranges (each one evidence that the server does not filter).
    #[must_use]
    pub fn dropped_out_of_range(&self) -> u64 {
        Self::get(&self.0.dropped_out_of_range)
    }

    /// Objects received whose hash lies outside the ranges this stream wants (its owned and incoming
    /// shards): what fallback mode's full watch costs. `received ÷ (received − unwanted)` is the read
    /// amplification (1 in server mode, about N with N members in fallback mode).
    #[must_use]
    pub fn objects_unwanted(&self) -> u64 {
        Self::get(&self.0.objects_unwanted)
    }

    /// Failed requests (each retried with backoff).
    #[must_use]
    pub fn errors(&self) -> u64 {
        Self::get(&self.0.errors)
    }

    /// Warm reports made.
    #[must_use]
    pub fn warm_reports(&self) -> u64 {
        Self::get(&self.0.warm_reports)
    }

    /// Activation barriers passed.
    #[must_use]
    pub fn activations(&self) -> u64 {
        Self::get(&self.0.activations)
    }

    /// `ObjectRef`s sent to the re-enqueue stream.
    #[must_use]
    pub fn reenqueued(&self) -> u64 {
        Self::get(&self.0.reenqueued)
    }

    /// Objects in the index (read, projected or not).
    #[must_use]
    pub fn indexed(&self) -> u64 {
        Self::get(&self.0.indexed)
    }

    /// Objects in the owned projection.
    #[must_use]
    pub fn projected(&self) -> u64 {
        Self::get(&self.0.projected)
    }

    /// Objects whose only copy is in the store (reflector mode: not held twice).
    #[must_use]
    pub fn handed_over(&self) -> u64 {
        Self::get(&self.0.handed_over)
    }

    /// Shards in the owned projection.
    #[must_use]
    pub fn projected_shards(&self) -> u64 {
        Self::get(&self.0.projected_shards)
    }
}

impl Debug for WatcherStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatcherStats")
            .field("mode", &self.mode())
            .field("subwatches", &self.subwatches())
            .field("lists", &self.lists())
            .field("objects_received", &self.objects_received())
            .field("indexed", &self.indexed())
            .field("projected", &self.projected())
            .finish()
    }
}
