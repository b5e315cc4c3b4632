//! `ShardGroupBuilder`: every setting of a member, validated by `build()`; where its client, namespace
//! and metrics come from.

use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use prometheus_client::registry::Registry;
use tracing::{info, warn};

use super::config::{ConfigError, GroupConfig};
use super::shard_group::ShardGroup;
use super::wiring::{AbortOnDrop, ClientSource, Collectors, GateSetup};
use crate::hash::ShardKey;
use crate::ownership::TermGate;
use crate::rt::{Clock, Spawner};
use crate::shard::ShardCount;

/// Where the service account's namespace is mounted in a pod.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Builds a [`ShardGroup`].
#[must_use]
pub struct ShardGroupBuilder {
    pub(super) source: ClientSource,
    /// `None`: found at `build()` in the pod (`POD_NAMESPACE`, the service account's namespace).
    pub(super) namespace: Option<String>,
    pub(super) config: GroupConfig,
    pub(super) dedicated: Option<kube::Config>,
    pub(super) clock: Clock,
    pub(super) spawner: Spawner,
    pub(super) gate: Option<GateSetup>,
    pub(super) metrics: Collectors,
}

impl std::fmt::Debug for ShardGroupBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardGroupBuilder")
            .field("config", &self.config)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl ShardGroup {
    /// A builder for group `group` whose Leases and assignment live in `namespace`, on `client`
    /// (renewals run on the caller's runtime unless [`dedicated_thread`](ShardGroupBuilder::dedicated_thread)
    /// is given a `kube::Config`).
    pub fn builder(client: Client, group: &str, namespace: &str) -> ShardGroupBuilder {
        ShardGroupBuilder::new(ClientSource::Client(client), group, Some(namespace))
    }

    /// A builder for group `group` from one `kube::Config`: `build()` makes the application's client from
    /// it ([`client`](Self::client), [`GroupHandle::client`](super::GroupHandle::client)), and the member
    /// renews on a dedicated thread with its own client from the same config
    /// ([`without_dedicated_thread`](ShardGroupBuilder::without_dedicated_thread) to opt out). The
    /// namespace is [`ShardGroupBuilder::namespace`], else the pod's (`POD_NAMESPACE`, else the service
    /// account's); outside a cluster it must be given. Never calls `Config::infer()`: pass its result.
    pub fn from_config(config: kube::Config, group: &str) -> ShardGroupBuilder {
        ShardGroupBuilder::new(ClientSource::Config(Box::new(config)), group, None)
    }
}

impl ShardGroupBuilder {
    fn new(source: ClientSource, group: &str, namespace: Option<&str>) -> Self {
        let dedicated = match &source {
            ClientSource::Config(c) => Some((**c).clone()),
            ClientSource::Client(_) => None,
        };
        ShardGroupBuilder {
            source,
            namespace: namespace.map(str::to_owned),
            config: GroupConfig::new(group, namespace.unwrap_or_default()),
            dedicated,
            clock: Clock::system(),
            spawner: Spawner::tokio(),
            gate: None,
            metrics: Collectors::default(),
        }
    }

    /// The group's namespace: its Leases, ConfigMaps and Events live there. Required outside a cluster
    /// with [`ShardGroup::from_config`]; in a pod it defaults to `POD_NAMESPACE`, else the service
    /// account's namespace (`/var/run/secrets/kubernetes.io/serviceaccount/namespace`). Never the
    /// kubeconfig's default namespace: replicas started with different kubeconfigs would form two groups.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Register the member's metrics in `registry` now, before the member starts: the group's
    /// ([`GroupHandle::metrics`](super::GroupHandle::metrics)), the read path's
    /// ([`GroupHandle::read_path_metrics`](super::GroupHandle::read_path_metrics): give it to every sharded
    /// watcher) and the fenced reconciles' ([`GroupHandle::fence_metrics`](super::GroupHandle::fence_metrics)).
    /// A registry can then be frozen at start-up. Their names are the same under a prefix
    /// (`Registry::with_prefix("app")` gives `app_kube_shard_…`); the shipped alerts match either.
    pub fn metrics(self, registry: &mut Registry) -> Self {
        self.metrics.register(registry);
        self
    }

    /// Run renewals, observation and coordination on a dedicated OS thread with its own runtime and its
    /// own client built from `config`, so nothing on the application's runtime can delay a renewal
    /// (recommended in production, and the default with [`ShardGroup::from_config`]; tests with paused
    /// time use the caller's runtime).
    pub fn dedicated_thread(mut self, config: kube::Config) -> Self {
        self.dedicated = Some(config);
        self
    }

    /// Run renewals on the caller's runtime with the application's client (the default with
    /// [`ShardGroup::builder`]; for tests with paused time).
    pub fn without_dedicated_thread(mut self) -> Self {
        self.dedicated = None;
        self
    }

    /// The member's clocks (default [`Clock::system`]): the boot clock fences are also checked against, and
    /// the wall clock that stamps `renewTime`, generations and terms. A simulator drives both from
    /// simulated time, so boot-clock expiry, suspends and wall-clock jumps are exercised. The runtime clock is
    /// always tokio's (pause it in tests).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Where the member starts its background tasks (default `tokio::spawn`): the Events it publishes. Give
    /// the member's sharded watchers the same spawner ([`ShardedWatcher::spawner`](crate::ShardedWatcher::spawner))
    /// and a simulator can freeze everything a member started. Ignored with
    /// [`dedicated_thread`](Self::dedicated_thread), whose runtime is its own.
    pub fn spawner(mut self, spawner: Spawner) -> Self {
        self.spawner = spawner;
        self
    }

    /// This member's stable name (default: `POD_NAME`, else the hostname).
    pub fn member(mut self, name: impl Into<String>) -> Self {
        self.config.member = name.into();
        self
    }

    /// This member's Pod (default: from `POD_NAMESPACE`, `POD_NAME`, `POD_UID`; see
    /// [`GroupConfig::pod`](super::config::GroupConfig::pod)); `None` publishes none.
    pub fn pod(mut self, pod: Option<super::PodRef>) -> Self {
        self.config.pod = pod;
        self
    }

    /// The key objects are placed by (default `uid`; immutable for the group).
    pub fn key(mut self, key: ShardKey) -> Self {
        self.config.key = key;
        self
    }

    /// `S` (default 256; at most 4096; immutable for the group).
    pub fn shards(mut self, shards: ShardCount) -> Self {
        self.config.shards = shards;
        self
    }

    /// Lease timings (defaults 15 s, 10 s, 2 s).
    pub fn timings(
        mut self,
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Self {
        self.config.lease_duration = lease_duration;
        self.config.renew_deadline = renew_deadline;
        self.config.retry_period = retry_period;
        self
    }

    /// Extra wait before a takeover (default 2 s).
    pub fn takeover_grace(mut self, grace: Duration) -> Self {
        self.config.takeover_grace = grace;
        self
    }

    /// How long a drain waits for in-flight work (default 10 s).
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.config.drain_timeout = d;
        self
    }

    /// Fences end this much before the renew deadline (default 1 s).
    pub fn fence_margin(mut self, d: Duration) -> Self {
        self.config.fence_margin = d;
        self
    }

    /// Placement weight, 1 to 1000 (default 1).
    pub fn weight(mut self, weight: u32) -> Self {
        self.config.weight = weight;
        self
    }

    /// Cold start: plan as soon as this many members are present.
    pub fn expected_replicas(mut self, n: u32) -> Self {
        self.config.expected_replicas = Some(n);
        self
    }

    /// Cold-start settle window and join debounce (defaults 5 s and 2 s).
    pub fn settle(mut self, settle: Duration, join_debounce: Duration) -> Self {
        self.config.settle = settle;
        self.config.join_debounce = join_debounce;
        self
    }

    /// At most this many shards moving at once (default 64; a leaver's set is exempt).
    pub fn max_concurrent_moves(mut self, n: u32) -> Self {
        self.config.max_concurrent_moves = n;
        self
    }

    /// Cancel a move whose target has not warmed within this time (default 60 s).
    pub fn move_timeout(mut self, d: Duration) -> Self {
        self.config.move_timeout = d;
        self
    }

    /// Shadow mode: join, compute and report ownership, admit nothing ([`AdmitError::Held`]). For trying the
    /// group beside an existing deployment.
    ///
    /// [`AdmitError::Held`]: crate::ownership::AdmitError::Held
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.config.shadow = shadow;
        self
    }

    /// Admit nothing while the leader-election Lease `lease` (`name` in the group namespace, or
    /// `namespace/name`) has a live holder — a holder whose `renewTime` this member sees change within its
    /// `leaseDurationSeconds`. Migrate from leader election by deploying beside the old version: the group
    /// takes over when the old leader is gone (every owned shard is re-enqueued then).
    pub fn legacy_leader_lease(mut self, lease: impl Into<String>) -> Self {
        self.config.legacy_leader_lease = Some(lease.into());
        self
    }

    /// The per-shard fence level ([`crate::fence_policy`], `kshard fence-policy --params NS/NAME`): the
    /// coordinator keeps the ConfigMap `name` in the group namespace — one key per shard, its current
    /// epoch — and raises it *before* each assignment write that activates a new owner, so the per-shard
    /// policy refuses a deposed owner's late writes. Off by default; needs `get`, `create` and `update` on
    /// that ConfigMap (the group's Role has them).
    pub fn fence_params(mut self, name: impl Into<String>) -> Self {
        self.config.fence_params = Some(name.into());
        self
    }

    /// `/healthz` fails once self-fenced this long (default 60 s).
    pub fn unhealthy_after_fenced(mut self, d: Duration) -> Self {
        self.config.unhealthy_after_fenced = d;
        self
    }

    /// Put a term gate in front of admission (cross-cluster Active/Standby, `kube_shard_ha::attach`, is
    /// one): every admission then needs the gate's term, and a permit records the term's failover epoch
    /// ([`Permit::failover_epoch`]); a fence is valid only while the term at that epoch holds, and ends
    /// by the term's deadline; without a term nothing is admitted (the reconcile wrapper returns
    /// `await_change()`), and a new term re-enqueues every owned shard. The group's singleton work
    /// ([`GroupHandle::leadership`](super::GroupHandle::leadership)) runs only in a term too. `tasks` are
    /// the gate's own (an elector): they are aborted when the member's task ends, or when the builder or
    /// the group is dropped without starting.
    ///
    /// [`Permit::failover_epoch`]: crate::ownership::Permit::failover_epoch
    pub fn term_gate(
        mut self,
        gate: Arc<dyn TermGate>,
        tasks: impl IntoIterator<Item = tokio::task::JoinHandle<()>>,
    ) -> Self {
        self.gate = Some(GateSetup {
            gate,
            tasks: AbortOnDrop(tasks.into_iter().collect()),
        });
        self
    }

    /// Validate and build: the namespace (given, or found in the pod), every setting, and — with
    /// [`ShardGroup::from_config`] — the application's client (call it inside a tokio runtime then).
    pub fn build(self) -> Result<ShardGroup, ConfigError> {
        let mut config = self.config;
        config.namespace = match self.namespace {
            Some(ns) => ns,
            None => {
                let (ns, from) = pod_namespace()?;
                info!(namespace = %ns, from, "the shard group's namespace");
                ns
            }
        };
        config.validate()?;
        if config.key == ShardKey::Namespace {
            warn!("the namespace key puts every cluster-scoped object in one shard (they all hash \"\")");
        }
        let client = match self.source {
            ClientSource::Client(c) => c,
            ClientSource::Config(c) => client_from(*c)?,
        };
        Ok(ShardGroup {
            client,
            config,
            dedicated: self.dedicated,
            clock: self.clock,
            spawner: self.spawner,
            gate: self.gate,
            metrics: self.metrics,
        })
    }
}

/// A client from `config`, or why not: a clear error, never a panic (kube's client starts a task, so it
/// needs a tokio runtime).
fn client_from(config: kube::Config) -> Result<Client, ConfigError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ConfigError::Client(
            "ShardGroupBuilder::build must run inside a tokio runtime to build the client".into(),
        ));
    }
    Client::try_from(config).map_err(|e| ConfigError::Client(e.to_string()))
}

/// The namespace of the pod this runs in, and where it was found.
fn pod_namespace() -> Result<(String, &'static str), ConfigError> {
    namespace_from(
        std::env::var("POD_NAMESPACE").ok(),
        std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok(),
    )
}

/// The group's namespace from `POD_NAMESPACE` (`pod_namespace`), else the service account's namespace
/// file (`service_account`), with the source's name; neither (outside a cluster): the namespace is
/// required.
fn namespace_from(
    pod_namespace: Option<String>,
    service_account: Option<String>,
) -> Result<(String, &'static str), ConfigError> {
    let present = |v: Option<String>| v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
    if let Some(ns) = present(pod_namespace) {
        return Ok((ns, "POD_NAMESPACE"));
    }
    if let Some(ns) = present(service_account) {
        return Ok((ns, SERVICE_ACCOUNT_NAMESPACE));
    }
    Err(ConfigError::NamespaceRequired)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_namespace_first_then_the_service_account_then_an_error() {
        let s = |v: &str| Some(v.to_owned());
        assert_eq!(
            namespace_from(s("ops"), s("other\n")).unwrap(),
            ("ops".to_owned(), "POD_NAMESPACE")
        );
        assert_eq!(
            namespace_from(None, s("ops\n")).unwrap(),
            ("ops".to_owned(), SERVICE_ACCOUNT_NAMESPACE)
        );
        assert_eq!(namespace_from(s(" "), s("ops")).unwrap().0, "ops");
        let err = namespace_from(None, None).unwrap_err();
        assert_eq!(err, ConfigError::NamespaceRequired);
        let text = err.to_string();
        assert!(
            text.contains("namespace is required") && text.contains("ShardGroupBuilder::namespace"),
            "{text}"
        );
        assert_eq!(
            namespace_from(s(""), s("")),
            Err(ConfigError::NamespaceRequired)
        );
    }

    fn local_config() -> kube::Config {
        kube::Config::new("http://127.0.0.1:1".parse().unwrap())
    }

    #[test]
    fn from_config_outside_a_tokio_runtime_is_a_clear_error() {
        let built = ShardGroup::from_config(local_config(), "widgets")
            .namespace("ops")
            .member("m-0");
        // outside a runtime: a clear error, not a panic
        let err = built.build().unwrap_err();
        assert!(
            matches!(&err, ConfigError::Client(m) if m.contains("tokio runtime")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn from_config_builds_the_client_and_a_dedicated_thread_by_default() {
        let g = ShardGroup::from_config(local_config(), "widgets")
            .namespace("ops")
            .member("m-0")
            .build()
            .unwrap();
        assert_eq!(g.config().namespace, "ops");
        assert!(g.dedicated.is_some(), "the renewal thread by default");
        assert_eq!(g.client().default_namespace(), "default");
        let shared = ShardGroup::from_config(local_config(), "widgets")
            .namespace("ops")
            .member("m-0")
            .without_dedicated_thread()
            .build()
            .unwrap();
        assert!(shared.dedicated.is_none());
    }

    /// The metric names the shipped alerts match (`{__name__=~"(.+_)?NAME"}`, the only form they use),
    /// with every expression checked to name metrics no other way.
    fn alert_metrics() -> Vec<String> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/prometheusrule.yaml");
        let rules = std::fs::read_to_string(path).expect("deploy/prometheusrule.yaml");
        let mut names = Vec::new();
        for expr in rules.lines().filter_map(|l| l.trim().strip_prefix("expr:")) {
            let mut rest = expr;
            while let Some(i) = rest.find("{__name__=~\"") {
                let after = &rest[i + "{__name__=~\"".len()..];
                let end = after.find("\"}").expect("a closed matcher");
                let name = after[..end]
                    .strip_prefix("(.+_)?")
                    .unwrap_or_else(|| panic!("{expr}: a matcher not of the form (.+_)?NAME"));
                assert!(
                    name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                    "{name}"
                );
                names.push(name.to_owned());
                let outside = &rest[..i];
                assert!(
                    !outside.contains("kube_shard_"),
                    "{expr}: a bare metric name"
                );
                rest = &after[end..];
            }
            assert!(!rest.contains("kube_shard_"), "{expr}: a bare metric name");
        }
        names
    }

    /// Every name a scrape of `registry` can show: each family's, and a counter's `_total` sample.
    fn encoded_names(registry: &Registry) -> Vec<String> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        let mut names = Vec::new();
        for line in text.lines() {
            let Some(t) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            let mut parts = t.split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            names.push(name.to_owned());
            if kind == "counter" {
                names.push(format!("{name}_total"));
            }
        }
        names
    }

    /// `(.+_)?name` as PromQL anchors it: `name` itself, or a non-empty prefix ending in `_`, then `name`.
    fn matches(name: &str, encoded: &str) -> bool {
        encoded == name
            || encoded
                .strip_suffix(name)
                .is_some_and(|p| p.len() > 1 && p.ends_with('_'))
    }

    #[test]
    fn the_shipped_alerts_match_the_metrics_with_or_without_a_registry_prefix() {
        let wanted = alert_metrics();
        assert!(wanted.len() >= 12, "{wanted:?}");
        for prefix in [None, Some("doc_ctrl")] {
            let mut registry = prefix.map_or_else(Registry::default, Registry::with_prefix);
            Collectors::default().register(&mut registry);
            let encoded = encoded_names(&registry);
            if let Some(p) = prefix {
                assert!(encoded
                    .iter()
                    .all(|n| n.starts_with(&format!("{p}_kube_shard_"))));
            }
            for name in &wanted {
                assert!(
                    encoded.iter().any(|e| matches(name, e)),
                    "the alerts' {name} is not among the metrics registered under prefix {prefix:?}: {encoded:?}"
                );
            }
        }
        // and the matcher is not vacuous
        assert!(!matches(
            "kube_shard_owned_shards",
            "xkube_shard_owned_shards"
        ));
        assert!(!matches(
            "kube_shard_owned_shards",
            "_kube_shard_owned_shards"
        ));
    }

    #[test]
    fn an_invalid_namespace_is_refused() {
        let err = ShardGroup::from_config(local_config(), "widgets")
            .namespace("Not_A_Namespace")
            .member("m-0")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("namespace"), "{err}");
    }
}
