//! [`MirrorMetrics`]: the mirror duty's Prometheus families, read from its status at scrape time.
//!
//! Per mirrored kind (label `kind`): `kube_shard_mirror_position`, `_lag_ms` (since the latest probe the
//! position passed; absent until one is confirmed), `_pending`, `_failed_objects`, `_stopped`, and the
//! counters `_lists`, `_resumes`, `_catchups`, `_writes`, `_prunes`, `_repairs`, and `_errors{kind,operation}` (carried over mirror restarts). For the duty:
//! `kube_shard_mirror_phase{phase}` (1 for the current phase), `_divergent_objects` (held by failback),
//! `_adopted_epoch`, and the counter `_starts`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::status::DutyStatus;
use crate::mirror::KindStatus;
use kube_shard::rt::Clock;

/// The phases `kube_shard_mirror_phase` enumerates.
const PHASES: [&str; 6] = [
    "starting",
    "waiting",
    "failback",
    "mirroring",
    "adopting",
    "active",
];

/// Per-kind counts of mirrors that ran before the current one (a restart starts its counts at 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Carried {
    pub(crate) lists: u64,
    pub(crate) resumes: u64,
    pub(crate) catchups: u64,
    pub(crate) writes: u64,
    pub(crate) prunes: u64,
    pub(crate) repairs: u64,
    pub(crate) errors: BTreeMap<&'static str, u64>,
}

impl Carried {
    pub(crate) fn add(&mut self, k: &KindStatus) {
        self.lists += k.lists;
        self.resumes += k.resumes;
        self.catchups += k.catchups;
        self.writes += k.writes;
        self.prunes += k.prunes;
        self.repairs += k.repairs;
        for (op, n) in &k.errors {
            *self.errors.entry(op).or_default() += n;
        }
    }
}

pub(crate) type CarriedMap = Arc<Mutex<BTreeMap<String, Carried>>>;

/// A prometheus-client [`Collector`] over one [`MirrorDuty`](super::MirrorDuty). Cheap to clone.
#[derive(Clone)]
pub struct MirrorMetrics {
    pub(crate) status: Arc<Mutex<DutyStatus>>,
    pub(crate) carried: CarriedMap,
    pub(crate) clock: Clock,
}

impl fmt::Debug for MirrorMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MirrorMetrics").finish_non_exhaustive()
    }
}

impl MirrorMetrics {
    /// Register in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }
}

type KindRead = fn(&KindStatus, &Carried, std::time::Duration) -> Option<u64>;

const KIND_GAUGES: &[(&str, &str, KindRead)] = &[
    (
        "kube_shard_mirror_position",
        "The mirror's low-watermark resourceVersion of the source",
        |k, _, _| k.position,
    ),
    (
        "kube_shard_mirror_lag_ms",
        "Milliseconds since the latest probe of the source the position has passed",
        |k, _, now| {
            k.lag(now)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        },
    ),
    (
        "kube_shard_mirror_pending",
        "Keys queued, in flight, retrying or failed",
        |k, _, _| Some(k.pending as u64),
    ),
    (
        "kube_shard_mirror_failed_objects",
        "Objects on the failed (poison) list",
        |k, _, _| Some(k.failed.len() as u64),
    ),
    (
        "kube_shard_mirror_stopped",
        "1 when the kind stopped (an unparseable version, a regression)",
        |k, _, _| Some(u64::from(k.stopped.is_some())),
    ),
];

const KIND_COUNTERS: &[(&str, &str, KindRead)] = &[
    (
        "kube_shard_mirror_lists",
        "Full LISTs of the source (at start without a checkpoint, after 410)",
        |k, c, _| Some(c.lists + k.lists),
    ),
    (
        "kube_shard_mirror_resumes",
        "Watches opened from a resourceVersion",
        |k, c, _| Some(c.resumes + k.resumes),
    ),
    (
        "kube_shard_mirror_catchups",
        "Catch-ups to a demotion token",
        |k, c, _| Some(c.catchups + k.catchups),
    ),
    (
        "kube_shard_mirror_writes",
        "Copies written or deleted",
        |k, c, _| Some(c.writes + k.writes),
    ),
    (
        "kube_shard_mirror_prunes",
        "Copies the prune backstop found without their source (a grace apart) and handed to the worker",
        |k, c, _| Some(c.prunes + k.prunes),
    ),
    (
        "kube_shard_mirror_repairs",
        "Copies the reverse sweep queued again: missing on the Standby, another version, or edited there",
        |k, c, _| Some(c.repairs + k.repairs),
    ),
];

fn gauge(v: u64) -> ConstGauge<i64> {
    ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
}

impl Collector for MirrorMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let st = self.status.lock().map(|s| s.clone()).unwrap_or_default();
        let carried = self.carried.lock().map(|c| c.clone()).unwrap_or_default();
        let now = self.clock.elapsed();
        // kinds that ran before but have no mirror now keep their counters
        let mut kinds: BTreeMap<String, KindStatus> = carried
            .keys()
            .map(|k| {
                (
                    k.clone(),
                    KindStatus {
                        kind: k.clone(),
                        ..KindStatus::default()
                    },
                )
            })
            .collect();
        for k in &st.mirror {
            kinds.insert(k.kind.clone(), k.clone());
        }
        let running: std::collections::BTreeSet<&str> =
            st.mirror.iter().map(|k| k.kind.as_str()).collect();
        for (name, help, read) in KIND_GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (key, k) in kinds.iter().filter(|(k, _)| running.contains(k.as_str())) {
                let c = carried.get(key).cloned().unwrap_or_default();
                if let Some(v) = read(k, &c, now) {
                    gauge(v).encode(family.encode_family(&[("kind", key.as_str())])?)?;
                }
            }
        }
        for (name, help, read) in KIND_COUNTERS {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (key, k) in &kinds {
                let c = carried.get(key).cloned().unwrap_or_default();
                if let Some(v) = read(k, &c, now) {
                    ConstCounter::new(v)
                        .encode(family.encode_family(&[("kind", key.as_str())])?)?;
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "kube_shard_mirror_errors",
            "Failed copy attempts by operation (retried, or put on the failed list)",
            None,
            MetricType::Counter,
        )?;
        for (key, k) in &kinds {
            let mut by_op = carried
                .get(key)
                .map(|c| c.errors.clone())
                .unwrap_or_default();
            for (op, n) in &k.errors {
                *by_op.entry(op).or_default() += n;
            }
            for (op, n) in by_op {
                ConstCounter::new(n)
                    .encode(family.encode_family(&[("kind", key.as_str()), ("operation", op)])?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "kube_shard_mirror_phase",
            "1 for the mirror duty's current phase",
            None,
            MetricType::Gauge,
        )?;
        for p in PHASES {
            gauge(u64::from(st.phase == p)).encode(family.encode_family(&[("phase", p)])?)?;
        }
        let divergent = st
            .failback
            .as_ref()
            .map_or(0, |r| r.divergent.len().saturating_sub(r.deleted.len()));
        for (name, help, v) in [
            (
                "kube_shard_mirror_divergent_objects",
                "Objects failback holds as divergent (within the prune grace, or kept)",
                divergent as u64,
            ),
            (
                "kube_shard_mirror_adopted_epoch",
                "The epoch of the latest adoption (wire form; 0: none)",
                st.adoption.epoch.unwrap_or(0),
            ),
        ] {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            gauge(v).encode(family)?;
        }
        let family = encoder.encode_descriptor(
            "kube_shard_mirror_starts",
            "Mirrors started (the first, and one after each failback or step-down)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(st.mirror_starts).encode(family)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn encodes_the_kinds_the_phase_and_carried_counters() {
        let st = DutyStatus {
            phase: "mirroring",
            mirror: vec![KindStatus {
                kind: "widgets.example.com".into(),
                position: Some(1200),
                confirmed_at: Some(Duration::from_secs(10)),
                lists: 1,
                writes: 7,
                errors: BTreeMap::from([("create", 2)]),
                ..KindStatus::default()
            }],
            mirror_starts: 2,
            ..DutyStatus::default()
        };
        let carried = BTreeMap::from([
            (
                "widgets.example.com".to_string(),
                Carried {
                    lists: 2,
                    writes: 3,
                    errors: BTreeMap::from([("create", 1), ("conflict", 4)]),
                    ..Carried::default()
                },
            ),
            (
                "configmaps".to_string(),
                Carried {
                    writes: 5,
                    ..Carried::default()
                },
            ),
        ]);
        let m = MirrorMetrics {
            status: Arc::new(Mutex::new(st)),
            carried: Arc::new(Mutex::new(carried)),
            clock: Clock::system().with_elapsed(|| Duration::from_millis(12_500)),
        };
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        for want in [
            "kube_shard_mirror_position{kind=\"widgets.example.com\"} 1200",
            "kube_shard_mirror_lag_ms{kind=\"widgets.example.com\"} 2500",
            "kube_shard_mirror_lists_total{kind=\"widgets.example.com\"} 3",
            "kube_shard_mirror_writes_total{kind=\"widgets.example.com\"} 10",
            "kube_shard_mirror_writes_total{kind=\"configmaps\"} 5",
            "kube_shard_mirror_phase{phase=\"mirroring\"} 1",
            "kube_shard_mirror_phase{phase=\"active\"} 0",
            "kube_shard_mirror_starts_total 2",
            "kube_shard_mirror_errors_total{kind=\"widgets.example.com\",operation=\"create\"} 3",
            "kube_shard_mirror_errors_total{kind=\"widgets.example.com\",operation=\"conflict\"} 4",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        // a kind with no running mirror has no position gauge
        assert!(!text.contains("kube_shard_mirror_position{kind=\"configmaps\"}"));
    }
}
