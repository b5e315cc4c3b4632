//! Read-path metrics for prometheus-client: one collector for every sharded watcher of a process.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::stats::{Stats, WatcherStats};

/// A prometheus-client [`Collector`] over the [`WatcherStats`] of every watcher it tracks, labelled by
/// `resource` (the watcher's name, by default its collection URL).
///
/// ```
/// use prometheus_client::registry::Registry;
/// let metrics = kube_shard::watcher::ReadPathMetrics::new();
/// let mut registry = Registry::default();
/// metrics.register(&mut registry);
/// // then: ShardedWatcher::new(api, config, ownership).metrics(&metrics).build()
/// ```
#[derive(Clone, Default)]
pub struct ReadPathMetrics {
    watchers: Arc<Mutex<Vec<Weak<Stats>>>>,
}

impl fmt::Debug for ReadPathMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadPathMetrics").finish_non_exhaustive()
    }
}

impl ReadPathMetrics {
    /// An empty collector.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Report `stats` (until its watcher is dropped).
    pub fn track(&self, stats: &WatcherStats) {
        let mut w = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        w.retain(|s| s.strong_count() > 0);
        w.push(Arc::downgrade(&stats.0));
    }

    /// Register the collector in `registry` (once per registry).
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    fn live(&self) -> Vec<Arc<Stats>> {
        let w = self.watchers.lock().unwrap_or_else(|e| e.into_inner());
        w.iter().filter_map(Weak::upgrade).collect()
    }
}

type Read = fn(&Stats) -> u64;

const GAUGES: &[(&str, &str, Read)] = &[
    ("kube_shard_read_fallback", "1 when the resource is read in fallback mode (full watch and local filter), 0 in server mode", |s| u64::from(s.fallback.load(Ordering::Relaxed))),
    ("kube_shard_read_subwatches", "Sub-watches running", |s| s.subwatches.load(Ordering::Relaxed)),
    ("kube_shard_read_indexed_objects", "Objects held in the read index", |s| s.indexed.load(Ordering::Relaxed)),
    ("kube_shard_read_projected_objects", "Objects in the owned projection", |s| s.projected.load(Ordering::Relaxed)),
    ("kube_shard_read_projected_shards", "Shards in the owned projection", |s| s.projected_shards.load(Ordering::Relaxed)),
];

const COUNTERS: &[(&str, &str, Read)] = &[
    (
        "kube_shard_read_objects_received",
        "Objects received from LISTs and WATCH events",
        |s| s.objects_received.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_dropped_out_of_range",
        "Objects a server sent outside the selector's ranges (evidence it does not filter; the stream falls back)",
        |s| s.dropped_out_of_range.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_objects_unwanted",
        "Objects received outside the ranges this stream wants (owned and incoming shards); received / (received - unwanted) is the read amplification",
        |s| s.objects_unwanted.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_subwatch_starts",
        "Sub-watches started (restarts included)",
        |s| s.subwatch_starts.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_lists",
        "Sub-watches started with a LIST",
        |s| s.lists.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_targeted_lists",
        "Targeted LISTs made by activation barriers",
        |s| s.targeted_lists.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_errors",
        "Failed list/watch requests (retried with backoff)",
        |s| s.errors.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_mode_flips",
        "Falls back from server to fallback mode",
        |s| s.mode_flips.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_invalid_selector_alarms",
        "Selectors the server refused as invalid (an alarm)",
        |s| s.invalid_selector_alarms.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_probes",
        "Re-probes of server-side filtering",
        |s| s.probes.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_warm_reports",
        "Incoming shards reported warm",
        |s| s.warm_reports.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_activations",
        "Activation barriers passed",
        |s| s.activations.load(Ordering::Relaxed),
    ),
    (
        "kube_shard_read_reenqueued",
        "ObjectRefs sent for re-enqueue",
        |s| s.reenqueued.load(Ordering::Relaxed),
    ),
];

impl Collector for ReadPathMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let live = self.live();
        for (name, help, read) in GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for s in &live {
                let labels = vec![("resource".to_owned(), s.name.clone())];
                ConstGauge::new(read(s) as i64).encode(family.encode_family(&labels)?)?;
            }
        }
        for (name, help, read) in COUNTERS {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for s in &live {
                let labels = vec![("resource".to_owned(), s.name.clone())];
                ConstCounter::new(read(s)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "kube_shard_read_warm_latency_seconds_sum",
            "Total time from a shard becoming Incoming to its warm report",
            None,
            MetricType::Counter,
        )?;
        for s in &live {
            let labels = vec![("resource".to_owned(), s.name.clone())];
            let secs = s.warm_latency_ms.load(Ordering::Relaxed) as f64 / 1000.0;
            ConstCounter::new(secs).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_family_with_resource_labels() {
        let metrics = ReadPathMetrics::new();
        let stats = WatcherStats(Arc::new(Stats {
            name: "/api/v1/configmaps".into(),
            ..Stats::default()
        }));
        stats.0.objects_received.store(42, Ordering::Relaxed);
        stats.0.fallback.store(true, Ordering::Relaxed);
        metrics.track(&stats);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                "kube_shard_read_objects_received_total{resource=\"/api/v1/configmaps\"} 42"
            ),
            "{text}"
        );
        assert!(
            text.contains("kube_shard_read_fallback{resource=\"/api/v1/configmaps\"} 1"),
            "{text}"
        );
        drop(stats);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            !text.contains("configmaps"),
            "a dropped watcher is no longer reported"
        );
    }
}
