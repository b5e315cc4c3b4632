//! The coordinator pass, the I/O around the pure step (`group::coordinator::step`): the assignment it reads
//! (and applies as a member), one step, takeovers, dead-Lease collection and the conditional assignment write.

use super::*;
use crate::group::assignment::MAX_GENERATION_STEP;

impl Runtime {
    pub(super) fn on_assignment_event(&mut self, ev: Event<ConfigMap>) {
        match ev {
            Event::Apply(cm) | Event::InitApply(cm) => {
                if let Some(seen) = self.coordination.assignment_relisted.as_mut() {
                    *seen = true;
                }
                self.assignment_seen(cm);
            }
            Event::Delete(_) => self.assignment_deleted(),
            Event::Init => self.coordination.assignment_relisted = Some(false),
            Event::InitDone => {
                // absent from a relist: deleted meanwhile (the watcher sends no Delete for it)
                if self.coordination.assignment_relisted.take() == Some(false)
                    && self.coordination.assignment_cm.is_some()
                {
                    self.assignment_deleted();
                }
                self.coordination.assignment_listed = true;
            }
        }
    }

    /// The assignment ConfigMap as read (from the watch, or directly after a hint in our Lease).
    pub(super) fn assignment_seen(&mut self, cm: ConfigMap) {
        self.coordination.assignment_missing = false;
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(DATA_KEY))
            .cloned()
            .unwrap_or_default();
        let decoded = Assignment::decode(&text, self.cfg.shards, self.cfg.key)
            .map_err(|e| e.to_string())
            .and_then(|a| self.sane_generation(a));
        match decoded {
            Ok(a) => self.decoded_assignment(a, cm),
            Err(err) => {
                error!(error = %err, "ALARM: the assignment cannot be applied; keeping the last good view, and no coordinator of this build writes over it");
                self.events.emit(
                    Kind::Warning,
                    "InvalidAssignment",
                    format!("keeping the last good view: {err}"),
                );
                self.health.set_assignment_refused(Some(err.clone()));
                self.coordination.assignment_refused = Some(err);
                self.coordination.assignment_cm = Some(cm);
            }
        }
    }

    fn decoded_assignment(&mut self, a: Assignment, cm: ConfigMap) {
        self.coordination.assignment_refused = None;
        self.health.set_assignment_refused(None);
        self.membership.seen_generation = self.membership.seen_generation.max(a.view.generation);
        let ours = self
            .coordination
            .assignment
            .as_ref()
            .map(|cur| cur.view.generation);
        if ours.is_none_or(|g| a.view.generation >= g) {
            self.ownership.apply_view(&a.view);
            self.coordination.assignment = Some(a);
            self.coordination.assignment_cm = Some(cm);
            self.coordination.stored_behind = false;
        } else {
            // an older assignment written over ours (a restore, a re-applied manifest): members ignore it;
            // we keep our view, and hold the stored object's resourceVersion so our view goes back over it
            // (writing against the old one would conflict on every pass)
            warn!(
                stored = a.view.generation,
                ours = ours.unwrap_or_default(),
                "ALARM: an older assignment was written over the current one; every member ignores it, and the coordinator writes the current view back over it"
            );
            self.coordination.stored_behind = true;
            self.coordination.assignment_cm = Some(cm);
            self.coordination.assignment_missing = false;
        }
        self.vacuous_progress();
    }

    fn assignment_deleted(&mut self) {
        warn!("the assignment ConfigMap was deleted; the coordinator re-creates it above the highest generation reported, with the owners the members hold");
        self.coordination.assignment_missing = true;
        self.coordination.assignment_cm = None;
        self.coordination.assignment_refused = None;
        self.health.set_assignment_refused(None);
    }

    /// A generation more than [`MAX_GENERATION_STEP`] above both our wall clock and the highest
    /// generation we accepted is refused (a hostile or buggy write, e.g. `u64::MAX`, would otherwise freeze
    /// the group: generations only grow). A forward-skewed coordinator cannot trip this: it caps each new
    /// generation at the previous one plus the same bound.
    fn sane_generation(&self, a: Assignment) -> Result<Assignment, String> {
        let limit = self
            .clock()
            .wall_ms()
            .max(self.membership.seen_generation)
            .saturating_add(MAX_GENERATION_STEP);
        if a.view.generation > limit {
            return Err(format!(
                "generation {} is more than {MAX_GENERATION_STEP} ms above both the wall clock and the highest generation seen ({})",
                a.view.generation, self.membership.seen_generation
            ));
        }
        Ok(a)
    }

    pub(super) async fn coordinate(&mut self) {
        // judge on everything the watches delivered, however long the requests before this took
        if !self.apply_delivered() {
            return;
        }
        let now = Instant::now();
        if !self.may_coordinate(now) {
            return;
        }
        let absent =
            self.coordination.assignment_missing || self.coordination.assignment_cm.is_none();
        // re-created from a last view older than a generation a member reports: a rollback like a
        // restored backup, handled the same way (members keep what they hold; nothing planned until
        // every live member applied the re-creation)
        let lagging = absent
            && self
                .coordination
                .assignment
                .as_ref()
                .is_some_and(|l| l.view.generation < self.reported_generation(now));
        let current = match (&self.coordination.assignment, absent) {
            (Some(a), false) => a.clone(),
            (last, true) => {
                let last = last.clone();
                self.recreated(last.as_ref(), now)
            }
            // a ConfigMap we never decoded: `may_coordinate` refused it
            (None, false) => return,
        };
        self.confirm_pods_gone(now).await;
        let mut members = self.step_members(now, &current);
        if !absent && self.rolled_back(&current, &members).await {
            return;
        }
        if !absent {
            self.adopt_rebuild(&current);
        }
        self.repair_fence_overshoot(&current.view, &mut members, now)
            .await;
        // a re-creation without a view of the assignment before it (not a cold start: someone saw one)
        let blind = absent
            && self.coordination.assignment.is_none()
            && members
                .iter()
                .filter_map(|m| m.report.as_ref())
                .any(|r| r.seen_generation > 0);
        if blind {
            self.coordination.rebuild = None;
        }
        let hold_write = blind && members.iter().any(|m| !m.alive && !m.gone);
        self.observations
            .displaced
            .retain(|id, _| named_in(&current, id));
        let ages = self.move_ages(&current, now);
        // cold start
        let live = members.iter().filter(|m| m.alive).count() as u32;
        let has_owners = !current.view.shards.is_empty();
        if !has_owners {
            // the first plan takes everyone present (`planner::Settle`): a join debounced now would hand
            // every shard to the members seen earliest and move them on at once
            for m in &mut members {
                m.joining = false;
            }
        }
        let settled =
            now.duration_since(self.observations.last_membership_change) >= self.cfg.settle;
        let enough = self.cfg.expected_replicas.is_some_and(|n| live >= n);
        let rebuilding = self.rebuild_holds(&members, now) || lagging;
        let ready_to_plan = (has_owners || settled || enough) && !blind && !rebuilding;
        // takeover budget: at most max(1, ceil(N/2) - 1) per lease period
        while self
            .coordination
            .takeovers
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.cfg.lease_duration)
        {
            self.coordination.takeovers.pop_front();
        }
        let n = members.len();
        let limit = 1usize.max(n.div_ceil(2).saturating_sub(1));
        let budget = limit.saturating_sub(self.coordination.takeovers.len());
        let may_take_over = self
            .membership
            .continuous_since
            .is_some_and(|t| now.duration_since(t) >= self.cfg.lease_duration);
        let now_ms = self.clock().wall_ms();
        let out = coordinator::step(&StepInput {
            current: &current,
            members: &members,
            now_ms,
            ready_to_plan,
            may_take_over,
            takeover_budget: budget,
            move_ages: &ages,
            move_timeout: self.cfg.move_timeout,
            drain_stall_timeout: self.cfg.drain_stall_timeout(),
            max_concurrent_moves: self.cfg.max_concurrent_moves as usize,
            rebuilding,
        });
        for note in &out.notes {
            info!(note = %note, "coordinator");
        }
        self.coordination.handoffs += out.completed as u64;
        if let Some(first) = out.notes.first() {
            let summary = if out.notes.len() == 1 {
                first.clone()
            } else {
                format!("{first} (and {} more)", out.notes.len() - 1)
            };
            self.events.emit(Kind::Normal, "Rebalance", summary);
        }
        // a renewal that falls due goes between the pass's requests; a pass that lost the
        // coordinator Lease or our own Lease meanwhile stops
        // a blind re-creation waits until every member that stopped renewing is gone; one the (unknown)
        // assignment may name is only known by its expired Lease, so it is taken over too — else a dead
        // member that joined while the assignment could not be read would hold the re-creation forever
        let mut takeovers = out.takeovers;
        if hold_write && may_take_over {
            for m in members.iter().filter(|m| m.expired && !m.gone) {
                if takeovers.len() >= budget {
                    break;
                }
                if !takeovers.contains(&m.id) {
                    takeovers.push(m.id.clone());
                }
            }
        }
        for victim in takeovers {
            if !self.renew_between().await {
                return;
            }
            self.take_over(&victim, now).await;
        }
        if !self.renew_between().await {
            return;
        }
        // the assignment first: under a slow API every request costs seconds, and housekeeping (dead
        // Leases, hints to lagging members) must not delay the write that gives orphaned shards an owner
        if hold_write {
            debug!("re-creating the assignment without a view of the last one: waiting until every member that stopped renewing is taken over");
        } else {
            // our view goes back over an older one written over it, unchanged if nothing else changes
            let rewrite = absent || self.coordination.stored_behind;
            if let Some(next) = out.assignment.or_else(|| rewrite.then(|| current.clone())) {
                let generation = next.view.generation;
                if self.write_assignment(next, blind || lagging).await && (blind || lagging) {
                    self.coordination.rebuild = Some(Rebuild {
                        generation,
                        all_applied_at: None,
                    });
                }
            }
        }
        if may_take_over && self.renew_between().await {
            self.collect_dead_lease(now).await;
        }
        if self.renew_between().await {
            self.nudge_lagging_members(&current, now).await;
        }
    }

    /// The highest generation a report may carry and still be followed: [`MAX_GENERATION_STEP`] above both
    /// our clock and every generation we saw. A member cannot have applied or seen more.
    fn report_limit(&self) -> u64 {
        self.clock()
            .wall_ms()
            .max(self.membership.seen_generation)
            .saturating_add(MAX_GENERATION_STEP)
    }

    /// The highest generation a live member reports applied, among reports within
    /// [`report_limit`](Self::report_limit); a report above it is refused with an alarm naming the member, so one hostile
    /// report cannot stop planning.
    fn applied_by_live(&mut self, members: &[Observed]) -> u64 {
        let limit = self.report_limit();
        let mut highest = 0;
        for m in members.iter().filter(|m| m.live()) {
            let Some(r) = &m.report else { continue };
            let g = r.applied_generation.max(r.seen_generation);
            if g > limit {
                if self.coordination.reports_refused.insert(m.id.clone()) {
                    let text = format!(
                        "member {} reports generation {g}, more than {MAX_GENERATION_STEP} ms above both the wall clock and every generation seen ({}): its report's generations are ignored",
                        m.id, self.membership.seen_generation
                    );
                    error!("ALARM: {text}");
                    self.events.emit_about(
                        Kind::Warning,
                        "ReportOutOfReach",
                        &m.id.to_string(),
                        text,
                    );
                }
                continue;
            }
            highest = highest.max(r.applied_generation);
        }
        highest
    }

    /// The stored assignment is older than a generation a live member applied: a restored backup or a
    /// re-applied manifest, and we have no newer view of our own (a fresh process, or one that adopted
    /// it). Never plan from it, nor write a plan over it: raise the alarm and write its content again
    /// above every generation reported — members keep what they hold at higher epochs (`kept`), never
    /// activate a grant at or below a generation they applied (`stale`), and planning waits until every
    /// live member applied the rebuild (`rebuild_holds`). Whether this pass stops here.
    async fn rolled_back(&mut self, current: &Assignment, members: &[Observed]) -> bool {
        let applied = self.applied_by_live(members);
        if current.view.generation >= applied {
            if self.coordination.rebuild.is_none() {
                self.health.set_assignment_rollback(None);
            }
            return false;
        }
        // our watch may only lag behind another coordinator's writes: read the stored one directly
        let (api, name) = (self.cms.clone(), self.cfg.assignment_name());
        match self
            .checked(self.assignment_access("get"), api.get_opt(&name))
            .await
        {
            Ok(Some(cm)) => self.assignment_seen(cm),
            Ok(None) => {
                self.assignment_deleted();
                return true;
            }
            Err(err) => {
                debug!(error = %err, "cannot re-read the assignment");
                return true;
            }
        }
        let Some(current) = self.coordination.assignment.clone() else {
            return true;
        };
        if self.coordination.assignment_refused.is_some() || current.view.generation >= applied {
            return true;
        }
        let text = format!(
            "the stored assignment (generation {}) is older than generation {applied} that a live member applied (a restored backup or a re-applied manifest): written again above it; nothing is planned until every live member applied that",
            current.view.generation
        );
        error!("ALARM: {text}");
        self.events
            .emit(Kind::Warning, "AssignmentRolledBack", text.clone());
        self.health.set_assignment_rollback(Some(text));
        let mut next = current.clone();
        next.view.generation = Assignment::next_generation(
            applied.max(self.membership.seen_generation),
            self.clock().wall_ms(),
        );
        let generation = next.view.generation;
        if self.renew_between().await && self.write_assignment(next, true).await {
            self.coordination.rollbacks += 1;
            self.coordination.rebuild = Some(Rebuild {
                generation,
                all_applied_at: None,
            });
        }
        true
    }

    /// After a rebuild (a blind re-creation: the assignment was deleted and we never saw it; or one written
    /// over a rolled-back assignment), a member may drop a shard it held without a release: one it held
    /// unreported (activating, or its report not yet renewed) that a blind rebuild left out, or one a
    /// rolled-back assignment left out. Its fenced requests may still be in flight. Planning waits until
    /// every live member reports the rebuild applied, and then for `renew_deadline − fence_margin` — the
    /// longest any fence it issued before can stay valid — on our clock from when we first saw all of
    /// them applied. Members that stopped renewing are taken over before a blind re-creation is written at
    /// all (`hold_write`), so every shard dropped from one of them is justified by its takeover mark.
    fn rebuild_holds(&mut self, members: &[Observed], now: Instant) -> bool {
        let fence_life = self
            .cfg
            .renew_deadline
            .saturating_sub(self.cfg.fence_margin);
        let Some(hold) = self.coordination.rebuild.as_mut() else {
            return false;
        };
        let behind = members.iter().filter(|m| m.live()).any(|m| {
            m.report
                .as_ref()
                .is_none_or(|r| r.applied_generation < hold.generation)
        });
        if behind {
            hold.all_applied_at = None;
            return true;
        }
        let since = *hold.all_applied_at.get_or_insert(now);
        if now.duration_since(since) < fence_life {
            return true;
        }
        self.coordination.rebuild_served = hold.generation;
        self.coordination.rebuild = None;
        self.health.set_assignment_rollback(None);
        false
    }

    /// The stored assignment is a rebuild (marked so by the coordinator that wrote it) whose hold we have
    /// not served: a coordinator process that did not write it — its writer was replaced right after —
    /// waits as the writer would have (`rebuild_holds`), from scratch on its own clock.
    fn adopt_rebuild(&mut self, current: &Assignment) {
        use crate::group::assignment::REBUILT_ANNOTATION;
        let generation = current.view.generation;
        if self.coordination.rebuild.is_some() || self.coordination.rebuild_served == generation {
            return;
        }
        let marked = self.coordination.assignment_cm.as_ref().and_then(|cm| {
            cm.metadata
                .annotations
                .as_ref()?
                .get(REBUILT_ANNOTATION)?
                .parse::<u64>()
                .ok()
        });
        if marked == Some(generation) {
            info!(
                generation,
                "the stored assignment is a rebuild: nothing is planned until every live member applied it and the fences they held before can no longer be valid"
            );
            self.coordination.rebuild = Some(Rebuild {
                generation,
                all_applied_at: None,
            });
        }
    }

    /// The age of each move in flight in its current phase, on our clock: from when we first saw it
    /// `Moving`, or `Draining`.
    fn move_ages(&mut self, current: &Assignment, now: Instant) -> BTreeMap<MoveId, Duration> {
        let in_flight: BTreeSet<(MoveId, bool)> = current
            .view
            .shards
            .values()
            .filter_map(|a| match &a.handoff {
                crate::ownership::state::Handoff::Moving { id, .. } => Some((*id, false)),
                crate::ownership::state::Handoff::Draining { id, .. } => Some((*id, true)),
                crate::ownership::state::Handoff::Stable => None,
            })
            .collect();
        self.coordination
            .move_first_seen
            .retain(|m, _| in_flight.contains(m));
        for m in &in_flight {
            self.coordination.move_first_seen.entry(*m).or_insert(now);
        }
        self.coordination
            .move_first_seen
            .iter()
            .map(|((m, _), t)| (*m, now.duration_since(*t)))
            .collect()
    }

    /// Delete the Lease of one member that is long gone — not seen renewing for `2 × lease_duration +
    /// grace` — and named nowhere in the assignment (taken over and reassigned, or it owned nothing), so
    /// the Leases of replaced pods do not pile up. Conditional on the resourceVersion last observed: a
    /// member that renewed after all keeps its Lease (and one that comes back later finds it gone and
    /// rejoins as a new incarnation). Also forgets members whose Lease is long deleted.
    pub(super) async fn collect_dead_lease(&mut self, now: Instant) {
        let Some(a) = self.coordination.assignment.as_ref() else {
            return;
        };
        let named: BTreeSet<&MemberId> = a
            .view
            .shards
            .values()
            .flat_map(|e| {
                let to = match &e.handoff {
                    crate::ownership::state::Handoff::Moving { to, .. }
                    | crate::ownership::state::Handoff::Draining { to, .. } => Some(to),
                    crate::ownership::state::Handoff::Stable => None,
                };
                std::iter::once(&e.owner).chain(to)
            })
            .collect();
        let threshold = self.cfg.lease_duration * 2 + self.cfg.takeover_grace;
        let coordinator = self.cfg.coordinator_lease();
        let dead = |name: &String, o: &Obs| {
            !o.role_coordinator
                && *name != coordinator
                && !o.id.incarnation.is_empty()
                && o.id != self.me
                && now.duration_since(o.last_change) >= threshold
                && !named.contains(&o.id)
        };
        let forget: Vec<String> = self
            .observations
            .observed
            .iter()
            .filter(|(n, o)| {
                dead(n, o)
                    && o.deleted_at
                        .is_some_and(|d| now.duration_since(d) >= threshold)
            })
            .map(|(n, _)| n.clone())
            .collect();
        let victim = self
            .observations
            .observed
            .iter()
            .find(|(n, o)| dead(n, o) && o.deleted_at.is_none())
            .map(|(n, o)| (n.clone(), o.rv.clone(), o.id.clone()));
        for n in forget {
            self.observations.observed.remove(&n);
        }
        let Some((name, rv, id)) = victim else {
            return;
        };
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: Some(rv),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        let (api, access) = (
            self.leases.clone(),
            self.lease_named("delete", name.clone()),
        );
        match self.checked(access, api.delete(&name, &dp)).await {
            Ok(_) => {
                info!(member = %id, lease = %name, "deleted the Lease of a member long gone");
                if let Some(o) = self.observations.observed.get_mut(&name) {
                    o.deleted_at.get_or_insert(now);
                }
            }
            Err(err) if is_not_found(&err) => {
                if let Some(o) = self.observations.observed.get_mut(&name) {
                    o.deleted_at.get_or_insert(now);
                }
            }
            Err(err) => {
                debug!(lease = %name, error = %err, "could not delete a dead member's Lease")
            }
        }
    }

    /// Whether this pass may decide anything. Never over a ConfigMap this member cannot apply (it may
    /// be another `S`, key or format, whose owners admit on it); never before both watches listed (an
    /// owner not yet observed would look absent); never while the lease watch is silent.
    fn may_coordinate(&mut self, now: Instant) -> bool {
        if let Some(why) = &self.coordination.assignment_refused {
            debug!(reason = %why, "the coordinator cannot apply the assignment and writes nothing over it");
            return false;
        }
        if !self.coordination.assignment_listed {
            return false;
        }
        if self.lease_watch_silent(now) {
            debug!("the lease watch is silent or not listed yet: judging nobody");
            return false;
        }
        true
    }

    /// The assignment to start from when the ConfigMap is absent (deleted, or never created): above every
    /// generation any member reports. Owners come from our last good view, or else from what the members
    /// publish as admitted — never from the planner, which would take shards from members that hold them.
    /// Without an epoch per shard in the reports, a rebuilt owner is re-granted at the new generation.
    fn recreated(&self, last: Option<&Assignment>, now: Instant) -> Assignment {
        let reported = self.reported_generation(now);
        let mut fresh = Assignment::empty(self.cfg.shards, self.cfg.key);
        let above = reported.max(self.membership.seen_generation);
        // one generation never carries two contents: a re-creation is always a new generation
        let gen = Assignment::next_generation(above, self.clock().wall_ms());
        fresh.view.generation = gen;
        // our last good view: members hold what it names. One older than a generation a member reports
        // names owners that may have moved on since — a rollback, which `coordinate` treats as one (the
        // members keep what they hold at higher epochs, and nothing is planned until they all applied it)
        if let Some(last) = last {
            fresh.view.shards = last.view.shards.clone();
            fresh.next_move_id = last.next_move_id;
            fresh.pins = last.pins.clone();
            fresh.paused = last.paused;
            fresh.drained = last.drained.clone();
            return fresh;
        }
        // above every generation reported, so every member applies it and drops what it does not name
        for m in self.members(now).iter().filter(|m| !m.gone) {
            let Some(r) = &m.report else { continue };
            for s in r.admitted.iter().chain(r.serving.iter()) {
                if let std::collections::btree_map::Entry::Vacant(e) = fresh.view.shards.entry(s) {
                    e.insert(crate::ownership::state::ShardAssignment::owned(
                        m.id.clone(),
                        gen,
                    ));
                }
            }
        }
        fresh
    }

    /// The highest generation any member not gone reports (applied or seen), among reports within reach
    /// ([`Runtime::report_limit`]).
    fn reported_generation(&self, now: Instant) -> u64 {
        let limit = self.report_limit();
        self.members(now)
            .iter()
            .filter_map(|m| m.report.as_ref())
            .map(|r| r.seen_generation.max(r.applied_generation))
            .filter(|g| *g <= limit)
            .max()
            .unwrap_or(0)
    }

    pub(super) async fn take_over(&mut self, victim: &MemberId, now: Instant) {
        let Some((name, o)) = self
            .observations
            .observed
            .iter()
            .find(|(_, o)| &o.id == victim)
        else {
            return;
        };
        if o.deleted_at.is_some() {
            return;
        }
        let name = name.clone();
        let mut lease = o.lease.clone();
        // the resourceVersion we last observed: a conflict means it renewed after all
        lease.metadata.resource_version = Some(o.rv.clone());
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(TAKEN_OVER.into(), victim.incarnation.to_string());
        let (api, access) = (
            self.leases.clone(),
            self.lease_named("update", name.clone()),
        );
        match self
            .checked(access, api.replace(&name, &PostParams::default(), &lease))
            .await
        {
            Ok(l) => {
                warn!(member = %victim, "took over a member that stopped renewing");
                self.events.emit(
                    Kind::Warning,
                    "TookOver",
                    format!("took over {victim}: no renewal seen for the lease duration"),
                );
                self.coordination.takeovers_done += 1;
                self.coordination.takeovers.push_back(now);
                self.observe_lease(l);
                // the member is gone now: plan its shards at the next turn of the loop, not a retry
                // period later (this pass's plan was made while it was only expired)
                self.coordination.coordinate_soon = true;
            }
            Err(err) if is_conflict(&err) => {
                debug!(member = %victim, "takeover conflicted: it renewed; re-observing");
            }
            // the Lease is gone; the member is gone once `lease_duration + grace` passed since its last
            // renewal we saw (already true for a takeover candidate)
            Err(err) if is_not_found(&err) => {
                debug!(member = %victim, "takeover: the Lease was deleted");
                if let Some(o) = self.observations.observed.get_mut(&name) {
                    o.deleted_at.get_or_insert(now);
                }
            }
            Err(err) => debug!(member = %victim, error = %err, "takeover failed"),
        }
    }

    /// `current`, or a new ConfigMap `name` in the group's namespace, labelled with the group (the
    /// assignment and the fence parameters).
    pub(super) fn group_configmap(&self, name: &str, current: Option<ConfigMap>) -> ConfigMap {
        let mut cm = current.unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(self.cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        });
        cm.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(GROUP_LABEL.into(), self.cfg.group.clone());
        cm
    }

    /// Write `next` (conditional on the resourceVersion we hold, or a create); whether it was written.
    /// `rebuilt`: it is a rebuild, marked as one for whichever coordinator finds it stored
    /// ([`REBUILT_ANNOTATION`](crate::group::assignment::REBUILT_ANNOTATION)).
    pub(super) async fn write_assignment(&mut self, next: Assignment, rebuilt: bool) -> bool {
        use crate::group::assignment::REBUILT_ANNOTATION;
        let name = self.cfg.assignment_name();
        let mut cm = self.group_configmap(&name, self.coordination.assignment_cm.clone());
        let ann = cm.metadata.annotations.get_or_insert_with(Default::default);
        if rebuilt {
            ann.insert(REBUILT_ANNOTATION.into(), next.view.generation.to_string());
        } else {
            ann.remove(REBUILT_ANNOTATION);
        }
        let text = next.encode();
        // never a write the apiserver would refuse for size, nor one our readers would refuse
        if text.len() > crate::group::assignment::MAX_TEXT {
            error!(
                bytes = text.len(),
                limit = crate::group::assignment::MAX_TEXT,
                "ALARM: the next assignment is too large to write; keeping the current one"
            );
            self.events.emit(
                Kind::Warning,
                "AssignmentTooLarge",
                format!(
                    "the next assignment takes {} bytes, above the {} a ConfigMap holds: not written (fewer shards, shorter member names or fewer concurrent moves)",
                    text.len(),
                    crate::group::assignment::MAX_TEXT
                ),
            );
            return false;
        }
        cm.data
            .get_or_insert_with(Default::default)
            .insert(DATA_KEY.into(), text);
        // the per-shard fence parameters go out before the write that activates a new owner
        if self.publish_fence_params(&next.view).await.is_err() {
            return false;
        }
        // a renewal that fell due during them goes first; a pass that lost the coordinator Lease stops
        if !self.renew_between().await {
            return false;
        }
        let api = self.cms.clone();
        let result = if self.coordination.assignment_cm.is_some() {
            let access = self.assignment_access("update");
            self.checked(access, api.replace(&name, &PostParams::default(), &cm))
                .await
        } else {
            cm.metadata.resource_version = None;
            let access = self.assignment_access("create");
            self.checked(access, api.create(&PostParams::default(), &cm))
                .await
        };
        match result {
            Ok(written) => {
                debug!(generation = next.view.generation, "assignment written");
                self.membership.seen_generation =
                    self.membership.seen_generation.max(next.view.generation);
                self.ownership.apply_view(&next.view);
                self.coordination.assignment = Some(next);
                self.coordination.assignment_cm = Some(written);
                self.coordination.assignment_missing = false;
                self.vacuous_progress();
                true
            }
            // our view is behind: read the assignment directly rather than trust our watch to catch up
            // (it may be stuck)
            Err(err) if is_conflict(&err) => {
                // the fence parameters raised for it stay: another coordinator may have committed those
                // epochs (see `fence_params`)
                debug!("assignment write conflicted; re-reading");
                if !self.renew_between().await {
                    return false;
                }
                let api = self.cms.clone();
                match self
                    .checked(self.assignment_access("get"), api.get_opt(&name))
                    .await
                {
                    Ok(Some(cm)) => self.assignment_seen(cm),
                    Ok(None) => self.assignment_deleted(),
                    Err(err) => debug!(error = %err, "cannot re-read the assignment"),
                }
                false
            }
            // deleted, and our watch missed it: absent, re-created on the next pass
            Err(err) if is_not_found(&err) => {
                self.assignment_deleted();
                false
            }
            Err(err) => {
                warn!(error = %err, "assignment write failed");
                false
            }
        }
    }
}

/// Whether `id` owns or receives a shard in `a`.
fn named_in(a: &Assignment, id: &MemberId) -> bool {
    a.view.shards.values().any(|e| {
        e.owner == *id
            || matches!(&e.handoff,
                crate::ownership::state::Handoff::Moving { to, .. }
                | crate::ownership::state::Handoff::Draining { to, .. } if to == id)
    })
}
