//! Control-plane metrics for prometheus-client: this member's shards and role, and cluster-wide gauges
//! every member computes from the admitted and serving sets all members publish in their Leases.

use std::fmt;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The numbers behind [`GroupMetrics`], as of the member's last pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupSnapshot {
    /// Shards Owned (admitted or self-fenced).
    pub owned: u64,
    /// Shards Incoming (target of a move).
    pub incoming: u64,
    /// Shards Activating (barrier pending).
    pub activating: u64,
    /// Shards Outgoing (draining).
    pub outgoing: u64,
    /// The highest epoch held.
    pub max_epoch: u64,
    /// The assignment generation applied.
    pub generation: u64,
    /// The member admits nothing until it renews.
    pub self_fenced: bool,
    /// The member holds the coordinator Lease.
    pub coordinator: bool,
    /// Another process holds this member's name.
    pub identity_collision: bool,
    /// The member refuses the group's assignment ConfigMap (another `S`, key or format; corrupt; an absurd
    /// generation): it admits nothing it has not applied, and a coordinator never writes over it.
    pub assignment_refused: bool,
    /// A member report of another format (another build) is in the group: nothing is admitted.
    pub foreign_format: bool,
    /// The API server refuses one of the group's requests (401, 403): a missing Role
    /// ([`Health::permission_error`](crate::group::Health::permission_error) says which).
    pub permission_denied: bool,
    /// Members seen renewing.
    pub live_members: u64,
    /// Shards moving per the assignment.
    pub moves_in_flight: u64,
    /// Moves this member completed as coordinator.
    pub handoffs_completed: u64,
    /// Takeovers this member performed as coordinator.
    pub takeovers: u64,
    /// Times this member self-fenced (its renew deadline passed, or it was taken over): the gauge
    /// `self_fenced` may last only milliseconds before a rejoin, this counter keeps the fact.
    pub self_fences: u64,
    /// Times this member rejoined as a new incarnation (after a takeover or a lost Lease).
    pub rejoins: u64,
    /// Times this member, as coordinator, found the stored assignment older than what a live member
    /// applied (a restored backup or a re-applied manifest) and wrote a newer one over it (alert on any).
    pub assignment_rollbacks: u64,
    /// Shards no live member admits (alert when sustained).
    pub unowned_shards: u64,
    /// Shards two or more live members admit (must stay 0; transient while reports lag).
    pub multi_owned_shards: u64,
    /// Shards admitted by a member whose read streams do not serve them (synced, not failing).
    pub owned_not_serving_shards: u64,
}

/// A prometheus-client [`Collector`] for one member of a shard group. Cheap to clone.
///
/// ```
/// let metrics = kube_shard::group::GroupMetrics::default();
/// let mut registry = prometheus_client::registry::Registry::default();
/// metrics.register(&mut registry);
/// ```
#[derive(Clone, Default)]
pub struct GroupMetrics {
    inner: Arc<Mutex<(String, String, GroupSnapshot)>>,
}

impl fmt::Debug for GroupMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupMetrics")
            .field("snapshot", &self.snapshot())
            .finish()
    }
}

impl GroupMetrics {
    /// Register in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(self.clone()));
    }

    /// The latest numbers.
    #[must_use]
    pub fn snapshot(&self) -> GroupSnapshot {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .2
            .clone()
    }

    pub(crate) fn update(&self, group: &str, member: &str, f: impl FnOnce(&mut GroupSnapshot)) {
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.0 = group.to_owned();
        g.1 = member.to_owned();
        f(&mut g.2);
    }
}

type Read = fn(&GroupSnapshot) -> u64;

const GAUGES: &[(&str, &str, Read)] = &[
    ("kube_shard_owned_shards", "Shards this member owns", |s| {
        s.owned
    }),
    (
        "kube_shard_incoming_shards",
        "Shards moving to this member",
        |s| s.incoming,
    ),
    (
        "kube_shard_activating_shards",
        "Shards waiting for their activation barrier",
        |s| s.activating,
    ),
    (
        "kube_shard_outgoing_shards",
        "Shards this member drains",
        |s| s.outgoing,
    ),
    (
        "kube_shard_epoch",
        "The highest epoch this member holds",
        |s| s.max_epoch,
    ),
    (
        "kube_shard_assignment_generation",
        "The assignment generation this member applied",
        |s| s.generation,
    ),
    (
        "kube_shard_self_fenced",
        "1 while the member admits nothing until it renews",
        |s| u64::from(s.self_fenced),
    ),
    (
        "kube_shard_coordinator",
        "1 while this member is the coordinator",
        |s| u64::from(s.coordinator),
    ),
    (
        "kube_shard_identity_collision",
        "1 while another process holds this member's name",
        |s| u64::from(s.identity_collision),
    ),
    (
        "kube_shard_assignment_refused",
        "1 while the member refuses the group's assignment (another S, key or format; corrupt)",
        |s| u64::from(s.assignment_refused),
    ),
    (
        "kube_shard_foreign_report_format",
        "1 while a member of another build (report format) is in the group: nothing is admitted",
        |s| u64::from(s.foreign_format),
    ),
    (
        "kube_shard_permission_denied",
        "1 while the API server refuses one of the group's requests (401, 403): a missing Role",
        |s| u64::from(s.permission_denied),
    ),
    ("kube_shard_live_members", "Members seen renewing", |s| {
        s.live_members
    }),
    (
        "kube_shard_moves_in_flight",
        "Shards moving per the assignment",
        |s| s.moves_in_flight,
    ),
    (
        "kube_shard_unowned_shards",
        "Shards no live member admits",
        |s| s.unowned_shards,
    ),
    (
        "kube_shard_multi_owned_shards",
        "Shards two or more live members admit",
        |s| s.multi_owned_shards,
    ),
    (
        "kube_shard_owned_not_serving_shards",
        "Admitted shards whose read streams are not synced or failing",
        |s| s.owned_not_serving_shards,
    ),
];

const COUNTERS: &[(&str, &str, Read)] = &[
    (
        "kube_shard_handoffs",
        "Moves completed by this member as coordinator",
        |s| s.handoffs_completed,
    ),
    (
        "kube_shard_takeovers",
        "Takeovers performed by this member as coordinator",
        |s| s.takeovers,
    ),
    (
        "kube_shard_self_fences",
        "Times this member self-fenced (renew deadline passed, or taken over)",
        |s| s.self_fences,
    ),
    (
        "kube_shard_rejoins",
        "Times this member rejoined as a new incarnation",
        |s| s.rejoins,
    ),
    (
        "kube_shard_assignment_rollbacks",
        "Times this member as coordinator found the stored assignment older than a generation a live member applied (a restore or a re-applied manifest) and wrote a newer one over it",
        |s| s.assignment_rollbacks,
    ),
];

impl Collector for GroupMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), fmt::Error> {
        let (group, member, snap) = self.inner.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let labels = vec![("group".to_owned(), group), ("member".to_owned(), member)];
        for (name, help, read) in GAUGES {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(read(&snap) as i64).encode(family.encode_family(&labels)?)?;
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
    fn encodes_with_group_and_member_labels() {
        let m = GroupMetrics::default();
        m.update("widgets", "pod-0", |s| {
            s.owned = 64;
            s.unowned_shards = 2;
            s.takeovers = 1;
        });
        let mut r = Registry::default();
        m.register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(
            text.contains("kube_shard_owned_shards{group=\"widgets\",member=\"pod-0\"} 64"),
            "{text}"
        );
        assert!(text.contains("kube_shard_unowned_shards{group=\"widgets\",member=\"pod-0\"} 2"));
        assert!(text.contains("kube_shard_takeovers_total{group=\"widgets\",member=\"pod-0\"} 1"));
    }
}
