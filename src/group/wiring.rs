//! What the builder, the group and its handle share: where the application's client comes from, the
//! member's collectors, and a term gate with the tasks that keep it.

use std::sync::Arc;

use kube::Client;
use prometheus_client::registry::Registry;

use super::metrics::GroupMetrics;
use crate::ownership::reconcile::FenceMetrics;
use crate::ownership::TermGate;
use crate::watcher::ReadPathMetrics;

/// Where the application's client comes from.
pub(super) enum ClientSource {
    /// Given ([`ShardGroup::builder`](super::ShardGroup::builder)).
    Client(Client),
    /// Built by `build()` from this ([`ShardGroup::from_config`](super::ShardGroup::from_config)).
    Config(Box<kube::Config>),
}

/// The member's collectors: the group's, its read path's and its fenced reconciles' (one instance each,
/// from the builder on).
#[derive(Clone, Debug, Default)]
pub(super) struct Collectors {
    pub(super) group: GroupMetrics,
    pub(super) read_path: ReadPathMetrics,
    pub(super) fence: FenceMetrics,
}

impl Collectors {
    pub(super) fn register(&self, registry: &mut Registry) {
        self.group.register(registry);
        self.read_path.register(registry);
        self.fence.register(registry);
    }
}

/// A term gate in front of admission ([`ShardGroupBuilder::term_gate`](super::ShardGroupBuilder::term_gate))
/// and the tasks that keep it (aborted if the builder or the group is dropped without starting).
pub(super) struct GateSetup {
    pub(super) gate: Arc<dyn TermGate>,
    pub(super) tasks: AbortOnDrop,
}

/// Aborts the gate's tasks when the member's task ends (or is dropped: a killed process).
pub(super) struct AbortOnDrop(pub(super) Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}
