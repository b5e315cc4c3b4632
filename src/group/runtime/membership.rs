//! This member's own Lease: join (and the same-name claim), renewals, self-fencing, rejoining and leaving.

use super::*;
use crate::group::permission::PERMISSION_ERROR;

impl Runtime {
    pub(super) fn report(&self) -> MemberReport {
        let snap = self.ownership.snapshot();
        let st = snap.state();
        let mut r = MemberReport {
            ready: self.membership.own.is_some(),
            leaving: self.leaving,
            weight: self.cfg.weight,
            applied_generation: st.generation(),
            seen_generation: self.membership.seen_generation,
            acks: st.acks(),
            ..MemberReport::default()
        };
        // serving: what every read stream serves now (synced, not failing); a member without read
        // streams serves what it holds
        r.stale = st.stale().collect();
        r.kept = st.kept().collect();
        let streams = self.ownership.inner.readers.serving();
        for (shard, state) in st.shards() {
            if st.is_admitted(shard) {
                r.admitted.insert(shard);
            }
            let held = matches!(
                state,
                ShardState::Owned { .. } | ShardState::Outgoing { .. }
            );
            if held && streams.as_ref().is_none_or(|s| s.contains(&shard)) {
                r.serving.insert(shard);
            }
        }
        r
    }

    /// Our report as committed in our Lease (the answer to our last successful write): what the
    /// coordinator judges itself on, as it judges every other member. Never [`report`](Self::report):
    /// the in-memory state may be ahead of every committed version (a release while a renewal is in
    /// flight), and an assignment completed on it would rest on an ack nobody can read — the group's
    /// history must justify every owner change on its own (`oracles::history`).
    pub(super) fn committed_report(&self) -> Option<MemberReport> {
        let text = self
            .membership
            .own
            .as_ref()?
            .metadata
            .annotations
            .as_ref()?
            .get(REPORT)?;
        MemberReport::decode(text, self.cfg.shards).ok()
    }

    pub(super) fn lease_body(&self, base: Option<&Lease>) -> Lease {
        let mut lease = base.cloned().unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.cfg.member_lease()),
                namespace: Some(self.cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        });
        let labels = lease.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(GROUP_LABEL.into(), self.cfg.group.clone());
        labels.insert(ROLE_LABEL.into(), "member".into());
        let ann = lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        ann.insert(INCARNATION.into(), self.me.incarnation.to_string());
        match &self.cfg.pod {
            Some(p) => ann.insert(POD.into(), p.text()),
            None => ann.remove(POD),
        };
        ann.insert(REPORT.into(), self.report().encode());
        ann.remove(TAKEN_OVER);
        match self.ownership.gate_drained() {
            Some(e) => ann.insert(GATE_DRAINED.into(), e.wire().to_string()),
            None => ann.remove(GATE_DRAINED),
        };
        // a refusal of another object is seen where the member's logs are not (`kshard status`)
        match self.oldest_refusal() {
            Some((p, _)) => ann.insert(PERMISSION_ERROR.into(), p.to_string()),
            None => ann.remove(PERMISSION_ERROR),
        };
        self.hint_consumed(ann);
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(self.me.name.to_string());
        spec.lease_duration_seconds = Some(self.cfg.lease_duration.as_secs().max(1) as i32);
        spec.renew_time = Some(self.stamp());
        if spec.acquire_time.is_none() {
            spec.acquire_time = spec.renew_time.clone();
        }
        lease
    }

    /// Create this member's lease, or claim it from a previous incarnation that is taken over or has not
    /// renewed for `lease_duration + grace` (two live processes with one name never ping-pong).
    pub(super) async fn join(&mut self) {
        let name = self.cfg.member_lease();
        let existing = match self
            .checked(self.own_lease("get"), self.leases.clone().get_opt(&name))
            .await
        {
            Ok(l) => l,
            Err(err) => {
                debug!(error = %err, "cannot read own lease yet");
                return;
            }
        };
        let start = self.ownership.inner.clock.now();
        let t0 = Instant::now();
        let result = match existing {
            None => {
                let body = self.lease_body(None);
                let api = self.leases.clone();
                self.checked(
                    self.own_lease("create"),
                    api.create(&PostParams::default(), &body),
                )
                .await
            }
            Some(l) => {
                let theirs = l
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(INCARNATION).cloned());
                let mine = theirs.as_deref() == Some(&*self.me.incarnation);
                let taken = theirs.is_some()
                    && l.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(TAKEN_OVER))
                        == theirs.as_ref();
                let expiry = self.cfg.lease_duration + self.cfg.takeover_grace;
                // stale on our own clock, with a watch that is not silent
                let watched_stale = !self.lease_watch_silent(t0)
                    && self
                        .observations
                        .observed
                        .get(&name)
                        .is_some_and(|o| t0.duration_since(o.last_change) >= expiry);
                // or by our own reads: the same resourceVersion read directly for `lease + grace`. The
                // claim is conditional on it, so it commits only if nothing was written since we first
                // read it — no watch needed (when every member of a group restarts under its old name,
                // nobody renews and the lease watch stays silent for good)
                let read_stale = self.read_stale(&l, t0, expiry);
                let stale = watched_stale || read_stale;
                if !(mine || taken || stale) {
                    if !self.observations.observed.contains_key(&name) {
                        // start observing it on our own clock
                        self.observe_lease(l);
                    }
                    warn!(
                        lease = %name,
                        other = theirs.as_deref().unwrap_or("?"),
                        "identity collision: another process holds this member name; waiting for its renewals to stop"
                    );
                    self.events.emit(
                        Kind::Warning,
                        "IdentityCollision",
                        format!(
                            "another process holds member name {}; waiting for its renewals to stop",
                            self.cfg.member
                        ),
                    );
                    self.health.set_collision(true);
                    return;
                }
                // a claim judged stale from our observation is conditional on the resourceVersion we
                // observed: a renewal since (that our watch has not shown yet) makes it conflict
                let base = match self.observations.observed.get(&name) {
                    _ if read_stale && !watched_stale => l,
                    Some(o) if !(mine || taken) => {
                        let mut seen = o.lease.clone();
                        seen.metadata.resource_version = Some(o.rv.clone());
                        seen
                    }
                    _ => l,
                };
                let body = self.lease_body(Some(&base));
                let api = self.leases.clone();
                self.checked(
                    self.own_lease("update"),
                    api.replace(&name, &PostParams::default(), &body),
                )
                .await
            }
        };
        match result {
            Ok(l) => {
                info!(incarnation = %self.me.incarnation, "joined the shard group");
                self.health.set_collision(false);
                self.membership.own = Some(l);
                self.renewed(start, t0);
            }
            Err(err) => debug!(error = %err, "join failed; retrying"),
        }
    }

    /// Our Lease, read directly, has carried the same resourceVersion since we first read it at least
    /// `expiry` ago on our clock.
    fn read_stale(&mut self, l: &Lease, now: Instant, expiry: Duration) -> bool {
        let rv = l.metadata.resource_version.clone().unwrap_or_default();
        match &self.membership.claim_seen {
            Some((seen, since)) if *seen == rv => now.duration_since(*since) >= expiry,
            _ => {
                self.membership.claim_seen = Some((rv, now));
                false
            }
        }
    }

    pub(super) fn renewed(&mut self, start: crate::rt::Now, t0: Instant) {
        self.ownership.record_renewal(start);
        // a gap: none renewed before, one longer than the renew deadline, or one `missed_renewal` already
        // judged one (it fences at `>= renew_deadline`; a renewal landing exactly on the deadline after it
        // must start a new continuous period, or `continuous_since` stays None and this member never takes
        // anyone over)
        let gap = self.membership.continuous_since.is_none()
            || self
                .membership
                .last_renew_ok
                .is_none_or(|prev| t0.duration_since(prev) > self.cfg.renew_deadline);
        if gap {
            // our own gap: nothing we observed of others during it may count against them
            self.reset_observations();
            self.membership.continuous_since = Some(t0);
        }
        self.membership.last_renew_ok = Some(t0);
        self.membership.fenced_since = None;
        self.health.set_fenced_since(None);
    }

    /// Between two requests of a longer sequence (a coordinator pass): start the renewals that are due
    /// (they run beside the pass, `beside.rs`). Returns whether we still hold our Lease and, as before, the
    /// coordinator role.
    pub(super) async fn renew_between(&mut self) -> bool {
        let leader = self.election.leader;
        self.start_due(Instant::now());
        self.membership.own.is_some() && self.election.leader == leader
    }

    /// Apply the answer to a renewal of our Lease. A conflict that is not a takeover (the coordinator wrote
    /// an assignment hint into it) is renewed again at once with what we read back, so it costs the
    /// renewal no retry period.
    pub(super) fn renewal_answered(&mut self, r: super::answers::MemberRenewal) {
        use super::answers::MemberAnswer;
        if r.incarnation != *self.me.incarnation || self.membership.own.is_none() {
            // an answer for an incarnation taken over meanwhile, or a Lease we deleted
            return;
        }
        let name = self.cfg.member_lease();
        match r.answer {
            MemberAnswer::Written(l) => {
                debug!(took = ?r.t0.elapsed(), "renewed");
                self.answered(&self.own_lease("update"));
                self.membership.own = Some(l);
                self.membership.published = r.report;
                self.renewed(r.start, r.t0);
                self.membership.hint_due = true;
            }
            MemberAnswer::Conflict(Ok(Some(l))) => {
                self.answered(&self.own_lease("update"));
                let ann = l.metadata.annotations.clone().unwrap_or_default();
                let taken = ann
                    .get(TAKEN_OVER)
                    .is_some_and(|i| i == &*self.me.incarnation)
                    || ann
                        .get(INCARNATION)
                        .is_some_and(|i| i != &*self.me.incarnation);
                if taken {
                    self.taken_over("our lease was taken over");
                    return;
                }
                self.membership.own = Some(l);
                self.membership.hint_due = true;
                if r.retry {
                    self.membership.renewal_started = None;
                    self.start_renewal(false);
                }
            }
            MemberAnswer::Conflict(Ok(None)) => self.taken_over("our lease was deleted"),
            MemberAnswer::Conflict(Err(e)) => {
                debug!(lease = %name, error = %e, "cannot re-read own lease");
                self.refused(self.own_lease("get"), &e);
            }
            MemberAnswer::Failed(err) if is_not_found(&err) => {
                self.taken_over("our lease was deleted");
            }
            MemberAnswer::Failed(err) => {
                debug!(error = %err, "renewal failed");
                self.refused(self.own_lease("update"), &err);
                self.missed_renewal(Instant::now());
            }
        }
    }

    pub(super) fn missed_renewal(&mut self, now: Instant) {
        let fenced = self
            .membership
            .last_renew_ok
            .is_none_or(|t| now.duration_since(t) >= self.cfg.renew_deadline);
        if fenced {
            self.membership.continuous_since = None;
            if self.membership.fenced_since.is_none() {
                warn!("renew deadline passed: self-fenced until the next successful renewal");
                self.events.emit(
                    Kind::Warning,
                    "SelfFenced",
                    "renew deadline passed: admitting nothing until the next renewal",
                );
                self.membership.fenced_since = Some(now);
                self.membership.self_fences += 1;
                self.health.set_fenced_since(Some(now));
                self.ownership.mark_self_fenced();
            }
        }
    }

    /// Self-fence at once and rejoin as a new incarnation; the lease is never re-created under the old one.
    pub(super) fn taken_over(&mut self, why: &str) {
        error!(
            reason = why,
            "self-fencing and rejoining as a new incarnation"
        );
        self.events.emit(
            Kind::Warning,
            "Rejoined",
            format!("{why}: self-fenced and rejoining as a new incarnation"),
        );
        self.ownership.revoke_renewal();
        self.me = MemberId::new(self.me.name.clone(), new_incarnation());
        self.ownership.reincarnate(self.me.clone());
        self.membership.own = None;
        self.membership.last_renew_ok = None;
        self.membership.continuous_since = None;
        self.step_down();
        if self.membership.fenced_since.is_none() {
            self.membership.self_fences += 1;
        }
        self.membership.rejoins += 1;
        self.membership.fenced_since = Some(Instant::now());
        self.health.set_fenced_since(self.membership.fenced_since);
    }

    pub(super) fn done_leaving(&self) -> bool {
        let snap = self.ownership.snapshot();
        let held = snap.state().shards().any(|(_, st)| {
            matches!(
                st,
                ShardState::Owned { .. }
                    | ShardState::Outgoing { .. }
                    | ShardState::Activating { .. }
            )
        });
        // done once nothing is held and the coordinator no longer names us as an owner
        let named = self
            .coordination
            .assignment
            .as_ref()
            .is_some_and(|a| a.view.shards.values().any(|e| e.owner == self.me));
        !held && !named
    }

    /// Leaving, and no other live member stays to take our shards: the last member, or every member
    /// leaving at once (scale to zero, a deleted Deployment). Waiting would only run into the termination
    /// grace period. Judged only after a lease period of continuous renewals, so that every member that
    /// renews has been seen to.
    pub(super) fn nobody_stays(&self) -> bool {
        let now = Instant::now();
        let observed_long_enough = self
            .membership
            .continuous_since
            .is_some_and(|t| now.duration_since(t) >= self.cfg.lease_duration);
        observed_long_enough
            && !self.lease_watch_silent(now)
            && self
                .members(now)
                .iter()
                .filter(|m| m.id != self.me)
                .all(|m| !m.live() || m.leaving())
    }

    pub(super) async fn delete_own_lease(&mut self) {
        // a renewal in flight would change the resourceVersion the delete is conditional on
        self.settle_renewal().await;
        let name = self.cfg.member_lease();
        let rv = self
            .membership
            .own
            .as_ref()
            .and_then(|l| l.metadata.resource_version.clone());
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: rv,
                uid: None,
            }),
            ..DeleteParams::default()
        };
        let api = self.leases.clone();
        if let Err(err) = self
            .checked(self.own_lease("delete"), api.delete(&name, &dp))
            .await
        {
            debug!(error = %err, "could not delete own lease (it will expire)");
        }
        self.membership.own = None;
    }
}
