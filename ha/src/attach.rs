//! Attach cross-cluster Active/Standby to a shard group: the member's HA elector runs on its own task, and
//! its term handle is installed as the group's term gate (`ShardGroupBuilder::term_gate`). Admission and
//! fences then need this cluster's HA term; on a Standby nothing is admitted, and a promotion re-enqueues
//! every owned shard (HA.md "HA in a shard group").

use std::sync::Arc;

use kube_shard::group::ShardGroupBuilder;

use crate::driver::{HaClients, HaControl};
use crate::handle::HaHandle;
use crate::{HaConfig, HaMetrics, HaMode};
use kube_shard::rt::Clock;

/// Attach HA with the defaults (tokio's clock, fresh metrics); see [`Attach`] for the options.
///
/// ```no_run
/// # fn f(client: kube::Client, cfg: kube_shard_ha::HaConfig, clients: kube_shard_ha::HaClients) {
/// use kube_shard::group::ShardGroup;
/// let builder = ShardGroup::builder(client, "widgets", "operators");
/// let (builder, ha) = kube_shard_ha::attach(builder, cfg, clients);
/// let (handle, task) = builder.build().unwrap().start();
/// // `ha` is `None` in standalone mode; its control serves `kshard ha status` and promotions
/// # }
/// ```
///
/// Call it inside a tokio runtime: the elector starts at once, on its own task, and stops when the
/// member's task ends.
pub fn attach(
    builder: ShardGroupBuilder,
    config: HaConfig,
    clients: HaClients,
) -> (ShardGroupBuilder, Option<GroupHa>) {
    Attach::new(config, clients).to(builder)
}

/// A member's HA, attached to its group: the term handle (what admission consults) and the elector's
/// commands.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct GroupHa {
    /// The member's term handle (the group's term gate).
    pub handle: HaHandle,
    /// Commands to the member's elector (`kshard ha status`, promotions).
    pub control: HaControl,
}

/// HA for a shard group, with options.
#[must_use]
pub struct Attach {
    config: HaConfig,
    clients: HaClients,
    clock: Clock,
    metrics: HaMetrics,
    #[cfg(feature = "test-util")]
    faults: crate::faults::Faults,
}

impl std::fmt::Debug for Attach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attach")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Attach {
    /// HA for `config`, the clusters reached through `clients`.
    pub fn new(config: HaConfig, clients: HaClients) -> Self {
        Attach {
            config,
            clients,
            clock: Clock::system(),
            metrics: HaMetrics::default(),
            #[cfg(feature = "test-util")]
            faults: crate::faults::Faults::none(),
        }
    }

    /// The elector's local monotonic clock (default: tokio's; tests give each cluster its own offset and
    /// rate).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The elector's metrics (default: fresh ones).
    pub fn metrics(mut self, metrics: HaMetrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The elector with fault points planted ([`crate::faults`]), so a test can show its checker catches
    /// each (feature `test-util`).
    #[cfg(feature = "test-util")]
    pub fn faults(mut self, faults: crate::faults::Faults) -> Self {
        self.faults = faults;
        self
    }

    /// Start the elector and install its handle as `builder`'s term gate. A standalone config (empty
    /// `--ha-mode`) changes nothing and returns `None`.
    pub fn to(self, builder: ShardGroupBuilder) -> (ShardGroupBuilder, Option<GroupHa>) {
        if self.config.mode == HaMode::Standalone {
            return (builder, None);
        }
        #[cfg(feature = "test-util")]
        let (handle, control, task) = crate::driver::spawn_with_faults(
            &self.config,
            self.clients,
            self.clock,
            self.metrics,
            self.faults,
        );
        #[cfg(not(feature = "test-util"))]
        let (handle, control, task) =
            crate::driver::spawn(&self.config, self.clients, self.clock, self.metrics);
        let builder = builder.term_gate(Arc::new(handle.clone()), task);
        (builder, Some(GroupHa { handle, control }))
    }
}
