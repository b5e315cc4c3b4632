//! Status and metrics published after each pass.

use super::*;

impl Runtime {
    pub(super) fn publish_status(&self) {
        let now = Instant::now();
        let snap = self.ownership.snapshot();
        let owned: ShardSet = snap
            .state()
            .shards()
            .filter(|(_, st)| matches!(st, ShardState::Owned { .. }))
            .map(|(s, _)| s)
            .collect();
        let members = self.members(now);
        let status = GroupStatus {
            member: self.me.clone(),
            namespace: self.cfg.namespace.clone(),
            coordinator: self.election.leader,
            generation: snap.state().generation(),
            owned,
            live_members: members.iter().filter(|m| m.alive).count(),
            moves_in_flight: self
                .coordination
                .assignment
                .as_ref()
                .map_or(0, Assignment::moves_in_flight),
            self_fenced: snap.state().is_fenced(),
            joined: self.membership.own.is_some(),
            permission_error: self.oldest_refusal().map(|(p, _)| p.clone()),
        };
        // cluster-wide gauges from every live member's published sets
        let mut admitted: BTreeMap<u32, usize> = BTreeMap::new();
        let mut not_serving = BTreeSet::new();
        for m in members.iter().filter(|m| m.alive && !m.gone) {
            if let Some(r) = &m.report {
                for s in r.admitted.iter() {
                    *admitted.entry(s).or_default() += 1;
                    if !r.serving.contains(s) {
                        not_serving.insert(s);
                    }
                }
            }
        }
        let shards = u64::from(self.cfg.shards.get());
        let (mut counts, mut max_epoch) = ([0u64; 4], 0u64);
        for (_, st) in snap.state().shards() {
            let i = match st {
                ShardState::Owned { .. } => 0,
                ShardState::Incoming { .. } => 1,
                ShardState::Activating { .. } => 2,
                ShardState::Outgoing { .. } => 3,
            };
            counts[i] += 1;
            max_epoch = max_epoch.max(st.epoch().unwrap_or(0));
        }
        let me = self.me.to_string();
        self.metrics.update(&self.cfg.group, &me, |g| {
            g.owned = counts[0];
            g.incoming = counts[1];
            g.activating = counts[2];
            g.outgoing = counts[3];
            g.max_epoch = max_epoch;
            g.generation = status.generation;
            g.self_fenced = status.self_fenced;
            g.coordinator = status.coordinator;
            g.identity_collision = self.health.identity_collision();
            g.assignment_refused = self.coordination.assignment_refused.is_some();
            g.foreign_format = !self.observations.foreign_formats.is_empty();
            g.permission_denied = status.permission_error.is_some();
            g.live_members = status.live_members as u64;
            g.moves_in_flight = status.moves_in_flight as u64;
            g.handoffs_completed = self.coordination.handoffs;
            g.takeovers = self.coordination.takeovers_done;
            g.self_fences = self.membership.self_fences;
            g.rejoins = self.membership.rejoins;
            g.assignment_rollbacks = self.coordination.rollbacks;
            g.unowned_shards = shards.saturating_sub(admitted.len() as u64);
            g.multi_owned_shards = admitted.values().filter(|n| **n > 1).count() as u64;
            g.owned_not_serving_shards = not_serving.len() as u64;
        });
        self.status.send_replace(status);
    }
}
