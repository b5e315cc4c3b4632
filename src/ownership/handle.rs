//! [`Ownership`]: the cheap-to-clone handle over the member's ownership state.
//!
//! Readers load an immutable [`Snapshot`] (arc-swap: no locks on the admission path). Writers — the control
//! plane, or the `test-util` driver — are serialised by a mutex, step the pure [`MemberState`], publish a new
//! snapshot, then notify: the change counter ([`Ownership::changed`]) and every [`Transitions`] stream.

use std::{
    collections::BTreeMap,
    fmt,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use arc_swap::ArcSwap;
use futures::Stream;
use kube::Resource;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, info_span, warn};

use super::{
    admission::{self, AdmitError, Permit},
    config::OwnershipConfig,
    gates::ShardGates,
    inflight::Gate,
    inner::{Hold, Inner, Snapshot},
    state::{Applied, AssignmentView, Event, MemberId, MemberState, ShardState, ShardTransition},
};
use crate::rt::{Clock, Deadline, Now};

/// The member's ownership: which logical shards it holds in which state, admission, fences, and the stream
/// of shard transitions (re-enqueue signals).
///
/// Cheap to clone. There is no public way to grant shards: the control plane drives it (and, for tests, the
/// `test-util` feature's `testing::driver`).
///
/// ```no_run
/// # async fn doc(ownership: kube_shard::ownership::Ownership, cm: k8s_openapi::api::core::v1::ConfigMap) {
/// match ownership.admit(&cm) {
///     Ok(permit) => {
///         let fence = permit.fence().expect("fresh fence");
///         println!("acting on shard {} as {}", permit.shard(), fence.token());
///     }
///     Err(e) if e.is_retryable() => { /* requeue soon */ }
///     Err(_) => { /* another member owns it */ }
/// }
/// # }
/// ```
#[derive(Clone)]
pub struct Ownership {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Ownership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let snap = self.inner.snapshot();
        f.debug_struct("Ownership")
            .field("me", snap.state.me())
            .field("generation", &snap.state.generation())
            .field("fenced", &snap.state.is_fenced())
            .finish_non_exhaustive()
    }
}

impl Ownership {
    /// Register a read stream (a sharded watcher): a shard is warm, and activated, only once every
    /// registered stream reported it.
    pub(crate) fn register_reader(&self) -> super::readers::ReaderGuard {
        let me = self.clone();
        self.inner.readers.register(move |e| {
            me.apply_event(e);
        })
    }

    /// A fresh member state: nothing held, self-fenced until the first renewal. Crate-internal: the control
    /// plane owns it.
    pub(crate) fn new(config: OwnershipConfig, me: MemberId, clock: Clock) -> Self {
        let (changed, _) = watch::channel(0);
        Ownership {
            inner: Arc::new(Inner {
                config,
                clock,
                snapshot: ArcSwap::from_pointee(Snapshot {
                    state: MemberState::new(me),
                    gates: BTreeMap::new(),
                    renewal: None,
                    drains: BTreeMap::new(),
                }),
                writer: Mutex::new(Vec::new()),
                changed,
                readers: Arc::default(),
                hold: std::sync::atomic::AtomicU8::new(0),
                gate: std::sync::OnceLock::new(),
                observer: std::sync::OnceLock::new(),
                gate_drained: Mutex::new(None),
            }),
        }
    }

    /// Report every fence and fenced request of this member to `observer` from now on (see
    /// [`observe`](super::observe)). Install it before the member issues fences: fences issued earlier are
    /// not reported. Returns `false` (and changes nothing) if an observer was already installed.
    #[cfg(any(test, feature = "test-util"))]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub(crate) fn observe_fences(&self, observer: Arc<dyn super::observe::FenceObserver>) -> bool {
        self.inner.observer.set(observer).is_ok()
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &OwnershipConfig {
        &self.inner.config
    }

    /// The member this is the ownership of (its name and incarnation).
    #[must_use]
    pub fn member(&self) -> MemberId {
        self.inner.snapshot().state.me().clone()
    }

    /// The current snapshot.
    #[must_use]
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.inner.snapshot()
    }

    /// The local state of every shard the member holds in any way (incoming, owned, outgoing), by shard.
    #[must_use]
    pub fn shard_states(&self) -> std::collections::BTreeMap<u32, ShardState> {
        self.inner.snapshot().state.shards().collect()
    }

    /// The local state of `shard` (`None` = not held in any way).
    #[must_use]
    pub fn shard_state(&self, shard: u32) -> Option<ShardState> {
        self.inner.snapshot().state.shard(shard)
    }

    /// Whether the member is self-fenced now (on either clock), or was fenced by a takeover.
    #[must_use]
    pub fn is_self_fenced(&self) -> bool {
        let snap = self.inner.snapshot();
        snap.state.is_fenced() || !self.inner.renewal_valid(&snap)
    }

    /// The logical shard of an object under the group's key.
    pub fn shard_of<K: Resource>(&self, obj: &K) -> Result<u32, crate::hash::KeyError> {
        let hash = self.inner.config.key.hash_object(obj)?;
        Ok(self.inner.config.shards.shard_of(hash))
    }

    /// A permit for work on `obj`: only for an Owned shard of an unfenced member.
    pub fn admit<K: Resource>(&self, obj: &K) -> Result<Permit, AdmitError> {
        let shard = self.shard_of(obj)?;
        self.admit_shard(shard)
    }

    /// A permit for work keyed by `key` (work that is not a Kubernetes object): the key is hashed like an
    /// object's key field.
    pub fn admit_key(&self, key: &str) -> Result<Permit, AdmitError> {
        let shard = self
            .inner
            .config
            .shards
            .shard_of(crate::hash::fnv1a64(key.as_bytes()));
        self.admit_shard(shard)
    }

    /// A permit for work on logical shard `shard`.
    pub fn admit_shard(&self, shard: u32) -> Result<Permit, AdmitError> {
        let res = admission::admit(&self.inner, shard);
        if let Err(AdmitError::SelfFenced { .. }) = res {
            // Record the missed deadline so that the next renewal emits re-enqueue signals (un-fencing).
            if !self.inner.snapshot().state.is_fenced() {
                self.mark_self_fenced();
            }
        }
        res
    }

    /// A counter bumped at every published change.
    #[must_use]
    pub fn changed(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// Every shard transition from now on, in order, never dropped (unbounded: transitions are per shard and
    /// rare). A transition with `admitted` set is a re-enqueue signal: the read path turns it into
    /// `ObjectRef`s for `Controller::reconcile_on` once its store holds that shard's objects, paced and
    /// jittered with [`jitter`](crate::rt::jitter) so a shard's objects do not arrive as one burst.
    pub fn transitions(&self) -> Transitions {
        let (tx, rx) = mpsc::unbounded_channel();
        self.inner
            .writer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        Transitions { rx }
    }

    // === crate-internal driver API (the control plane; the `test-util` driver) ===

    /// Apply an assignment view (ignored unless newer than every applied generation).
    pub(crate) fn apply_view(&self, view: &AssignmentView) -> Applied {
        let span = info_span!("ownership.apply_view", generation = view.generation);
        let _g = span.enter();
        let applied = self.step(|st| st.apply_view(view));
        if applied.ignored {
            debug!(
                generation = view.generation,
                "ignored an assignment view that is not newer"
            );
        }
        applied
    }

    /// Apply a local event.
    pub(crate) fn apply_event(&self, event: Event) -> Applied {
        self.step(|st| st.apply_event(event))
    }

    /// Record a successful renewal whose request started at `start`. If the member was self-fenced, it is
    /// admitted again and every Owned shard is re-enqueued.
    pub(crate) fn record_renewal(&self, start: Now) -> Applied {
        let deadline = start.plus(
            self.inner
                .config
                .renew_deadline
                .saturating_sub(self.inner.config.fence_margin),
        );
        let expired = !self.inner.renewal_valid(&self.inner.snapshot());
        self.step_with(|st, snap| {
            snap.renewal = Some(deadline);
            let mut out = Applied::default();
            if expired && !st.is_fenced() {
                st.apply_event(Event::SelfFenced);
            }
            if st.is_fenced() {
                out = st.apply_event(Event::Unfenced);
            }
            out
        })
    }

    /// Fence the member now (its lease was taken over, or it missed its deadline).
    pub(crate) fn mark_self_fenced(&self) -> Applied {
        warn!("member self-fenced: admitting nothing until it renews");
        self.step_with(|st, _| st.apply_event(Event::SelfFenced))
    }

    /// Fence the member for good until a renewal (a takeover of its lease).
    pub(crate) fn revoke_renewal(&self) -> Applied {
        self.step_with(|st, snap| {
            snap.renewal = None;
            st.apply_event(Event::SelfFenced)
        })
    }

    /// Set or clear one cause of the member-wide hold; the other causes' bits are untouched. Clearing the
    /// last bit re-enqueues every Owned shard (cause [`AdmitCause::Unfenced`]: the member became
    /// admissible again).
    ///
    /// [`AdmitCause::Unfenced`]: super::state::AdmitCause::Unfenced
    pub(crate) fn set_hold(&self, hold: Hold, on: bool) {
        use std::sync::atomic::Ordering;
        let before = if on {
            self.inner.hold.fetch_or(hold.bit(), Ordering::AcqRel)
        } else {
            self.inner.hold.fetch_and(!hold.bit(), Ordering::AcqRel)
        };
        let after = if on {
            before | hold.bit()
        } else {
            before & !hold.bit()
        };
        if before != 0 && after == 0 {
            self.step_with(|st, _| {
                let transitions = st
                    .shards()
                    .filter(|(_, s)| matches!(s, ShardState::Owned { .. }))
                    .map(|(shard, from)| ShardTransition {
                        shard,
                        from: Some(from),
                        to: Some(from),
                        admitted: Some(super::state::AdmitCause::Unfenced),
                    })
                    .collect();
                Applied {
                    transitions,
                    ignored: false,
                }
            });
        } else if before != after {
            self.inner.changed.send_modify(|v| *v += 1);
        }
    }

    /// Put admission and fences behind the cluster's HA term (once; later calls are ignored).
    /// Nothing in flight on any shard this member holds: no permit and no live fence, under the current
    /// gates or the retired ones still kept.
    pub(crate) fn idle(&self) -> bool {
        self.snapshot()
            .gates
            .values()
            .flat_map(ShardGates::drain_set)
            .all(|g| g.in_flight() == 0)
    }

    /// The failover epoch whose term this member acknowledges as drained at its term gate's request
    /// (`kube-shard.io/ha-drained` in its member Lease, written at its next renewal).
    #[must_use]
    pub fn gate_drained(&self) -> Option<crate::token::FailoverEpoch> {
        *self
            .inner
            .gate_drained
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_gate_drained(&self, e: Option<crate::token::FailoverEpoch>) {
        *self
            .inner
            .gate_drained
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = e;
    }

    /// Install the gate every admission needs a term from (once; `false` if one is installed already).
    pub(crate) fn install_gate(
        &self,
        gate: std::sync::Arc<dyn super::term_gate::TermGate>,
    ) -> bool {
        self.inner.gate.set(gate).is_ok()
    }

    /// The member-wide admission hold, if any (shadow mode, a member of another build, the HA Standby, a
    /// live legacy leader; the strongest when several apply).
    #[must_use]
    pub fn admission_hold(&self) -> Option<&'static str> {
        self.inner.hold_reason()
    }

    /// Rejoin as a new incarnation after a takeover (or a lost Lease): everything held is dropped, the
    /// member is fenced until it renews, and nothing of the old incarnation is inherited — the assignment
    /// names owners by (name, incarnation), so only grants to `me` at newer epochs apply from now on.
    pub(crate) fn reincarnate(&self, me: MemberId) -> Applied {
        warn!(member = %me, "rejoining as a new incarnation: all shards dropped");
        self.step_with(|st, snap| {
            snap.renewal = None;
            let dropped: Vec<ShardTransition> = st
                .shards()
                .map(|(shard, from)| ShardTransition {
                    shard,
                    from: Some(from),
                    to: None,
                    admitted: None,
                })
                .collect();
            *st = MemberState::new(me);
            Applied {
                transitions: dropped,
                ignored: false,
            }
        })
    }

    /// Install a static-mode state: every held shard Owned with a fresh gate, renewed for `valid`.
    pub(crate) fn install_static(&self, state: MemberState, valid: Duration) {
        let gates = state
            .shards()
            .map(|(s, _)| (s, ShardGates::open(Arc::new(Gate::default()))))
            .collect();
        let renewal = Some(self.inner.clock.now().plus(valid));
        self.inner.snapshot.store(Arc::new(Snapshot {
            state,
            gates,
            renewal,
            drains: BTreeMap::new(),
        }));
        self.inner.changed.send_modify(|v| *v += 1);
    }

    fn step(&self, f: impl FnOnce(&mut MemberState) -> Applied) -> Applied {
        self.step_with(|st, _| f(st))
    }

    fn step_with(&self, f: impl FnOnce(&mut MemberState, &mut Snapshot) -> Applied) -> Applied {
        let mut subs = self.inner.writer.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.inner.snapshot();
        let mut snap = Snapshot::clone(&old);
        let mut state = snap.state.clone();
        let applied = f(&mut state, &mut snap);
        snap.state = state;
        let mut drains = Vec::new();
        for t in &applied.transitions {
            self.update_gates(&mut snap, t, &mut drains);
            info!(shard = t.shard, from = ?t.from, to = ?t.to, admitted = ?t.admitted, "shard transition");
        }
        let now = self.inner.clock.now().runtime;
        snap.gates.retain(|_, gates| {
            gates.prune(|g| settled(g, now));
            !gates.is_empty()
        });
        let snap = Arc::new(snap);
        self.inner.snapshot.store(snap.clone());
        subs.retain(|tx| applied.transitions.iter().all(|t| tx.send(*t).is_ok()));
        drop(subs);
        self.inner.changed.send_modify(|v| *v += 1);
        for drain in drains {
            self.spawn_drain(drain);
        }
        applied
    }

    fn update_gates(&self, snap: &mut Snapshot, t: &ShardTransition, drains: &mut Vec<Drain>) {
        let gates = snap.gates.entry(t.shard).or_default();
        // a closed gate admits nothing again: an Owned shard whose gate was closed starts a new holding
        let from = match t.from {
            Some(ShardState::Owned { .. }) if gates.current().is_some_and(|g| g.is_closed()) => {
                None
            }
            from => from,
        };
        if let Some(retired) = gates.follow(from, t.to, || Arc::new(Gate::default())) {
            retired.close();
        }
        match t.to {
            Some(ShardState::Outgoing { move_id, .. }) => {
                let gates = gates.clone();
                if let Some(current) = gates.current() {
                    current.close();
                }
                let deadline = match snap.drains.get(&t.shard) {
                    Some(d) => *d,
                    None => {
                        let d = self.inner.clock.now().plus(self.inner.config.drain_timeout);
                        snap.drains.insert(t.shard, d);
                        d
                    }
                };
                drains.push(Drain {
                    shard: t.shard,
                    move_id,
                    gates,
                    deadline,
                });
            }
            _ => {
                snap.drains.remove(&t.shard);
            }
        }
    }

    /// Wait until every gate of the shard drains — the one it is drained under and every retired gate kept
    /// (requests admitted under an earlier holding, before a re-grant or a cancel-back, may still be in
    /// flight) — or until both the drain deadline and the latest `valid_until` of the fences issued on any
    /// of them have passed; then release it.
    ///
    /// The second bound matters when a fence issued while Owned outlives the drain deadline
    /// (`drain_timeout < renew_deadline − fence_margin`, which `GroupConfig::validate` refuses): a fenced
    /// request sent with it may still be in flight, and releasing would let the next owner act meanwhile.
    fn spawn_drain(&self, drain: Drain) {
        let Drain {
            shard,
            move_id,
            gates,
            deadline,
        } = drain;
        let Some(gate) = gates.current().cloned() else {
            return;
        };
        let all: Vec<Arc<Gate>> = gates.drain_set().cloned().collect();
        if !gates.retired().is_empty() {
            debug!(
                shard,
                move_id,
                retired = gates.retired().len(),
                "the drain also waits for requests admitted under retired gates of the shard"
            );
        }
        let this = self.clone();
        let planted_skip = planted!(SKIP_DRAIN_WAIT);
        let fut = async move {
            if !planted_skip {
                wait_drained(&this.inner.clock, shard, move_id, &all, deadline).await;
            }
            this.finish_drain(shard, move_id, &gate);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(fut);
            }
            Err(_) => warn!(
                shard,
                "no tokio runtime: the drain must be completed by the caller"
            ),
        }
    }

    fn finish_drain(&self, shard: u32, move_id: u64, gate: &Arc<Gate>) {
        if self.inner.snapshot().is_current_gate(shard, gate) {
            self.apply_event(Event::Drained { shard, move_id });
        }
    }

    /// The time a refused-but-held object should wait before it is retried.
    #[must_use]
    pub fn requeue_delay(&self) -> Duration {
        crate::rt::jitter(self.inner.config.not_admitted_requeue)
    }
}

/// A drain to start once the snapshot is published: the shard's gates as the drain found them.
struct Drain {
    shard: u32,
    move_id: u64,
    gates: ShardGates<Arc<Gate>>,
    deadline: Deadline,
}

/// Wait until nothing is in flight on any of `gates`, or until both `deadline` and the latest
/// `valid_until` of the fences issued on them have passed.
async fn wait_drained(
    clock: &Clock,
    shard: u32,
    move_id: u64,
    gates: &[Arc<Gate>],
    deadline: Deadline,
) {
    let left = deadline.remaining(clock.now());
    if tokio::time::timeout(left, all_drained(gates)).await.is_ok() {
        return;
    }
    if let Some(until) = gates.iter().filter_map(|g| g.latest_valid_until()).max() {
        if tokio::time::timeout_at(until, all_drained(gates))
            .await
            .is_ok()
        {
            debug!(
                shard,
                move_id, "drained after the drain deadline, before the last fence ended"
            );
            return;
        }
    }
    warn!(
        shard,
        move_id, "drain deadline passed: every fence for the shard has expired"
    );
}

/// Close every gate and wait until nothing is in flight on any. Zero is final on a closed gate: only a
/// live permit or fence enters it again.
async fn all_drained(gates: &[Arc<Gate>]) {
    for g in gates {
        g.drained().await;
    }
}

/// A retired gate that can hold no drain back: nothing in flight on it, and its last fence's validity
/// (if it issued any) passed.
fn settled(gate: &Gate, now: tokio::time::Instant) -> bool {
    gate.in_flight() == 0 && gate.latest_valid_until().is_none_or(|u| u <= now)
}

/// The stream of [`ShardTransition`]s from [`Ownership::transitions`].
#[derive(Debug)]
#[must_use = "streams do nothing unless polled"]
pub struct Transitions {
    rx: mpsc::UnboundedReceiver<ShardTransition>,
}

impl Transitions {
    /// The next transition (`None` only if every `Ownership` handle was dropped).
    pub async fn next_transition(&mut self) -> Option<ShardTransition> {
        self.rx.recv().await
    }

    /// The next transition if one is ready.
    pub fn try_next_transition(&mut self) -> Option<ShardTransition> {
        self.rx.try_recv().ok()
    }
}

impl Stream for Transitions {
    type Item = ShardTransition;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
pub(crate) mod tests;
