//! `GroupHandle`: what the application holds of a running member.

use std::sync::{Arc, Mutex};

use kube::Client;
use tokio::sync::{oneshot, watch};

use super::metrics::GroupMetrics;
use super::singleton::{LeaderTerm, Leadership};
use super::status::{GroupStatus, Health};
use super::wiring::Collectors;
use crate::ownership::reconcile::FenceMetrics;
use crate::ownership::{Ownership, TermGate};
use crate::watcher::ReadPathMetrics;

/// The running member's handle. Cheap to clone.
#[derive(Clone)]
pub struct GroupHandle {
    pub(super) client: Client,
    pub(super) gate: Option<Arc<dyn TermGate>>,
    pub(super) ownership: Ownership,
    pub(super) leadership: watch::Receiver<Option<LeaderTerm>>,
    pub(super) status: watch::Receiver<GroupStatus>,
    pub(super) health: Health,
    pub(super) metrics: Collectors,
    pub(super) leave: Arc<Mutex<Option<oneshot::Sender<()>>>>,
}

impl std::fmt::Debug for GroupHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupHandle")
            .field("ownership", &self.ownership)
            .field("status", &*self.status.borrow())
            .field("health", &self.health)
            .finish_non_exhaustive()
    }
}

impl GroupHandle {
    /// The application's client: the one given to [`ShardGroup::builder`](super::ShardGroup::builder), or
    /// the one [`ShardGroup::from_config`](super::ShardGroup::from_config) built.
    #[must_use]
    pub fn client(&self) -> Client {
        self.client.clone()
    }

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

    /// The member's metrics: registered already when the builder was given a registry
    /// ([`ShardGroupBuilder::metrics`](super::ShardGroupBuilder::metrics)), else register them yourself.
    #[must_use]
    pub fn metrics(&self) -> GroupMetrics {
        self.metrics.group.clone()
    }

    /// The read path's metrics, to give every sharded watcher of this member
    /// ([`ShardedWatcher::metrics`](crate::ShardedWatcher::metrics)); the same instance
    /// [`ShardGroupBuilder::metrics`](super::ShardGroupBuilder::metrics) registered, if it was called.
    #[must_use]
    pub fn read_path_metrics(&self) -> ReadPathMetrics {
        self.metrics.read_path.clone()
    }

    /// The fenced reconcile wrapper's metrics, to give [`reconcile`](crate::reconcile)'s wrapper; the same
    /// instance [`ShardGroupBuilder::metrics`](super::ShardGroupBuilder::metrics) registered, if it was
    /// called.
    #[must_use]
    pub fn fence_metrics(&self) -> FenceMetrics {
        self.metrics.fence.clone()
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
