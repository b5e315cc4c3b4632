//! The member's shared ownership state (data, no behaviour beyond reads): the [`Snapshot`] readers load,
//! the [`Inner`] every handle shares, and the member-wide [`Hold`] bits.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, watch};

use super::{
    config::OwnershipConfig,
    gates::ShardGates,
    inflight::Gate,
    state::{MemberState, ShardTransition},
};
use crate::rt::{Clock, Deadline};

/// An immutable view of the member's ownership at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Snapshot {
    pub(crate) state: MemberState,
    /// Per shard: the gate it is admitted (or drained) under now, and the retired gates kept while
    /// requests admitted under them may still be in flight.
    pub(crate) gates: BTreeMap<u32, ShardGates<Arc<Gate>>>,
    pub(crate) renewal: Option<Deadline>,
    pub(crate) drains: BTreeMap<u32, Deadline>,
}

impl Snapshot {
    /// The pure state.
    #[must_use]
    pub(crate) fn state(&self) -> &MemberState {
        &self.state
    }

    /// The gate `shard` is admitted (or drained) under now.
    pub(crate) fn gate(&self, shard: u32) -> Option<Arc<Gate>> {
        self.gates.get(&shard)?.current().cloned()
    }

    /// Whether `gate` is the one `shard` is admitted (or drained) under now, not a retired one.
    pub(crate) fn is_current_gate(&self, shard: u32, gate: &Arc<Gate>) -> bool {
        self.gates
            .get(&shard)
            .and_then(ShardGates::current)
            .is_some_and(|g| Arc::ptr_eq(g, gate))
    }

    /// How many retired gates `shard` still keeps.
    #[cfg(test)]
    pub(crate) fn retired_gates(&self, shard: u32) -> usize {
        self.gates.get(&shard).map_or(0, |g| g.retired().len())
    }

    pub(crate) fn drain_deadline(&self, shard: u32) -> Option<Deadline> {
        self.drains.get(&shard).copied()
    }
}

pub(crate) struct Inner {
    pub(crate) config: OwnershipConfig,
    pub(crate) clock: Clock,
    pub(crate) snapshot: ArcSwap<Snapshot>,
    pub(crate) writer: Mutex<Vec<mpsc::UnboundedSender<ShardTransition>>>,
    pub(crate) changed: watch::Sender<u64>,
    /// The read streams registered by the read path (warm and activation need all of them).
    pub(crate) readers: Arc<super::readers::Readers>,
    /// The member-wide admission holds, one bit per [`Hold`] (0 = none).
    pub(crate) hold: std::sync::atomic::AtomicU8,
    /// Cross-cluster HA: the cluster's term (admission and fences need it), when configured.
    pub(crate) gate: std::sync::OnceLock<std::sync::Arc<dyn super::term_gate::TermGate>>,
    /// Where fences and fenced requests report (none by default; see [`super::observe`]).
    pub(crate) observer: std::sync::OnceLock<Arc<dyn super::observe::FenceObserver>>,
    /// The failover epoch whose demotion this member has drained (its `ha-drained` ack).
    pub(crate) gate_drained: Mutex<Option<crate::token::FailoverEpoch>>,
}

/// Why a member admits nothing although it owns shards. Each cause is its own bit: a gate sets and clears
/// only its own, so one gate lifting (the legacy leader gone) never clears another's hold (the HA Standby).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum Hold {
    /// Shadow mode: ownership is computed and reported, nothing is admitted.
    Shadow,
    /// A legacy leader-election Lease still has a live holder (migration from leader election).
    LegacyLeader,
    /// A member of the group writes another report format (another build): the members cannot be
    /// sure they read each other's acks alike, so nothing is admitted until it is gone.
    ForeignFormat,
    /// The installed [`TermGate`](super::TermGate) grants no term (cross-cluster HA: this cluster is
    /// not the Active one).
    Term,
}

impl Hold {
    /// Strongest first: the reason reported when several bits are set.
    const ALL: [Hold; 4] = [
        Hold::Shadow,
        Hold::ForeignFormat,
        Hold::Term,
        Hold::LegacyLeader,
    ];

    pub(crate) fn bit(self) -> u8 {
        match self {
            Hold::Shadow => 1,
            Hold::LegacyLeader => 2,
            Hold::ForeignFormat => 4,
            Hold::Term => 8,
        }
    }

    pub(crate) fn reason_text(self) -> &'static str {
        self.text()
    }

    fn text(self) -> &'static str {
        match self {
            Hold::Shadow => "shadow mode",
            Hold::LegacyLeader => "a legacy leader-election lease has a live holder",
            Hold::ForeignFormat => "a member of another build (report format) is in the group",
            Hold::Term => "this cluster is not the active HA cluster",
        }
    }

    fn reason(bits: u8) -> Option<&'static str> {
        Hold::ALL
            .iter()
            .find(|h| bits & h.bit() != 0)
            .map(|h| h.text())
    }
}

impl Inner {
    /// The member-wide admission hold, if any.
    pub(crate) fn hold_reason(&self) -> Option<&'static str> {
        Hold::reason(self.hold.load(std::sync::atomic::Ordering::Acquire))
    }

    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// Whether the last renewal still covers now on both clocks (`false` if never renewed).
    pub(crate) fn renewal_valid(&self, snap: &Snapshot) -> bool {
        snap.renewal
            .is_some_and(|d| !d.remaining(self.clock.now()).is_zero())
    }
}
