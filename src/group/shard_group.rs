//! `ShardGroup`: join a group of replicas that share the work by logical shards.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::{oneshot, watch};
use tracing::warn;

use super::config::{ConfigError, GroupConfig};
use super::metrics::GroupMetrics;
use super::runtime::{new_incarnation, GroupError, Runtime};
use super::singleton::{LeaderTerm, Leadership};
use super::status::{GroupStatus, Health};
use crate::hash::ShardKey;
use crate::ownership::{MemberId, Ownership, OwnershipConfig, TermGate};
use crate::rt::Clock;
use crate::rt::Spawner;
use crate::shard::ShardCount;

/// A member of a shard group, ready to start.
///
/// ```no_run
/// use kube_shard::group::ShardGroup;
/// # async fn run(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
/// let group = ShardGroup::builder(client, "widgets", "operators").build()?;
/// let (handle, task) = group.start();
/// tokio::spawn(task);
/// let ownership = handle.ownership(); // give it to kube_shard::watcher and the reconcile wrapper
/// // ... on SIGTERM:
/// handle.leave();
/// # Ok(()) }
/// ```
pub struct ShardGroup {
    client: Client,
    config: GroupConfig,
    dedicated: Option<kube::Config>,
    clock: Clock,
    spawner: Spawner,
    gate: Option<GateSetup>,
}

/// A term gate in front of admission ([`ShardGroupBuilder::term_gate`]) and the tasks that keep it (aborted
/// if the builder or the group is dropped without starting).
struct GateSetup {
    gate: Arc<dyn TermGate>,
    tasks: AbortOnDrop,
}

impl std::fmt::Debug for ShardGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardGroup")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Builds a [`ShardGroup`].
#[must_use]
pub struct ShardGroupBuilder {
    client: Client,
    config: GroupConfig,
    dedicated: Option<kube::Config>,
    clock: Clock,
    spawner: Spawner,
    gate: Option<GateSetup>,
}

impl std::fmt::Debug for ShardGroupBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardGroupBuilder")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ShardGroup {
    /// A builder for group `group` whose Leases and assignment live in `namespace`.
    pub fn builder(client: Client, group: &str, namespace: &str) -> ShardGroupBuilder {
        ShardGroupBuilder {
            client,
            config: GroupConfig::new(group, namespace),
            dedicated: None,
            clock: Clock::system(),
            spawner: Spawner::tokio(),
            gate: None,
        }
    }

    /// The validated configuration.
    #[must_use]
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// Start the member: returns its handle and the task to run (spawn it). The task ends after a graceful
    /// leave ([`GroupHandle::leave`]) has moved every shard away and the Lease was deleted.
    ///
    /// With a term gate ([`ShardGroupBuilder::term_gate`]) this also starts the gate's two tasks (call it
    /// inside a tokio runtime then); they and the gate's own tasks stop when the returned task ends or is
    /// dropped.
    ///
    /// Create the read streams (`kube_shard::watcher`, ...) for `handle.ownership()` before the task first
    /// runs: a shard is warm only when every stream registered by then has synced it. A member with no
    /// streams (admission only) reports warm and activation at once.
    pub fn start(
        self,
    ) -> (
        GroupHandle,
        impl Future<Output = Result<(), GroupError>> + Send + 'static,
    ) {
        let c = &self.config;
        let mut oc = OwnershipConfig::new(c.shards, c.key);
        oc.renew_deadline = c.renew_deadline;
        oc.fence_margin = c.fence_margin;
        oc.drain_timeout = c.drain_timeout;
        let me = MemberId::new(c.member.as_str(), new_incarnation());
        let ownership = Ownership::new(oc, me.clone(), self.clock);
        let (status_tx, status_rx) = watch::channel(GroupStatus::initial(me.clone()));
        let health = Health::new(c.unhealthy_after_fenced);
        let metrics = GroupMetrics::default();
        let (leave_tx, leave_rx) = oneshot::channel();
        let (leader_tx, leader_rx) = watch::channel(None);
        let (gate, gate_tasks) = match self.gate {
            Some(mut setup) => {
                let ours = super::term_gate::install(setup.gate.clone(), &ownership);
                setup.tasks.0.extend(ours);
                (Some(setup.gate), setup.tasks)
            }
            None => (None, AbortOnDrop(Vec::new())),
        };
        let handle = GroupHandle {
            gate,
            leadership: leader_rx,
            ownership: ownership.clone(),
            status: status_rx,
            health: health.clone(),
            metrics: metrics.clone(),
            leave: std::sync::Arc::new(std::sync::Mutex::new(Some(leave_tx))),
        };
        let (client, config) = (self.client, self.config);
        let (dedicated, spawner) = (self.dedicated, self.spawner);
        (handle, async move {
            let _gate = gate_tasks;
            if let Some(kube_config) = dedicated {
                return run_dedicated(
                    kube_config,
                    config,
                    ownership,
                    me,
                    status_tx,
                    health,
                    metrics,
                    leader_tx,
                    leave_rx,
                )
                .await;
            }
            // built when the task first runs, so read streams created after `start` are counted
            let runtime = Runtime::new(
                client, config, ownership, me, status_tx, health, metrics, leader_tx, spawner,
            );
            runtime.run(leave_rx).await
        })
    }
}

/// Aborts the gate's tasks when the member's task ends (or is dropped: a killed process).
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Run the member on its own OS thread, with its own single-threaded tokio runtime and its own `Client`, so a
/// busy reconcile or a large deserialisation on the application's runtime cannot starve its renewals.
#[allow(clippy::too_many_arguments)]
async fn run_dedicated(
    kube_config: kube::Config,
    config: GroupConfig,
    ownership: Ownership,
    me: MemberId,
    status_tx: watch::Sender<GroupStatus>,
    health: Health,
    metrics: GroupMetrics,
    leadership: watch::Sender<Option<LeaderTerm>>,
    leave_rx: oneshot::Receiver<()>,
) -> Result<(), GroupError> {
    let (done_tx, done_rx) = oneshot::channel();
    let group = config.group.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("kube-shard-{}", config.member))
        .spawn(move || {
            let result = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(async move {
                    let client =
                        Client::try_from(kube_config).map_err(|source| GroupError::Api {
                            group: config.group.clone(),
                            what: "building the member's own client",
                            source,
                        })?;
                    Runtime::new(
                        client,
                        config,
                        ownership,
                        me,
                        status_tx,
                        health,
                        metrics,
                        leadership,
                        Spawner::tokio(),
                    )
                    .run(leave_rx)
                    .await
                }),
                Err(e) => Err(GroupError::Thread(e.to_string())),
            };
            let _ = done_tx.send(result);
        });
    if let Err(e) = spawned {
        return Err(GroupError::Thread(format!("{group}: {e}")));
    }
    done_rx
        .await
        .unwrap_or_else(|_| Err(GroupError::Thread("the member thread panicked".into())))
}

impl ShardGroupBuilder {
    /// Run renewals, observation and coordination on a dedicated OS thread with its own runtime and its
    /// own client built from `config`, so nothing on the application's runtime can delay a renewal
    /// (recommended in production; tests with paused time use the default, the caller's runtime).
    pub fn dedicated_thread(mut self, config: kube::Config) -> Self {
        self.dedicated = Some(config);
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
    /// ([`GroupHandle::leadership`]) runs only in a term too. `tasks` are the gate's own (an elector):
    /// they are aborted when the member's task ends, or when the builder or the group is dropped without
    /// starting.
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

    /// Validate and build.
    pub fn build(self) -> Result<ShardGroup, ConfigError> {
        self.config.validate()?;
        if self.config.key == ShardKey::Namespace {
            warn!("the namespace key puts every cluster-scoped object in one shard (they all hash \"\")");
        }
        Ok(ShardGroup {
            client: self.client,
            config: self.config,
            dedicated: self.dedicated,
            clock: self.clock,
            spawner: self.spawner,
            gate: self.gate,
        })
    }
}

/// The running member's handle. Cheap to clone.
#[derive(Clone, Debug)]
pub struct GroupHandle {
    gate: Option<Arc<dyn TermGate>>,
    ownership: Ownership,
    leadership: watch::Receiver<Option<LeaderTerm>>,
    status: watch::Receiver<GroupStatus>,
    health: Health,
    metrics: GroupMetrics,
    leave: std::sync::Arc<std::sync::Mutex<Option<oneshot::Sender<()>>>>,
}

impl GroupHandle {
    /// The member's ownership: pass it to the read path and the reconcile wrapper.
    #[must_use]
    pub fn ownership(&self) -> Ownership {
        self.ownership.clone()
    }

    /// The latest status.
    #[must_use]
    pub fn status(&self) -> GroupStatus {
        self.status.borrow().clone()
    }

    /// Status updates.
    #[must_use]
    pub fn watch_status(&self) -> watch::Receiver<GroupStatus> {
        self.status.clone()
    }

    /// Liveness and readiness.
    #[must_use]
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// The member's metrics (register them in a prometheus-client registry).
    #[must_use]
    pub fn metrics(&self) -> GroupMetrics {
        self.metrics.clone()
    }

    /// Leadership of the group (the coordinator Lease), for work that must run once per group: see
    /// [`Leadership::run_singleton`] and the fencing term it hands out.
    #[must_use]
    pub fn leadership(&self) -> Leadership {
        // the group's clock: terms are stamped on it (an injected boot clock must judge them too)
        // behind a term gate (cross-cluster HA) a leader's term counts only within the gate's term
        Leadership::with_clock(self.leadership.clone(), self.ownership.inner.clock.clone())
            .with_gate(self.gate.clone())
    }

    /// Leave gracefully: the shards move away (as one batch), the member keeps serving until each is
    /// released, then the task ends and the Lease is deleted. Call it on SIGTERM.
    pub fn leave(&self) {
        if let Some(tx) = self.leave.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = tx.send(());
        }
    }
}
