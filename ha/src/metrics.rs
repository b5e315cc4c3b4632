//! HA metrics for prometheus-client: role, epoch, term remaining, the ages of the peer's and the witness
//! Lease (since this process first saw their current version), promotions, step-downs and refused
//! admissions.

use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The numbers behind [`HaMetrics`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HaSnapshot {
    /// 1 while this cluster acts (inside its term).
    pub active: bool,
    /// 1 while this process leads (it may be between renewals, outside its term).
    pub leader: bool,
    /// The epoch led (wire form), or the highest seen when standing by.
    pub epoch: u64,
    /// Milliseconds until the term ends if nothing is renewed (0 when not active).
    pub term_remaining_ms: u64,
    /// Milliseconds since the peer's HA Lease's current version was first seen (0: never seen).
    pub peer_lease_age_ms: u64,
    /// The same for the witness Lease.
    pub witness_lease_age_ms: u64,
    /// 1 while an alarm is raised (undecodable Lease, peer unreadable at start, a configuration conflicting
    /// with the peer's: one cluster id, one rank, or a peer client reaching this cluster).
    pub alarm: bool,
    /// Candidacies started (promotions), including forced ones.
    pub promotions: u64,
    /// Times a leader stepped down.
    pub step_downs: u64,
    /// Admissions refused by [`HaHandle::admit`](super::HaHandle::admit) because the cluster was not active.
    pub refused_admissions: u64,
}

/// A prometheus-client [`Collector`] for one cluster's elector. Cheap to clone.
#[derive(Clone, Default)]
pub struct HaMetrics {
    inner: Arc<Mutex<(String, HaSnapshot)>>,
}

impl fmt::Debug for HaMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HaMetrics")
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl HaMetrics {
    /// Register in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    /// The latest numbers.
    #[must_use]
    pub fn snapshot(&self) -> HaSnapshot {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    pub(crate) fn update_keep(&self, f: impl FnOnce(&mut HaSnapshot)) {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()).1);
    }

    pub(crate) fn update(&self, cluster: &str, f: impl FnOnce(&mut HaSnapshot)) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        cluster.clone_into(&mut g.0);
        f(&mut g.1);
    }
}

type Read = fn(&HaSnapshot) -> u64;

const GAUGES: &[(&str, &str, Read)] = &[
    (
        "kube_shard_ha_active",
        "1 while this cluster acts (inside its term)",
        |s| u64::from(s.active),
    ),
    (
        "kube_shard_ha_leader",
        "1 while this cluster leads (renews the HA Leases)",
        |s| u64::from(s.leader),
    ),
    (
        "kube_shard_ha_epoch",
        "The failover epoch led, or the highest seen",
        |s| s.epoch,
    ),
    (
        "kube_shard_ha_term_remaining_ms",
        "Milliseconds until the term ends unless renewed",
        |s| s.term_remaining_ms,
    ),
    (
        "kube_shard_ha_peer_lease_age_ms",
        "Milliseconds since the peer HA Lease's current version was first seen",
        |s| s.peer_lease_age_ms,
    ),
    (
        "kube_shard_ha_witness_lease_age_ms",
        "Milliseconds since the witness Lease's current version was first seen",
        |s| s.witness_lease_age_ms,
    ),
    (
        "kube_shard_ha_alarm",
        "1 while an HA alarm is raised",
        |s| u64::from(s.alarm),
    ),
];

const COUNTERS: &[(&str, &str, Read)] = &[
    (
        "kube_shard_ha_promotions",
        "Candidacies started (promotions)",
        |s| s.promotions,
    ),
    (
        "kube_shard_ha_step_downs",
        "Times this cluster stepped down",
        |s| s.step_downs,
    ),
    (
        "kube_shard_ha_refused_admissions",
        "Admissions refused because this cluster was not active",
        |s| s.refused_admissions,
    ),
];

impl Collector for HaMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let (cluster, snap) = self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let labels = vec![("cluster".to_owned(), cluster)];
        for (name, help, read) in GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(i64::try_from(read(&snap)).unwrap_or(i64::MAX))
                .encode(family.encode_family(&labels)?)?;
        }
        for (name, help, read) in COUNTERS {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(read(&snap)).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_family_with_the_cluster_label() {
        let m = HaMetrics::default();
        m.update("east", |s| {
            s.active = true;
            s.epoch = 2001;
            s.step_downs = 3;
        });
        let mut reg = Registry::default();
        m.register(&mut reg);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        assert!(
            text.contains("kube_shard_ha_active{cluster=\"east\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kube_shard_ha_epoch{cluster=\"east\"} 2001"),
            "{text}"
        );
        assert!(
            text.contains("kube_shard_ha_step_downs_total{cluster=\"east\"} 3"),
            "{text}"
        );
    }
}
