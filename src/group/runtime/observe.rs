//! What this member observes of the others, from the group's Lease watch, on its own monotonic clock.

use super::*;

impl Runtime {
    pub(super) fn reset_observations(&mut self) {
        let now = Instant::now();
        for o in self.observed.values_mut() {
            o.last_change = now;
        }
    }

    /// Record a Lease; returns whether anything the coordinator acts on changed (a report, a takeover, a
    /// new member or incarnation).
    pub(super) fn observe_lease(&mut self, l: Lease) -> bool {
        let Some(name) = l.metadata.name.clone() else {
            return false;
        };
        let now = Instant::now();
        let ann = l.metadata.annotations.clone().unwrap_or_default();
        let labels = l.metadata.labels.clone().unwrap_or_default();
        let holder = l.spec.as_ref().and_then(|s| s.holder_identity.clone());
        let renew_time = l
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0.to_string());
        let incarnation = ann.get(INCARNATION).cloned().unwrap_or_default();
        let member_name = holder.clone().unwrap_or_default();
        let report = ann
            .get(REPORT)
            .and_then(|t| match MemberReport::decode(t, self.cfg.shards) {
                Ok(r) => Some(r),
                Err(err) => {
                    warn!(lease = %name, error = %err, "ignoring an undecodable member report");
                    None
                }
            });
        let taken_over = ann.get(TAKEN_OVER).is_some_and(|t| t == &incarnation);
        let rv = l.metadata.resource_version.clone().unwrap_or_default();
        let coordinator = labels.get(ROLE_LABEL).is_some_and(|r| r == "coordinator");
        match self.observed.get_mut(&name) {
            Some(o) => {
                let mut relevant =
                    o.report != report || o.taken_over != taken_over || o.deleted_at.is_some();
                let new_id = MemberId::new(member_name.as_str(), incarnation.as_str());
                if o.id != new_id {
                    o.id = new_id;
                    o.first_seen = now;
                    o.last_change = now;
                    self.last_membership_change = now;
                    relevant = true;
                }
                if o.renew_time != renew_time {
                    o.renew_time = renew_time;
                    o.last_change = now;
                }
                o.rv = rv;
                o.report = report;
                o.taken_over = taken_over;
                o.deleted_at = None;
                o.holder = holder;
                o.lease = l;
                relevant
            }
            None => {
                self.last_membership_change = now;
                self.observed.insert(
                    name,
                    Obs {
                        id: MemberId::new(member_name.as_str(), incarnation.as_str()),
                        rv,
                        renew_time,
                        last_change: now,
                        first_seen: now,
                        report,
                        taken_over,
                        deleted_at: None,
                        role_coordinator: coordinator,
                        holder,
                        lease: l,
                    },
                );
                true
            }
        }
    }

    /// Returns whether the coordinator should look again now.
    pub(super) fn on_lease_event(&mut self, ev: Event<Lease>) -> bool {
        match ev {
            Event::Apply(l) | Event::InitApply(l) => {
                let ours = l.metadata.name.as_deref() == Some(self.cfg.member_lease().as_str())
                    || l.metadata.name.as_deref() == Some(self.cfg.coordinator_lease().as_str());
                if self.superseded_by_our_write(&l) {
                    // the watch is behind our own later write, which we observed from its response
                    return false;
                }
                self.observe_lease(l) && !ours
            }
            Event::Delete(l) => {
                if let Some(o) = l.metadata.name.and_then(|n| self.observed.get_mut(&n)) {
                    o.deleted_at.get_or_insert_with(Instant::now);
                    self.last_membership_change = Instant::now();
                }
                true
            }
            // a relist: our view had a gap
            Event::Init => {
                self.reset_observations();
                false
            }
            Event::InitDone => false,
        }
    }

    pub(super) fn members(&self, now: Instant) -> Vec<Observed> {
        let lease_period = self.cfg.lease_duration;
        let expiry = self.cfg.lease_duration + self.cfg.takeover_grace;
        let mut out = Vec::new();
        for (name, o) in &self.observed {
            if o.role_coordinator
                || o.id.incarnation.is_empty()
                || name == &self.cfg.coordinator_lease()
            {
                continue;
            }
            let since = now.duration_since(o.last_change);
            let deleted = o.deleted_at.is_some();
            let me = o.id == self.me;
            out.push(Observed {
                id: o.id.clone(),
                alive: me || (!deleted && !o.taken_over && since < lease_period),
                expired: !me && since >= expiry,
                gone: o.taken_over || (deleted && since >= expiry),
                report: if me {
                    Some(self.report())
                } else {
                    o.report.clone()
                },
                joined: o.first_seen.elapsed().as_millis() as u64,
                joining: !me && now.duration_since(o.first_seen) < self.cfg.join_debounce,
            });
        }
        out
    }
}
