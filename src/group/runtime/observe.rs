//! What this member observes of the others, from the group's Lease watch, on its own monotonic clock.

use super::*;

impl Runtime {
    /// Our view had a gap (a watch error, a relist, a silence, our own renewal gap): nothing we missed may
    /// count against anyone, so every observation clock starts again now.
    pub(super) fn reset_observations(&mut self) {
        let now = Instant::now();
        for o in self.observations.observed.values_mut() {
            o.last_change = now;
        }
        for (seen, _) in self.observations.displaced.values_mut() {
            *seen = now;
        }
        if self.observations.leases_synced_at.is_some() {
            self.observations.leases_synced_at = Some(now);
        }
    }

    /// How long the lease watch may stay silent: every member renews every `retry_period`, or as soon as
    /// its last renewal is answered when answers take longer (up to `renew_deadline − fence_margin`, the
    /// longest a renewal may take), so a longer silence is a gap in our view (a backoff pause, a silent
    /// watch restart, a frozen connection). A shorter bound reset every observation clock over and over
    /// under a slow API, and nobody was ever taken over.
    fn lease_gap(&self) -> Duration {
        let slowest_renewal = self
            .cfg
            .renew_deadline
            .saturating_sub(self.cfg.fence_margin)
            + self.cfg.retry_period;
        (self.cfg.lease_duration / 2)
            .max(self.cfg.retry_period * 2)
            .max(slowest_renewal)
    }

    /// The lease watch delivered something: after a silence, restart the observation clocks first.
    pub(super) fn lease_watch_delivered(&mut self, now: Instant) {
        if self
            .observations
            .last_lease_event
            .is_some_and(|t| now.duration_since(t) > self.lease_gap())
        {
            debug!("the lease watch resumes after a silence: resetting observation clocks");
            self.reset_observations();
        }
        self.observations.last_lease_event = Some(now);
    }

    /// The lease watch is silent (or never listed): what we observe of others is not current, so nobody
    /// may be judged on it.
    pub(super) fn lease_watch_silent(&self, now: Instant) -> bool {
        self.observations.leases_synced_at.is_none()
            || self
                .observations
                .last_lease_event
                .is_none_or(|t| now.duration_since(t) > self.lease_gap())
    }

    /// A member Lease's identity is valid only as this build writes it: named `<group>-<holder>`, the holder a
    /// member name (1 to 63 characters), an incarnation of 1 to 253 characters. Anything else is ignored:
    /// the coordinator must never plan for an identity the assignment cannot carry.
    fn valid_member_lease(&self, name: &str, holder: &str, incarnation: &str) -> bool {
        !holder.is_empty()
            && holder.len() <= 63
            && !incarnation.is_empty()
            && incarnation.len() <= 253
            && name
                .strip_prefix(self.cfg.group.as_str())
                .and_then(|r| r.strip_prefix('-'))
                == Some(holder)
    }

    /// Record a Lease; returns whether anything the coordinator acts on changed (a report, a takeover, a
    /// new member or incarnation).
    pub(super) fn observe_lease(&mut self, l: Lease) -> bool {
        self.observe_lease_at(l, Instant::now())
    }

    /// [`observe_lease`](Self::observe_lease) for a Lease that arrived at `arrived` on our clock (a watch
    /// event applied after a slow request): a change counts from when it could first be seen, never later
    /// than the observation clocks already stand.
    pub(super) fn observe_lease_at(&mut self, l: Lease, arrived: Instant) -> bool {
        let Some(name) = l.metadata.name.clone() else {
            return false;
        };
        let now = arrived;
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
        let report = self.decode_report(&name, ann.get(REPORT));
        let taken_over = ann.get(TAKEN_OVER).is_some_and(|t| t == &incarnation);
        let rv = l.metadata.resource_version.clone().unwrap_or_default();
        let coordinator = labels.get(ROLE_LABEL).is_some_and(|r| r == "coordinator")
            || name == self.cfg.coordinator_lease();
        if !coordinator && !self.valid_member_lease(&name, &member_name, &incarnation) {
            if !self.observations.observed.contains_key(&name)
                && self.observations.invalid_leases.insert(name.clone())
            {
                warn!(lease = %name, holder = %member_name, "ignoring a group Lease with an invalid member identity");
                self.events.emit(
                    Kind::Warning,
                    "InvalidMemberLease",
                    format!("ignoring Lease {name}: not a member identity of this group"),
                );
            }
            return false;
        }
        match self.observations.observed.get_mut(&name) {
            Some(o) => {
                let mut relevant =
                    o.report != report || o.taken_over != taken_over || o.deleted_at.is_some();
                let new_id = MemberId::new(member_name.as_str(), incarnation.as_str());
                if o.id != new_id {
                    // another incarnation under this name: the displaced one is not gone by this alone; it
                    // is gone once taken over, or `lease_duration + grace` after its last renewal we saw
                    if !o.id.incarnation.is_empty() {
                        let old = std::mem::replace(&mut o.id, new_id.clone());
                        self.observations
                            .displaced
                            .insert(old, (o.last_change, o.taken_over));
                    }
                    o.id = new_id;
                    o.pod_gone = false;
                    o.first_seen = now;
                    o.last_change = o.last_change.max(now);
                    self.observations.last_membership_change =
                        self.observations.last_membership_change.max(now);
                    relevant = true;
                }
                if o.renew_time != renew_time {
                    o.renew_time = renew_time;
                    o.last_change = o.last_change.max(now);
                    // a renewal: whatever was observed of its Pod before says nothing now
                    o.pod_gone = false;
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
                self.observations.last_membership_change =
                    self.observations.last_membership_change.max(now);
                self.observations.observed.insert(
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
                        pod_gone: false,
                        pod_read_at: None,
                    },
                );
                true
            }
        }
    }

    /// A member's report, or none when it is missing or undecodable. A report of another format (a member
    /// of another build) raises the alarm and holds admission until that Lease is gone or speaks this
    /// build's format again: the two builds may not read each other's acks alike.
    fn decode_report(&mut self, lease: &str, text: Option<&String>) -> Option<MemberReport> {
        let decoded = text.map(|t| MemberReport::decode(t, self.cfg.shards));
        let foreign = match &decoded {
            Some(Err(err)) if err.is_other_format() => Some(err.to_string()),
            _ => None,
        };
        self.set_foreign_format(lease, foreign);
        match decoded? {
            Ok(r) => Some(r),
            Err(err) => {
                warn!(lease = %lease, error = %err, "ignoring an undecodable member report");
                None
            }
        }
    }

    /// Record whether `lease` carries a report of another format, and hold or lift admission to match.
    pub(super) fn set_foreign_format(&mut self, lease: &str, why: Option<String>) {
        let changed = match why {
            Some(why) => {
                let new = !self.observations.foreign_formats.contains_key(lease);
                if new {
                    error!(lease = %lease, error = %why, "ALARM: a member of another build is in the group: admitting nothing until it is gone");
                    self.events.emit(
                        Kind::Warning,
                        "ForeignReportFormat",
                        format!("Lease {lease}: {why}; admitting nothing until it is gone"),
                    );
                }
                self.observations
                    .foreign_formats
                    .insert(lease.to_owned(), why);
                new
            }
            None => self.observations.foreign_formats.remove(lease).is_some(),
        };
        if changed {
            let why = self
                .observations
                .foreign_formats
                .iter()
                .next()
                .map(|(l, w)| format!("Lease {l}: {w}"));
            self.health.set_foreign_format(why);
            self.update_hold();
        }
    }

    /// Returns whether the coordinator should look again now.
    pub(super) fn on_lease_event(&mut self, ev: Event<Lease>, arrived: Instant) -> bool {
        match ev {
            Event::Apply(l) | Event::InitApply(l) => {
                if let (Some(seen), Some(n)) =
                    (self.observations.leases_relisted.as_mut(), &l.metadata.name)
                {
                    seen.insert(n.clone());
                }
                let ours = l.metadata.name.as_deref() == Some(self.cfg.member_lease().as_str())
                    || l.metadata.name.as_deref() == Some(self.cfg.coordinator_lease().as_str());
                if self.superseded_by_our_write(&l) {
                    // the watch is behind our own later write, which we observed from its response
                    return false;
                }
                self.observe_lease_at(l, arrived) && !ours
            }
            Event::Delete(l) => {
                if let Some(n) = &l.metadata.name {
                    self.set_foreign_format(n, None);
                }
                if let Some(o) = l
                    .metadata
                    .name
                    .and_then(|n| self.observations.observed.get_mut(&n))
                {
                    o.deleted_at.get_or_insert_with(Instant::now);
                    self.observations.last_membership_change = Instant::now();
                }
                true
            }
            // a relist: our view had a gap
            Event::Init => {
                self.reset_observations();
                self.observations.leases_relisted = Some(BTreeSet::new());
                false
            }
            // a Lease missing from the relist was deleted meanwhile (the watcher sends no Delete for it)
            Event::InitDone => {
                let now = Instant::now();
                let seen = self.observations.leases_relisted.take().unwrap_or_default();
                let mut gone = false;
                for (name, o) in &mut self.observations.observed {
                    if !seen.contains(name) && o.deleted_at.is_none() {
                        debug!(lease = %name, "a Lease vanished during a relist: deleted");
                        o.deleted_at = Some(now);
                        gone = true;
                    }
                }
                let vanished: Vec<String> = self
                    .observations
                    .foreign_formats
                    .keys()
                    .filter(|l| !seen.contains(*l))
                    .cloned()
                    .collect();
                for l in vanished {
                    self.set_foreign_format(&l, None);
                }
                if gone {
                    self.observations.last_membership_change = now;
                }
                if self.observations.leases_synced_at.is_none() {
                    self.observations.leases_synced_at = Some(now);
                }
                true
            }
        }
    }

    pub(super) fn members(&self, now: Instant) -> Vec<Observed> {
        let lease_period = self.cfg.lease_duration;
        let expiry = self.cfg.lease_duration + self.cfg.takeover_grace;
        let mut out = Vec::new();
        for (name, o) in &self.observations.observed {
            if o.role_coordinator || name == &self.cfg.coordinator_lease() {
                continue;
            }
            let since = now.duration_since(o.last_change);
            let deleted = o.deleted_at.is_some();
            let me = o.id == self.me;
            // planted: a member whose Lease is deleted (no longer observed) is gone at once
            let since = if deleted && planted!(UNOBSERVED_IS_GONE) {
                expiry
            } else {
                since
            };
            out.push(Observed {
                id: o.id.clone(),
                alive: me || (!deleted && !o.taken_over && since < lease_period),
                expired: !me && since >= expiry,
                // gone by evidence once expired: its Lease deleted, or its Pod deleted or replaced
                gone: o.taken_over || ((deleted || o.pod_gone) && since >= expiry),
                report: if me {
                    self.committed_report()
                } else {
                    o.report.clone()
                },
                // the planner's join order: when it was first seen, from a fixed origin (smaller is earlier)
                joined: o
                    .first_seen
                    .duration_since(self.observations.origin)
                    .as_millis() as u64,
                joining: !me && now.duration_since(o.first_seen) < self.cfg.join_debounce,
            });
        }
        out
    }

    /// The members for a coordinator pass: the observed ones, plus every member the assignment names that
    /// is not observed. Such a member is *unknown* (limbo: it holds its shards), never gone by absence: it
    /// is gone only once taken over, or `lease_duration + grace` on our clock without a renewal of that
    /// incarnation seen (since it was displaced on its Lease, or since our lease watch listed).
    pub(super) fn step_members(&self, now: Instant, current: &Assignment) -> Vec<Observed> {
        let expiry = self.cfg.lease_duration + self.cfg.takeover_grace;
        let mut out = self.members(now);
        let known: BTreeSet<MemberId> = out.iter().map(|m| m.id.clone()).collect();
        let mut absent = BTreeSet::new();
        for e in current.view.shards.values() {
            absent.insert(&e.owner);
            match &e.handoff {
                crate::ownership::state::Handoff::Moving { to, .. }
                | crate::ownership::state::Handoff::Draining { to, .. } => {
                    absent.insert(to);
                }
                crate::ownership::state::Handoff::Stable => {}
            }
        }
        for id in absent {
            if known.contains(id) {
                continue;
            }
            let me = *id == self.me;
            if !me && planted!(UNOBSERVED_IS_GONE) {
                // planted: an owner not observed on its Lease is gone at once (no wait, no evidence)
                out.push(Observed {
                    id: id.clone(),
                    alive: false,
                    expired: false,
                    gone: true,
                    report: None,
                    joined: 0,
                    joining: false,
                });
                continue;
            }
            let gone = !me
                && match self.observations.displaced.get(id) {
                    Some((seen, taken)) => *taken || now.duration_since(*seen) >= expiry,
                    None => self
                        .observations
                        .leases_synced_at
                        .is_some_and(|t| now.duration_since(t) >= expiry),
                };
            out.push(Observed {
                id: id.clone(),
                alive: me,
                expired: false,
                gone,
                report: if me { self.committed_report() } else { None },
                joined: 0,
                joining: false,
            });
        }
        out
    }
}
