//! The pure per-member ownership state machine: no I/O, no async, no clocks.
//!
//! [`MemberState::apply`] is the *only* way shard states change. It is driven by
//!
//! - [`AssignmentView`]s, applied only in strictly increasing generation (an older or equal one is ignored and
//!   counted), and
//! - local [`Event`]s: warm reports of the read path, a completed drain, a passed activation barrier, and the
//!   member's fencing status.
//!
//! Every call returns the [`ShardTransition`]s it made; a transition into "admitted" is a re-enqueue signal.
//! The stateright models in `src/model_check` drive this very function.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    sync::Arc,
};

/// The identity of a member: a stable name (the pod name) and a random per-process incarnation.
///
/// A new incarnation never inherits its predecessor's ownership: the assignment names owners by both.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemberId {
    /// The stable name.
    pub name: Arc<str>,
    /// The per-process incarnation.
    pub incarnation: Arc<str>,
}

impl MemberId {
    /// A member identity.
    ///
    /// ```
    /// use kube_shard::ownership::MemberId;
    /// let me = MemberId::new("pod-0", "7f3c");
    /// assert_eq!(me.to_string(), "pod-0/7f3c");
    /// ```
    pub fn new(name: impl Into<Arc<str>>, incarnation: impl Into<Arc<str>>) -> Self {
        MemberId {
            name: name.into(),
            incarnation: incarnation.into(),
        }
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.name, self.incarnation)
    }
}

impl fmt::Debug for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MemberId({self})")
    }
}

/// A per-shard move id: names one attempt to move a shard, so acks of an older attempt never advance a newer.
pub type MoveId = u64;

/// The handoff state of one shard in the assignment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Handoff {
    /// Not moving.
    Stable,
    /// `Moving(m)`: the target starts reading (overlap); the owner keeps serving.
    Moving {
        /// The move id.
        id: MoveId,
        /// The target.
        to: MemberId,
    },
    /// `Draining(m)`: the owner admits nothing new and releases when drained; the target keeps reading.
    Draining {
        /// The move id.
        id: MoveId,
        /// The target.
        to: MemberId,
    },
}

/// One shard's entry in the assignment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ShardAssignment {
    /// The owner.
    pub owner: MemberId,
    /// The generation at which the owner was activated.
    pub epoch: u64,
    /// The handoff in progress, if any.
    pub handoff: Handoff,
}

impl ShardAssignment {
    /// A stable assignment of a shard to `owner` at `epoch`.
    pub fn owned(owner: MemberId, epoch: u64) -> Self {
        ShardAssignment {
            owner,
            epoch,
            handoff: Handoff::Stable,
        }
    }

    /// The same assignment with a handoff.
    #[must_use]
    pub fn with_handoff(mut self, handoff: Handoff) -> Self {
        self.handoff = handoff;
        self
    }
}

/// The decoded assignment as one member sees it: the control plane decodes it from the assignment ConfigMap.
///
/// Shards absent from `shards` are unassigned.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct AssignmentView {
    /// The group generation: increases with every write.
    pub generation: u64,
    /// Per logical shard, its assignment.
    pub shards: BTreeMap<u32, ShardAssignment>,
}

impl AssignmentView {
    /// An empty view at `generation`.
    pub fn new(generation: u64) -> Self {
        AssignmentView {
            generation,
            shards: BTreeMap::new(),
        }
    }

    /// The view with `shard` assigned as given.
    #[must_use]
    pub fn with(mut self, shard: u32, assignment: ShardAssignment) -> Self {
        self.shards.insert(shard, assignment);
        self
    }
}

/// The local state of one shard. A shard the member has nothing to do with is absent (none).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ShardState {
    /// The member is the target of move `move_id`: it reads the shard (overlap) but admits nothing.
    Incoming {
        /// The move id.
        move_id: MoveId,
        /// The read path reported the shard synced for this move.
        warm: bool,
    },
    /// Granted at `epoch`, waiting for the activation barrier: not admitted (requeue).
    Activating {
        /// The epoch.
        epoch: u64,
    },
    /// Owned and admitted at `epoch`.
    Owned {
        /// The epoch.
        epoch: u64,
    },
    /// Draining for move `move_id`: admits nothing new; fences issued now expire at the drain deadline.
    Outgoing {
        /// The epoch it was owned at.
        epoch: u64,
        /// The move id.
        move_id: MoveId,
    },
}

impl ShardState {
    /// The epoch the member holds the shard at, if it holds it (Activating, Owned, Outgoing).
    #[must_use]
    pub fn epoch(self) -> Option<u64> {
        match self {
            ShardState::Incoming { .. } => None,
            ShardState::Activating { epoch }
            | ShardState::Owned { epoch }
            | ShardState::Outgoing { epoch, .. } => Some(epoch),
        }
    }
}

/// A member's acknowledgement, published in its lease for the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Ack {
    /// `warm(s, m)`: the target has read shard `s` for move `m`.
    Warm {
        /// The shard.
        shard: u32,
        /// The move id.
        move_id: MoveId,
    },
    /// `released(s, m)`: the source drained shard `s` for move `m` and holds no more fences for it.
    Released {
        /// The shard.
        shard: u32,
        /// The move id.
        move_id: MoveId,
    },
}

/// A local event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Event {
    /// The read path synced `shard` for move `move_id` (Incoming → Incoming warm).
    Warm {
        /// The shard.
        shard: u32,
        /// The move id.
        move_id: MoveId,
    },
    /// The activation barrier of `shard` at `epoch` holds (Activating → Owned: admitted).
    Activated {
        /// The shard.
        shard: u32,
        /// The epoch.
        epoch: u64,
    },
    /// The drain of `shard` for `move_id` completed (Outgoing → released).
    Drained {
        /// The shard.
        shard: u32,
        /// The move id.
        move_id: MoveId,
    },
    /// The member missed its renew deadline: it admits nothing.
    SelfFenced,
    /// The member renewed after being self-fenced: Owned shards are admitted again.
    Unfenced,
}

/// Why a shard became admitted: each of these is a re-enqueue signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AdmitCause {
    /// The activation barrier passed.
    Activation,
    /// A move was cancelled before release: the shard came back (anything refused while Outgoing).
    CancelBack,
    /// The member renewed after being self-fenced.
    Unfenced,
}

/// One change to one shard's local state, or to whether it is admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ShardTransition {
    /// The shard.
    pub shard: u32,
    /// The state before (`None` = none).
    pub from: Option<ShardState>,
    /// The state after (`None` = none).
    pub to: Option<ShardState>,
    /// Set when the shard became admitted: re-enqueue all its objects.
    pub admitted: Option<AdmitCause>,
}

impl ShardTransition {
    /// Whether this is a re-enqueue signal (a transition into admitted).
    #[must_use]
    pub fn is_reenqueue(&self) -> bool {
        self.admitted.is_some()
    }
}

/// What a call to [`MemberState::apply`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Applied {
    /// The transitions made, in shard order.
    pub transitions: Vec<ShardTransition>,
    /// The input was ignored: a view at an older or equal generation, or an event that does not match the
    /// current state (a late warm report, a drain of a move no longer in progress, ...).
    pub ignored: bool,
}

#[cfg(any(test, feature = "test-util"))]
/// The input of one step: an assignment view or a local event.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Input {
    /// A decoded assignment.
    View(AssignmentView),
    /// A local event.
    Event(Event),
}

/// The whole per-member state. Cloning is cheap enough for snapshots (a few maps of small values).
///
/// Equality and hashing ignore the ignored-views counter: it is a metric, not state.
#[derive(Clone, Debug)]
pub struct MemberState {
    me: MemberId,
    generation: u64,
    shards: BTreeMap<u32, ShardState>,
    /// Per shard, the highest epoch released locally: a shard stays released until granted at a newer epoch.
    released: BTreeMap<u32, (u64, MoveId)>,
    /// Shards the last applied view names us the owner of at an epoch we are past (see [`MemberState::stale`]).
    stale: BTreeSet<u32>,
    /// Shards we hold that the last applied view names another owner of at an epoch at or below ours (see
    /// [`MemberState::kept`]).
    kept: BTreeSet<u32>,
    fenced: bool,
    ignored_views: u64,
}

impl PartialEq for MemberState {
    fn eq(&self, other: &Self) -> bool {
        self.me == other.me
            && self.generation == other.generation
            && self.shards == other.shards
            && self.released == other.released
            && self.stale == other.stale
            && self.kept == other.kept
            && self.fenced == other.fenced
    }
}

impl Eq for MemberState {}

impl std::hash::Hash for MemberState {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.me.hash(h);
        self.generation.hash(h);
        self.shards.hash(h);
        self.released.hash(h);
        self.stale.hash(h);
        self.kept.hash(h);
        self.fenced.hash(h);
    }
}

impl MemberState {
    /// The initial state of member `me`: nothing held, generation 0, self-fenced until its first renewal.
    #[must_use]
    pub fn new(me: MemberId) -> Self {
        MemberState {
            me,
            generation: 0,
            shards: BTreeMap::new(),
            released: BTreeMap::new(),
            stale: BTreeSet::new(),
            kept: BTreeSet::new(),
            fenced: true,
            ignored_views: 0,
        }
    }

    /// The member.
    #[must_use]
    pub fn me(&self) -> &MemberId {
        &self.me
    }

    /// The highest generation applied.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    #[cfg(any(test, feature = "test-util"))]
    /// How many views were ignored for an older or equal generation.
    #[must_use]
    pub fn ignored_views(&self) -> u64 {
        self.ignored_views
    }

    /// Whether the member is self-fenced.
    #[must_use]
    pub fn is_fenced(&self) -> bool {
        self.fenced
    }

    /// The local state of `shard` (`None` = none).
    #[must_use]
    pub fn shard(&self, shard: u32) -> Option<ShardState> {
        self.shards.get(&shard).copied()
    }

    /// Every shard with a local state.
    pub fn shards(&self) -> impl Iterator<Item = (u32, ShardState)> + '_ {
        self.shards.iter().map(|(s, st)| (*s, *st))
    }

    /// Whether `shard` is admitted: Owned and the member is not self-fenced.
    #[must_use]
    pub fn is_admitted(&self, shard: u32) -> bool {
        !self.fenced && matches!(self.shard(shard), Some(ShardState::Owned { .. }))
    }

    /// Shards the last applied view names this member the owner of at an epoch it is already past: it
    /// holds the shard at a higher epoch, or released it at that epoch or a higher one (outside the
    /// `Draining` of that very release). Only a rolled-back assignment (a restored backup) says so: epochs
    /// of one owner only grow. The member keeps what it has (a lower epoch is never followed) and reports
    /// these shards; the coordinator re-grants each to its owner at a new epoch
    /// (`group::coordinator`), without which a handoff at the stale epoch would wait for a release the
    /// owner never gives, and a released shard would stay owned by nobody.
    pub fn stale(&self) -> impl Iterator<Item = u32> + '_ {
        self.stale.iter().copied()
    }

    /// Shards this member holds that the last applied view names *another* owner of, at an epoch at or below
    /// the one it holds. Only a rolled-back assignment says so (a grant to another owner is always at the
    /// generation that made it, above every epoch held before): the member keeps the shard (it never drops a
    /// shard on an older fact) and reports it, and the coordinator names it the owner again rather than
    /// let the other one activate.
    pub fn kept(&self) -> impl Iterator<Item = u32> + '_ {
        self.kept.iter().copied()
    }

    /// The highest epoch at which `shard` was released locally, and the move id.
    #[must_use]
    pub fn released(&self, shard: u32) -> Option<(u64, MoveId)> {
        self.released.get(&shard).copied()
    }

    /// The acks to publish: warm for warm Incoming shards, released for released shards.
    #[must_use]
    pub fn acks(&self) -> Vec<Ack> {
        let mut acks: Vec<Ack> = self
            .shards
            .iter()
            .filter_map(|(&shard, st)| match *st {
                ShardState::Incoming {
                    move_id,
                    warm: true,
                } => Some(Ack::Warm { shard, move_id }),
                _ => None,
            })
            .collect();
        acks.extend(
            self.released
                .iter()
                .map(|(&shard, &(_, move_id))| Ack::Released { shard, move_id }),
        );
        acks.sort();
        acks
    }

    #[cfg(any(test, feature = "test-util"))]
    /// Apply one input. This is the whole transition function.
    pub fn apply(&mut self, input: &Input) -> Applied {
        match input {
            Input::View(view) => self.apply_view(view),
            Input::Event(event) => self.apply_event(*event),
        }
    }

    /// Apply an assignment view; ignored (and counted) unless its generation is newer than any applied.
    pub fn apply_view(&mut self, view: &AssignmentView) -> Applied {
        if view.generation <= self.generation {
            self.ignored_views += 1;
            return Applied {
                transitions: Vec::new(),
                ignored: true,
            };
        }
        let before = self.generation;
        self.generation = view.generation;
        let mut touched: Vec<u32> = self.shards.keys().copied().collect();
        touched.extend(view.shards.keys().copied());
        touched.sort_unstable();
        touched.dedup();
        let mut out = Applied::default();
        self.stale.clear();
        self.kept.clear();
        for shard in touched {
            let from = self.shard(shard);
            let (to, verdict) = self.next_for_view(shard, from, view.shards.get(&shard), before);
            match verdict {
                Verdict::Follow => {}
                Verdict::Stale => {
                    self.stale.insert(shard);
                }
                Verdict::Kept => {
                    self.kept.insert(shard);
                }
            }
            let admitted = match (from, to) {
                (Some(ShardState::Outgoing { .. }), Some(ShardState::Owned { .. }))
                    if !self.fenced =>
                {
                    Some(AdmitCause::CancelBack)
                }
                _ => None,
            };
            self.set(shard, from, to, admitted, &mut out);
        }
        out
    }

    /// The shard's next state under `entry`, and what the entry says about it. `before` is the generation
    /// applied before this view: every legitimate grant's epoch is the generation of the write that made
    /// it, so a grant at or below `before` that we do not hold at that epoch is a rolled-back assignment.
    fn next_for_view(
        &self,
        shard: u32,
        from: Option<ShardState>,
        entry: Option<&ShardAssignment>,
        before: u64,
    ) -> (Option<ShardState>, Verdict) {
        let Some(a) = entry else {
            return (None, Verdict::Follow);
        };
        if a.owner == self.me {
            return self.next_as_owner(shard, from, a, before);
        }
        // another owner at an epoch at or below the one we hold: a rollback; keep the shard, say so
        if let Some(held) = from.and_then(ShardState::epoch) {
            if a.epoch <= held && !planted_lower_epoch() {
                return (from, Verdict::Kept);
            }
        }
        let next = match &a.handoff {
            Handoff::Moving { id, to } | Handoff::Draining { id, to } if *to == self.me => {
                match from {
                    Some(ShardState::Incoming { move_id, warm }) if move_id == *id => {
                        Some(ShardState::Incoming { move_id, warm })
                    }
                    // A new move to us (or we lost the shard while holding it: a takeover of us; we drop it).
                    _ => Some(ShardState::Incoming {
                        move_id: *id,
                        warm: false,
                    }),
                }
            }
            _ => None,
        };
        (next, Verdict::Follow)
    }

    fn next_as_owner(
        &self,
        shard: u32,
        from: Option<ShardState>,
        a: &ShardAssignment,
        before: u64,
    ) -> (Option<ShardState>, Verdict) {
        let held = from.and_then(ShardState::epoch);
        // An epoch older than the one we hold is never followed: keep what we have (safe input).
        if held.is_some_and(|h| a.epoch < h) && !planted_lower_epoch() {
            return (from, Verdict::Stale);
        }
        // Released stays released until granted again at a newer epoch; named at that epoch or an older
        // one outside the Draining of that very release, we are past it.
        if let Some((r, id)) = self.released(shard) {
            if a.epoch <= r {
                let own_drain =
                    a.epoch == r && matches!(a.handoff, Handoff::Draining { id: d, .. } if d == id);
                let verdict = if own_drain {
                    Verdict::Follow
                } else {
                    Verdict::Stale
                };
                return (None, verdict);
            }
        }
        let same_epoch = held == Some(a.epoch);
        // A grant we do not hold, at or below a generation we applied before: a rolled-back assignment
        // (a restored backup). Never activated: the shard may be held by its real owner at a higher epoch.
        if !same_epoch
            && before > 0
            && a.epoch <= before
            && !planted_lower_epoch()
            && !planted_rolled_back_grant()
        {
            let keep = from.filter(|st| st.epoch().is_some());
            return (keep, Verdict::Stale);
        }
        let next = match (&a.handoff, from) {
            // Draining away from us: stop admitting.
            (
                Handoff::Draining { id, .. },
                Some(ShardState::Owned { epoch } | ShardState::Activating { epoch }),
            ) if same_epoch => Some(ShardState::Outgoing {
                epoch,
                move_id: *id,
            }),
            (Handoff::Draining { id, .. }, Some(ShardState::Outgoing { epoch, move_id }))
                if same_epoch =>
            {
                Some(ShardState::Outgoing {
                    epoch,
                    move_id: if move_id == *id { move_id } else { *id },
                })
            }
            // Draining a grant we never activated (we skipped generations): nothing to drain.
            (Handoff::Draining { id, .. }, _) => Some(ShardState::Outgoing {
                epoch: a.epoch,
                move_id: *id,
            }),
            // Stable or Moving at the epoch we hold: Owned/Activating stay; Outgoing is a cancel-back.
            (_, Some(ShardState::Outgoing { epoch, .. })) if same_epoch => {
                Some(ShardState::Owned { epoch })
            }
            (_, Some(st @ (ShardState::Owned { .. } | ShardState::Activating { .. })))
                if same_epoch =>
            {
                Some(st)
            }
            // A (new) grant: activate behind the barrier.
            _ => Some(ShardState::Activating { epoch: a.epoch }),
        };
        (next, Verdict::Follow)
    }

    /// Apply a local event.
    pub fn apply_event(&mut self, event: Event) -> Applied {
        let mut out = Applied::default();
        match event {
            Event::Warm { shard, move_id } => match self.shard(shard) {
                from @ Some(ShardState::Incoming {
                    move_id: m,
                    warm: false,
                }) if m == move_id => {
                    let to = Some(ShardState::Incoming {
                        move_id,
                        warm: true,
                    });
                    self.set(shard, from, to, None, &mut out);
                }
                _ => out.ignored = true,
            },
            Event::Activated { shard, epoch } => match self.shard(shard) {
                from @ Some(ShardState::Activating { epoch: e }) if e == epoch => {
                    let admitted = (!self.fenced).then_some(AdmitCause::Activation);
                    self.set(
                        shard,
                        from,
                        Some(ShardState::Owned { epoch }),
                        admitted,
                        &mut out,
                    );
                }
                _ => out.ignored = true,
            },
            Event::Drained { shard, move_id } => match self.shard(shard) {
                from @ Some(ShardState::Outgoing { epoch, move_id: m }) if m == move_id => {
                    self.released.insert(shard, (epoch, move_id));
                    self.set(shard, from, None, None, &mut out);
                }
                _ => out.ignored = true,
            },
            Event::SelfFenced => {
                if self.fenced {
                    out.ignored = true;
                }
                self.fenced = true;
            }
            Event::Unfenced => {
                if !self.fenced {
                    out.ignored = true;
                    return out;
                }
                self.fenced = false;
                for (&shard, &st) in &self.shards {
                    if let ShardState::Owned { .. } = st {
                        out.transitions.push(ShardTransition {
                            shard,
                            from: Some(st),
                            to: Some(st),
                            admitted: Some(AdmitCause::Unfenced),
                        });
                    }
                }
            }
        }
        out
    }

    fn set(
        &mut self,
        shard: u32,
        from: Option<ShardState>,
        to: Option<ShardState>,
        admitted: Option<AdmitCause>,
        out: &mut Applied,
    ) {
        if from == to {
            return;
        }
        match to {
            Some(st) => self.shards.insert(shard, st),
            None => self.shards.remove(&shard),
        };
        out.transitions.push(ShardTransition {
            shard,
            from,
            to,
            admitted,
        });
    }

    /// The same state with members and shards renamed (feature `test-util`: symmetry reduction in model
    /// checks). `shard` must be a bijection.
    #[cfg(any(test, feature = "test-util"))]
    #[must_use]
    pub fn relabeled(
        &self,
        member: impl Fn(&MemberId) -> MemberId,
        shard: impl Fn(u32) -> u32,
    ) -> Self {
        MemberState {
            me: member(&self.me),
            generation: self.generation,
            shards: self.shards.iter().map(|(s, st)| (shard(*s), *st)).collect(),
            released: self.released.iter().map(|(s, r)| (shard(*s), *r)).collect(),
            stale: self.stale.iter().map(|s| shard(*s)).collect(),
            kept: self.kept.iter().map(|s| shard(*s)).collect(),
            fenced: self.fenced,
            ignored_views: self.ignored_views,
        }
    }

    /// Mark every shard of `shards` Owned at epoch 0, unfenced (static mode). Crate-internal.
    pub(crate) fn set_static(&mut self, shards: impl IntoIterator<Item = u32>) {
        self.fenced = false;
        for s in shards {
            self.shards.insert(s, ShardState::Owned { epoch: 0 });
        }
    }
}

/// What one view's entry says about a shard this member has to do with.
enum Verdict {
    /// Followed as written.
    Follow,
    /// It names us the owner at an epoch we are past, or grants us the shard at or below a generation we
    /// applied before: a rollback; reported so the coordinator re-grants it above.
    Stale,
    /// It names another owner at or below the epoch we hold: a rollback; we keep the shard and report it.
    Kept,
}

/// The planted fault "a lower epoch is followed": the models must catch it.
fn planted_lower_epoch() -> bool {
    planted!(ACCEPT_LOWER_EPOCH)
}

/// The planted fault "a grant at or below a generation applied before is activated": the models must catch
/// it.
fn planted_rolled_back_grant() -> bool {
    planted!(ACTIVATE_ROLLED_BACK_GRANT)
}

#[cfg(test)]
mod tests;
