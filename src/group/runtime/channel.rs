//! The member Lease as control channel (DESIGN §2): a member whose assignment watch is stuck (frozen
//! open, a LIST that never answers) still renews, and reads its own Lease back at every renewal. The
//! coordinator writes the generation a member is behind on into that Lease; the member then reads the
//! assignment directly (one bounded GET) and applies it as if its watch had delivered it.
//!
//! The hint is only a nudge: the member applies what it reads from the ConfigMap, never the hint itself,
//! so a hostile or stale hint costs at most one GET per renewal.

use super::*;
use crate::group::report::ASSIGNMENT_HINT;

impl Runtime {
    /// Coordinator: for every live member that has not applied a generation we wrote a lease period ago
    /// (on our clock), write the current generation into its Lease (at most once per lease period per
    /// member; conditional on the resourceVersion last observed, never over a renewal). The clock runs
    /// from the first generation it was seen behind on, not the newest: a coordinator writing every few
    /// seconds on a slow API would otherwise find every member behind the latest write, always.
    pub(super) async fn nudge_lagging_members(&mut self, current: &Assignment, now: Instant) {
        let generation = current.view.generation;
        let members = self.members(now);
        let behind: BTreeMap<MemberId, u64> = members
            .iter()
            .filter(|m| m.id != self.me && m.live())
            .filter_map(|m| {
                let applied = m.report.as_ref()?.applied_generation;
                (applied < generation).then(|| (m.id.clone(), applied))
            })
            .collect();
        // a member that caught up with the generation it was behind on starts a new clock
        self.coordination
            .lag_since
            .retain(|id, (_, on)| behind.get(id).is_some_and(|applied| applied < on));
        // a report, and a hint's effect, take two answers and a renewal to show (a request's time limit
        // each): a lease period, or longer on a slow API
        let patience = self
            .cfg
            .lease_duration
            .max(self.timeout() * 2 + self.cfg.retry_period);
        let mut due = Vec::new();
        for id in behind.into_keys() {
            let (since, _) = *self
                .coordination
                .lag_since
                .entry(id.clone())
                .or_insert((now, generation));
            let last = self.coordination.nudged.get(&id).copied();
            if now.duration_since(since) >= patience
                && last.is_none_or(|t| now.duration_since(t) >= patience)
            {
                due.push(id);
            }
        }
        self.coordination
            .nudged
            .retain(|id, _| self.coordination.lag_since.contains_key(id));
        for id in due {
            // a renewal that falls due goes between the hints (each up to three requests)
            if !self.renew_between().await {
                return;
            }
            self.coordination.nudged.insert(id.clone(), now);
            self.nudge(&id, generation).await;
        }
    }

    /// Write the hint into `id`'s Lease: first over the resourceVersion we observed; on a conflict (it
    /// renewed meanwhile, as it does every retry period) once more over a fresh read. Only the annotation
    /// changes: the holder's renewals stay its own, and a Lease of another incarnation is left alone.
    async fn nudge(&mut self, id: &MemberId, generation: u64) {
        let Some((name, o)) = self.observations.observed.iter().find(|(_, o)| &o.id == id) else {
            return;
        };
        let name = name.clone();
        let mut lease = o.lease.clone();
        lease.metadata.resource_version = Some(o.rv.clone());
        for attempt in 0..2 {
            let incarnation = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(INCARNATION));
            if incarnation.is_none_or(|i| *i != *id.incarnation) {
                return;
            }
            lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(ASSIGNMENT_HINT.into(), generation.to_string());
            let api = self.leases.clone();
            match self
                .checked(
                    self.lease_named("update", name.clone()),
                    api.replace(&name, &PostParams::default(), &lease),
                )
                .await
            {
                Ok(l) => {
                    info!(member = %id, generation, "a member is behind on the assignment: told it through its Lease");
                    self.observe_lease(l);
                    return;
                }
                Err(err) if attempt == 0 && is_conflict(&err) => {
                    let (api, access) =
                        (self.leases.clone(), self.lease_named("get", name.clone()));
                    match self.checked(access, api.get_opt(&name)).await {
                        Ok(Some(l)) => lease = l,
                        _ => return,
                    }
                }
                // the next pass looks again
                Err(err) => {
                    debug!(member = %id, error = %err, "assignment hint not written");
                    return;
                }
            }
        }
    }

    /// Member: our own Lease, as just written or read back, may carry a hint that we are behind on the
    /// assignment; if so, read the assignment directly and apply it.
    pub(super) async fn follow_hint(&mut self) {
        let hint = self
            .membership
            .own
            .as_ref()
            .and_then(|l| l.metadata.annotations.as_ref())
            .and_then(|a| a.get(ASSIGNMENT_HINT))
            .and_then(|h| h.parse::<u64>().ok());
        let applied = self.ownership.snapshot().state().generation();
        let Some(hint) = hint.filter(|h| *h > applied && *h > self.membership.hint_followed) else {
            return;
        };
        let name = self.cfg.assignment_name();
        // a failed read is tried again at the next renewal: only a read marks the hint followed
        let api = self.cms.clone();
        match self
            .checked(self.assignment_access("get"), api.get_opt(&name))
            .await
        {
            Ok(Some(cm)) => {
                self.membership.hint_followed = hint;
                warn!(
                    generation = hint,
                    applied, "told through our Lease that we are behind on the assignment: read it directly (is the assignment watch stuck?)"
                );
                self.assignment_seen(cm);
            }
            Ok(None) => {
                self.membership.hint_followed = hint;
                debug!("assignment hint, but no assignment ConfigMap");
            }
            Err(err) => debug!(error = %err, "assignment hint: cannot read the assignment"),
        }
    }

    /// The hint is consumed once we applied what it names (and a malformed one at once): drop it from
    /// the Lease we write.
    pub(super) fn hint_consumed(&self, ann: &mut BTreeMap<String, String>) {
        let applied = self.ownership.snapshot().state().generation();
        if ann
            .get(ASSIGNMENT_HINT)
            .is_none_or(|h| h.parse::<u64>().map_or(true, |h| h <= applied))
        {
            ann.remove(ASSIGNMENT_HINT);
        }
    }
}
