//! The member runtime: its Lease, what it observes of the others, the assignment it applies, and — while
//! it holds the coordinator Lease — the coordinator passes.
//!
//! One task, driven by a `select!` over the group's Lease watch, the assignment watch, a tick every
//! `retry_period`, ownership changes (to publish acks promptly) and the leave signal. Every API call is
//! bounded by a timeout; every write carries a resourceVersion precondition.
//!
//! One file per concept: [`membership`] (this member's own Lease), [`observe`] (the others, on our clock),
//! [`election`] (the coordinator Lease), [`coordinator_pass`] (the assignment, and the I/O around the pure `group::coordinator::step`),
//! [`gates`] (the legacy leader gate, vacuous readers), [`channel`] (the member Lease as control channel),
//! [`fence_params`] (the per-shard fence parameters, before each assignment write) and [`publish`] (status
//! and metrics).

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
use super::report::{
    MemberReport, GATE_DRAINED, GROUP_LABEL, INCARNATION, POD, REPORT, ROLE_LABEL, TAKEN_OVER,
};
use super::singleton::{LeaderTerm, TERM_ANNOTATION};
use super::status::{GroupStatus, Health};
use crate::ownership::inner::Hold;
use crate::ownership::{state::Event as OwnEvent, MemberId, MoveId, Ownership, ShardState};
use crate::shard::ShardSet;

mod answers;
mod beside;
mod channel;
mod coordinator_pass;
mod election;
mod fence_params;
mod floors;
mod gates;
mod membership;
mod observe;
mod parts;
mod permissions;
mod pods;
mod publish;

use parts::{Coordination, Election, Gates, Membership, Obs, Observations, Permissions, Rebuild};

/// Why the member task stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The Kubernetes API failed in a way that retrying cannot fix: the dedicated thread's own client could
    /// not be built. (A refused request is [`Forbidden`](Self::Forbidden).)
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
    /// The API server refused one of the group's requests (401 Unauthorized or 403 Forbidden) for a whole
    /// renew deadline: a Role (or the credentials) the member needs is missing, which retrying cannot fix.
    /// The member admits nothing once it ends; its Lease, when writable, names the refusal
    /// ([`PERMISSION_ERROR`](crate::group::PERMISSION_ERROR)) until it expires.
    #[error("shard group member: {} (refused for a whole renew deadline: the member stopped)", super::permission::describe(verb, resource, namespace, name.as_deref(), *code, message))]
    #[non_exhaustive]
    Forbidden {
        /// The verb refused (`get`, `list`, `watch`, `create`, `update`, `delete`).
        verb: &'static str,
        /// `group/plural` (`coordination.k8s.io/leases`), or the plural for the core group (`configmaps`).
        resource: &'static str,
        /// The namespace of the request (the group's; the object's name starts with the group's).
        namespace: String,
        /// The object named, if any.
        name: Option<String>,
        /// 401 or 403.
        code: u16,
        /// What the API server said.
        message: String,
    },
}

impl GroupError {
    /// The member stopped for `denied`.
    pub(crate) fn forbidden(denied: &super::permission::PermissionError) -> Self {
        GroupError::Forbidden {
            verb: denied.verb,
            resource: denied.resource,
            namespace: denied.namespace.clone(),
            name: denied.name.clone(),
            code: denied.code,
            message: denied.message.clone(),
        }
    }
}

pub(crate) struct Runtime {
    cfg: GroupConfig,
    leases: Api<Lease>,
    cms: Api<ConfigMap>,
    ownership: Ownership,
    me: MemberId,
    leaving: bool,
    status: watch::Sender<GroupStatus>,
    health: Health,
    last_stamp: std::sync::Mutex<Option<k8s_openapi::jiff::Timestamp>>,
    metrics: GroupMetrics,
    events: Events,
    /// A watch stream ended (the member task stops).
    watch_ended: bool,
    /// Leaving for good: no renewal starts any more.
    exiting: bool,
    /// The renewals in flight, answered beside whatever this task awaits (`beside.rs`).
    beside: futures::stream::FuturesUnordered<futures::future::BoxFuture<'static, answers::Beside>>,
    /// What the lease watch delivered, with when it arrived (the watch is read by a task of its own, so a
    /// slow pass never makes it look silent).
    lease_rx: Feed<Lease>,
    /// What the assignment watch delivered.
    cm_rx: Feed<ConfigMap>,
    spawner: crate::rt::Spawner,
    /// This member's own Lease: renewals, self-fencing, the report it publishes, hints it follows (`membership.rs`).
    membership: Membership,
    /// What this member observes of the others' Leases, on its own clock (`observe.rs`).
    observations: Observations,
    /// The coordinator Lease: whether this member leads, its term, its writes (`election.rs`).
    election: Election,
    /// The assignment as read, and the coordinator's memory between passes (`coordinator_pass.rs`, `channel.rs`, `fence_params.rs`).
    coordination: Coordination,
    /// The admission gates this runtime sets: the legacy leader gate and the hold (`gates.rs`).
    gates: Gates,
    /// The group's requests the API server refuses (401, 403) (`permissions.rs`).
    permissions: Permissions,
}

/// A watch read by a task of its own: each item with its arrival time on our clock (`None`: it ended).
type Feed<K> = tokio::sync::mpsc::UnboundedReceiver<(Instant, Option<watcher::Result<Event<K>>>)>;

/// Read `stream` on a task of its own until the receiver is dropped.
fn feed<K: Send + 'static>(
    spawner: &crate::rt::Spawner,
    mut stream: futures::stream::BoxStream<'static, watcher::Result<Event<K>>>,
) -> Feed<K> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    spawner.spawn(async move {
        loop {
            tokio::select! {
                biased; // the receiver gone first: a dropped feed stops reading at once
                _ = tx.closed() => return,
                ev = stream.next() => {
                    let end = ev.is_none();
                    if tx.send((Instant::now(), ev)).is_err() || end {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// The wall clock at microsecond precision (what `MicroTime` carries), strictly after `last`: others judge
/// liveness by seeing `renewTime` *change*, so two renewals must never write the same value.
pub fn next_stamp(
    now: k8s_openapi::jiff::Timestamp,
    last: Option<k8s_openapi::jiff::Timestamp>,
) -> k8s_openapi::jiff::Timestamp {
    use k8s_openapi::jiff::{SignedDuration, Timestamp};
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
        spawner: crate::rt::Spawner,
    ) -> Self {
        let now = Instant::now();
        let events = Events::new(
            client.clone(),
            &cfg.namespace,
            &cfg.member_lease(),
            &cfg.member,
            spawner.clone(),
        );
        // the watches start reading when `run` starts them; until then, empty feeds
        let (_, lease_rx) = tokio::sync::mpsc::unbounded_channel();
        let (_, cm_rx) = tokio::sync::mpsc::unbounded_channel();
        Runtime {
            metrics,
            events,
            watch_ended: false,
            exiting: false,
            beside: Default::default(),
            lease_rx,
            cm_rx,
            spawner,
            leases: Api::namespaced(client.clone(), &cfg.namespace),
            cms: Api::namespaced(client, &cfg.namespace),
            cfg,
            ownership,
            me,
            leaving: false,
            status,
            health,
            last_stamp: std::sync::Mutex::new(None),
            membership: Membership {
                self_fences: 0,
                rejoins: 0,
                hint_followed: 0,
                claim_seen: None,
                renewal_in_flight: false,
                renewal_started: None,
                hint_due: false,
                own: None,
                last_renew_ok: None,
                continuous_since: None,
                seen_generation: 0,
                fenced_since: None,
                published: String::new(),
            },
            observations: Observations {
                leases_synced_at: None,
                leases_relisted: None,
                last_lease_event: None,
                displaced: BTreeMap::new(),
                origin: now,
                invalid_leases: BTreeSet::new(),
                foreign_formats: BTreeMap::new(),
                pods_forbidden: false,
                observed: BTreeMap::new(),
                last_membership_change: now,
            },
            election: Election {
                term: None,
                leadership,
                coordinator_writes: VecDeque::new(),
                elect_in_flight: false,
                elected_at: None,
                leader: false,
            },
            coordination: Coordination {
                handoffs: 0,
                takeovers_done: 0,
                assignment_listed: false,
                assignment_refused: None,
                assignment_relisted: None,
                fence_floors: Default::default(),
                lag_since: BTreeMap::new(),
                nudged: BTreeMap::new(),
                coordinate_soon: false,
                assignment: None,
                assignment_cm: None,
                assignment_missing: false,
                rebuild: None,
                rebuild_served: 0,
                stored_behind: false,
                rollbacks: 0,
                reports_refused: BTreeSet::new(),
                move_first_seen: BTreeMap::new(),
                takeovers: VecDeque::new(),
            },
            gates: Gates {
                legacy: None,
                legacy_alarm: false,
                legacy_live: false,
                hold: None,
            },
            permissions: Default::default(),
        }
    }

    /// The member's clocks (injectable: `ShardGroupBuilder::clock`).
    pub(crate) fn clock(&self) -> &crate::rt::Clock {
        &self.ownership.inner.clock
    }

    fn stamp(&self) -> MicroTime {
        let mut last = self.last_stamp.lock().unwrap_or_else(|e| e.into_inner());
        let t = next_stamp(self.clock().wall_timestamp(), *last);
        *last = Some(t);
        MicroTime(t)
    }

    /// The shortest bound any request gets: `max(retry_period, 1 s)`.
    fn request_floor(&self) -> Duration {
        self.cfg.retry_period.max(Duration::from_secs(1))
    }

    /// How long one control-plane request may take: as long as a renewal ([`renewal_timeout`](Self::renewal_timeout)),
    /// the life of the fence an answer can still be worth something within. The renewals run beside every
    /// request (`beside.rs`), so no request needs a shorter bound to leave room for them; a shorter one timed
    /// out the coordinator Lease write on every round when answers took most of a fence's life (the
    /// group kept no coordinator).
    fn timeout(&self) -> Duration {
        self.renewal_timeout()
    }

    /// How long a renewal may take and still be worth having: the fence it yields lasts
    /// `renew_deadline − fence_margin` from its start, so an answer within that renews and un-fences.
    /// A fixed 1–2 s bound left a member whose writes commit just above it renewing (so never taken over)
    /// but never recording a renewal.
    fn renewal_timeout(&self) -> Duration {
        self.cfg
            .renew_deadline
            .saturating_sub(self.cfg.fence_margin)
            .max(self.request_floor())
    }

    pub(crate) async fn run(mut self, mut leave: oneshot::Receiver<()>) -> Result<(), GroupError> {
        let span = info_span!("shard_group", group = %self.cfg.group, member = %self.cfg.member, namespace = %self.cfg.namespace);
        async move {
            self.begin();
            let mut lease_watch_started = Instant::now();
            let mut changed = self.ownership.changed();
            let mut tick = tokio::time::interval(self.cfg.retry_period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut leave_armed = true;
            let mut dirty = true;
            loop {
                // a renewal starts the moment it falls due, whatever else waits
                self.start_due(Instant::now());
                let next_due = self.next_due();
                let forbidden_due = self.forbidden_due();
                // biased: a fixed branch order (tokio's random one cannot be seeded), rarest first so a
                // busy watch never starves the tick or the leave; the watches are drained below anyway
                tokio::select! {
                    biased;
                    // a refusal that lasted a renew deadline ends the task (checked below)
                    _ = tokio::time::sleep_until(forbidden_due.unwrap_or(next_due)), if forbidden_due.is_some() => {}
                    _ = &mut leave, if leave_armed => {
                        leave_armed = false;
                        info!("leaving the shard group: shards move away before shutdown");
                        self.leaving = true;
                        dirty = true;
                    }
                    _ = tick.tick() => {
                        dirty = true;
                        if !self.on_tick(&mut lease_watch_started) {
                            return Ok(());
                        }
                    }
                    Some(done) = self.beside.next(), if !self.beside.is_empty() => {
                        self.beside_done(done);
                    }
                    _ = tokio::time::sleep_until(next_due) => {}
                    r = changed.changed() => {
                        if r.is_err() { return Ok(()); }
                        dirty |= self.on_ownership_changed();
                    }
                    Some(ev) = self.lease_rx.recv() => match self.lease_item(ev) {
                        Some(soon) => self.coordination.coordinate_soon |= soon,
                        None => return Ok(()),
                    },
                    Some(ev) = self.cm_rx.recv() => if !self.assignment_item(ev) {
                        return Ok(());
                    },
                }
                // apply everything the watches have delivered already before acting
                if !self.apply_delivered() {
                    return Ok(());
                }
                if let Some(e) = self.forbidden(Instant::now()) {
                    return Err(self.stop_forbidden(e));
                }
                if self.act(std::mem::take(&mut dirty)).await {
                    return Ok(());
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Before the loop: say where the group lives, hold admission as configured, start the watches.
    fn begin(&mut self) {
        info!(
            "starting: the group's Leases, ConfigMaps and Events are in namespace {}",
            self.cfg.namespace
        );
        if self.cfg.shadow {
            info!("shadow mode: ownership is computed and reported, nothing is admitted");
        }
        // fail closed: held until a successful read shows no live legacy holder
        self.gates.legacy_live = self.cfg.legacy_leader_lease.is_some();
        self.update_hold();
        self.start_watches();
    }

    /// Every retry period: apply what the watches delivered, and restart a lease watch that hangs. False
    /// when a watch ended.
    fn on_tick(&mut self, lease_watch_started: &mut Instant) -> bool {
        // events that arrived while a long pass ran wait in the feed: apply them before judging the watch
        // silent (a restart would drop them and reset every clock)
        if !self.apply_delivered() {
            return false;
        }
        // a LIST or watch start that never answers (a black-holed connection) is not bounded by kube's
        // watcher; a lease watch silent for a lease period is restarted
        let now = Instant::now();
        if self.lease_watch_stuck(now, *lease_watch_started) {
            warn!("the lease watch delivered nothing for a lease period: restarting it");
            self.lease_rx = feed(&self.spawner, self.lease_watch());
            *lease_watch_started = now;
            self.reset_observations();
        }
        true
    }

    /// Ownership changed: whether to renew early (publish acks promptly; a renewal itself changes the
    /// ownership bookkeeping, so only when the report would say something new).
    fn on_ownership_changed(&mut self) -> bool {
        self.vacuous_progress();
        self.report().encode() != self.membership.published
    }

    /// Act on what the loop saw: follow a hint, coordinate, and — when `dirty` — join or renew, elect,
    /// coordinate and publish. True once the member has left.
    async fn act(&mut self, dirty: bool) -> bool {
        if self.membership.hint_due {
            self.membership.hint_due = false;
            self.follow_hint().await;
        }
        if self.coordination.coordinate_soon && !dirty && self.election.leader {
            self.coordination.coordinate_soon = false;
            self.start_due(Instant::now());
            self.coordinate().await;
            self.publish_status();
        }
        if !dirty {
            return false;
        }
        self.coordination.coordinate_soon = false;
        if self.membership.own.is_none() {
            self.join().await;
        } else {
            // an early renewal when the report changed; else whatever is due
            self.start_renewal(true);
        }
        self.check_legacy_leader().await;
        self.elect().await;
        if self.election.leader && self.renew_between().await {
            self.coordinate().await;
        }
        self.publish_status();
        if self.leaving && (self.done_leaving() || self.nobody_stays()) {
            self.finish_leaving().await;
            return true;
        }
        false
    }

    /// Leave for good: no renewal starts from here, and the one in flight answers first (a renewal answered
    /// after the fence below would lift it); then the Lease is deleted.
    async fn finish_leaving(&mut self) {
        self.exiting = true;
        self.settle_renewal().await;
        if !self.done_leaving() {
            warn!("leaving while holding shards: no live member stays to take them (the last member, or all leave at once); self-fenced, they are reassigned once this member's lease has expired");
            self.ownership.mark_self_fenced();
        }
        self.delete_own_lease().await;
        info!("left the shard group");
    }
}

/// Watch events applied at most between two rounds of requests.
const MAX_DRAINED: usize = 10_000;

impl Runtime {
    /// Start the group's Lease watch and the assignment watch. The streams back off by themselves, each
    /// read by a task of its own: a failing watch never blocks renewals, and a slow pass never leaves the
    /// watches unread.
    fn start_watches(&mut self) {
        self.lease_rx = feed(&self.spawner, self.lease_watch());
        let cm_cfg = watcher::Config::default()
            .fields(&format!("metadata.name={}", self.cfg.assignment_name()))
            .timeout(30);
        self.cm_rx = feed(
            &self.spawner,
            watcher::watcher(self.cms.clone(), cm_cfg)
                .default_backoff()
                .boxed(),
        );
    }

    /// One item of the lease watch: `None` when the stream ended, else whether the coordinator should
    /// look again now.
    fn lease_item(
        &mut self,
        (arrived, ev): (Instant, Option<watcher::Result<Event<Lease>>>),
    ) -> Option<bool> {
        let item = ev?;
        self.watch_noted(super::permission::LEASES, None, &item);
        match item {
            Ok(ev) => {
                self.lease_watch_delivered(arrived);
                Some(self.on_lease_event(ev, arrived))
            }
            Err(err) => {
                debug!(error = %err, "lease watch failed: resetting observation clocks");
                self.reset_observations();
                Some(false)
            }
        }
    }

    /// One item of the assignment watch: false when the stream ended.
    fn assignment_item(
        &mut self,
        (_, ev): (Instant, Option<watcher::Result<Event<ConfigMap>>>),
    ) -> bool {
        if let Some(item) = &ev {
            let name = self.cfg.assignment_name();
            self.watch_noted(super::permission::CONFIGMAPS, Some(name), item);
        }
        match ev {
            Some(Ok(ev)) => self.on_assignment_event(ev),
            Some(Err(err)) => debug!(error = %err, "assignment watch failed"),
            None => return false,
        }
        true
    }

    /// Apply everything the watches delivered so far (before judging anyone, and between rounds): false
    /// when a watch ended.
    pub(super) fn apply_delivered(&mut self) -> bool {
        for _ in 0..MAX_DRAINED {
            if self.watch_ended {
                break;
            }
            let mut any = false;
            if let Ok(ev) = self.lease_rx.try_recv() {
                any = true;
                match self.lease_item(ev) {
                    Some(soon) => self.coordination.coordinate_soon |= soon,
                    None => self.watch_ended = true,
                }
            }
            if let Ok(ev) = self.cm_rx.try_recv() {
                any = true;
                if !self.assignment_item(ev) {
                    self.watch_ended = true;
                }
            }
            if !any {
                break;
            }
        }
        !self.watch_ended
    }

    /// The group's Lease watch (members renew every retry period, so it is never quiet for long).
    fn lease_watch(&self) -> futures::stream::BoxStream<'static, watcher::Result<Event<Lease>>> {
        let selector = format!("{GROUP_LABEL}={}", self.cfg.group);
        let cfg = watcher::Config::default().labels(&selector).timeout(30);
        watcher::watcher(self.leases.clone(), cfg)
            .default_backoff()
            .boxed()
    }

    /// The lease watch has delivered nothing for a lease period (at least two requests' time limits and a
    /// retry period), neither since it was (re)started: its LIST or watch start hangs. Every member, this
    /// one included, renews every retry period, or as soon as its last renewal is answered.
    fn lease_watch_stuck(&self, now: Instant, started: Instant) -> bool {
        // a (re)start is a LIST and a watch start, each answered as late as the API answers (up to a
        // request's time limit): restarting sooner would restart a slow but working watch forever
        let period = self
            .cfg
            .lease_duration
            .max(self.timeout() * 2 + self.cfg.retry_period);
        now.duration_since(started) >= period
            && self
                .observations
                .last_lease_event
                .is_none_or(|t| now.duration_since(t) >= period)
    }
}

/// A fresh random incarnation.
pub(crate) fn new_incarnation() -> String {
    format!("{:016x}", crate::rt::next_u64())
}
