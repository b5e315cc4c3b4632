//! The manager task of one sharded watcher: follows ownership, runs the sub-watches, keeps the index, and
//! produces the owned projection, warm reports, activation barriers and re-enqueue markers.
//!
//! It runs in its own task, so a consumer that pauses polling (for example behind `.default_backoff()`)
//! never delays warm reports or activation: output waits in a queue until the consumer takes it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures::future::AbortHandle;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::rt::Spawner;
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use super::dependent::{ChangedFn, MapShared};
use super::handover::Handover;
use super::index::{Index, Observer, Placement, Relist};
use super::mode::{FlipCause, ModeDetector, ReadMode};
use super::outq::OutQueue;
use super::plan::{self, Action, SubView};
use super::request::{ListFrom, Requests};
use super::stats::Stats;
use super::subwatch::{self, Start, SubId, SubMsg, SubWatch};
use super::types::parse_rv;
use super::types::{Out, StreamRole};
use crate::hash::ShardKey;
use crate::ownership::readers::ReaderGuard;
use crate::ownership::{Ownership, ShardState, ShardTransition};
use crate::range::{HashRange, RangeSet};
use crate::selector::ShardSelector;
use crate::shard::ShardCount;

/// Copies of the initial sync waiting for the consumer's store before [`Manager::settle`] confirms which
/// it applied (later emissions keep no copy: they move through the handover slots).
const HANDOVER_BATCH: usize = 64;

/// A user transform applied to every object before it is indexed.
pub(crate) type Transform<K> = Arc<dyn Fn(&mut K) + Send + Sync>;

/// Tunables (set through the public builder).
#[derive(Clone)]
pub(crate) struct Settings<K: Resource> {
    pub(crate) role: StreamRole,
    pub(crate) max_subwatches: usize,
    pub(crate) barrier_timeout: Duration,
    pub(crate) probe_interval: Duration,
    pub(crate) probe_max: Duration,
    pub(crate) error_interval: Duration,
    pub(crate) transform: Option<Transform<K>>,
    pub(crate) dyntype: K::DynamicType,
    pub(crate) name: String,
    /// Secondaries: place objects by the dependency-key map instead of the group key.
    pub(crate) placement: Option<Placement<K>>,
    /// Never send a `shardSelector` (the placement is not a server key): one full (or label-selected)
    /// watch, filtered locally; no re-probe.
    pub(crate) local_only: bool,
    /// Render sub-watch selectors as the `kube-shard.io/shard in (...)` label selector (the shard label
    /// strategy): exact on every apiserver, so no re-probe either.
    pub(crate) shard_label: bool,
    /// Primaries: feed this dependency-key map (every object read, warm and activation reports).
    pub(crate) feeds: Option<(Arc<MapShared>, Observer<K>)>,
    /// Secondaries placed through a dependency-key map: re-place on its changes, and report a shard warm
    /// or activated only after its primaries were (so the map already places the shard's secondaries).
    pub(crate) depends: Option<Arc<MapShared>>,
    /// What to re-place after a map change (`None`: everything).
    pub(crate) depends_changed: Option<ChangedFn>,
    /// Secondaries: told of the index's changes (a mapper's reverse edges).
    pub(crate) dep_observer: Option<Observer<K>>,
    /// Starts the sub-watches and barrier LISTs (and, in `EventStream`, the manager itself).
    pub(crate) spawner: Spawner,
}

struct Sub {
    /// The last request failed and nothing succeeded since.
    failing: bool,
    ranges: RangeSet,
    selector: Option<ShardSelector>,
    /// The version of its last (re)list, or the version it was started from: `Some` once synced.
    synced_rv: Option<String>,
    /// The newest version the manager processed for it (events, bookmarks, lists), and its exact text:
    /// re-watches (narrowing, merging, back to server mode) resume from here, never from `synced_rv`.
    passed: Option<u64>,
    passed_rv: Option<String>,
    /// Synced by a consistent LIST issued after it started (see `Barrier::first_sub`).
    consistent_synced: bool,
    abort: AbortHandle,
}

impl Sub {
    /// Where a re-watch of this sub-watch's ranges resumes, once it is synced.
    fn resume_rv(&self) -> Option<String> {
        self.synced_rv.as_ref()?;
        self.passed_rv.clone().or_else(|| self.synced_rv.clone())
    }

    /// The manager processed everything up to `rv` for this sub-watch.
    fn pass(&mut self, rv: Option<&str>) {
        if let Some(n) = parse_rv(rv) {
            if self.passed.is_none_or(|p| n > p) {
                self.passed = Some(n);
                self.passed_rv = rv.map(str::to_owned);
            }
        }
    }
}

struct Barrier {
    epoch: u64,
    target: Option<u64>,
    deadline: Option<Instant>,
    targeted: bool,
    /// The first sub-watch started after this barrier: such a sub-watch's LIST was issued after the
    /// activation was seen, so once it is synced by a consistent LIST it has passed the barrier by itself
    /// (a `limit=1` version would only add a wait for a bookmark on a quiet collection).
    first_sub: SubId,
}

enum Ctl<K> {
    BarrierVersion {
        shard: u32,
        epoch: u64,
        rv: Option<u64>,
    },
    BarrierListed {
        shard: u32,
        epoch: u64,
        objects: Vec<K>,
        rv: Option<u64>,
    },
    Probe {
        filtered: Option<bool>,
    },
    /// A consistent LIST of everything (local-only secondaries): settles every barrier in `barriers`.
    FullListed {
        barriers: Vec<(u32, u64)>,
        objects: Vec<K>,
        rv: Option<u64>,
    },
}

pub(crate) struct Manager<K: Resource> {
    client: Client,
    requests: Arc<Requests>,
    ownership: Ownership,
    key: ShardKey,
    count: ShardCount,
    settings: Settings<K>,
    stats: Arc<Stats>,
    detector: ModeDetector,
    index: Index<K>,
    subs: BTreeMap<SubId, Sub>,
    next_id: SubId,
    sub_tx: mpsc::Sender<SubMsg<K>>,
    sub_rx: mpsc::Receiver<SubMsg<K>>,
    ctl_tx: mpsc::Sender<Ctl<K>>,
    ctl_rx: mpsc::Receiver<Ctl<K>>,
    /// Output waiting for the consumer, coalesced per object (see `outq`).
    outq: OutQueue<K>,
    out: mpsc::Sender<Out<K>>,
    reader: ReaderGuard,
    /// The shards read now, and the ranges they make.
    read: BTreeSet<u32>,
    want: RangeSet,
    incoming: BTreeMap<u32, u64>,
    incoming_since: BTreeMap<(u32, u64), Instant>,
    warm_reported: BTreeSet<(u32, u64)>,
    barriers: BTreeMap<u32, Barrier>,
    reenqueue_wait: BTreeSet<u32>,
    probing: bool,
    serving_dirty: bool,
    last_error_item: Option<Instant>,
    /// The dependency-map version the index was last re-placed at.
    dep_seen: u64,
}

impl<K> Manager<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Clone + Send + Sync + Eq + std::hash::Hash,
{
    /// Where this manager starts its tasks.
    pub(crate) fn spawner(&self) -> Spawner {
        self.settings.spawner.clone()
    }

    pub(crate) fn new(
        client: Client,
        requests: Requests,
        ownership: Ownership,
        settings: Settings<K>,
        stats: Arc<Stats>,
        out: mpsc::Sender<Out<K>>,
        store: Option<(Store<K>, Arc<Handover<K>>)>,
    ) -> Self {
        let config = ownership.config().clone();
        let (sub_tx, sub_rx) = mpsc::channel(256);
        let (ctl_tx, ctl_rx) = mpsc::channel(64);
        let reader = ownership.register_reader();
        Manager {
            client,
            requests: Arc::new(requests),
            key: config.key,
            count: config.shards,
            detector: ModeDetector::new(settings.probe_interval, settings.probe_max),
            index: match store {
                Some((store, handover)) => {
                    // one reference reused for every read (its type is cloned once, not per read)
                    let probe =
                        std::sync::Mutex::new(ObjectRef::new_with("", settings.dyntype.clone()));
                    Index::with_store(
                        config.key,
                        config.shards,
                        Box::new(move |(ns, name)| {
                            let mut r = probe.lock().unwrap_or_else(|p| p.into_inner());
                            r.name.clear();
                            r.name.push_str(name);
                            match (ns, r.namespace.as_mut()) {
                                (Some(ns), Some(held)) => {
                                    held.clear();
                                    held.push_str(ns);
                                }
                                (Some(ns), None) => r.namespace = Some(ns.to_string()),
                                (None, _) => r.namespace = None,
                            }
                            store.get(&r)
                        }),
                        handover,
                    )
                }
                None => Index::new(config.key, config.shards),
            },
            ownership,
            settings,
            stats,
            subs: BTreeMap::new(),
            next_id: 1,
            sub_tx,
            sub_rx,
            ctl_tx,
            ctl_rx,
            outq: OutQueue::default(),
            out,
            reader,
            read: BTreeSet::new(),
            want: RangeSet::new(),
            incoming: BTreeMap::new(),
            incoming_since: BTreeMap::new(),
            warm_reported: BTreeSet::new(),
            barriers: BTreeMap::new(),
            reenqueue_wait: BTreeSet::new(),
            probing: false,
            serving_dirty: true,
            last_error_item: None,
            dep_seen: 0,
        }
        .with_dependencies()
    }

    fn with_dependencies(mut self) -> Self {
        if let Some(p) = self.settings.placement.clone() {
            self.index.set_placement(p);
        }
        match (
            self.settings.feeds.clone(),
            self.settings.dep_observer.clone(),
        ) {
            (Some((_, a)), Some(b)) => self.index.set_observer(Arc::new(move |c| {
                a(c);
                b(c);
            })),
            (Some((_, a)), None) | (None, Some(a)) => self.index.set_observer(a),
            (None, None) => {}
        }
        if self.settings.local_only {
            // not a flip: this resource is never read with a shard selector
            self.detector
                .fall_back(FlipCause::OutOfRange, Instant::now());
            self.stats.fallback.store(true, Ordering::Relaxed);
        }
        self
    }

    fn probes_enabled(&self) -> bool {
        !self.settings.local_only && !self.settings.shard_label
    }

    /// Whether the primaries of `shard` were read for move `move_id` (always, without a map).
    fn gate_warm(&self, shard: u32, move_id: u64) -> bool {
        self.settings.depends.as_ref().is_none_or(|m| {
            m.warm_at(shard, move_id)
                .is_some_and(|v| v <= self.dep_seen)
        })
    }

    fn gate_activated(&self, shard: u32, epoch: u64) -> bool {
        self.settings.depends.as_ref().is_none_or(|m| {
            m.activated_at(shard, epoch)
                .is_some_and(|v| v <= self.dep_seen)
        })
    }

    fn report_warm(&self, shard: u32, move_id: u64) {
        if let Some((map, _)) = &self.settings.feeds {
            map.primary_warm(shard, move_id);
        }
        self.reader.report_warm(shard, move_id);
    }

    fn report_activated(&self, shard: u32, epoch: u64) {
        if let Some((map, _)) = &self.settings.feeds {
            map.primary_activated(shard, epoch);
        }
        self.reader.report_activated(shard, epoch);
    }

    /// The dependency-key map changed: re-place every held object, then re-check progress.
    fn on_dependencies(&mut self, version: u64) {
        let changed = self
            .settings
            .depends_changed
            .as_ref()
            .and_then(|f| f(self.dep_seen));
        self.dep_seen = version;
        match changed {
            Some(keys) => self.index.replace_keys(&keys),
            None => self.index.replace_all(),
        }
        self.check_progress();
    }

    pub(crate) async fn run(mut self) {
        let mut changed = self.ownership.changed();
        let mut transitions = self.ownership.transitions();
        let mut deps = self.settings.depends.as_ref().map(|m| m.subscribe());
        if let Some(rx) = deps.as_mut() {
            let v = *rx.borrow_and_update();
            self.on_dependencies(v);
        }
        self.on_ownership();
        loop {
            self.settle();
            let timer = self.next_timer();
            let out = self.out.clone();
            tokio::select! {
                biased; // the consumer's end first; each message branch drains a queue that empties
                _ = out.closed() => break,
                Some(msg) = self.sub_rx.recv() => self.on_sub(msg),
                Some(ctl) = self.ctl_rx.recv() => self.on_ctl(ctl),
                r = changed.changed() => {
                    if r.is_err() {
                        break;
                    }
                    self.on_ownership();
                }
                Some(t) = transitions.next_transition() => self.on_transition(t),
                permit = out.reserve(), if !self.outq.is_empty() => match permit {
                    Ok(permit) => {
                        if let Some(item) = self.outq.pop() {
                            permit.send(item);
                        }
                    }
                    Err(_) => break,
                },
                () = sleep_until(timer), if timer.is_some() => self.on_timer(),
                v = dep_changed(deps.as_mut()) => match v {
                    Some(v) => self.on_dependencies(v),
                    None => deps = None,
                },
            }
        }
        for sub in self.subs.values() {
            sub.abort.abort();
        }
        if let Some((map, _)) = &self.settings.feeds {
            // what this index held is no longer known: a new feeding watcher starts from nothing
            map.clear();
        }
        debug!(watcher = %self.settings.name, "sharded watcher stopped: its stream was dropped");
    }

    // === ownership ===

    fn on_ownership(&mut self) {
        let snap = self.ownership.snapshot();
        let mut read = BTreeSet::new();
        let mut projected = Vec::new();
        let mut incoming = BTreeMap::new();
        let mut activating = BTreeMap::new();
        for (shard, state) in snap.state().shards() {
            read.insert(shard);
            match state {
                ShardState::Incoming { move_id, warm } => {
                    if !warm {
                        incoming.insert(shard, move_id);
                    }
                    if self.settings.role == StreamRole::Secondary {
                        projected.push(shard);
                    }
                }
                ShardState::Activating { epoch } => {
                    activating.insert(shard, epoch);
                    // a re-grant of a shard projected until now (a move cancelled while Draining, a new
                    // epoch for its owner) stays projected: no Delete-then-Apply of the whole shard in
                    // the store; admission waits for the activation either way
                    if self.settings.role == StreamRole::Secondary || self.index.is_projected(shard)
                    {
                        projected.push(shard);
                    }
                }
                ShardState::Owned { .. } | ShardState::Outgoing { .. } => projected.push(shard),
            }
        }
        // barriers: forget stale ones, start new ones
        self.barriers
            .retain(|s, b| activating.get(s) == Some(&b.epoch));
        for (shard, epoch) in &activating {
            if planted!(SKIP_ACTIVATION_BARRIER) {
                self.report_activated(*shard, *epoch);
                continue;
            }
            if !self.barriers.contains_key(shard) {
                self.barriers.insert(
                    *shard,
                    Barrier {
                        epoch: *epoch,
                        target: None,
                        deadline: None,
                        targeted: false,
                        first_sub: self.next_id,
                    },
                );
                self.start_barrier(*shard, *epoch);
            }
        }
        self.warm_reported
            .retain(|(s, m)| incoming.get(s) == Some(m));
        self.reader
            .retain(|s| incoming.contains_key(&s) || activating.contains_key(&s));
        let now = Instant::now();
        self.incoming_since
            .retain(|(s, m), _| incoming.get(s) == Some(m));
        for (s, m) in &incoming {
            self.incoming_since.entry((*s, *m)).or_insert(now);
        }
        self.incoming = incoming;
        self.reenqueue_wait.retain(|s| read.contains(s));
        let want = self
            .count
            .ranges_of(read.iter().copied())
            .unwrap_or_default();
        self.read = read;
        let previous = std::mem::replace(&mut self.want, want);
        self.replan(Some(previous));
        self.index.set_projected(projected);
        self.stats
            .projected_shards
            .store(self.index_projected_shards(), Ordering::Relaxed);
        self.check_progress();
    }

    fn index_projected_shards(&self) -> u64 {
        (0..self.count.get())
            .filter(|s| self.index.is_projected(*s))
            .count() as u64
    }

    fn on_transition(&mut self, t: ShardTransition) {
        if t.is_reenqueue() && self.settings.role == StreamRole::Primary {
            self.reenqueue_wait.insert(t.shard);
        }
    }

    // === sub-watches ===

    fn replan(&mut self, previous: Option<RangeSet>) {
        match self.detector.mode() {
            ReadMode::Fallback => {
                if !self.subs.values().any(|s| s.selector.is_none()) {
                    self.stop_all();
                    self.spawn_sub(RangeSet::full(), None, Start::List);
                }
            }
            ReadMode::Server => {
                let views: Vec<SubView> = self
                    .subs
                    .iter()
                    .map(|(id, s)| SubView {
                        id: *id,
                        ranges: s.ranges.clone(),
                        resume_rv: s.resume_rv(),
                    })
                    .collect();
                let actions =
                    plan::plan(self.key, &self.want, &views, self.settings.max_subwatches);
                for action in actions {
                    match action {
                        Action::Stop(ids) => {
                            for id in ids {
                                self.stop_sub(id);
                            }
                        }
                        Action::Start {
                            replaces,
                            ranges,
                            start,
                        } => {
                            for id in replaces {
                                self.stop_sub(id);
                            }
                            match ShardSelector::new(self.key, &ranges) {
                                Ok(sel) => self.spawn_sub(ranges, Some(sel), start),
                                Err(err) => {
                                    // cannot happen: the planner splits long range sets
                                    error!(error = %err, "cannot build a selector: falling back");
                                    self.fall_back(FlipCause::InvalidSelector);
                                    return;
                                }
                            }
                        }
                    }
                }
                if let Some(previous) = previous {
                    let dropped = previous.difference(&self.want);
                    if !dropped.is_empty() {
                        self.index.drop_ranges(&dropped);
                    }
                }
            }
        }
        self.stats
            .subwatches
            .store(self.subs.len() as u64, Ordering::Relaxed);
        self.serving_dirty = true;
    }

    fn spawn_sub(&mut self, ranges: RangeSet, selector: Option<ShardSelector>, start: Start) {
        let id = self.next_id;
        self.next_id += 1;
        let synced_rv = match &start {
            Start::Watch(rv) => Some(rv.clone()),
            Start::List => None,
        };
        if start == Start::List {
            self.stats.lists.fetch_add(1, Ordering::Relaxed);
        }
        self.stats.subwatch_starts.fetch_add(1, Ordering::Relaxed);
        debug!(
            id,
            selector = selector
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            ?start,
            "starting sub-watch"
        );
        // a shard activating now: this sub-watch's first LIST doubles as its barrier
        let consistent_first_list = start == Start::List && !self.barriers.is_empty();
        let task = SubWatch {
            id,
            selector: selector.clone(),
            start,
            consistent_first_list,
            requests: self.requests.clone(),
            client: self.client.clone(),
            tx: self.sub_tx.clone(),
            _marker: std::marker::PhantomData,
        };
        let (run, abort) = futures::future::abortable(task.run());
        self.settings.spawner.spawn(async move {
            let _ = run.await;
        });
        self.subs.insert(
            id,
            Sub {
                failing: false,
                ranges,
                selector,
                passed: parse_rv(synced_rv.as_deref()),
                passed_rv: synced_rv.clone(),
                synced_rv,
                consistent_synced: false,
                abort,
            },
        );
    }

    fn stop_sub(&mut self, id: SubId) {
        if let Some(sub) = self.subs.remove(&id) {
            sub.abort.abort();
        }
    }

    fn stop_all(&mut self) {
        let ids: Vec<SubId> = self.subs.keys().copied().collect();
        for id in ids {
            self.stop_sub(id);
        }
    }

    fn fall_back(&mut self, cause: FlipCause) {
        if cause == FlipCause::InvalidSelector {
            self.stats
                .invalid_selector_alarms
                .fetch_add(1, Ordering::Relaxed);
            error!(
                watcher = %self.settings.name,
                "ALARM: the server refused a shard selector kube-shard considers valid; reading in fallback mode"
            );
        }
        if self.detector.fall_back(cause, Instant::now()) {
            warn!(watcher = %self.settings.name, ?cause, "server does not filter by shardSelector: fallback mode");
            self.stats.mode_flips.fetch_add(1, Ordering::Relaxed);
            self.stats.fallback.store(true, Ordering::Relaxed);
            self.stop_all();
            self.replan(None);
        }
    }

    fn back_to_server(&mut self) {
        // the full watch has read everything up to its version: narrow it, no LIST
        let full = self
            .subs
            .iter()
            .find(|(_, s)| s.selector.is_none())
            .map(|(id, s)| (*id, s.resume_rv()));
        let Some((full_id, Some(rv))) = full else {
            return;
        };
        info!(watcher = %self.settings.name, "server filters by shardSelector again: server mode");
        self.stats.fallback.store(false, Ordering::Relaxed);
        self.stop_sub(full_id);
        if !self.want.is_empty() {
            let ranges = self.want.clone();
            for piece in plan::split(self.key, &ranges) {
                if let Ok(sel) = ShardSelector::new(self.key, &piece) {
                    self.spawn_sub(piece, Some(sel), Start::Watch(rv.clone()));
                }
            }
        }
        self.index
            .drop_ranges(&RangeSet::full().difference(&self.want));
        self.stats
            .subwatches
            .store(self.subs.len() as u64, Ordering::Relaxed);
    }

    fn on_sub(&mut self, msg: SubMsg<K>) {
        match msg {
            SubMsg::Listed {
                id,
                objects,
                rv,
                shard_info,
                consistent,
            } => {
                let Some(sub) = self.subs.get(&id) else {
                    return;
                };
                self.stats
                    .objects_received
                    .fetch_add(objects.len() as u64, Ordering::Relaxed);
                self.count_unwanted(&objects);
                let (filtered, ranges, passed) =
                    (sub.selector.is_some(), sub.ranges.clone(), sub.passed);
                if filtered && self.out_of_range(&ranges, &objects) {
                    return;
                }
                let _ = shard_info; // evidence of filtering; the data already said so
                let rv_n = parse_rv(rv.as_deref());
                if let (Some(new), Some(seen)) = (rv_n, passed) {
                    if new < seen {
                        debug!(
                            id,
                            new, seen, "ignoring a relist older than what this sub-watch saw"
                        );
                        return;
                    }
                }
                let objects = self.transformed(objects);
                self.index.relist(Relist {
                    ranges,
                    objects,
                    rv: rv_n,
                });
                if let Some(sub) = self.subs.get_mut(&id) {
                    sub.pass(rv.as_deref());
                    sub.synced_rv = rv;
                    sub.consistent_synced |= consistent;
                    sub.failing = false;
                }
                self.serving_dirty = true;
                // a newly synced sub-watch may make merging possible
                self.replan(None);
            }
            SubMsg::Applied { id, obj, rv } | SubMsg::Deleted { id, obj, rv }
                if !self.subs.contains_key(&id) =>
            {
                let _ = (obj, rv);
            }
            SubMsg::Applied { id, obj, rv } => {
                self.stats.objects_received.fetch_add(1, Ordering::Relaxed);
                self.count_unwanted(std::slice::from_ref(&obj));
                let Some(sub) = self.subs.get(&id) else {
                    return;
                };
                let (filtered, ranges) = (sub.selector.is_some(), sub.ranges.clone());
                if filtered && self.out_of_range(&ranges, std::slice::from_ref(&obj)) {
                    return;
                }
                let mut obj = obj;
                if let Some(f) = &self.settings.transform {
                    f(&mut obj);
                }
                self.index.upsert_event(obj);
                self.advance(id, rv.as_deref());
            }
            SubMsg::Deleted { id, obj, rv } => {
                self.stats.objects_received.fetch_add(1, Ordering::Relaxed);
                self.count_unwanted(std::slice::from_ref(&obj));
                let Some(sub) = self.subs.get(&id) else {
                    return;
                };
                let (filtered, ranges) = (sub.selector.is_some(), sub.ranges.clone());
                if filtered && self.out_of_range(&ranges, std::slice::from_ref(&obj)) {
                    return;
                }
                self.index.delete(obj);
                self.advance(id, rv.as_deref());
            }
            SubMsg::Progress { id, rv } => self.advance(id, Some(&rv)),
            SubMsg::Failed {
                id,
                error,
                invalid_selector,
            } => {
                if !self.subs.contains_key(&id) {
                    return;
                }
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                if let Some(sub) = self.subs.get_mut(&id) {
                    sub.failing = true;
                }
                self.serving_dirty = true;
                if invalid_selector {
                    self.fall_back(FlipCause::InvalidSelector);
                }
                self.error_item(format!("sub-watch {id} failed (retrying): {error}"));
            }
        }
        self.check_progress();
    }

    /// Count received objects outside the wanted ranges (the read amplification of fallback mode).
    fn count_unwanted(&self, objects: &[K]) {
        let unwanted = objects
            .iter()
            .filter(|o| {
                self.index
                    .hash_of(o)
                    .is_some_and(|h| !self.want.contains(h))
            })
            .count();
        if unwanted > 0 {
            self.stats
                .objects_unwanted
                .fetch_add(unwanted as u64, Ordering::Relaxed);
        }
    }

    /// Whether any object lies outside what `sub` asked for; if so, fall back.
    fn out_of_range(&mut self, ranges: &RangeSet, objects: &[K]) -> bool {
        if self.settings.shard_label {
            // label selectors are exact on every apiserver; a watch reports an object whose label left the
            // selection as DELETED with its new label, which is not evidence of anything
            return false;
        }
        let outside = objects
            .iter()
            .filter(|o| self.index.hash_of(o).is_some_and(|h| !ranges.contains(h)))
            .count();
        if outside > 0 {
            self.stats
                .dropped_out_of_range
                .fetch_add(outside as u64, Ordering::Relaxed);
            self.fall_back(FlipCause::OutOfRange);
            true
        } else {
            false
        }
    }

    fn transformed(&self, mut objects: Vec<K>) -> Vec<K> {
        if let Some(f) = &self.settings.transform {
            for o in &mut objects {
                f(o);
            }
        }
        objects
    }

    fn advance(&mut self, id: SubId, rv: Option<&str>) {
        if let Some(sub) = self.subs.get_mut(&id) {
            if sub.failing {
                sub.failing = false;
                self.serving_dirty = true;
            }
            sub.pass(rv);
        }
    }

    /// Publish the shards served now: read by a synced sub-watch that is not failing.
    fn publish_serving(&self) {
        let serving: BTreeSet<u32> = self
            .read
            .iter()
            .copied()
            .filter(|s| self.covering(*s).is_some_and(|sub| !sub.failing))
            .collect();
        self.reader.set_serving(serving);
    }

    // === warm, barrier ===

    fn shard_range(&self, shard: u32) -> Option<HashRange> {
        self.count.range_of(shard).ok()
    }

    /// The synced sub-watch that reads `shard`, if any.
    fn covering(&self, shard: u32) -> Option<&Sub> {
        self.covering_entry(shard).map(|(_, sub)| sub)
    }

    /// The synced sub-watch whose ranges hold `shard`, with its id.
    fn covering_entry(&self, shard: u32) -> Option<(SubId, &Sub)> {
        let range: RangeSet = std::iter::once(self.shard_range(shard)?).collect();
        self.subs
            .iter()
            .find(|(_, s)| s.synced_rv.is_some() && range.is_subset(&s.ranges))
            .map(|(id, s)| (*id, s))
    }

    /// The sub-watch reading `shard` has passed its barrier: the `limit=1` version, or a consistent LIST
    /// of its own issued after the activation was seen.
    fn covering_passed(&self, shard: u32, b: &Barrier) -> bool {
        self.covering_entry(shard).is_some_and(|(id, sub)| {
            (b.target.is_some() && sub.passed >= b.target)
                || (sub.consistent_synced && id >= b.first_sub)
        })
    }

    fn check_progress(&mut self) {
        let warm: Vec<(u32, u64)> = self
            .incoming
            .iter()
            .map(|(s, m)| (*s, *m))
            .filter(|(s, m)| {
                !self.warm_reported.contains(&(*s, *m))
                    && self.covering(*s).is_some()
                    && self.gate_warm(*s, *m)
            })
            .collect();
        for (shard, move_id) in warm {
            self.warm_reported.insert((shard, move_id));
            self.stats.warm_reports.fetch_add(1, Ordering::Relaxed);
            if let Some(since) = self.incoming_since.get(&(shard, move_id)) {
                let ms = since.elapsed().as_millis().min(u128::from(u64::MAX)) as u64;
                self.stats.warm_latency_ms.fetch_add(ms, Ordering::Relaxed);
            }
            self.report_warm(shard, move_id);
        }
        let passed: Vec<(u32, u64)> = self
            .barriers
            .iter()
            .filter(|(s, b)| self.covering_passed(**s, b) && self.gate_activated(**s, b.epoch))
            .map(|(s, b)| (*s, b.epoch))
            .collect();
        for (shard, epoch) in passed {
            self.barriers.remove(&shard);
            self.stats.activations.fetch_add(1, Ordering::Relaxed);
            self.report_activated(shard, epoch);
        }
    }

    /// The selector of a barrier LIST: the shard's range in server mode; none in fallback mode (the
    /// server may refuse or ignore selectors; the result is filtered locally either way).
    fn barrier_selector(&self, range: HashRange) -> Option<ShardSelector> {
        match self.detector.mode() {
            ReadMode::Server => {
                ShardSelector::new(self.key, &std::iter::once(range).collect()).ok()
            }
            ReadMode::Fallback => None,
        }
    }

    /// What the barrier LISTs, which run on tasks of their own, need from the manager.
    fn lister(&self) -> Lister {
        Lister {
            client: self.client.clone(),
            requests: self.requests.clone(),
            stats: self.stats.clone(),
        }
    }

    fn start_barrier(&self, shard: u32, epoch: u64) {
        let Some(range) = self.shard_range(shard) else {
            return;
        };
        let selector = self.barrier_selector(range);
        let lister = self.lister();
        let tx = self.ctl_tx.clone();
        self.settings.spawner.spawn(async move {
            let listed = lister
                .list_retrying::<serde_json::Value>(
                    selector,
                    ListFrom::Consistent,
                    Some(1),
                    || tx.is_closed(),
                    "barrier version",
                )
                .await;
            if let Some(l) = listed {
                let rv = parse_rv(l.resource_version.as_deref());
                let _ = tx.send(Ctl::BarrierVersion { shard, epoch, rv }).await;
            }
        });
    }

    fn start_targeted_list(&self, shard: u32, epoch: u64, from: ListFrom) {
        let Some(range) = self.shard_range(shard) else {
            return;
        };
        let selector = self.barrier_selector(range);
        let lister = self.lister();
        let tx = self.ctl_tx.clone();
        self.stats.targeted_lists.fetch_add(1, Ordering::Relaxed);
        self.settings.spawner.spawn(async move {
            let listed = lister
                .list_retrying::<K>(selector, from, None, || tx.is_closed(), "targeted barrier")
                .await;
            if let Some(l) = listed {
                let rv = parse_rv(l.resource_version.as_deref());
                let _ = tx
                    .send(Ctl::BarrierListed {
                        shard,
                        epoch,
                        objects: l.items,
                        rv,
                    })
                    .await;
            }
        });
    }

    fn start_full_list(&self, barriers: Vec<(u32, u64)>, from: ListFrom) {
        let lister = self.lister();
        let tx = self.ctl_tx.clone();
        self.stats.targeted_lists.fetch_add(1, Ordering::Relaxed);
        self.settings.spawner.spawn(async move {
            let listed = lister
                .list_retrying::<K>(None, from, None, || tx.is_closed(), "collection barrier")
                .await;
            if let Some(l) = listed {
                let rv = parse_rv(l.resource_version.as_deref());
                let _ = tx
                    .send(Ctl::FullListed {
                        barriers,
                        objects: l.items,
                        rv,
                    })
                    .await;
            }
        });
    }

    fn start_probe(&mut self) {
        if self.probing {
            return;
        }
        self.probing = true;
        self.stats.probes.fetch_add(1, Ordering::Relaxed);
        // a valid but tiny range: a filtering server returns (almost surely) nothing
        let Ok(range) = HashRange::new(0, 1) else {
            return;
        };
        let selector = ShardSelector::new(self.key, &std::iter::once(range).collect()).ok();
        let client = self.client.clone();
        let requests = self.requests.clone();
        let tx = self.ctl_tx.clone();
        let known_nonempty = self.index.len() > 0;
        self.settings.spawner.spawn(async move {
            let filtered = match subwatch::list_all::<serde_json::Value>(
                &client,
                &requests,
                selector.as_ref(),
                &ListFrom::Consistent,
                Some(1),
            )
            .await
            {
                Ok(l) if l.shard_info.is_some() => Some(true),
                Ok(l) if !l.items.is_empty() => Some(false),
                Ok(_) if known_nonempty => Some(true),
                Ok(_) => None,
                Err(err) if subwatch::is_invalid_selector(&err) => Some(false),
                Err(_) => None,
            };
            let _ = tx.send(Ctl::Probe { filtered }).await;
        });
    }

    fn on_ctl(&mut self, ctl: Ctl<K>) {
        match ctl {
            Ctl::BarrierVersion { shard, epoch, rv } => {
                if let Some(b) = self.barriers.get_mut(&shard) {
                    if b.epoch == epoch {
                        // an unparseable version cannot be compared: list the shard instead
                        b.target = Some(rv.unwrap_or(u64::MAX));
                        b.deadline = Some(Instant::now() + self.settings.barrier_timeout);
                        if rv.is_none() {
                            b.deadline = Some(Instant::now());
                        }
                    }
                }
            }
            Ctl::BarrierListed {
                shard,
                epoch,
                objects,
                rv,
            } => {
                let Some(range) = self.shard_range(shard) else {
                    return;
                };
                if self.barriers.get(&shard).is_none_or(|b| b.epoch != epoch) {
                    return;
                }
                let ranges: RangeSet = std::iter::once(range).collect();
                // the server may not filter: keep only the shard's objects
                let objects = self.transformed(objects);
                let objects: Vec<K> = objects
                    .into_iter()
                    .filter(|o| self.index.placed_in(o, &range))
                    .collect();
                self.index.relist(Relist {
                    ranges,
                    objects,
                    rv,
                });
                if self.gate_activated(shard, epoch) {
                    self.barriers.remove(&shard);
                    self.stats.activations.fetch_add(1, Ordering::Relaxed);
                    self.report_activated(shard, epoch);
                } else if let Some(b) = self.barriers.get_mut(&shard) {
                    // read; its primaries are not yet: check_progress reports it once they are
                    b.target = Some(0);
                }
            }
            Ctl::FullListed {
                barriers,
                objects,
                rv,
            } => {
                // the mode may have flipped back to server while it listed: hold only what is read then
                let ranges =
                    if self.settings.local_only || self.detector.mode() == ReadMode::Fallback {
                        RangeSet::full()
                    } else {
                        self.want.clone()
                    };
                let objects: Vec<K> = self
                    .transformed(objects)
                    .into_iter()
                    .filter(|o| {
                        ranges.is_full()
                            || self.index.hash_of(o).is_some_and(|h| ranges.contains(h))
                    })
                    .collect();
                self.index.relist(Relist {
                    ranges,
                    objects,
                    rv,
                });
                for (shard, epoch) in barriers {
                    if self.barriers.get(&shard).is_none_or(|b| b.epoch != epoch) {
                        continue;
                    }
                    if self.gate_activated(shard, epoch) {
                        self.barriers.remove(&shard);
                        self.stats.activations.fetch_add(1, Ordering::Relaxed);
                        self.report_activated(shard, epoch);
                    } else if let Some(b) = self.barriers.get_mut(&shard) {
                        b.target = Some(0);
                    }
                }
            }
            Ctl::Probe { filtered } => {
                self.probing = false;
                let now = Instant::now();
                match filtered {
                    Some(filtered) => {
                        if self.detector.probed(filtered, now) {
                            self.back_to_server();
                        }
                    }
                    None => {
                        self.detector.probed(false, now);
                    }
                }
            }
        }
        self.check_progress();
    }

    // === timers ===

    fn next_timer(&self) -> Option<Instant> {
        let barrier = self
            .barriers
            .values()
            .filter(|b| !b.targeted)
            .filter_map(|b| b.deadline)
            .min();
        let probe = (!self.probing && self.probes_enabled())
            .then(|| self.detector.next_probe())
            .flatten();
        // copies handed to the consumer's store are dropped once it applied them
        let handover = self
            .index
            .has_pending_handover()
            .then(|| Instant::now() + Duration::from_millis(500));
        [barrier, probe, handover].into_iter().flatten().min()
    }

    fn on_timer(&mut self) {
        self.index.confirm_handover();
        let now = Instant::now();
        let due: Vec<(u32, u64, u64)> = self
            .barriers
            .iter()
            .filter(|(_, b)| !b.targeted && b.deadline.is_some_and(|d| d <= now))
            .filter_map(|(s, b)| b.target.map(|t| (*s, b.epoch, t)))
            .collect();
        let full_watch = self.settings.local_only || self.detector.mode() == ReadMode::Fallback;
        if full_watch && !due.is_empty() {
            // one full watch reads every shard, and a barrier LIST without a selector lists the whole
            // collection: one LIST settles every barrier whose target is known — due or not (a takeover
            // of many shards costs one LIST, not one per shard)
            let batch: Vec<(u32, u64, u64)> = self
                .barriers
                .iter()
                .filter(|(_, b)| !b.targeted)
                .filter_map(|(s, b)| b.target.map(|t| (*s, b.epoch, t)))
                .collect();
            for (shard, _, _) in &batch {
                if let Some(b) = self.barriers.get_mut(shard) {
                    b.targeted = true;
                }
            }
            let from = barrier_list_from(batch.iter().map(|(_, _, t)| *t));
            self.start_full_list(batch.iter().map(|(s, e, _)| (*s, *e)).collect(), from);
        } else {
            for (shard, epoch, target) in due {
                if let Some(b) = self.barriers.get_mut(&shard) {
                    b.targeted = true;
                }
                self.start_targeted_list(shard, epoch, barrier_list_from([target]));
            }
        }
        if self.probes_enabled() && self.detector.probe_due(now) {
            self.start_probe();
        }
    }

    // === output ===

    /// Move the index's events to the output queue, then any re-enqueue markers that are now due, and emit
    /// the initial sync once every sub-watch has synced.
    fn settle(&mut self) {
        if !self.index.is_initialized() && self.subs.values().all(|s| s.synced_rv.is_some()) {
            self.index.initialize();
            self.stats.initialized.store(true, Ordering::Relaxed);
        }
        // the initial sync's copies: a confirmation reads the consumer's store, and the first copy it finds
        // not applied yet ends it (kube's store shows none until the sync is done): confirm once a batch
        // waits, not after every event (the handover timer confirms the rest once the stream goes quiet)
        if self.index.pending_handover() >= HANDOVER_BATCH {
            self.index.confirm_handover();
        }
        while let Some(item) = self.index.pop() {
            self.outq.push(item);
        }
        if !self.index.is_initialized() {
            return;
        }
        // a marker waits until a synced sub-watch covers its shard: before that the index may not hold the
        // shard's objects yet, and an empty marker taken now would be lost for them
        let due: Vec<u32> = self
            .reenqueue_wait
            .iter()
            .copied()
            .filter(|s| self.index.is_projected(*s) && self.covering(*s).is_some())
            .collect();
        for shard in due {
            self.reenqueue_wait.remove(&shard);
            let refs: Vec<ObjectRef<K>> = self
                .index
                .projected_refs_of(shard)
                .into_iter()
                .map(|(ns, name)| {
                    let r = ObjectRef::new_with(&name, self.settings.dyntype.clone());
                    match ns {
                        Some(ns) => r.within(&ns),
                        None => r,
                    }
                })
                .collect();
            if !refs.is_empty() {
                self.stats
                    .reenqueued
                    .fetch_add(refs.len() as u64, Ordering::Relaxed);
                self.outq.push(Out::Reenqueue(refs));
            }
        }
        if self.serving_dirty {
            self.serving_dirty = false;
            self.publish_serving();
        }
        // a tombstone every sub-watch has passed can never be replayed again
        if let Some(passed) = self.subs.values().map(|s| s.passed).min().flatten() {
            self.index.prune_tombstones(Some(passed));
        }
        self.stats
            .indexed
            .store(self.index.len() as u64, Ordering::Relaxed);
        self.stats
            .handed_over
            .store(self.index.handed_over() as u64, Ordering::Relaxed);
        self.stats
            .projected
            .store(self.index.projected_len() as u64, Ordering::Relaxed);
    }

    fn error_item(&mut self, message: String) {
        let now = Instant::now();
        if self
            .last_error_item
            .is_some_and(|t| now.duration_since(t) < self.settings.error_interval)
        {
            return;
        }
        self.last_error_item = Some(now);
        self.outq.push(Out::Error(watcher::Error::WatchFailed(
            kube::Error::Service(message.into()),
        )));
    }
}

/// The next version of a dependency-key map (`None` once it is gone; pending without one).
async fn dep_changed(rx: Option<&mut tokio::sync::watch::Receiver<u64>>) -> Option<u64> {
    match rx {
        Some(rx) => match rx.changed().await {
            Ok(()) => Some(*rx.borrow_and_update()),
            Err(_) => None,
        },
        None => futures::future::pending().await,
    }
}

/// Where a barrier LIST reads from: not older than every target, or a consistent read when a target is
/// unknown (an unparseable version, `u64::MAX`) — never `resourceVersion=0`, which any cached state
/// satisfies.
fn barrier_list_from(targets: impl IntoIterator<Item = u64>) -> ListFrom {
    let mut max = None;
    for t in targets {
        if t == u64::MAX {
            return ListFrom::Consistent;
        }
        max = max.max(Some(t));
    }
    match max {
        Some(t) => ListFrom::NotOlderThan(t.to_string()),
        None => ListFrom::Consistent,
    }
}

/// The client side of the manager's background LISTs (barrier version, targeted and collection).
struct Lister {
    client: Client,
    requests: Arc<Requests>,
    stats: Arc<Stats>,
}

impl Lister {
    /// LIST until it succeeds, with the default backoff; a selector the server refuses is dropped (the
    /// caller filters the result locally either way). A failure (a LIST that ran out of its time limit
    /// included) counts in the watcher's errors and starts the LIST over. `None` once `stop()` says nobody
    /// waits for the result.
    async fn list_retrying<V: DeserializeOwned>(
        &self,
        mut selector: Option<ShardSelector>,
        from: ListFrom,
        limit: Option<u32>,
        stop: impl Fn() -> bool,
        what: &'static str,
    ) -> Option<subwatch::Listed<V>> {
        let mut backoff = subwatch::default_backoff();
        loop {
            let listed = subwatch::list_all::<V>(
                &self.client,
                &self.requests,
                selector.as_ref(),
                &from,
                limit,
            )
            .await;
            match listed {
                Ok(l) => return Some(l),
                Err(err) if selector.is_some() && subwatch::is_invalid_selector(&err) => {
                    selector = None
                }
                Err(err) => {
                    self.stats.errors.fetch_add(1, Ordering::Relaxed);
                    debug!(error = %err, what, "LIST failed; retrying");
                    if stop() {
                        return None;
                    }
                    tokio::time::sleep(backoff.next().unwrap_or(Duration::from_secs(30))).await;
                }
            }
        }
    }
}

async fn sleep_until(t: Option<Instant>) {
    match t {
        Some(t) => tokio::time::sleep_until(t).await,
        None => futures::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unknown barrier version is settled by a consistent read, never `resourceVersion=0`.
    #[test]
    fn unparseable_barrier_version_lists_consistently() {
        assert_eq!(barrier_list_from([u64::MAX]), ListFrom::Consistent);
        assert_eq!(barrier_list_from([7, u64::MAX, 9]), ListFrom::Consistent);
        assert_eq!(
            barrier_list_from([7, 12, 9]),
            ListFrom::NotOlderThan("12".into())
        );
        assert_eq!(barrier_list_from([]), ListFrom::Consistent);
    }
}
