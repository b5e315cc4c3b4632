//! The gates of one shard across holdings: the current one, and the retired ones that may still have
//! requests in flight.
//!
//! A re-grant at a new epoch, a cancel-back or a release *retires* a holding's gate: nothing is admitted
//! under it, and its permits and fences no longer mint or pass a fence (see [`Fence`](super::Fence)). The
//! shard keeps it, and every later drain waits for it, until nothing is in flight on it and its last fence's
//! validity has passed. The handoff model keeps [`ShardGates`] too, so its drain waits for exactly the gates
//! the handle's does. Crate-private; `testing::member` re-exports it (feature `test-util`, unstable).
//!
//! See `docs/protocol.md#admission-drains-and-fences-ownershipadmission-fence-handle`.
#![cfg_attr(not(feature = "test-util"), allow(dead_code))]

use super::state::ShardState;

/// The gates of one shard: the one it is admitted under now (if any) and the retired ones kept.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ShardGates<G> {
    current: Option<G>,
    retired: Vec<G>,
}

impl<G> Default for ShardGates<G> {
    fn default() -> Self {
        ShardGates {
            current: None,
            retired: Vec::new(),
        }
    }
}

impl<G: Clone> ShardGates<G> {
    /// A shard admitted under `gate`, with nothing retired.
    pub fn open(gate: G) -> Self {
        ShardGates {
            current: Some(gate),
            retired: Vec::new(),
        }
    }

    /// Follow the shard's transition `from` → `to`, opening a gate with `open` when it needs a new one.
    /// Returns the gate this retired, if any (the caller closes it).
    ///
    /// Owned after Owned keeps the gate; Owned after anything else (an activation, a cancel-back) retires
    /// the gate of the earlier holding and opens a new one. Outgoing keeps the gate it drains (a fresh one
    /// when the shard was not admitted under any: a drain of a grant never activated). Anything else (a
    /// re-grant at a new epoch, a release, a drop) retires the gate.
    pub fn follow(
        &mut self,
        from: Option<ShardState>,
        to: Option<ShardState>,
        open: impl FnOnce() -> G,
    ) -> Option<G> {
        match to {
            Some(ShardState::Owned { .. }) if matches!(from, Some(ShardState::Owned { .. })) => {
                self.current.get_or_insert_with(open);
                None
            }
            Some(ShardState::Owned { .. }) => {
                let retired = self.retire();
                self.current = Some(open());
                retired
            }
            Some(ShardState::Outgoing { .. }) => {
                self.current.get_or_insert_with(open);
                None
            }
            _ => self.retire(),
        }
    }

    /// The gate the shard is admitted (or drained) under now.
    pub fn current(&self) -> Option<&G> {
        self.current.as_ref()
    }

    /// The retired gates kept: requests admitted under them may still be in flight.
    pub fn retired(&self) -> &[G] {
        &self.retired
    }

    /// Every gate a drain of the shard waits for: the current one, then the retired ones.
    pub fn drain_set(&self) -> impl Iterator<Item = &G> {
        self.current.iter().chain(&self.retired)
    }

    /// Forget the retired gates that can hold nothing back (`settled`: nothing in flight on it and its
    /// last fence's validity passed).
    pub fn prune(&mut self, settled: impl Fn(&G) -> bool) {
        self.retired.retain(|g| !settled(g));
    }

    /// The same gates, each replaced by `f`'s image (the model renumbers its gates with it).
    pub fn map<H>(&self, f: impl Fn(&G) -> H) -> ShardGates<H> {
        ShardGates {
            current: self.current.as_ref().map(&f),
            retired: self.retired.iter().map(f).collect(),
        }
    }

    /// No gate at all: neither a current one nor a retired one kept.
    pub fn is_empty(&self) -> bool {
        self.current.is_none() && self.retired.is_empty()
    }

    fn retire(&mut self) -> Option<G> {
        let gate = self.current.take()?;
        if !planted!(FORGET_RETIRED_GATES) {
            self.retired.push(gate.clone());
        }
        Some(gate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNED: Option<ShardState> = Some(ShardState::Owned { epoch: 1 });
    const OUTGOING: Option<ShardState> = Some(ShardState::Outgoing {
        epoch: 1,
        move_id: 7,
    });
    const ACTIVATING: Option<ShardState> = Some(ShardState::Activating { epoch: 2 });

    fn gates(current: Option<u8>, retired: &[u8]) -> ShardGates<u8> {
        ShardGates {
            current,
            retired: retired.to_vec(),
        }
    }

    #[test]
    fn a_holding_keeps_its_gate_through_its_drain() {
        let mut g = ShardGates::open(0u8);
        assert_eq!(g.follow(OWNED, OWNED, || 9), None);
        assert_eq!(g.follow(OWNED, OUTGOING, || 9), None);
        assert_eq!(g, gates(Some(0), &[]));
    }

    #[test]
    fn a_regrant_retires_the_gate_and_the_next_drain_waits_for_it() {
        let mut g = ShardGates::open(0u8);
        g.follow(OWNED, OUTGOING, || 9);
        assert_eq!(g.follow(OUTGOING, ACTIVATING, || 9), Some(0));
        assert_eq!(g.follow(ACTIVATING, OUTGOING, || 1), None);
        assert_eq!(g.drain_set().copied().collect::<Vec<_>>(), vec![1, 0]);
    }

    #[test]
    fn a_cancel_back_retires_the_drained_gate_and_opens_a_new_one() {
        let mut g = ShardGates::open(0u8);
        g.follow(OWNED, OUTGOING, || 9);
        assert_eq!(g.follow(OUTGOING, OWNED, || 1), Some(0));
        assert_eq!(g, gates(Some(1), &[0]));
    }

    #[test]
    fn a_release_keeps_the_gate_until_it_settles() {
        let mut g = ShardGates::open(0u8);
        assert_eq!(g.follow(OUTGOING, None, || 9), Some(0));
        assert!(!g.is_empty());
        g.prune(|_| false);
        assert_eq!(g, gates(None, &[0]));
        g.prune(|_| true);
        assert!(g.is_empty());
    }

    #[test]
    fn map_keeps_the_order() {
        let g = gates(Some(4), &[2, 3]);
        assert_eq!(g.map(|x| x * 10), gates(Some(40), &[20, 30]));
    }
}
