//! [`MirrorConfig`]: what the mirror copies, from where, and how often it probes and checkpoints.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::core::Selector;

use super::error::MirrorError;
use super::kinds::{KindSet, OwnObjects};
use super::queue::Backoff;
use crate::HaConfig;

/// The mirror's settings. Build with [`MirrorConfig::new`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MirrorConfig {
    /// This (the Standby's) HA configuration: the checkpoint `<name>-ha-mirror` lives in its namespace.
    pub ha: HaConfig,
    /// The source (Active) cluster's id: the copies' `kube-shard.io/mirrored-from` label.
    pub source_cluster: String,
    /// The classified kinds; the mirrored ones are copied.
    pub kinds: KindSet,
    /// kube-shard's own objects, never copied.
    pub own: OwnObjects,
    /// Only these namespaces (`None`: all). Copies that fall out of scope are reported, not deleted.
    pub namespaces: Option<BTreeSet<String>>,
    /// Only objects whose labels match (`None`: every object). Required for built-in kinds
    /// ([`super::scope::check_builtin_selectors`]).
    pub labels: Option<Selector>,
    /// A person's decision that every object of the mirrored built-in kinds in scope is the operator's:
    /// they are mirrored without a label selector.
    pub whole_builtin_kinds: bool,
    /// Copy writes in flight at once per kind (at least 1); one object's writes stay in order.
    pub workers: usize,
    /// The most copy requests per second over every kind (`None`: no limit).
    pub rate_limit: Option<f64>,
    /// The source term's failover epoch (wire form) for the fence `<f>:mirror`; `None`: read from the
    /// source's HA Lease at start.
    pub epoch: Option<u64>,
    /// Retry backoff and the attempts before an object goes to the failed list.
    pub backoff: Backoff,
    /// How often a `limit=1` LIST confirms each kind's current resourceVersion (lag).
    pub probe_period: Duration,
    /// How often an advanced position is written to the checkpoint.
    pub checkpoint_period: Duration,
    /// The server-side timeout of each watch (`timeoutSeconds`).
    pub watch_timeout_secs: u32,
    /// The prune backstop's period (`None`: off): one LIST of the source per kind, against the copies.
    pub prune_period: Option<Duration>,
    /// The backstop's confirmation grace: a copy whose source is absent (or has another uid) at two
    /// sweeps at least this far apart is handed to the worker, which deletes it by its usual rules.
    pub prune_grace: Duration,
}

impl MirrorConfig {
    /// Mirror `kinds` from the cluster `source_cluster` into the Standby of `ha`. Defaults: every
    /// namespace, no label selector, 8 workers per kind, no rate limit, a 10 s probe period, a 1 s checkpoint period, 290 s watches, the default backoff, a
    /// prune backstop every 5 min with a 60 s confirmation grace.
    #[must_use]
    pub fn new(ha: HaConfig, source_cluster: impl Into<String>, kinds: KindSet) -> Self {
        let own = OwnObjects::new(&ha.name, &ha.namespace, &ha.witness_namespace, None);
        MirrorConfig {
            ha,
            source_cluster: source_cluster.into(),
            kinds,
            own,
            namespaces: None,
            labels: None,
            whole_builtin_kinds: false,
            workers: 8,
            rate_limit: None,
            epoch: None,
            backoff: Backoff::default(),
            probe_period: Duration::from_secs(10),
            checkpoint_period: Duration::from_secs(1),
            watch_timeout_secs: 290,
            prune_period: Some(Duration::from_secs(300)),
            prune_grace: Duration::from_secs(60),
        }
    }

    /// The shard group's assignment ConfigMap (namespace, name), never copied.
    #[must_use]
    pub fn assignment(mut self, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        self.own.configmaps.push((namespace.into(), name.into()));
        self
    }

    /// Only these namespaces.
    #[must_use]
    pub fn namespaces<I: IntoIterator<Item = S>, S: Into<String>>(mut self, ns: I) -> Self {
        self.namespaces = Some(ns.into_iter().map(Into::into).collect());
        self
    }

    /// Only objects whose labels match `selector` (`kubectl -l` syntax: `app=shop,tier in (web,api)`).
    /// With a selector that selects everything (empty text), no selector.
    pub fn labels(mut self, selector: &str) -> Result<Self, MirrorError> {
        let s = super::labels::parse_labels(selector)?;
        self.labels = (!s.selects_all()).then_some(s);
        Ok(self)
    }

    /// Mirror built-in kinds without a label selector: every object of them in scope is the operator's
    /// (the per-cluster objects every cluster makes for itself stay out of scope).
    #[must_use]
    pub fn whole_builtin_kinds(mut self, yes: bool) -> Self {
        self.whole_builtin_kinds = yes;
        self
    }

    /// Copy writes in flight at once per kind (clamped to 1..=64).
    #[must_use]
    pub fn workers(mut self, n: usize) -> Self {
        self.workers = n.clamp(1, 64);
        self
    }

    /// At most `per_second` copy requests per second over every kind (`None`: no limit).
    #[must_use]
    pub fn rate_limit(mut self, per_second: Option<f64>) -> Self {
        self.rate_limit = per_second.filter(|r| r.is_finite() && *r > 0.0);
        self
    }

    /// The source term's failover epoch (wire form).
    #[must_use]
    pub fn epoch(mut self, wire: u64) -> Self {
        self.epoch = Some(wire);
        self
    }

    /// Retry backoff.
    #[must_use]
    pub fn backoff(mut self, b: Backoff) -> Self {
        self.backoff = b;
        self
    }

    /// The probe period.
    #[must_use]
    pub fn probe_period(mut self, d: Duration) -> Self {
        self.probe_period = d;
        self
    }

    /// The checkpoint period.
    #[must_use]
    pub fn checkpoint_period(mut self, d: Duration) -> Self {
        self.checkpoint_period = d;
        self
    }

    /// The prune backstop: every `period` (`None`: off), with a confirmation `grace`.
    #[must_use]
    pub fn prune(mut self, period: Option<Duration>, grace: Duration) -> Self {
        self.prune_period = period;
        self.prune_grace = grace;
        self
    }
}
