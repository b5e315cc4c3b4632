//! The member runtime: its Lease, what it observes of the others, the assignment it applies, and — while
//! it holds the coordinator Lease — the coordinator passes.
//!
//! One task, driven by a `select!` over the group's Lease watch, the assignment watch, a tick every
//! `retry_period`, ownership changes (to publish acks promptly) and the leave signal. Every API call is
//! bounded by a timeout; every write carries a resourceVersion precondition.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, error, info, info_span, warn, Instrument};

use super::assignment::{Assignment, DATA_KEY};
use super::config::GroupConfig;
use super::coordinator::{self, Observed, StepInput};
use super::events::{Events, Kind};
use super::metrics::GroupMetrics;
use super::report::{MemberReport, GROUP_LABEL, INCARNATION, REPORT, ROLE_LABEL, TAKEN_OVER};
use super::singleton::{LeaderTerm, TERM_ANNOTATION};
use super::status::{GroupStatus, Health};
use crate::ownership::{state::Event as OwnEvent, Hold, MemberId, MoveId, Ownership, ShardState};
use crate::shard::ShardSet;

/// Why the member task stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The Kubernetes API failed in a way that retrying cannot fix (for example RBAC).
    #[error("shard group {group}: {what}: {source}")]
    Api {
        /// The group.
        group: String,
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: kube::Error,
    },
    /// The dedicated member thread could not run.
    #[error("shard group member thread: {0}")]
    Thread(String),
}

struct Obs {
    id: MemberId,
    rv: String,
    renew_time: Option<String>,
    last_change: Instant,
    first_seen: Instant,
    report: Option<MemberReport>,
    taken_over: bool,
    deleted_at: Option<Instant>,
    role_coordinator: bool,
    holder: Option<String>,
    lease: Lease,
}

pub(crate) struct Runtime {
    cfg: GroupConfig,
    leases: Api<Lease>,
    cms: Api<ConfigMap>,
    ownership: Ownership,
    me: MemberId,
    own: Option<Lease>,
    last_renew_ok: Option<Instant>,
    continuous_since: Option<Instant>,
    leaving: bool,
    observed: BTreeMap<String, Obs>,
    assignment: Option<Assignment>,
    assignment_cm: Option<ConfigMap>,
    assignment_missing: bool,
    seen_generation: u64,
    leader: bool,
    move_first_seen: BTreeMap<MoveId, Instant>,
    takeovers: VecDeque<Instant>,
    last_membership_change: Instant,
    vacuous_readers: bool,
    status: watch::Sender<GroupStatus>,
    health: Health,
    fenced_since: Option<Instant>,
    last_stamp: std::sync::Mutex<Option<k8s_openapi::jiff::Timestamp>>,
    /// The report in the Lease as last written: an early renewal is only worth it when it changes.
    published: String,
    metrics: GroupMetrics,
    events: Events,
    handoffs: u64,
    takeovers_done: u64,
    /// Times this member self-fenced (renew deadline passed, or taken over).
    self_fences: u64,
    /// Times this member rejoined as a new incarnation.
    rejoins: u64,
    /// The legacy leader Lease: (renewTime last seen, when it last changed on our clock).
    legacy: Option<(Option<String>, Instant)>,
    /// Our term on the coordinator Lease while we lead, published to singleton work.
    term: Option<LeaderTerm>,
    leadership: watch::Sender<Option<LeaderTerm>>,
    /// resourceVersions of our recent writes to the coordinator Lease, newest last.
    coordinator_writes: VecDeque<String>,
}

/// The wall clock at microsecond precision (what `MicroTime` carries), strictly after `last`: others judge
/// liveness by seeing `renewTime` *change*, so two renewals must never write the same value.
fn next_stamp(last: Option<k8s_openapi::jiff::Timestamp>) -> k8s_openapi::jiff::Timestamp {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
    let now = Timestamp::now();
    let now = Timestamp::from_microsecond(now.as_microsecond()).unwrap_or(now);
    match last {
        Some(l) if now <= l => l.checked_add(SignedDuration::from_micros(1)).unwrap_or(l),
        _ => now,
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

impl Runtime {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        client: Client,
        cfg: GroupConfig,
        ownership: Ownership,
        me: MemberId,
        status: watch::Sender<GroupStatus>,
        health: Health,
        metrics: GroupMetrics,
        leadership: watch::Sender<Option<LeaderTerm>>,
    ) -> Self {
        let now = Instant::now();
        let events = Events::new(
            client.clone(),
            &cfg.namespace,
            &cfg.member_lease(),
            &cfg.member,
        );
        Runtime {
            metrics,
            events,
            handoffs: 0,
            takeovers_done: 0,
            self_fences: 0,
            rejoins: 0,
            legacy: None,
            term: None,
            leadership,
            coordinator_writes: VecDeque::new(),
            leases: Api::namespaced(client.clone(), &cfg.namespace),
            cms: Api::namespaced(client, &cfg.namespace),
            vacuous_readers: ownership.inner.readers.is_empty(),
            cfg,
            ownership,
            me,
            own: None,
            last_renew_ok: None,
            continuous_since: None,
            leaving: false,
            observed: BTreeMap::new(),
            assignment: None,
            assignment_cm: None,
            assignment_missing: false,
            seen_generation: 0,
            leader: false,
            move_first_seen: BTreeMap::new(),
            takeovers: VecDeque::new(),
            last_membership_change: now,
            status,
            health,
            fenced_since: None,
            last_stamp: std::sync::Mutex::new(None),
            published: String::new(),
        }
    }

    fn stamp(&self) -> MicroTime {
        let mut last = self.last_stamp.lock().unwrap_or_else(|e| e.into_inner());
        let t = next_stamp(*last);
        *last = Some(t);
        MicroTime(t)
    }

    fn timeout(&self) -> Duration {
        self.cfg.retry_period.max(Duration::from_secs(1))
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        match tokio::time::timeout(self.timeout(), fut).await {
            Ok(r) => r,
            Err(_) => Err(kube::Error::Service("request timed out".into())),
        }
    }

    pub(crate) async fn run(mut self, mut leave: oneshot::Receiver<()>) -> Result<(), GroupError> {
        let span = info_span!("shard_group", group = %self.cfg.group, member = %self.cfg.member);
        async move {
            if self.cfg.shadow {
                info!("shadow mode: ownership is computed and reported, nothing is admitted");
                self.ownership.set_hold(Some(Hold::Shadow));
            }
            let selector = format!("{GROUP_LABEL}={}", self.cfg.group);
            let lease_cfg = watcher::Config::default().labels(&selector).timeout(30);
            // the streams back off by themselves: a failing watch never blocks renewals in this loop
            let mut lease_events =
                std::pin::pin!(watcher::watcher(self.leases.clone(), lease_cfg).default_backoff());
            let cm_cfg = watcher::Config::default()
                .fields(&format!("metadata.name={}", self.cfg.assignment_name()))
                .timeout(30);
            let mut cm_events =
                std::pin::pin!(watcher::watcher(self.cms.clone(), cm_cfg).default_backoff());
            let mut changed = self.ownership.changed();
            let mut tick = tokio::time::interval(self.cfg.retry_period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut leave_armed = true;
            let mut dirty = true;
            let mut coordinate_soon = false;
            loop {
                tokio::select! {
                    ev = lease_events.next() => match ev {
                        Some(Ok(ev)) => {
                            if self.on_lease_event(ev) {
                                coordinate_soon = true;
                            }
                        }
                        Some(Err(err)) => {
                            debug!(error = %err, "lease watch failed: resetting observation clocks");
                            self.reset_observations();
                        }
                        None => return Ok(()),
                    },
                    ev = cm_events.next() => match ev {
                        Some(Ok(ev)) => self.on_assignment_event(ev),
                        Some(Err(err)) => debug!(error = %err, "assignment watch failed"),
                        None => return Ok(()),
                    },
                    r = changed.changed() => {
                        if r.is_err() { return Ok(()); }
                        self.vacuous_progress();
                        // publish acks promptly, but a renewal itself changes ownership bookkeeping:
                        // renew early only when the report would say something new
                        if self.report().encode() != self.published {
                            dirty = true;
                        }
                    }
                    r = &mut leave, if leave_armed => {
                        leave_armed = false;
                        let _ = r;
                        info!("leaving the shard group: shards move away before shutdown");
                        self.leaving = true;
                        dirty = true;
                    }
                    _ = tick.tick() => { dirty = true; }
                }
                if coordinate_soon && !dirty && self.leader {
                    coordinate_soon = false;
                    self.coordinate().await;
                    self.publish_status();
                }
                if dirty {
                    dirty = false;
                    coordinate_soon = false;
                    if self.own.is_none() {
                        self.join().await;
                    } else {
                        self.renew().await;
                    }
                    self.check_legacy_leader().await;
                    self.elect().await;
                    if self.leader {
                        self.coordinate().await;
                    }
                    self.publish_status();
                    if self.leaving && (self.done_leaving() || self.nobody_stays()) {
                        if !self.done_leaving() {
                            warn!("leaving while holding shards: no live member stays to take them (the last member, or all leave at once); self-fenced, they are reassigned once this member's lease has expired");
                            self.ownership.mark_self_fenced();
                        }
                        self.delete_own_lease().await;
                        info!("left the shard group");
                        return Ok(());
                    }
                }
            }
        }
        .instrument(span)
        .await
    }

    // === own lease ===

    fn report(&self) -> MemberReport {
        let snap = self.ownership.snapshot();
        let st = snap.state();
        let mut r = MemberReport {
            ready: self.own.is_some(),
            leaving: self.leaving,
            weight: self.cfg.weight,
            applied_generation: st.generation(),
            seen_generation: self.seen_generation,
            acks: st.acks(),
            ..MemberReport::default()
        };
        // serving: what every read stream serves now (synced, not failing); a member without read
        // streams serves what it holds
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

    fn lease_body(&self, base: Option<&Lease>) -> Lease {
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
        ann.insert(REPORT.into(), self.report().encode());
        ann.remove(TAKEN_OVER);
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
    async fn join(&mut self) {
        let name = self.cfg.member_lease();
        let existing = match self.bounded(self.leases.get_opt(&name)).await {
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
                self.bounded(self.leases.create(&PostParams::default(), &body))
                    .await
            }
            Some(l) => {
                let theirs = l
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(INCARNATION).cloned());
                let mine = theirs.as_deref() == Some(&*self.me.incarnation);
                let taken = l
                    .metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(TAKEN_OVER));
                let stale = self.observed.get(&name).is_some_and(|o| {
                    t0.duration_since(o.last_change)
                        >= self.cfg.lease_duration + self.cfg.takeover_grace
                });
                if !(mine || taken || stale) {
                    if !self.observed.contains_key(&name) {
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
                let body = self.lease_body(Some(&l));
                self.bounded(self.leases.replace(&name, &PostParams::default(), &body))
                    .await
            }
        };
        match result {
            Ok(l) => {
                info!(incarnation = %self.me.incarnation, "joined the shard group");
                self.health.set_collision(false);
                self.own = Some(l);
                self.renewed(start, t0);
            }
            Err(err) => debug!(error = %err, "join failed; retrying"),
        }
    }

    fn renewed(&mut self, start: crate::ownership::clock::Now, t0: Instant) {
        self.ownership.record_renewal(start);
        let gap = self
            .last_renew_ok
            .is_none_or(|prev| t0.duration_since(prev) > self.cfg.renew_deadline);
        if gap {
            // our own gap: nothing we observed of others during it may count against them
            self.reset_observations();
            self.continuous_since = Some(t0);
        }
        self.last_renew_ok = Some(t0);
        self.fenced_since = None;
        self.health.set_fenced_since(None);
    }

    async fn renew(&mut self) {
        let Some(own) = self.own.clone() else { return };
        let start = self.ownership.inner.clock.now();
        let t0 = Instant::now();
        let body = self.lease_body(Some(&own));
        let name = self.cfg.member_lease();
        let report = body
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REPORT).cloned())
            .unwrap_or_default();
        match self
            .bounded(self.leases.replace(&name, &PostParams::default(), &body))
            .await
        {
            Ok(l) => {
                self.own = Some(l);
                self.published = report;
                self.renewed(start, t0);
            }
            Err(err) if is_conflict(&err) => {
                // someone else wrote our lease: re-read and see whether we were taken over
                match self.bounded(self.leases.get_opt(&name)).await {
                    Ok(Some(l)) => {
                        let ann = l.metadata.annotations.clone().unwrap_or_default();
                        let taken = ann
                            .get(TAKEN_OVER)
                            .is_some_and(|i| i == &*self.me.incarnation)
                            || ann
                                .get(INCARNATION)
                                .is_some_and(|i| i != &*self.me.incarnation);
                        if taken {
                            self.taken_over("our lease was taken over");
                        } else {
                            self.own = Some(l);
                        }
                    }
                    Ok(None) => self.taken_over("our lease was deleted"),
                    Err(e) => debug!(error = %e, "cannot re-read own lease"),
                }
            }
            Err(err) if is_not_found(&err) => self.taken_over("our lease was deleted"),
            Err(err) => {
                debug!(error = %err, "renewal failed");
                self.missed_renewal(t0);
            }
        }
    }

    fn missed_renewal(&mut self, now: Instant) {
        let fenced = self
            .last_renew_ok
            .is_none_or(|t| now.duration_since(t) >= self.cfg.renew_deadline);
        if fenced {
            self.continuous_since = None;
            if self.fenced_since.is_none() {
                warn!("renew deadline passed: self-fenced until the next successful renewal");
                self.events.emit(
                    Kind::Warning,
                    "SelfFenced",
                    "renew deadline passed: admitting nothing until the next renewal",
                );
                self.fenced_since = Some(now);
                self.self_fences += 1;
                self.health.set_fenced_since(Some(now));
                self.ownership.mark_self_fenced();
            }
        }
    }

    /// Self-fence at once and rejoin as a new incarnation; the lease is never re-created under the old one.
    fn taken_over(&mut self, why: &str) {
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
        self.own = None;
        self.last_renew_ok = None;
        self.continuous_since = None;
        self.step_down();
        if self.fenced_since.is_none() {
            self.self_fences += 1;
        }
        self.rejoins += 1;
        self.fenced_since = Some(Instant::now());
        self.health.set_fenced_since(self.fenced_since);
    }

    fn done_leaving(&self) -> bool {
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
            .assignment
            .as_ref()
            .is_some_and(|a| a.view.shards.values().any(|e| e.owner == self.me));
        !held && !named
    }

    /// Leaving, and no other live member stays to take our shards: the last member, or every member
    /// leaving at once (scale to zero, a deleted Deployment). Waiting would only run into the termination
    /// grace period. Judged only after a lease period of continuous renewals, so that every member that
    /// renews has been seen to.
    fn nobody_stays(&self) -> bool {
        let now = Instant::now();
        let observed_long_enough = self
            .continuous_since
            .is_some_and(|t| now.duration_since(t) >= self.cfg.lease_duration);
        observed_long_enough
            && self
                .members(now)
                .iter()
                .filter(|m| m.id != self.me)
                .all(|m| !m.live() || m.leaving())
    }

    async fn delete_own_lease(&mut self) {
        let name = self.cfg.member_lease();
        let rv = self
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
        if let Err(err) = self.bounded(self.leases.delete(&name, &dp)).await {
            debug!(error = %err, "could not delete own lease (it will expire)");
        }
        self.own = None;
    }

    /// Members without read streams have nothing to sync: warm and activation are immediate.
    fn vacuous_progress(&self) {
        if !self.vacuous_readers {
            return;
        }
        let snap = self.ownership.snapshot();
        for (shard, st) in snap.state().shards() {
            match st {
                ShardState::Incoming {
                    move_id,
                    warm: false,
                } => {
                    self.ownership
                        .apply_event(OwnEvent::Warm { shard, move_id });
                }
                ShardState::Activating { epoch } => {
                    self.ownership
                        .apply_event(OwnEvent::Activated { shard, epoch });
                }
                _ => {}
            }
        }
    }

    // === observation ===

    fn reset_observations(&mut self) {
        let now = Instant::now();
        for o in self.observed.values_mut() {
            o.last_change = now;
        }
    }

    /// Record a Lease; returns whether anything the coordinator acts on changed (a report, a takeover, a
    /// new member or incarnation).
    fn observe_lease(&mut self, l: Lease) -> bool {
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

    /// The resourceVersions of our recent writes to the coordinator Lease (newest last). A watch event
    /// carrying an older one of them arrives after we observed the newer write's response: applying it
    /// would make the next write conflict (resourceVersions are opaque, so we never compare them).
    fn superseded_by_our_write(&self, l: &Lease) -> bool {
        if l.metadata.name.as_deref() != Some(self.cfg.coordinator_lease().as_str()) {
            return false;
        }
        let Some(rv) = l.metadata.resource_version.as_deref() else {
            return false;
        };
        let pos = self.coordinator_writes.iter().position(|w| w == rv);
        pos.is_some_and(|p| p + 1 < self.coordinator_writes.len())
    }

    fn wrote_coordinator_lease(&mut self, l: &Lease) {
        if let Some(rv) = l.metadata.resource_version.clone() {
            if self.coordinator_writes.len() >= 8 {
                self.coordinator_writes.pop_front();
            }
            self.coordinator_writes.push_back(rv);
        }
    }

    /// Returns whether the coordinator should look again now.
    fn on_lease_event(&mut self, ev: Event<Lease>) -> bool {
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

    // === assignment ===

    fn on_assignment_event(&mut self, ev: Event<ConfigMap>) {
        match ev {
            Event::Apply(cm) | Event::InitApply(cm) => {
                self.assignment_missing = false;
                let text = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(DATA_KEY))
                    .cloned()
                    .unwrap_or_default();
                match Assignment::decode(&text, self.cfg.shards, self.cfg.key) {
                    Ok(a) => {
                        self.seen_generation = self.seen_generation.max(a.view.generation);
                        let newer = self
                            .assignment
                            .as_ref()
                            .is_none_or(|cur| a.view.generation >= cur.view.generation);
                        if newer {
                            self.ownership.apply_view(&a.view);
                            self.assignment = Some(a);
                            self.assignment_cm = Some(cm);
                        } else {
                            debug!(
                                generation = a.view.generation,
                                "ignoring an older assignment"
                            );
                        }
                        self.vacuous_progress();
                    }
                    Err(err) => {
                        error!(error = %err, "ALARM: the assignment cannot be decoded; keeping the last good view");
                        self.events.emit(
                            Kind::Warning,
                            "InvalidAssignment",
                            format!("keeping the last good view: {err}"),
                        );
                        self.assignment_cm = Some(cm);
                    }
                }
            }
            Event::Delete(_) => {
                warn!("the assignment ConfigMap was deleted; the coordinator re-creates it above the highest generation reported");
                self.assignment_missing = true;
                self.assignment_cm = None;
            }
            Event::Init | Event::InitDone => {}
        }
    }

    /// While a legacy leader-election Lease has a live holder, hold admission (unless in shadow mode,
    /// which holds it anyway).
    async fn check_legacy_leader(&mut self) {
        let Some(spec) = self.cfg.legacy_leader_lease.clone() else {
            return;
        };
        let (ns, name) = match spec.split_once('/') {
            Some((ns, name)) => (ns.to_owned(), name.to_owned()),
            None => (self.cfg.namespace.clone(), spec.clone()),
        };
        let api: Api<Lease> = Api::namespaced(self.leases.clone().into_client(), &ns);
        let now = Instant::now();
        let live = match self.bounded(api.get_opt(&name)).await {
            Ok(Some(l)) => {
                let spec = l.spec.unwrap_or_default();
                let renew = spec.renew_time.map(|t| t.0.to_string());
                let duration =
                    Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
                let changed_at = match &self.legacy {
                    Some((seen, at)) if *seen == renew => *at,
                    _ => now,
                };
                self.legacy = Some((renew, changed_at));
                spec.holder_identity.is_some_and(|h| !h.is_empty())
                    && now.duration_since(changed_at) < duration
            }
            Ok(None) => false,
            // cannot tell: keep the current hold
            Err(err) => {
                debug!(error = %err, "cannot read the legacy leader lease");
                return;
            }
        };
        if self.cfg.shadow {
            return;
        }
        let held = self.ownership.admission_hold().is_some();
        if live && !held {
            info!(lease = %spec, "a legacy leader holds its lease: admitting nothing until it is gone");
            self.ownership.set_hold(Some(Hold::LegacyLeader));
        } else if !live && held {
            info!(lease = %spec, "the legacy leader is gone: admitting owned shards");
            self.events.emit(
                Kind::Normal,
                "LegacyLeaderGone",
                format!("{spec} has no live holder: admitting"),
            );
            self.ownership.set_hold(None);
        }
    }

    // === coordinator ===

    /// Not the coordinator (any more): end our term first, so singleton work stops before anyone else
    /// could acquire the Lease.
    fn step_down(&mut self) {
        if self.leader {
            info!("stepped down as coordinator");
        }
        self.leader = false;
        if self.term.take().is_some() {
            self.leadership.send_replace(None);
        }
    }

    async fn elect(&mut self) {
        let name = self.cfg.coordinator_lease();
        let holder_me = format!("{}/{}", self.me.name, self.me.incarnation);
        let now = Instant::now();
        let observed = self.observed.get(&name);
        let current = observed.map(|o| o.lease.clone());
        let held_by_me = observed.is_some_and(|o| o.holder.as_deref() == Some(&holder_me));
        if self.own.is_none() || self.leaving {
            let was_leader = self.leader;
            self.step_down();
            if was_leader && held_by_me {
                self.release_coordinator(current).await;
            }
            return;
        }
        let expired = observed.is_none_or(|o| {
            o.holder.is_none() || now.duration_since(o.last_change) >= self.cfg.lease_duration
        });
        if !(held_by_me || expired) {
            self.step_down();
            return;
        }
        let prev_term = current
            .as_ref()
            .and_then(|l| {
                l.metadata
                    .annotations
                    .as_ref()?
                    .get(TERM_ANNOTATION)?
                    .parse()
                    .ok()
            })
            .unwrap_or(0u64);
        // a new term on every acquisition, and after our own term lapsed (each run of singleton work has
        // its own term)
        let renewing = held_by_me
            && self
                .term
                .is_some_and(|t| t.is_valid() && t.term == prev_term);
        let term = if renewing {
            prev_term
        } else {
            let now_ms =
                u64::try_from(k8s_openapi::jiff::Timestamp::now().as_millisecond()).unwrap_or(0);
            Assignment::next_generation(prev_term, now_ms)
        };
        let mut lease = current.clone().unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        });
        let labels = lease.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(GROUP_LABEL.into(), self.cfg.group.clone());
        labels.insert(ROLE_LABEL.into(), "coordinator".into());
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(TERM_ANNOTATION.into(), term.to_string());
        let stamp = self.stamp();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !held_by_me {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            spec.acquire_time = Some(stamp.clone());
        }
        spec.holder_identity = Some(holder_me.clone());
        spec.lease_duration_seconds = Some(self.cfg.lease_duration.as_secs().max(1) as i32);
        spec.renew_time = Some(stamp);
        let t0 = Instant::now();
        let result = match current {
            None => {
                self.bounded(self.leases.create(&PostParams::default(), &lease))
                    .await
            }
            Some(_) => {
                self.bounded(self.leases.replace(&name, &PostParams::default(), &lease))
                    .await
            }
        };
        match result {
            Ok(l) => {
                if !self.leader {
                    info!(term, "became the coordinator");
                    self.events.emit(
                        Kind::Normal,
                        "Coordinator",
                        format!("became the coordinator (term {term})"),
                    );
                }
                self.leader = true;
                // valid for less than anyone else waits before acquiring (lease_duration)
                let valid_until = t0
                    + self
                        .cfg
                        .renew_deadline
                        .saturating_sub(self.cfg.fence_margin);
                if !renewing && self.term.is_some() {
                    info!(term, "our previous term lapsed: a new term");
                }
                let t = LeaderTerm::new(term, valid_until);
                self.term = Some(t);
                self.leadership.send_replace(Some(t));
                self.wrote_coordinator_lease(&l);
                self.observe_lease(l);
            }
            Err(err) => {
                debug!(error = %err, "coordinator lease not acquired");
                self.step_down();
            }
        }
    }

    /// A leaving coordinator hands the Lease back (holder cleared, conditional on what we last saw), so the
    /// next coordinator need not wait for it to expire.
    async fn release_coordinator(&mut self, current: Option<Lease>) {
        let Some(mut lease) = current else { return };
        let name = self.cfg.coordinator_lease();
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        match self
            .bounded(self.leases.replace(&name, &PostParams::default(), &lease))
            .await
        {
            Ok(l) => {
                info!("released the coordinator lease");
                self.wrote_coordinator_lease(&l);
                self.observe_lease(l);
            }
            Err(err) => debug!(error = %err, "could not release the coordinator lease"),
        }
    }

    fn members(&self, now: Instant) -> Vec<Observed> {
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

    async fn coordinate(&mut self) {
        let now = Instant::now();
        let members = self.members(now);
        // the assignment: ours, or a fresh one above every generation any member reports
        let current = match (
            &self.assignment,
            self.assignment_missing || self.assignment_cm.is_none(),
        ) {
            (Some(a), false) => a.clone(),
            (last, _) => {
                let reported = members
                    .iter()
                    .filter_map(|m| m.report.as_ref())
                    .map(|r| r.seen_generation.max(r.applied_generation))
                    .max()
                    .unwrap_or(0);
                let mut fresh = Assignment::empty(self.cfg.shards, self.cfg.key);
                fresh.view.generation = reported.max(self.seen_generation);
                if let Some(last) = last {
                    // keep who owns what: members hold it already
                    fresh.view.shards = last.view.shards.clone();
                    fresh.next_move_id = last.next_move_id;
                    fresh.pins = last.pins.clone();
                    fresh.paused = last.paused;
                    fresh.drained = last.drained.clone();
                }
                fresh
            }
        };
        // move ages
        let in_flight: BTreeSet<MoveId> = current
            .view
            .shards
            .values()
            .filter_map(|a| match &a.handoff {
                crate::ownership::Handoff::Moving { id, .. }
                | crate::ownership::Handoff::Draining { id, .. } => Some(*id),
                crate::ownership::Handoff::Stable => None,
            })
            .collect();
        self.move_first_seen.retain(|m, _| in_flight.contains(m));
        for m in &in_flight {
            self.move_first_seen.entry(*m).or_insert(now);
        }
        let ages: BTreeMap<MoveId, Duration> = self
            .move_first_seen
            .iter()
            .map(|(m, t)| (*m, now.duration_since(*t)))
            .collect();
        // cold start
        let live = members.iter().filter(|m| m.alive).count() as u32;
        let has_owners = !current.view.shards.is_empty();
        let settled = now.duration_since(self.last_membership_change) >= self.cfg.settle;
        let enough = self.cfg.expected_replicas.is_some_and(|n| live >= n);
        let ready_to_plan = has_owners || settled || enough;
        // takeover budget: at most max(1, ceil(N/2) - 1) per lease period
        while self
            .takeovers
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.cfg.lease_duration)
        {
            self.takeovers.pop_front();
        }
        let n = members.len();
        let limit = 1usize.max(n.div_ceil(2).saturating_sub(1));
        let budget = limit.saturating_sub(self.takeovers.len());
        let may_take_over = self
            .continuous_since
            .is_some_and(|t| now.duration_since(t) >= self.cfg.lease_duration);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let out = coordinator::step(&StepInput {
            current: &current,
            members: &members,
            now_ms,
            ready_to_plan,
            may_take_over,
            takeover_budget: budget,
            move_ages: &ages,
            move_timeout: self.cfg.move_timeout,
            max_concurrent_moves: self.cfg.max_concurrent_moves as usize,
        });
        for note in &out.notes {
            info!(note = %note, "coordinator");
        }
        self.handoffs += out.completed as u64;
        if let Some(first) = out.notes.first() {
            let summary = if out.notes.len() == 1 {
                first.clone()
            } else {
                format!("{first} (and {} more)", out.notes.len() - 1)
            };
            self.events.emit(Kind::Normal, "Rebalance", summary);
        }
        for victim in out.takeovers {
            self.take_over(&victim, now).await;
        }
        if may_take_over {
            self.collect_dead_lease(now).await;
        }
        let fresh_needed = self.assignment_missing || self.assignment_cm.is_none();
        if let Some(next) = out.assignment.or_else(|| fresh_needed.then_some(current)) {
            self.write_assignment(next).await;
        }
    }

    /// Delete the Lease of one member that is long gone — not seen renewing for `2 × lease_duration +
    /// grace` — and named nowhere in the assignment (taken over and reassigned, or it owned nothing), so
    /// the Leases of replaced pods do not pile up. Conditional on the resourceVersion last observed: a
    /// member that renewed after all keeps its Lease (and one that comes back later finds it gone and
    /// rejoins as a new incarnation). Also forgets members whose Lease is long deleted.
    async fn collect_dead_lease(&mut self, now: Instant) {
        let Some(a) = self.assignment.as_ref() else {
            return;
        };
        let named: BTreeSet<&MemberId> = a
            .view
            .shards
            .values()
            .flat_map(|e| {
                let to = match &e.handoff {
                    crate::ownership::Handoff::Moving { to, .. }
                    | crate::ownership::Handoff::Draining { to, .. } => Some(to),
                    crate::ownership::Handoff::Stable => None,
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
            .observed
            .iter()
            .find(|(n, o)| dead(n, o) && o.deleted_at.is_none())
            .map(|(n, o)| (n.clone(), o.rv.clone(), o.id.clone()));
        for n in forget {
            self.observed.remove(&n);
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
        match self.bounded(self.leases.delete(&name, &dp)).await {
            Ok(_) => {
                info!(member = %id, lease = %name, "deleted the Lease of a member long gone");
                if let Some(o) = self.observed.get_mut(&name) {
                    o.deleted_at.get_or_insert(now);
                }
            }
            Err(err) if is_not_found(&err) => {
                if let Some(o) = self.observed.get_mut(&name) {
                    o.deleted_at.get_or_insert(now);
                }
            }
            Err(err) => {
                debug!(lease = %name, error = %err, "could not delete a dead member's Lease")
            }
        }
    }

    async fn take_over(&mut self, victim: &MemberId, now: Instant) {
        let Some((name, o)) = self.observed.iter().find(|(_, o)| &o.id == victim) else {
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
        match self
            .bounded(self.leases.replace(&name, &PostParams::default(), &lease))
            .await
        {
            Ok(l) => {
                warn!(member = %victim, "took over a member that stopped renewing");
                self.events.emit(
                    Kind::Warning,
                    "TookOver",
                    format!("took over {victim}: no renewal seen for the lease duration"),
                );
                self.takeovers_done += 1;
                self.takeovers.push_back(now);
                self.observe_lease(l);
            }
            Err(err) if is_conflict(&err) => {
                debug!(member = %victim, "takeover conflicted: it renewed; re-observing");
            }
            Err(err) => debug!(member = %victim, error = %err, "takeover failed"),
        }
    }

    async fn write_assignment(&mut self, next: Assignment) {
        let name = self.cfg.assignment_name();
        let mut cm = self.assignment_cm.clone().unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        });
        cm.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(GROUP_LABEL.into(), self.cfg.group.clone());
        cm.data
            .get_or_insert_with(Default::default)
            .insert(DATA_KEY.into(), next.encode());
        let result = if self.assignment_cm.is_some() {
            self.bounded(self.cms.replace(&name, &PostParams::default(), &cm))
                .await
        } else {
            cm.metadata.resource_version = None;
            self.bounded(self.cms.create(&PostParams::default(), &cm))
                .await
        };
        match result {
            Ok(written) => {
                debug!(generation = next.view.generation, "assignment written");
                self.seen_generation = self.seen_generation.max(next.view.generation);
                self.ownership.apply_view(&next.view);
                self.assignment = Some(next);
                self.assignment_cm = Some(written);
                self.assignment_missing = false;
                self.vacuous_progress();
            }
            Err(err) if is_conflict(&err) => debug!("assignment write conflicted; re-reading"),
            Err(err) => debug!(error = %err, "assignment write failed"),
        }
    }

    fn publish_status(&self) {
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
            coordinator: self.leader,
            generation: snap.state().generation(),
            owned,
            live_members: members.iter().filter(|m| m.alive).count(),
            moves_in_flight: self
                .assignment
                .as_ref()
                .map_or(0, Assignment::moves_in_flight),
            self_fenced: snap.state().is_fenced(),
            joined: self.own.is_some(),
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
            g.live_members = status.live_members as u64;
            g.moves_in_flight = status.moves_in_flight as u64;
            g.handoffs_completed = self.handoffs;
            g.takeovers = self.takeovers_done;
            g.self_fences = self.self_fences;
            g.rejoins = self.rejoins;
            g.unowned_shards = shards.saturating_sub(admitted.len() as u64);
            g.multi_owned_shards = admitted.values().filter(|n| **n > 1).count() as u64;
            g.owned_not_serving_shards = not_serving.len() as u64;
        });
        self.status.send_replace(status);
    }
}

/// A fresh random incarnation.
pub(crate) fn new_incarnation() -> String {
    format!("{:016x}", rand::random::<u64>())
}
