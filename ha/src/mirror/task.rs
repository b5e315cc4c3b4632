//! The task of one mirrored kind: it consumes the source loop's deliveries into the retry queue and the
//! watermark, starts applies of due keys in its worker pool ([`super::pool`], up to `workers` at once,
//! never two of one key), probes the source for lag, checkpoints the position, and publishes its
//! [`KindStatus`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{DynamicObject, ListParams, VersionMatch};
use kube::{Api, ResourceExt};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::apply::{apply, Failure, Outcome, Sides};
use super::catchup::CatchUp;
use super::checkpoint::{position_text, put_synced, Synced};
use super::config::MirrorConfig;
use super::error::MirrorError;
use super::failures::FailureEvents;
use super::hold::Hold;
use super::lag::Confirmations;
use super::plan::{CopyContext, MIRRORED_FROM};
use super::pool::Pool;
use super::queue::{Key, RetryQueue};
use super::rate::RateLimit;
use super::rv::{check_regression, parse_rv};
use super::scope::in_scope;
use super::source::Delivery;
use super::status::KindStatus;
use super::watermark::Watermark;
use crate::checkpoint::edit::edit_checkpoint;
use crate::checkpoint::Kind;
use crate::HaControl;
use kube_shard::rt::Clock;

pub(super) type Shared = Arc<Mutex<std::collections::BTreeMap<String, KindStatus>>>;

pub(super) struct KindTask {
    pub(super) kind: Kind,
    pub(super) sides: Sides,
    pub(super) ctx: CopyContext,
    pub(super) cfg: Arc<MirrorConfig>,
    pub(super) clock: Clock,
    pub(super) shared: Shared,
    pub(super) control: Option<HaControl>,
    pub(super) queue: RetryQueue,
    pub(super) wm: Watermark,
    pub(super) conf: Confirmations,
    pub(super) last_written: HashMap<Key, String>,
    pub(super) status: KindStatus,
    /// The prune backstop's suspects: copy key → (the copy's uid, when first seen without its source).
    pub(super) suspects: BTreeMap<Key, (String, Duration)>,
    /// Copy writes are made under it; none while the mirror holds at a token.
    pub(super) hold: Hold,
    /// Catch-ups to acknowledge once applied: the catch-up LIST's version, and where to say so.
    pub(super) waiting: Vec<(u64, tokio::sync::oneshot::Sender<usize>)>,
    /// The kind's initial full LIST, until its completion is recorded in the checkpoint.
    pub(super) initial: Initial,
    /// The applies in flight.
    pub(super) pool: Pool,
    /// The global rate limit, shared by every kind; each apply's requests await it.
    pub(super) rate: RateLimit,
    /// The Warning Events of objects put on the failed list.
    pub(super) failures: FailureEvents,
}

/// A kind's initial full LIST (what "synced" means: [`super::checkpoint`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Initial {
    /// Recorded in the checkpoint (at start, from this source's incarnation, or since).
    Recorded,
    /// No full LIST delivered yet.
    Awaited,
    /// The LIST at `rv`, with `objects` in scope, is being applied.
    Listed { rv: u64, objects: usize },
    /// Applied: recorded with the next checkpoint.
    Applied(Synced),
}

fn key_of(o: &DynamicObject) -> Key {
    (o.namespace().unwrap_or_default(), o.name_any())
}

impl KindTask {
    fn now(&self) -> Duration {
        self.clock.elapsed()
    }

    fn in_scope(&self, o: &DynamicObject) -> bool {
        in_scope(&self.cfg, &self.kind, o)
    }

    pub(super) async fn run(
        mut self,
        mut rx: mpsc::Receiver<Delivery>,
        mut catchup: mpsc::Receiver<CatchUp>,
        mut stop: watch::Receiver<bool>,
    ) {
        // a probe or checkpoint slower than its period must not make its tick ready on every turn (the
        // select below is biased: it would starve catch-ups, work and deliveries)
        let mut probe = tokio::time::interval(self.cfg.probe_period);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut cp = tokio::time::interval(self.cfg.checkpoint_period);
        cp.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut prune = self.cfg.prune_period.map(|p| {
            let mut i = tokio::time::interval(p);
            i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            i
        });
        loop {
            let due = self.queue.next_due().map(|d| d.saturating_sub(self.now()));
            let (room, busy) = (self.pool.has_room(), !self.pool.is_empty());
            tokio::select! {
                // the stop first, then the periodic ticks (ready at most once a period: missed ticks
                // are delayed), catch-up requests, ended applies (before new ones: each frees a worker
                // and may queue its key again; at most `workers` of them), due work (it starts what is
                // due up to the free workers, a bounded queue), and last the deliveries, which a busy
                // source can keep ready
                biased;
                _ = stop.changed() => break,
                _ = probe.tick() => if let Err(e) = self.probe().await {
                    self.stop_with(e);
                    break;
                },
                _ = cp.tick() => self.checkpoint().await,
                _ = async { prune.as_mut().expect("guarded").tick().await }, if prune.is_some() => self.prune().await,
                Some(c) = catchup.recv() => if let Err(e) = self.catch_up(c).await {
                    self.stop_with(e);
                    break;
                },
                Some((key, out)) = self.pool.next(), if busy => self.finish(key, out),
                () = tokio::time::sleep(due.unwrap_or_default()), if due.is_some() && room && !self.hold.held() => self.start_due(),
                d = rx.recv() => match d {
                    Some(d) => if let Err(e) = self.deliver(d).await {
                        self.stop_with(e);
                        break;
                    },
                    None => break,
                },
            }
            self.advance().await;
        }
        // the applies in flight end before the task does (stop waits for the workers' requests)
        while let Some((key, out)) = self.pool.next().await {
            self.finish(key, out);
        }
        self.advance().await;
    }

    fn stop_with(&mut self, e: MirrorError) {
        warn!(kind = %self.kind, error = %e, "mirror: kind stopped");
        self.status.stopped = Some(e.to_string());
        self.publish();
    }

    async fn deliver(&mut self, d: Delivery) -> Result<(), MirrorError> {
        let now = self.now();
        match d {
            Delivery::Listed { items, rv } => {
                check_regression(&self.kind.key(), self.wm.position(), rv)?;
                self.status.lists += 1;
                self.status.last_list = Some((now, items.len()));
                let mut seen = BTreeSet::new();
                let mut objects = 0;
                for o in &items {
                    let k = key_of(o);
                    seen.insert(k.clone());
                    if self.in_scope(o) {
                        let orv = parse_rv(
                            o.metadata.resource_version.as_deref().unwrap_or(""),
                            "a listed object",
                        )?;
                        self.queue.push(k, orv, now);
                        objects += 1;
                    }
                }
                self.diff_copies(&seen, rv, now).await;
                self.wm.delivered(rv);
                if self.initial == Initial::Awaited {
                    self.initial = Initial::Listed { rv, objects };
                }
            }
            Delivery::Changed(o, v) | Delivery::Deleted(o, v) => {
                if self.in_scope(&o) {
                    self.queue.push(key_of(&o), v, now);
                }
                self.wm.delivered(v);
            }
            Delivery::Bookmark(v) => self.wm.delivered(v),
            Delivery::Resumed => self.status.resumes += 1,
            Delivery::Fatal(e) => return Err(e),
        }
        Ok(())
    }

    /// After a full LIST: copies of this source whose key the LIST lacks are queued (the worker deletes
    /// them after its GET by name); copies out of scope are counted, not touched.
    async fn diff_copies(&mut self, seen: &BTreeSet<Key>, rv: u64, now: Duration) {
        let api: Api<DynamicObject> = Api::all_with(self.sides.target.clone(), &self.sides.ar);
        let lp =
            ListParams::default().labels(&format!("{MIRRORED_FROM}={}", self.cfg.source_cluster));
        match api.list(&lp).await {
            Ok(l) => {
                let mut out = 0;
                for c in l.items {
                    let k = key_of(&c);
                    if seen.contains(&k) {
                        continue;
                    }
                    if self.in_scope(&c) {
                        self.queue.push(k, rv, now);
                    } else {
                        out += 1;
                    }
                }
                self.status.out_of_scope = out;
            }
            Err(e) => warn!(kind = %self.kind, error = %e, "mirror: listing the copies failed"),
        }
    }

    /// The prune backstop (HA.md "The mirror"): one LIST of the source; a copy in scope whose source
    /// is absent or has another uid becomes a suspect, and a suspect still so (same copy uid) a grace
    /// later is queued: the worker re-reads the source and deletes by its usual rules (GET by name,
    /// preconditions, `Orphan`). Catches a delete the watch lost.
    async fn prune(&mut self) {
        let now = self.now();
        let src: Api<DynamicObject> = Api::all_with(self.sides.source.clone(), &self.sides.ar);
        let tgt: Api<DynamicObject> = Api::all_with(self.sides.target.clone(), &self.sides.ar);
        let lp =
            ListParams::default().labels(&format!("{MIRRORED_FROM}={}", self.cfg.source_cluster));
        let (sources, copies) = match (src.list(&ListParams::default()).await, tgt.list(&lp).await)
        {
            (Ok(s), Ok(c)) => (s.items, c.items),
            (Err(e), _) | (_, Err(e)) => {
                warn!(kind = %self.kind, error = %e, "mirror: prune sweep failed; next period");
                return;
            }
        };
        let live: HashMap<Key, String> = sources
            .iter()
            .map(|o| (key_of(o), o.metadata.uid.clone().unwrap_or_default()))
            .collect();
        let mut still = BTreeMap::new();
        let (cfg, kind) = (self.cfg.clone(), self.kind.clone());
        for c in copies.iter().filter(|c| in_scope(&cfg, &kind, c)) {
            let k = key_of(c);
            let recorded = c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(super::plan::SOURCE_UID));
            if live.get(&k).is_some_and(|u| Some(u) == recorded) {
                continue;
            }
            let uid = c.metadata.uid.clone().unwrap_or_default();
            match self.suspects.get(&k) {
                Some((u, first))
                    if *u == uid && now.saturating_sub(*first) >= self.cfg.prune_grace =>
                {
                    info!(kind = %self.kind, ns = %k.0, name = %k.1, "mirror: prune backstop: the source is gone; queued");
                    self.status.prunes += 1;
                    self.queue.push(k, self.wm.position().unwrap_or(0), now);
                }
                Some((u, first)) if *u == uid => {
                    still.insert(k, (uid, *first));
                }
                _ => {
                    still.insert(k, (uid, now));
                }
            }
        }
        self.suspects = still;
        self.repair(&sources, &copies, now);
    }

    /// The reverse sweep (with the prune pass's two LISTs): a source in scope whose copy is missing, holds
    /// another version, or was changed since the mirror's own last write (someone on the Standby deleted or
    /// edited it) is queued; the worker brings it back by its usual rules. Until then the queued key holds
    /// the position below it. Only once the kind's initial LIST is applied.
    fn repair(&mut self, sources: &[DynamicObject], copies: &[DynamicObject], now: Duration) {
        if !matches!(self.initial, Initial::Recorded | Initial::Applied(_)) {
            return; // until the initial LIST is applied, it queues every object itself
        }
        let copies: HashMap<Key, &DynamicObject> = copies.iter().map(|c| (key_of(c), c)).collect();
        let src = self.ctx.source.clone();
        let mut queued = Vec::new();
        for o in sources.iter().filter(|o| self.in_scope(o)) {
            let k = key_of(o);
            let Some(orv) = o
                .metadata
                .resource_version
                .as_deref()
                .and_then(|v| parse_rv(v, "a listed object").ok())
            else {
                continue; // unparseable: the source loop's LIST stops the kind on it
            };
            let ok = copies.get(&k).is_some_and(|c| {
                let held = c
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(super::plan::SOURCE_RV));
                let same = super::rv::marker_rv(held.map(String::as_str), &src)
                    .ok()
                    .flatten()
                    .is_some_and(|h| h >= orv);
                let untouched = self
                    .last_written
                    .get(&k)
                    .is_none_or(|w| c.metadata.resource_version.as_deref() == Some(w));
                same && untouched
            });
            if !ok && !self.queue.contains(&k) {
                queued.push((k, orv));
            }
        }
        for (k, orv) in queued {
            info!(kind = %self.kind, ns = %k.0, name = %k.1, "mirror: repair: the copy is missing or not the source's; queued");
            self.status.repairs += 1;
            self.queue.push(k, orv, now);
        }
    }

    /// Start applies of the due keys while a worker is free and the mirror is not held.
    fn start_due(&mut self) {
        while self.pool.has_room() {
            let Some(writing) = self.hold.try_writing() else {
                return; // held at a token (or being held): nothing new is written
            };
            let Some(key) = self.queue.pop(self.now()) else {
                return;
            };
            let (sides, rate, ctx) = (self.sides.clone(), self.rate.clone(), self.ctx.clone());
            let (cfg, kind) = (self.cfg.clone(), self.kind.clone());
            let last = self.last_written.get(&key).cloned();
            let k = key.clone();
            self.pool.start(key, writing, async move {
                apply(&sides, &rate, &ctx, &k, last.as_deref(), |o| {
                    in_scope(&cfg, &kind, o)
                })
                .await
            });
        }
    }

    /// An apply of `key` ended.
    fn finish(&mut self, key: Key, out: Outcome) {
        let now = self.now();
        match out {
            Outcome::Applied(rv) => {
                if let Some(rv) = rv {
                    self.status.writes += 1;
                    self.last_written.insert(key.clone(), rv);
                }
                self.queue.done(&key, now);
            }
            Outcome::Gone => {
                if self.last_written.remove(&key).is_some() {
                    self.status.writes += 1;
                }
                self.queue.done(&key, now);
            }
            Outcome::Retry(e) => {
                info!(kind = %self.kind, ns = %key.0, name = %key.1, operation = e.op.label(), error = %e, "mirror: retrying");
                *self.status.errors.entry(e.op.label()).or_default() += 1;
                self.queue.retry(&key, now, e.text.clone());
                self.event_if_failed(&key, &e, now);
            }
            Outcome::Poison(e) => {
                warn!(kind = %self.kind, ns = %key.0, name = %key.1, operation = e.op.label(), error = %e, "mirror: failed object");
                *self.status.errors.entry(e.op.label()).or_default() += 1;
                self.queue.fail(&key, e.text.clone());
                self.event_if_failed(&key, &e, now);
            }
        }
    }

    /// The Warning Event of `key` when the failure `e` put it on the failed list (a change that arrived
    /// while it was in flight queues it again instead).
    fn event_if_failed(&mut self, key: &Key, e: &Failure, now: Duration) {
        if self.queue.is_failed(key) {
            let kind = self.kind.key();
            self.failures.failed(&kind, key, e.op.label(), &e.text, now);
        }
    }

    /// Catch-up to a token's version: one consistent LIST at `resourceVersion=rv` with
    /// `resourceVersionMatch=NotOlderThan` (answered even after compaction), applied as a diff like a
    /// relist; the position reaches that LIST's version once its changes are applied.
    async fn catch_up(&mut self, c: CatchUp) -> Result<(), MirrorError> {
        let rv = c.rv;
        let api: Api<DynamicObject> = Api::all_with(self.sides.source.clone(), &self.sides.ar);
        let lp = ListParams::default()
            .at(&rv.to_string())
            .matching(VersionMatch::NotOlderThan);
        match api.list(&lp).await {
            Ok(l) => {
                let v = parse_rv(
                    l.metadata.resource_version.as_deref().unwrap_or(""),
                    "a catch-up LIST",
                )?;
                info!(kind = %self.kind, token_rv = rv, list_rv = v, items = l.items.len(), "mirror: catch-up");
                self.status.catchups += 1;
                self.deliver(Delivery::Listed {
                    items: l.items,
                    rv: v,
                })
                .await?;
                if let Some(done) = c.done {
                    self.waiting.push((v, done));
                }
                Ok(())
            }
            Err(e) => {
                warn!(kind = %self.kind, error = %e, "mirror: catch-up LIST failed");
                Ok(())
            }
        }
    }

    async fn probe(&mut self) -> Result<(), MirrorError> {
        let api: Api<DynamicObject> = Api::all_with(self.sides.source.clone(), &self.sides.ar);
        let at = self.now();
        match api.list(&ListParams::default().limit(1)).await {
            Ok(l) => {
                let rv = parse_rv(
                    l.metadata.resource_version.as_deref().unwrap_or(""),
                    "a probe LIST",
                )?;
                check_regression(&self.kind.key(), self.wm.position(), rv)?;
                self.status.probed_rv = Some(rv);
                self.conf.probe(at, rv);
            }
            Err(e) => warn!(kind = %self.kind, error = %e, "mirror: probe failed"),
        }
        Ok(())
    }

    async fn advance(&mut self) {
        let pending = if planted!(WATERMARK_IGNORES_QUEUE) {
            None
        } else {
            self.queue.oldest_pending()
        };
        let pos = self.wm.advance(pending);
        let before = self.conf.confirmed();
        self.conf.passed(pos);
        self.status.position = pos;
        self.status.pending = self.queue.len();
        self.status.in_flight = self.pool.len();
        self.status.failed = self.queue.failed();
        self.status.confirmed_at = self.conf.confirmed();
        self.publish();
        self.settle_catch_ups(pos);
        self.settle_initial();
        if self.conf.confirmed() != before {
            self.report_lag().await;
        }
    }

    /// A catch-up is applied once the position reached its LIST's version and nothing but failed
    /// objects is left in the queue (the LIST queued every object, and the position alone may already
    /// have passed the version by a bookmark).
    ///
    /// With failed objects the position stays below them, so the catch-up is also applied once every
    /// change at or below its version was applied or failed: it acknowledges with the failed count, and the
    /// promotion decides (`--accept-failed`) whether to go on without them.
    fn settle_catch_ups(&mut self, pos: Option<u64>) {
        if self.waiting.is_empty() {
            return;
        }
        let failed = self.queue.failed().len();
        if self.queue.len() > failed {
            return;
        }
        let pos = pos.unwrap_or(0);
        // only failed objects are left (above), so with any of them every change at or below each
        // catch-up's version (delivered by its LIST) is applied or failed
        let (ready, rest): (Vec<_>, Vec<_>) = std::mem::take(&mut self.waiting)
            .into_iter()
            .partition(|(v, _)| pos >= *v || failed > 0);
        self.waiting = rest;
        for (_, done) in ready {
            let _ = done.send(failed);
        }
    }

    /// The initial LIST is applied once every change at or below its version was applied or put on
    /// the failed list (the watermark then passes it, unless objects failed: the record counts them).
    fn settle_initial(&mut self) {
        let Initial::Listed { rv, objects } = self.initial else {
            return;
        };
        let Some(failed) = self.queue.settled_through(rv) else {
            return;
        };
        let at = format!("{:.0}", k8s_openapi::jiff::Timestamp::now());
        info!(kind = %self.kind, list_rv = rv, objects, failed, "mirror: the initial LIST is applied (synced)");
        let s = Synced::new(self.ctx.source.cluster_source(), rv, objects, failed, at);
        self.status.synced = Some(s.clone());
        self.initial = Initial::Applied(s);
    }

    /// Write an advanced position, and with it the initial LIST's completion once applied.
    async fn checkpoint(&mut self) {
        let Some(pos) = self.wm.position() else {
            return;
        };
        let synced = match &self.initial {
            Initial::Applied(s) => Some(s.clone()),
            _ => None,
        };
        if synced.is_none() && self.status.checkpointed.is_some_and(|c| c >= pos) {
            return;
        }
        let (src, key) = (self.ctx.source.cluster_source(), self.kind.key());
        let r = edit_checkpoint(&self.sides.target, &self.cfg.ha, |d| {
            d.insert(key.clone(), position_text(&src, pos));
            if let Some(s) = &synced {
                put_synced(d, &key, s);
            }
        })
        .await;
        match r {
            Ok(()) => {
                self.status.checkpointed = Some(pos);
                if synced.is_some() {
                    self.initial = Initial::Recorded;
                }
            }
            Err(e) => warn!(kind = %self.kind, error = %e, "mirror: checkpoint write failed"),
        }
    }

    fn publish(&self) {
        if let Ok(mut m) = self.shared.lock() {
            m.insert(self.kind.key(), self.status.clone());
        }
    }

    /// The lag gate: the oldest confirmation over every kind.
    async fn report_lag(&self) {
        let Some(c) = &self.control else {
            return;
        };
        let min = self.shared.lock().ok().and_then(|m| {
            m.values()
                .map(|s| s.confirmed_at)
                .collect::<Option<Vec<_>>>()
                .and_then(|v| v.into_iter().min())
        });
        if let Some(at) = min {
            let _ = c.mirror_confirmed(at).await;
        }
    }
}
