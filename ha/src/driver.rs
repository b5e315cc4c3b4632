//! The I/O driver: runs the pure [`Elector`] against `kube::Api<Lease>` in the local, peer and witness
//! clusters, on its own task with its own timeouts (never inside a reconcile loop), and publishes the term
//! to the [`HaHandle`].
//!
//! Every request is bounded by the configured request timeout; a timed-out write counts as `Failed` (it
//! may still commit: the next conditional write finds out). Reads are plain GETs (consistent reads, never a
//! cache or a watch event). Times fed to the elector are readings of the injected local clock at the start
//! of each request and at the receipt of each answer.

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use super::config::{HaConfig, HaMode};
use super::elector::{
    Alarm, Answer, Elector, ElectorConfig, ForceError, HaRole, Op, Request, Seen, Slot,
    TokenTakeover, Transition,
};
use super::epoch::FailoverEpoch;
use super::events::{reason, HaEvents};
use super::handle::{HaHandle, Term};
use super::identity::{self, Identity};
use super::metrics::HaMetrics;
use super::record::{self, Origin, Record};
use kube_shard::rt::Clock;

/// The clients of the three clusters.
#[derive(Clone)]
#[non_exhaustive]
pub struct HaClients {
    /// This cluster.
    pub local: Client,
    /// The peer cluster.
    pub peer: Client,
    /// The witness cluster, if any.
    pub witness: Option<Client>,
}

impl std::fmt::Debug for HaClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HaClients")
            .field("witness", &self.witness.is_some())
            .finish_non_exhaustive()
    }
}

impl HaClients {
    /// Clients for this, the peer and (optionally) the witness cluster.
    #[must_use]
    pub fn new(local: Client, peer: Client, witness: Option<Client>) -> Self {
        HaClients {
            local,
            peer,
            witness,
        }
    }
}

/// One slot's state as this process sees it, for `kshard ha status`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SlotStatus {
    /// `own`, `peer` or `witness`.
    pub slot: &'static str,
    /// `unknown`, `missing`, `undecodable` or `present`.
    pub state: &'static str,
    /// The holder `<cluster-id>/<epoch>`, when present and decodable.
    pub holder: Option<String>,
    /// The resourceVersion seen.
    pub resource_version: Option<String>,
    /// Milliseconds since this version was first seen.
    pub age_ms: Option<u64>,
}

/// What one cluster's elector knows, for `kshard ha status`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct HaStatus {
    /// This cluster's id.
    pub cluster: String,
    /// `active`, `leader-without-term` or `standby`.
    pub role: &'static str,
    /// The epoch led, or the highest seen (wire form).
    pub epoch: u64,
    /// Milliseconds left in the term.
    pub term_remaining_ms: u64,
    /// Armed: `--force` would be accepted.
    pub armed: bool,
    /// The alarm, if any.
    pub alarm: Option<String>,
    /// The three Leases as seen.
    pub leases: Vec<SlotStatus>,
}

enum Command {
    Force(oneshot::Sender<Result<FailoverEpoch, ForceError>>),
    DemotionToken(
        TokenTakeover,
        oneshot::Sender<Result<FailoverEpoch, ForceError>>,
    ),
    Status(oneshot::Sender<HaStatus>),
    MirrorConfirmed(Duration),
    PeerIsThisCluster,
    PeerIdentity(Option<(String, Origin)>),
}

/// Commands to a running driver (`kshard ha promote --force`, `kshard ha status`). Cheap to clone.
#[derive(Clone, Debug)]
pub struct HaControl {
    tx: mpsc::Sender<Command>,
}

/// The driver has stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the HA driver has stopped")]
#[non_exhaustive]
pub struct Stopped;

/// A refused or failed forced promotion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PromoteError {
    /// The elector refused.
    #[error(transparent)]
    Refused(#[from] ForceError),
    /// The driver has stopped.
    #[error(transparent)]
    Stopped(#[from] Stopped),
}

impl HaControl {
    /// Start a forced candidacy (`promote --force --old-active-stopped`): the new epoch, or why not.
    pub async fn force_promote(&self) -> Result<FailoverEpoch, PromoteError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Force(tx))
            .await
            .map_err(|_| Stopped)?;
        Ok(rx.await.map_err(|_| Stopped)??)
    }

    /// Start a promotion with a demotion token (`promote --token`, after the token table's checks): the
    /// new epoch, or why not.
    pub async fn promote_with_token(
        &self,
        t: TokenTakeover,
    ) -> Result<FailoverEpoch, PromoteError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::DemotionToken(t, tx))
            .await
            .map_err(|_| Stopped)?;
        Ok(rx.await.map_err(|_| Stopped)??)
    }

    /// The mirror's lag report for `--max-auto-promote-lag`: `at` is the local-clock time (this process's
    /// [`Clock`]) of the latest probe the mirror's watermark has passed for **every** kind. The lag
    /// is the time since then, so it grows by itself when the mirror stops confirming.
    pub async fn mirror_confirmed(&self, at: Duration) -> Result<(), Stopped> {
        self.tx
            .send(Command::MirrorConfirmed(at))
            .await
            .map_err(|_| Stopped)
    }

    /// What the elector knows now.
    pub async fn status(&self) -> Result<HaStatus, Stopped> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(Command::Status(tx))
            .await
            .map_err(|_| Stopped)?;
        rx.await.map_err(|_| Stopped)
    }
}

/// Start the elector of `cfg` on its own task. Standalone mode starts nothing and returns an always-active
/// handle. The returned task runs until the runtime stops (abort it to stop the elector; the term then
/// ends at its deadline).
///
/// The elector may be one of several processes of this cluster (the members of a shard group, or `kshard
/// ha promote` beside the operator): while Standby it follows a term another process of this cluster
/// leads ([`ElectorConfig::follow`]), dating it from its own renewals.
pub fn spawn(
    cfg: &HaConfig,
    clients: HaClients,
    clock: Clock,
    metrics: HaMetrics,
) -> (HaHandle, HaControl, Option<tokio::task::JoinHandle<()>>) {
    spawn_elector(cfg, clients, clock, metrics, |e| e)
}

/// [`spawn`] with fault points planted in the elector ([`crate::faults`]), so a test can show its checker
/// catches each (feature `test-util`).
#[cfg(any(test, feature = "test-util"))]
pub fn spawn_with_faults(
    cfg: &HaConfig,
    clients: HaClients,
    clock: Clock,
    metrics: HaMetrics,
    faults: crate::faults::Faults,
) -> (HaHandle, HaControl, Option<tokio::task::JoinHandle<()>>) {
    spawn_elector(cfg, clients, clock, metrics, move |e| e.with_faults(faults))
}

fn spawn_elector(
    cfg: &HaConfig,
    clients: HaClients,
    clock: Clock,
    metrics: HaMetrics,
    adjust: impl FnOnce(Elector) -> Elector + Send + 'static,
) -> (HaHandle, HaControl, Option<tokio::task::JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel(8);
    if cfg.mode == HaMode::Standalone {
        return (HaHandle::standalone(), HaControl { tx }, None);
    }
    let handle = HaHandle::new(clock.clone(), metrics.clone(), false);
    let witness = clients.witness.is_some();
    let (min_local, min_peer) = (clients.local.clone(), clients.peer.clone());
    let ecfg = ElectorConfig::new(
        cfg.cluster_id.clone(),
        cfg.rank,
        clients.witness.is_some(),
        cfg.timings,
    )
    .bootstrap_active(cfg.mode == HaMode::Active)
    .follow(true);
    let lease = cfg.lease_name();
    let (uid_local, uid_peer) = (clients.local.clone(), clients.peer.clone());
    let apis = [
        Some(Api::namespaced(clients.local.clone(), &cfg.namespace)),
        Some(Api::namespaced(clients.peer, &cfg.namespace)),
        clients
            .witness
            .map(|c| Api::namespaced(c, &cfg.witness_namespace)),
    ];
    let namespaces = [
        cfg.namespace.clone(),
        cfg.namespace.clone(),
        cfg.witness_namespace.clone(),
    ];
    let mut driver = Driver {
        // replaced once this cluster's identity is read, before the first request
        elector: Elector::new(ecfg.clone(), clock.elapsed()),
        apis,
        namespaces,
        lease: lease.clone(),
        ha_name: cfg.name.clone(),
        timeout: cfg.timings.request_timeout,
        tick: cfg.timings.retry_period / 4,
        events: HaEvents::new(clients.local, &cfg.namespace, &lease, &cfg.cluster_id),
        handle: handle.clone(),
        metrics,
        clock,
        was_active: false,
        stamps: [None; 3],
        unidentified: [false; 3],
        max_lag: cfg.max_auto_promote_lag,
        confirmed: None,
    };
    // automatic promotion (witness mode) has no command to set the minimum epoch: follow the handle
    let follower = witness.then(|| {
        super::min_epoch::follow_promotions(handle.clone(), min_local, min_peer, cfg.clone())
    });
    let (retry, limit) = (cfg.timings.retry_period, cfg.timings.request_timeout);
    let peer_check = tx.clone();
    let floor_cfg = cfg.clone();
    let task = tokio::spawn(async move {
        // every record carries this cluster's identity, and every record read is checked against it
        let uid = read_uid(&uid_local, "this", retry, limit).await;
        let floor = super::floor::read(
            &floor_cfg,
            &[("this", &uid_local), ("the peer", &uid_peer)],
            limit,
        )
        .await;
        let ecfg = ecfg.uid(uid.clone()).floor(floor.epoch);
        driver.elector = adjust(Elector::new(ecfg, driver.clock.elapsed()));
        // ends only by the task's end, so it never outlives an aborted driver
        let identities = async move {
            let me = Identity::of(&floor_cfg, uid.clone());
            publish_identity(&uid_local, &floor_cfg, &me, limit).await;
            if read_uid(&uid_peer, "the peer", retry, limit).await == uid {
                error!(%uid, "HA: the peer client reaches this very cluster (one kube-system uid): nothing is admitted until the peer kubeconfig points at the other cluster");
                let _ = peer_check.send(Command::PeerIsThisCluster).await;
                std::future::pending::<()>().await;
            }
            watch_peer_identity(&uid_local, &uid_peer, &floor_cfg, &me, peer_check).await;
        };
        let follower = async move {
            match follower {
                Some(f) => f.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // the driver is the task's life; the others only wait (for the peer's identity, for the
            // follower's promotions), so their order is immaterial
            biased;
            () = driver.run(rx) => {}
            () = identities => {}
            () = follower => {}
        }
    });
    (handle, HaControl { tx }, Some(task))
}

struct Driver {
    elector: Elector,
    apis: [Option<Api<Lease>>; 3],
    namespaces: [String; 3],
    lease: String,
    ha_name: String,
    timeout: Duration,
    tick: Duration,
    events: HaEvents,
    handle: HaHandle,
    metrics: HaMetrics,
    clock: Clock,
    was_active: bool,
    /// Per slot, the latest `renewTime` seen in an answer or sent: the next write stamps strictly after
    /// it, so every renewal changes the Lease (a no-op update keeps the resourceVersion, and an observer
    /// would take a renewed Lease for a stale one).
    stamps: [Option<Timestamp>; 3],
    /// Per slot, whether a record without its writer's identity (an older build) was reported.
    unidentified: [bool; 3],
    /// `--max-auto-promote-lag`.
    max_lag: Option<Duration>,
    /// The mirror's latest confirmation (local clock).
    confirmed: Option<Duration>,
}

type Flight =
    std::pin::Pin<Box<dyn std::future::Future<Output = (Slot, Answer, Option<Timestamp>)> + Send>>;

impl Driver {
    /// A record without its writer's identity (a build before identities) is never a conflict, so it
    /// is only reported, once per slot until a record with one is read.
    fn warn_unidentified(&mut self, slot: Slot, answer: &Answer) {
        let Answer::Found {
            record: Some(r), ..
        } = answer
        else {
            return;
        };
        let seen = &mut self.unidentified[slot as usize];
        if r.origin.is_none() && !*seen {
            warn!(?slot, cluster = %r.cluster, "HA: a Lease record carries no writer identity (an older build): its cluster id and rank cannot be checked until that side is upgraded");
        }
        *seen = r.origin.is_none();
    }

    async fn run(mut self, mut cmds: mpsc::Receiver<Command>) {
        let mut inflight: FuturesUnordered<Flight> = FuturesUnordered::new();
        // every `HaControl` dropped: no more commands (a closed channel answers at once, and polling it
        // again would spin without ever letting the timers run)
        let mut commands_open = true;
        loop {
            self.gate_auto_promotion();
            let (reqs, trans) = self.elector.poll(self.clock.elapsed());
            self.on_transitions(&trans);
            for r in reqs {
                inflight.push(self.send(r));
            }
            self.publish();
            tokio::select! {
                // answers first (they end or keep the term); every turn polls the elector, so the tick
                // below only wakes the loop and a busy branch above it delays nothing
                biased;
                Some((slot, answer, stamp)) = inflight.next(), if !inflight.is_empty() => {
                    let last = &mut self.stamps[slot as usize];
                    *last = (*last).max(stamp);
                    self.warn_unidentified(slot, &answer);
                    let trans = self.elector.on_answer(slot, answer, self.clock.elapsed());
                    self.on_transitions(&trans);
                }
                cmd = cmds.recv(), if commands_open => match cmd {
                    Some(Command::Force(reply)) => {
                        let r = self.elector.force_promote(self.clock.elapsed());
                        let out = r.map(|t| { self.on_transitions(&t); self.epoch() });
                        let _ = reply.send(out);
                    }
                    Some(Command::DemotionToken(t, reply)) => {
                        let r = self.elector.promote_with_token(t, self.clock.elapsed());
                        let out = r.map(|t| { self.on_transitions(&t); self.epoch() });
                        let _ = reply.send(out);
                    }
                    Some(Command::Status(reply)) => { let _ = reply.send(self.status()); }
                    Some(Command::PeerIdentity(id)) => self.elector.on_peer_identity(id),
                    Some(Command::PeerIsThisCluster) => {
                        let trans = self.elector.peer_is_this_cluster();
                        self.on_transitions(&trans);
                    }
                    Some(Command::MirrorConfirmed(at)) => {
                        self.confirmed = Some(self.confirmed.map_or(at, |c| c.max(at)));
                    }
                    None => commands_open = false,
                },
                () = tokio::time::sleep(self.tick) => {}
            }
        }
    }

    /// Witness mode with `--max-auto-promote-lag`: automatic promotion only while the mirror's lag (the
    /// time since its latest confirmation) is below the bound; never before a first confirmation.
    fn gate_auto_promotion(&mut self) {
        if let Some(max) = self.max_lag {
            let now = self.clock.elapsed();
            let allowed = self.confirmed.is_some_and(|c| now.saturating_sub(c) < max);
            self.elector.set_auto_promote(allowed);
        }
    }

    fn epoch(&self) -> FailoverEpoch {
        match self.elector.role() {
            HaRole::Leader { epoch, .. } => epoch,
            HaRole::Standby => self.elector.max_seen(),
        }
    }

    fn send(&mut self, r: Request) -> Flight {
        let stamp = if r.op == Op::Read {
            None
        } else {
            let last = &mut self.stamps[r.slot as usize];
            let t = kube_shard::group::next_stamp(Timestamp::now(), *last);
            *last = Some(t);
            Some(t)
        };
        let api = self.apis[r.slot as usize].clone();
        let name = self.lease.clone();
        let ns = self.namespaces[r.slot as usize].clone();
        let ha = self.ha_name.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            let Some(api) = api else {
                return (r.slot, Answer::Failed, None);
            };
            let fut = request(api, name, ns, ha, r.op, stamp);
            let (answer, seen) = tokio::time::timeout(timeout, fut)
                .await
                .unwrap_or((Answer::Failed, None));
            (r.slot, answer, seen)
        })
    }

    fn publish(&mut self) {
        let now = self.clock.elapsed();
        let term = self.elector.is_active(now).and_then(|epoch| {
            self.elector
                .term_deadline(now)
                .map(|deadline| Term { epoch, deadline })
        });
        self.handle.publish(term);
        self.handle.publish_demoting(self.elector.demoting());
        let active = term.is_some();
        if active != self.was_active {
            let e = self.epoch();
            if active {
                info!(epoch = %e, "HA: became active");
                self.events
                    .emit(false, reason::BECAME_ACTIVE, format!("active at epoch {e}"));
            } else {
                warn!(epoch = %e, "HA: became standby");
                self.events.emit(
                    false,
                    reason::BECAME_STANDBY,
                    format!("standing by (epoch {e})"),
                );
            }
            self.was_active = active;
        }
        let age = |s: Slot| match self.elector.seen(s) {
            Seen::Present { since, .. } | Seen::Missing { since } => {
                u64::try_from(now.saturating_sub(*since).as_millis()).unwrap_or(u64::MAX)
            }
            Seen::Unknown => 0,
        };
        let (peer_age, witness_age) = (age(Slot::Peer), age(Slot::Witness));
        let leader = matches!(self.elector.role(), HaRole::Leader { .. });
        let epoch = self.epoch().wire();
        let alarm = self.elector.alarm().is_some();
        let remaining = self.handle.term_remaining();
        self.metrics.update(&self.elector.config().cluster, |s| {
            s.active = active;
            s.leader = leader;
            s.epoch = epoch;
            s.term_remaining_ms = u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX);
            s.peer_lease_age_ms = peer_age;
            s.witness_lease_age_ms = witness_age;
            s.alarm = alarm;
        });
    }

    fn on_transitions(&self, trans: &[Transition]) {
        for t in trans {
            match *t {
                Transition::Promoted(e) | Transition::Bootstrapped(e) | Transition::Resumed(e) => {
                    if matches!(t, Transition::Promoted(_)) {
                        self.metrics.update_keep(|s| s.promotions += 1);
                    }
                    info!(epoch = %e, transition = ?t, "HA: leading");
                    self.events.emit(
                        false,
                        reason::PROMOTED,
                        format!("{t:?}: leading at epoch {e}"),
                    );
                }
                Transition::SteppedDown(e, why) => {
                    self.metrics.update_keep(|s| s.step_downs += 1);
                    warn!(epoch = %e, ?why, "HA: stepped down");
                    self.events.emit(
                        true,
                        reason::STEPPED_DOWN,
                        format!("stepped down from epoch {e}: {why:?}"),
                    );
                }
                Transition::Alarmed(a) => {
                    warn!(alarm = ?a, "HA: alarm");
                    self.events.emit(true, reason::ALARM, format!("{a:?}"));
                }
            }
        }
    }

    fn status(&self) -> HaStatus {
        let now = self.clock.elapsed();
        let active = self.elector.is_active(now).is_some();
        let role = match (self.elector.role(), active) {
            (_, true) => "active",
            (HaRole::Leader { .. }, false) if self.elector.demoting().is_some() => "demoting",
            (HaRole::Leader { .. }, false) => "leader-without-term",
            (HaRole::Standby, false) => "standby",
        };
        let slots: &[Slot] = if self.apis[2].is_some() {
            &Slot::ALL
        } else {
            &Slot::ALL[..2]
        };
        HaStatus {
            cluster: self.elector.config().cluster.clone(),
            role,
            epoch: self.epoch().wire(),
            term_remaining_ms: u64::try_from(self.handle.term_remaining().as_millis())
                .unwrap_or(u64::MAX),
            armed: self.elector.armed(now),
            alarm: self.elector.alarm().map(|a: Alarm| format!("{a:?}")),
            leases: slots
                .iter()
                .map(|&s| slot_status(&self.elector, s, now))
                .collect(),
        }
    }
}

fn slot_status(el: &Elector, s: Slot, now: Duration) -> SlotStatus {
    let name = match s {
        Slot::Own => "own",
        Slot::Peer => "peer",
        Slot::Witness => "witness",
    };
    let age = |since: Duration| u64::try_from(now.saturating_sub(since).as_millis()).ok();
    let (state, holder, rv, age_ms) = match el.seen(s) {
        Seen::Present {
            rv,
            record: Some(r),
            since,
        } if r.state.demoting => ("demoting", Some(r.holder()), Some(rv.clone()), age(*since)),
        Seen::Unknown => ("unknown", None, None, None),
        Seen::Missing { since } => ("missing", None, None, age(*since)),
        Seen::Present {
            rv, record, since, ..
        } => match record {
            Some(r) => ("present", Some(r.holder()), Some(rv.clone()), age(*since)),
            None => ("undecodable", None, Some(rv.clone()), age(*since)),
        },
    };
    SlotStatus {
        slot: name,
        state,
        holder,
        resource_version: rv,
        age_ms,
    }
}

/// One request; the answer and the `renewTime` the Lease carries after it (if known).
async fn request(
    api: Api<Lease>,
    name: String,
    ns: String,
    ha: String,
    op: Op,
    stamp: Option<Timestamp>,
) -> (Answer, Option<Timestamp>) {
    let encode = |r: &Record| {
        let mut l = record::encode(r, &name, &ns, &ha);
        if let Some(spec) = l.spec.as_mut() {
            spec.renew_time = stamp.map(MicroTime);
        }
        l
    };
    let renewed = |l: &Lease| {
        l.spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0)
    };
    let res = match op {
        Op::Read => {
            return match api.get(&name).await {
                Ok(l) => (
                    Answer::Found {
                        rv: l.metadata.resource_version.clone().unwrap_or_default(),
                        record: record::decode(&l).ok(),
                    },
                    renewed(&l),
                ),
                Err(e) => (classify(&e), None),
            }
        }
        Op::Update { rv, record } => {
            let mut l = encode(&record);
            l.metadata.resource_version = Some(rv);
            api.replace(&name, &PostParams::default(), &l).await
        }
        Op::Create { record } => api.create(&PostParams::default(), &encode(&record)).await,
    };
    match res {
        Ok(l) => (
            Answer::Written {
                rv: l.metadata.resource_version.clone().unwrap_or_default(),
            },
            renewed(&l),
        ),
        Err(e) => (classify(&e), None),
    }
}

/// The uid of `client`'s cluster's `kube-system` namespace, read again every retry period until it answers.
/// Publish this side's identity, retried until written (then at every peer read, if it changed).
async fn publish_identity(local: &Client, cfg: &HaConfig, me: &Identity, limit: Duration) -> bool {
    match tokio::time::timeout(limit, identity::publish(local, cfg, me)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            warn!(error = %e, "HA: cannot publish this side's identity (ConfigMap `<name>-ha-identity`; RBAC?)");
            false
        }
        Err(_) => {
            warn!("HA: publishing this side's identity timed out");
            false
        }
    }
}

/// Every lease duration: read the identity the peer published and hand it to the elector (an
/// unreadable one keeps the last; a malformed one is none, with a warning); keep ours published.
async fn watch_peer_identity(
    local: &Client,
    peer: &Client,
    cfg: &HaConfig,
    me: &Identity,
    tx: mpsc::Sender<Command>,
) {
    let limit = cfg.timings.request_timeout;
    let mut published = false;
    loop {
        if !published {
            published = publish_identity(local, cfg, me, limit).await;
        }
        let seen = match tokio::time::timeout(limit, identity::read(peer, cfg)).await {
            Ok(Ok(Some(Ok(p)))) => Some(Some((
                p.cluster,
                Origin {
                    uid: p.uid,
                    rank: p.rank,
                },
            ))),
            Ok(Ok(Some(Err(e)))) => {
                warn!(error = %e, "HA: the peer's published identity is malformed: ignored");
                Some(None)
            }
            Ok(Ok(None)) => Some(None),
            Ok(Err(e)) => {
                debug!(error = %e, "HA: cannot read the peer's identity");
                None
            }
            Err(_) => None,
        };
        if let Some(seen) = seen {
            if tx.send(Command::PeerIdentity(seen)).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(cfg.timings.lease_duration).await;
    }
}

async fn read_uid(client: &Client, which: &str, retry: Duration, limit: Duration) -> String {
    let api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    loop {
        match tokio::time::timeout(limit, api.get("kube-system")).await {
            Ok(Ok(ns)) => match ns.metadata.uid {
                Some(uid) => return uid,
                None => warn!(cluster = which, "HA: namespace kube-system has no uid"),
            },
            Ok(Err(e)) => {
                warn!(cluster = which, error = %e, "HA: cannot read namespace kube-system (the cluster's identity)")
            }
            Err(_) => warn!(
                cluster = which,
                "HA: reading namespace kube-system timed out"
            ),
        }
        tokio::time::sleep(retry).await;
    }
}

fn classify(e: &kube::Error) -> Answer {
    match e {
        kube::Error::Api(s) if s.code == 404 => Answer::NotFound,
        kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists" => {
            Answer::AlreadyExists
        }
        kube::Error::Api(s) if s.code == 409 => Answer::Conflict,
        _ => Answer::Failed,
    }
}
