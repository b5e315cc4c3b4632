//! `ShardGroup`: join a group of replicas that share the work by logical shards.

use std::future::Future;
use std::sync::Arc;

use kube::Client;
use tokio::sync::{oneshot, watch};

use super::config::GroupConfig;
use super::handle::GroupHandle;
use super::metrics::GroupMetrics;
use super::runtime::{new_incarnation, GroupError, Runtime};
use super::singleton::LeaderTerm;
use super::status::{GroupStatus, Health};
use super::wiring::{AbortOnDrop, Collectors, GateSetup};
use crate::ownership::{MemberId, Ownership, OwnershipConfig, TermGate};
use crate::rt::Clock;
use crate::rt::Spawner;

/// A member of a shard group, ready to start.
///
/// ```no_run
/// use kube_shard::group::ShardGroup;
/// # async fn run(config: kube::Config) -> Result<(), Box<dyn std::error::Error>> {
/// let mut registry = prometheus_client::registry::Registry::default();
/// // the group's namespace defaults to the pod's (POD_NAMESPACE, else the service account's)
/// let group = ShardGroup::from_config(config, "widgets")
///     .metrics(&mut registry)
///     .build()?;
/// let client = group.client(); // the application's client, built from the same config
/// let (handle, task) = group.start();
/// tokio::spawn(task);
/// let ownership = handle.ownership(); // give it to kube_shard::watcher and the reconcile wrapper
/// // ... on SIGTERM:
/// handle.leave();
/// # Ok(()) }
/// ```
pub struct ShardGroup {
    pub(super) client: Client,
    pub(super) config: GroupConfig,
    pub(super) dedicated: Option<kube::Config>,
    pub(super) clock: Clock,
    pub(super) spawner: Spawner,
    pub(super) gate: Option<GateSetup>,
    pub(super) metrics: Collectors,
}

impl std::fmt::Debug for ShardGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardGroup")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl ShardGroup {
    /// The validated configuration.
    #[must_use]
    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// The application's client (given to [`builder`](Self::builder), or built by
    /// [`from_config`](Self::from_config)'s `build()`).
    #[must_use]
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Start the member: returns its handle and the task to run (spawn it). The task ends after a graceful
    /// leave ([`GroupHandle::leave`]) has moved every shard away and the Lease was deleted, or with an
    /// error ([`GroupError`]; [`Health`] is then neither live nor ready).
    ///
    /// With a term gate ([`ShardGroupBuilder::term_gate`](super::ShardGroupBuilder::term_gate)) this also starts the gate's two tasks (call it
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
        let me = MemberId::new(c.member.as_str(), new_incarnation());
        let ownership = Ownership::new(ownership_config(c), me.clone(), self.clock);
        let (status_tx, status_rx) = watch::channel(GroupStatus::initial(me.clone(), &c.namespace));
        let health = Health::new(c.unhealthy_after_fenced, c.renew_deadline, &c.namespace);
        let (leave_tx, leave_rx) = oneshot::channel();
        let (leader_tx, leader_rx) = watch::channel(None);
        let (gate, gate_tasks) = install_gate(self.gate, &ownership);
        let handle = GroupHandle {
            client: self.client.clone(),
            gate,
            leadership: leader_rx,
            ownership: ownership.clone(),
            status: status_rx,
            health: health.clone(),
            metrics: self.metrics.clone(),
            leave: Arc::new(std::sync::Mutex::new(Some(leave_tx))),
        };
        let parts = Parts {
            config: self.config,
            ownership,
            me,
            status: status_tx,
            health,
            metrics: self.metrics.group,
            leadership: leader_tx,
        };
        let (client, dedicated, spawner) = (self.client, self.dedicated, self.spawner);
        (handle, async move {
            let _gate = gate_tasks;
            let health = parts.health.clone();
            let result = match dedicated {
                Some(kube_config) => run_dedicated(kube_config, parts, leave_rx).await,
                // built when the task first runs, so read streams created after `start` are counted
                None => parts.runtime(client, spawner).run(leave_rx).await,
            };
            if let Err(e) = &result {
                health.set_task_error(e.to_string());
            }
            result
        })
    }
}

/// The member's ownership settings from the group's.
fn ownership_config(c: &GroupConfig) -> OwnershipConfig {
    let mut oc = OwnershipConfig::new(c.shards, c.key);
    oc.renew_deadline = c.renew_deadline;
    oc.fence_margin = c.fence_margin;
    oc.drain_timeout = c.drain_timeout;
    oc
}

/// The gate (if any) installed in front of `ownership`, and every task that keeps it.
fn install_gate(
    gate: Option<GateSetup>,
    ownership: &Ownership,
) -> (Option<Arc<dyn TermGate>>, AbortOnDrop) {
    match gate {
        Some(mut setup) => {
            let ours = super::term_gate::install(setup.gate.clone(), ownership);
            setup.tasks.0.extend(ours);
            (Some(setup.gate), setup.tasks)
        }
        None => (None, AbortOnDrop(Vec::new())),
    }
}

/// What the member's runtime is made of, besides its client and spawner.
struct Parts {
    config: GroupConfig,
    ownership: Ownership,
    me: MemberId,
    status: watch::Sender<GroupStatus>,
    health: Health,
    metrics: GroupMetrics,
    leadership: watch::Sender<Option<LeaderTerm>>,
}

impl Parts {
    fn runtime(self, client: Client, spawner: Spawner) -> Runtime {
        Runtime::new(
            client,
            self.config,
            self.ownership,
            self.me,
            self.status,
            self.health,
            self.metrics,
            self.leadership,
            spawner,
        )
    }
}

/// Run the member on its own OS thread, with its own single-threaded tokio runtime and its own `Client`, so a
/// busy reconcile or a large deserialisation on the application's runtime cannot starve its renewals.
async fn run_dedicated(
    kube_config: kube::Config,
    parts: Parts,
    leave_rx: oneshot::Receiver<()>,
) -> Result<(), GroupError> {
    let (done_tx, done_rx) = oneshot::channel();
    let group = parts.config.group.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("kube-shard-{}", parts.config.member))
        .spawn(move || {
            let result = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt.block_on(async move {
                    let client =
                        Client::try_from(kube_config).map_err(|source| GroupError::Api {
                            group: parts.config.group.clone(),
                            what: "building the member's own client",
                            source,
                        })?;
                    parts.runtime(client, Spawner::tokio()).run(leave_rx).await
                }),
                Err(e) => Err(GroupError::Thread(e.to_string())),
            };
            let _ = done_tx.send(result);
        });
    if let Err(e) = spawned {
        return Err(GroupError::Thread(format!("{group}: {e}")));
    }
    match done_rx.await {
        Ok(result) => result,
        Err(_) => Err(GroupError::Thread("the member thread panicked".into())),
    }
}
