//! The cluster elector as a pure step function (no I/O, no clock), driven by the I/O driver and by the
//! stateright model `ha/tests/it/elector/model.rs`, which runs this very code.
//!
//! The caller asks [`Elector::poll`] for the requests to send now, sends each with a timeout, and feeds
//! every answer back with [`Elector::on_answer`]. Times are readings of the caller's local monotonic
//! clock; the elector never sees another machine's clock (`renewTime` is never read).
//! [`Elector::is_active`] is true only inside the term; without a witness, only
//! [`Elector::force_promote`] starts a candidacy.
//!
//! See `docs/ha.md#the-rules-what-the-code-does` for the rules it follows.

use std::time::Duration;

use super::config::Timings;
use super::epoch::FailoverEpoch;
use super::record::{HaState, Origin, Published, Record};

/// One of the Leases the elector reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Slot {
    /// This cluster's HA Lease.
    Own,
    /// The peer cluster's HA Lease.
    Peer,
    /// The witness Lease.
    Witness,
}

impl Slot {
    /// All slots, in index order.
    pub const ALL: [Slot; 3] = [Slot::Own, Slot::Peer, Slot::Witness];

    fn index(self) -> usize {
        self as usize
    }
}

/// A request to send.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// GET the Lease (a consistent read, never a cache or a watch event).
    Read,
    /// Replace the Lease with `record`, precondition `metadata.resourceVersion = rv`.
    Update {
        /// The precondition.
        rv: String,
        /// What to write.
        record: Record,
    },
    /// Create the Lease with `record`.
    Create {
        /// What to write.
        record: Record,
    },
}

/// A request for one slot.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    /// Which Lease.
    pub slot: Slot,
    /// What to do.
    pub op: Op,
}

/// The answer to a [`Request`], as the caller classified it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Answer {
    /// A read found the Lease at `rv`; `record` is `None` if it does not decode.
    Found {
        /// Its resourceVersion.
        rv: String,
        /// What it says.
        record: Option<Record>,
    },
    /// 404 (a read, or an update of a Lease that is gone).
    NotFound,
    /// A write succeeded and produced `rv`.
    Written {
        /// The new resourceVersion.
        rv: String,
    },
    /// 409 on an update (the precondition failed).
    Conflict,
    /// 409 AlreadyExists on a create: the create lost.
    AlreadyExists,
    /// Anything else: a timeout, a refused connection, a 5xx. The write may still commit.
    Failed,
}

/// Why the elector raises an alarm (shown by `kshard ha status`, Events and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Alarm {
    /// A Lease does not decode: a higher epoch may exist; nothing is admitted and it is never overwritten.
    Undecodable(Slot),
    /// At start the peer's Lease could not be read: Standby until it can, or a human promotes.
    PeerUnreadableAtStart,
    /// A record in this slot names this cluster's id but was written from another cluster (another
    /// `kube-system` uid): both clusters were given one id. Nothing is admitted, the record is never resumed
    /// or followed, and it lasts while any Lease shows such a record.
    IdentityConflict(Slot),
    /// A record in this slot was written by the other cluster configured with this cluster's rank: equal
    /// ranks make equal epochs under a partition, and neither side would step down. Nothing is admitted and
    /// nothing promoted while any Lease shows such a record.
    EqualRank(Slot),
    /// The peer client reaches this very cluster (one `kube-system` uid): nothing is ever admitted.
    PeerIsThisCluster,
}

/// Why a leader stopped leading.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StepDown {
    /// A higher epoch was seen in this slot.
    HigherEpoch(Slot),
    /// A conflict's re-read showed another record in this slot.
    Conflict(Slot),
    /// A Lease does not decode.
    Undecodable(Slot),
    /// It held no term for `lease_duration`.
    NoTerm,
}

/// What changed in one step (the driver turns these into Events and metrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transition {
    /// A candidacy began at this epoch (a promotion; acting starts only once the term is held).
    Promoted(FailoverEpoch),
    /// A (re)started process resumed leading at this epoch, as the Leases say.
    Resumed(FailoverEpoch),
    /// Bootstrap (every Lease missing, `--ha-mode=active`) at this epoch.
    Bootstrapped(FailoverEpoch),
    /// It stopped leading.
    SteppedDown(FailoverEpoch, StepDown),
    /// An alarm was raised.
    Alarmed(Alarm),
}

/// Why [`Elector::force_promote`] refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForceError {
    /// Not armed: the peer's Lease was seen changing (or readable and fresh) within the last full wait.
    #[error("not armed: the peer's HA Lease was renewed or read fresh within the takeover wait")]
    NotArmed,
    /// This cluster already leads.
    #[error("this cluster already leads")]
    AlreadyLeading,
    /// A Lease does not decode: a human must look first.
    #[error("a HA Lease does not decode")]
    Undecodable,
    /// The two sides' configuration conflicts (one cluster id, one rank, or a peer client reaching this
    /// cluster): a human must fix it first.
    #[error("the HA configuration conflicts with the peer's: {0:?}")]
    Misconfigured(Alarm),
    /// The epoch space is exhausted.
    #[error("no higher epoch can be written")]
    Exhausted,
    /// A token promotion whose token epoch is not the highest epoch this process has seen.
    #[error("the token's epoch {token} is not the highest epoch seen ({seen})")]
    TokenStale {
        /// The token's epoch.
        token: FailoverEpoch,
        /// The highest epoch seen.
        seen: FailoverEpoch,
    },
}

/// A promotion with a demotion token (HA.md contract 2): each Lease whose record is the source's at the
/// token's epoch in the state `demoting(token)` is taken over by a conditional write at once, with no
/// `lease_duration` wait: its holder has published, after draining, that it no longer acts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenTakeover {
    /// The demoting cluster.
    pub source: String,
    /// Its epoch.
    pub epoch: FailoverEpoch,
    /// The token, as its Leases record it.
    pub token: String,
}

/// What this elector knows of one slot's Lease.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Seen {
    /// Not read yet (or re-read needed after a conflict).
    Unknown,
    /// 404 since the receipt of the first read that showed it missing.
    Missing {
        /// Receipt time.
        since: Duration,
    },
    /// At `rv` since the receipt of the first read (or own write) that showed this version.
    Present {
        /// resourceVersion.
        rv: String,
        /// What it says (`None`: undecodable).
        record: Option<Record>,
        /// Receipt time.
        since: Duration,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct View {
    seen: Seen,
    /// Start of my last successful write of it.
    held_from: Option<Duration>,
    /// When the hold of my last successful write of it ends (`start + renew_deadline`), kept when a
    /// conflict or a lost answer clears `held_from`: a later write that succeeds after this regains a
    /// lapsed term, whatever happened in between.
    hold_end: Option<Duration>,
    /// A conflict (or lost create) happened: the next read decides whether I step down.
    recheck: bool,
    /// Start of the request in flight.
    pending: Option<Duration>,
    /// Start of the last request sent.
    last_sent: Option<Duration>,
    /// Receipt of the last answer that was not `Failed`.
    last_ok: Option<Duration>,
    /// Start of the last request whose answer showed what the Lease says now (a read, a 404, or my own
    /// successful conditional write): a term regained after a lapse needs one that started after it.
    fresh_from: Option<Duration>,
    /// Receipt of the last `Failed` answer, while no success followed: nothing is resent before a retry
    /// period has passed (a refused connection answers at once).
    failed_at: Option<Duration>,
}

impl View {
    fn new() -> Self {
        View {
            seen: Seen::Unknown,
            held_from: None,
            hold_end: None,
            recheck: false,
            pending: None,
            last_sent: None,
            last_ok: None,
            fresh_from: None,
            failed_at: None,
        }
    }
}

/// The role, derived from the Leases.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HaRole {
    /// Admits nothing.
    Standby,
    /// Leads at `epoch`: writes the Leases, and admits while [`Elector::is_active`].
    Leader {
        /// The failover epoch.
        epoch: FailoverEpoch,
        /// Bootstrap without a witness: the peer's Lease must be held too before acting.
        bootstrap: bool,
    },
}

/// The elector's fixed settings.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ElectorConfig {
    /// This cluster's id.
    pub cluster: String,
    /// This cluster's rank.
    pub rank: u16,
    /// Whether a witness Lease is used.
    pub witness: bool,
    /// `--ha-mode=active`: bootstrap as leader while every Lease is missing.
    pub bootstrap_active: bool,
    /// Timings.
    pub timings: Timings,
    /// One of several processes of this cluster (the members of a shard group): while Standby, follow a
    /// term another process of this cluster leads (the Leases name this cluster at the highest epoch, and
    /// changed since this process last stepped down). Each process still dates the term from its own
    /// writes, so following never extends anyone's hold.
    pub follow: bool,
    /// The uid of this cluster's `kube-system` namespace: stamped with the rank into every record written
    /// ([`Origin`]) and compared with the records read. `None`: no identity is written or checked.
    pub uid: Option<String>,
    /// The highest epoch that survives outside the Leases (the minimum-epoch parameters, the checkpoint's
    /// `was-active` mark, fence stamps on objects), read before the elector starts: every epoch this
    /// process takes is above it, so a pair whose Leases were lost (operator reinstalled, HA namespace
    /// recreated) never starts again below the stamps the fence policies compare with.
    pub floor: FailoverEpoch,
}

impl ElectorConfig {
    /// Settings for cluster `cluster` of rank `rank`.
    #[must_use]
    pub fn new(cluster: impl Into<String>, rank: u16, witness: bool, timings: Timings) -> Self {
        ElectorConfig {
            cluster: cluster.into(),
            rank,
            witness,
            bootstrap_active: false,
            timings,
            follow: false,
            uid: None,
            floor: FailoverEpoch::default(),
        }
    }

    /// The highest epoch surviving outside the Leases (see [`ElectorConfig::floor`]).
    #[must_use]
    pub fn floor(mut self, floor: FailoverEpoch) -> Self {
        self.floor = floor;
        self
    }

    /// This cluster's `kube-system` uid (see [`ElectorConfig::uid`]).
    #[must_use]
    pub fn uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = Some(uid.into());
        self
    }

    /// One of several processes of this cluster (see [`ElectorConfig::follow`]).
    #[must_use]
    pub fn follow(mut self, on: bool) -> Self {
        self.follow = on;
        self
    }

    /// Bootstrap as leader while every Lease is missing.
    #[must_use]
    pub fn bootstrap_active(mut self, on: bool) -> Self {
        self.bootstrap_active = on;
        self
    }
}

/// The elector of one process. Cheap to clone; hashable (the model stores it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Elector {
    cfg: ElectorConfig,
    views: [View; 3],
    role: HaRole,
    /// Since when a leader has held no term.
    no_term_since: Option<Duration>,
    alarm: Option<Alarm>,
    /// The highest epoch in any decodable record seen.
    max_seen: FailoverEpoch,
    /// The start-up decision (resume, bootstrap or standby) was taken.
    decided: bool,
    /// When this process started.
    started: Duration,
    /// The caller's gate on automatic promotion (the mirror's lag), default open.
    auto_promote: bool,
    /// When this process last stepped down (a follower re-follows only a record written after it).
    stepped_down_at: Option<Duration>,
    /// The switchover state at the epoch led (adopted from the Leases: the highest `seq` read wins).
    state: HaState,
    /// A token promotion in progress.
    token: Option<TokenTakeover>,
    /// When the own Lease's hold last lapsed while leading (its renewal came after `renew_deadline`): a
    /// Standby may have been promoted meanwhile, so without a witness the term is not regained before a
    /// read of the peer's Lease that started after this.
    lapsed_at: Option<Duration>,
    /// The identity the peer cluster published (its cluster id, and its `kube-system` uid and rank):
    /// a Standby writes no record, so this is how the Active sees the Standby's settings.
    peer_identity: Option<(String, Origin)>,
    /// Fault points planted in this elector (tests only).
    #[cfg(any(test, feature = "test-util"))]
    faults: crate::faults::Faults,
}

impl Elector {
    /// A process that starts at local time `now` knowing nothing: Standby until it has read the Leases.
    #[must_use]
    pub fn new(cfg: ElectorConfig, now: Duration) -> Self {
        Elector {
            cfg,
            views: [View::new(), View::new(), View::new()],
            role: HaRole::Standby,
            no_term_since: None,
            alarm: None,
            max_seen: FailoverEpoch::default(),
            decided: false,
            started: now,
            auto_promote: true,
            stepped_down_at: None,
            state: HaState::default(),
            token: None,
            lapsed_at: None,
            peer_identity: None,
            #[cfg(any(test, feature = "test-util"))]
            faults: crate::faults::Faults::none(),
        }
    }

    /// The same elector with fault points planted ([`crate::faults`]; tests only).
    #[cfg(any(test, feature = "test-util"))]
    #[must_use]
    pub fn with_faults(mut self, faults: crate::faults::Faults) -> Self {
        self.faults = faults;
        self
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &ElectorConfig {
        &self.cfg
    }

    /// The role.
    #[must_use]
    pub fn role(&self) -> HaRole {
        self.role
    }

    /// The current alarm.
    #[must_use]
    pub fn alarm(&self) -> Option<Alarm> {
        self.alarm
    }

    /// The highest epoch seen in any decodable record.
    #[must_use]
    pub fn max_seen(&self) -> FailoverEpoch {
        self.max_seen
    }

    /// What this elector last saw of `slot`.
    #[must_use]
    pub fn seen(&self, slot: Slot) -> &Seen {
        &self.views[slot.index()].seen
    }

    /// Open or close automatic promotion (witness mode; the mirror's lag gate).
    pub fn set_auto_promote(&mut self, allowed: bool) {
        self.auto_promote = allowed;
    }

    fn slots(&self) -> &'static [Slot] {
        if self.cfg.witness {
            &Slot::ALL
        } else {
            &Slot::ALL[..2]
        }
    }

    fn view(&self, s: Slot) -> &View {
        &self.views[s.index()]
    }

    fn view_mut(&mut self, s: Slot) -> &mut View {
        &mut self.views[s.index()]
    }

    fn published(&self) -> Published {
        let t = &self.cfg.timings;
        Published {
            lease_duration: t.lease_duration,
            renew_deadline: t.renew_deadline,
            request_timeout: t.request_timeout,
        }
    }

    fn my_record(&self, epoch: FailoverEpoch) -> Record {
        Record {
            cluster: self.cfg.cluster.clone(),
            epoch,
            timings: self.published(),
            state: self.state.clone(),
            origin: self.cfg.uid.as_ref().map(|uid| Origin {
                uid: uid.clone(),
                rank: self.cfg.rank,
            }),
        }
    }

    /// What `r` says of the configuration, when it conflicts with ours: our cluster id written from another
    /// cluster, or the other cluster at our rank. A record without an identity (an older build) is never one.
    fn misconfigured(&self, r: &Record, slot: Slot) -> Option<Alarm> {
        self.conflicts(&r.cluster, r.origin.as_ref()?, slot)
    }

    /// What the identity `(cluster, o)` of another writer says of our configuration (see
    /// [`Elector::misconfigured`]).
    fn conflicts(&self, cluster: &str, o: &Origin, slot: Slot) -> Option<Alarm> {
        if planted!(self, IGNORE_IDENTITY) {
            return None;
        }
        let uid = self.cfg.uid.as_ref()?;
        if cluster == self.cfg.cluster {
            (o.uid != *uid).then_some(Alarm::IdentityConflict(slot))
        } else {
            (o.uid != *uid && o.rank == self.cfg.rank).then_some(Alarm::EqualRank(slot))
        }
    }

    /// The first slot whose record conflicts with our configuration, else the peer's published identity
    /// if it does.
    fn misconfiguration(&self) -> Option<Alarm> {
        self.slots()
            .iter()
            .find_map(|&s| match &self.view(s).seen {
                Seen::Present {
                    record: Some(r), ..
                } => self.misconfigured(r, s),
                _ => None,
            })
            .or_else(|| {
                let (cluster, o) = self.peer_identity.as_ref()?;
                self.conflicts(cluster, o, Slot::Peer)
            })
    }

    /// The identity the peer cluster published (`None`: none, or unreadable). A conflicting one holds
    /// this side, alarmed, at the next step, and clears when the peer publishes a fixed one.
    pub fn on_peer_identity(&mut self, identity: Option<(String, Origin)>) {
        self.peer_identity = identity;
    }

    /// The epoch every new one is taken above: the highest seen in a record or surviving elsewhere.
    fn above(&self) -> FailoverEpoch {
        self.max_seen.max(self.cfg.floor)
    }

    /// The peer client reaches this very cluster: raise the alarm for good (the driver's start check).
    pub fn peer_is_this_cluster(&mut self) -> Vec<Transition> {
        let mut out = Vec::new();
        if self.alarm != Some(Alarm::PeerIsThisCluster) {
            self.alarm = Some(Alarm::PeerIsThisCluster);
            out.push(Transition::Alarmed(Alarm::PeerIsThisCluster));
        }
        out
    }

    /// The switchover state of the term led (`demoting`: nothing is admitted).
    #[must_use]
    pub fn state(&self) -> &HaState {
        &self.state
    }

    /// Leading at this epoch in the state `demoting` (the members drain and acknowledge it).
    #[must_use]
    pub fn demoting(&self) -> Option<FailoverEpoch> {
        match self.role {
            HaRole::Leader { epoch, .. } if self.state.demoting => Some(epoch),
            _ => None,
        }
    }

    /// The token's source still demoting at the token's epoch (perhaps a copy of its state from before the
    /// token): a conflict with it is a renewal of the demoting holder, not a reason to give up.
    fn token_source_demoting(&self, r: &Record) -> bool {
        self.token
            .as_ref()
            .is_some_and(|t| r.cluster == t.source && r.epoch == t.epoch && r.state.demoting)
    }

    fn token_matches(&self, r: &Record) -> bool {
        self.token.as_ref().is_some_and(|t| {
            r.cluster == t.source
                && r.epoch == t.epoch
                && r.state.demoting
                && r.state.token.as_deref() == Some(t.token.as_str())
        })
    }

    fn adopt(&mut self, r: &Record) {
        if r.state.seq > self.state.seq {
            self.state = r.state.clone();
        }
    }

    fn is_mine(&self, r: &Record, epoch: FailoverEpoch) -> bool {
        self.names_us(r) && r.epoch == epoch
    }

    /// `r` names this cluster: its id, and (when both sides publish one) its `kube-system` uid.
    fn names_us(&self, r: &Record) -> bool {
        r.cluster == self.cfg.cluster
            && match (&r.origin, &self.cfg.uid) {
                (Some(o), Some(uid)) => o.uid == *uid || planted!(self, IGNORE_IDENTITY),
                _ => true,
            }
    }

    fn mine(&self, s: Slot, epoch: FailoverEpoch) -> bool {
        matches!(&self.view(s).seen, Seen::Present { record: Some(r), .. } if self.is_mine(r, epoch))
    }

    /// The wait before taking over a version of `record` (`None`: missing or undecodable).
    fn wait(&self, record: Option<&Record>) -> Duration {
        let t = &self.cfg.timings;
        if planted!(self, IGNORE_PUBLISHED_TIMINGS) {
            return t.lease_duration + t.grace;
        }
        let published = record.map_or(Duration::ZERO, |r| {
            r.timings.renew_deadline + r.timings.request_timeout
        });
        t.lease_duration
            .max(published)
            .max(record.map_or(Duration::ZERO, |r| r.timings.lease_duration))
            + t.grace
    }

    /// The slot's current version has been unchanged (or missing) for the full wait.
    fn stale(&self, s: Slot, now: Duration) -> bool {
        match &self.view(s).seen {
            Seen::Present {
                record: Some(r),
                since,
                ..
            } => now >= *since + self.wait(Some(r)),
            Seen::Missing { since } => {
                planted!(self, CREATE_MISSING_AT_ONCE) || now >= *since + self.wait(None)
            }
            _ => false,
        }
    }

    fn held(&self, s: Slot, now: Duration) -> bool {
        let HaRole::Leader { epoch, .. } = self.role else {
            return false;
        };
        let v = self.view(s);
        v.held_from
            .is_some_and(|h| now < h + self.cfg.timings.renew_deadline)
            && self.mine(s, epoch)
    }

    fn in_term(&self, now: Duration) -> bool {
        let HaRole::Leader { bootstrap, .. } = self.role else {
            return false;
        };
        if !self.held(Slot::Own, now) {
            return false;
        }
        if self.cfg.witness {
            self.held(Slot::Peer, now) || self.held(Slot::Witness, now)
        } else {
            !bootstrap || self.held(Slot::Peer, now)
        }
    }

    /// The epoch this process may act under now: leader, inside its term, no alarm, and (without a
    /// witness) the peer's Lease read since start. "Started acting" is only ever signalled after a
    /// successful write, because a hold needs one.
    #[must_use]
    pub fn is_active(&self, now: Duration) -> Option<FailoverEpoch> {
        let HaRole::Leader { epoch, .. } = self.role else {
            return None;
        };
        let peer = self.view(Slot::Peer);
        let peer_read = match self.lapsed_at {
            // regained after a lapse: only a read started after it can show a promotion meanwhile
            Some(t) => peer.fresh_from.is_some_and(|f| f >= t),
            None => peer.last_ok.is_some(),
        };
        let acts = self.alarm.is_none() && !self.state.demoting;
        (acts && (self.cfg.witness || peer_read) && self.in_term(now)).then_some(epoch)
    }

    /// When the current term ends if nothing is renewed (`None` if not active): the earliest hold that
    /// the term needs.
    #[must_use]
    pub fn term_deadline(&self, now: Duration) -> Option<Duration> {
        self.is_active(now)?;
        let end = |s: Slot| {
            self.held(s, now)
                .then(|| {
                    self.view(s)
                        .held_from
                        .map(|h| h + self.cfg.timings.renew_deadline)
                })
                .flatten()
        };
        let own = end(Slot::Own)?;
        let other = if self.cfg.witness {
            end(Slot::Peer).max(end(Slot::Witness))?
        } else if let HaRole::Leader {
            bootstrap: true, ..
        } = self.role
        {
            end(Slot::Peer)?
        } else {
            own
        };
        Some(own.min(other))
    }

    /// Armed: the peer's Lease has been stale, missing or unreadable for the full wait on this process's
    /// clock, counted from this process's start (a restart disarms; arming never shortens a wait).
    #[must_use]
    pub fn armed(&self, now: Duration) -> bool {
        let v = self.view(Slot::Peer);
        let unreadable = now >= v.last_ok.unwrap_or(self.started) + self.wait(None);
        self.stale(Slot::Peer, now) || unreadable
    }

    /// `kshard ha promote --force --old-active-stopped`: start a candidacy at a new epoch now. The Lease
    /// rules still apply (each takeover waits its full wait).
    pub fn force_promote(&mut self, now: Duration) -> Result<Vec<Transition>, ForceError> {
        if matches!(self.role, HaRole::Leader { .. }) {
            return Err(ForceError::AlreadyLeading);
        }
        if matches!(self.alarm, Some(Alarm::Undecodable(_))) {
            return Err(ForceError::Undecodable);
        }
        if let Some(
            a @ (Alarm::IdentityConflict(_) | Alarm::EqualRank(_) | Alarm::PeerIsThisCluster),
        ) = self.alarm
        {
            return Err(ForceError::Misconfigured(a));
        }
        if !self.armed(now) {
            return Err(ForceError::NotArmed);
        }
        let epoch = self
            .above()
            .next(self.cfg.rank)
            .map_err(|_| ForceError::Exhausted)?;
        self.alarm = None;
        self.decided = true;
        self.lead(epoch, false);
        Ok(vec![Transition::Promoted(epoch)])
    }

    /// `kshard ha promote --token`: start a candidacy at a new epoch that takes over every Lease the
    /// demoting source `t` still holds in the state `demoting(token)` at once. The caller has checked the
    /// token against the Leases; here the token's epoch must be the highest seen. Without a witness the
    /// source's Lease (the peer's) is written first: a `demote --cancel` and this promotion then serialise
    /// on it.
    pub fn promote_with_token(
        &mut self,
        t: TokenTakeover,
        _now: Duration,
    ) -> Result<Vec<Transition>, ForceError> {
        if matches!(self.role, HaRole::Leader { .. }) {
            return Err(ForceError::AlreadyLeading);
        }
        if matches!(self.alarm, Some(Alarm::Undecodable(_))) {
            return Err(ForceError::Undecodable);
        }
        if let Some(
            a @ (Alarm::IdentityConflict(_) | Alarm::EqualRank(_) | Alarm::PeerIsThisCluster),
        ) = self.alarm
        {
            return Err(ForceError::Misconfigured(a));
        }
        if t.epoch != self.max_seen {
            return Err(ForceError::TokenStale {
                token: t.epoch,
                seen: self.max_seen,
            });
        }
        let epoch = self
            .above()
            .next(self.cfg.rank)
            .map_err(|_| ForceError::Exhausted)?;
        self.alarm = None;
        self.decided = true;
        self.lead(epoch, false);
        self.token = Some(t);
        Ok(vec![Transition::Promoted(epoch)])
    }

    fn lead(&mut self, epoch: FailoverEpoch, bootstrap: bool) {
        self.role = HaRole::Leader { epoch, bootstrap };
        self.state = HaState::default();
        self.token = None;
        self.no_term_since = None;
        self.lapsed_at = None;
        for v in &mut self.views {
            v.held_from = None;
            v.hold_end = None;
        }
    }

    fn step_down(&mut self, why: StepDown, now: Duration, out: &mut Vec<Transition>) {
        if let HaRole::Leader { epoch, .. } = self.role {
            self.role = HaRole::Standby;
            self.stepped_down_at = Some(now);
            self.no_term_since = None;
            self.state = HaState::default();
            self.token = None;
            for v in &mut self.views {
                v.held_from = None;
            }
            out.push(Transition::SteppedDown(epoch, why));
        }
    }

    /// Feed the answer to the request in flight for `slot`, received at local time `now`.
    pub fn on_answer(&mut self, slot: Slot, answer: Answer, now: Duration) -> Vec<Transition> {
        let mut out = Vec::new();
        let Some(start) = self.view_mut(slot).pending.take() else {
            return out; // nothing in flight: a stray answer
        };
        let answer_ok = answer != Answer::Failed;
        match answer {
            Answer::Found { rv, record } => {
                self.view_mut(slot).fresh_from = Some(start);
                self.on_found(slot, rv, record, now, &mut out);
            }
            Answer::NotFound => {
                let v = self.view_mut(slot);
                v.last_ok = Some(now);
                v.fresh_from = Some(start);
                v.held_from = None;
                v.recheck = false;
                if !matches!(v.seen, Seen::Missing { .. }) {
                    v.seen = Seen::Missing { since: now };
                }
            }
            Answer::Written { rv } => self.on_written(slot, rv, start, now),
            Answer::Conflict | Answer::AlreadyExists => {
                let v = self.view_mut(slot);
                v.last_ok = Some(now);
                v.held_from = None;
                v.seen = Seen::Unknown;
                v.recheck = true;
            }
            Answer::Failed => self.view_mut(slot).failed_at = Some(now),
        }
        if answer_ok {
            self.view_mut(slot).failed_at = None;
        }
        self.settle(now, &mut out);
        out
    }

    fn on_written(&mut self, slot: Slot, rv: String, start: Duration, now: Duration) {
        let HaRole::Leader { epoch, .. } = self.role else {
            // stepped down while the write was in flight: it counts as nothing but a new version
            let v = self.view_mut(slot);
            v.seen = Seen::Unknown;
            return;
        };
        let record = self.my_record(epoch);
        let renew_deadline = self.cfg.timings.renew_deadline;
        // not `held_from`: a 409 after a renewal whose answer was lost clears it, and the write after
        // the re-read would then not see the lapse (the real-cluster demo's heal window)
        let lapsed = self.view(slot).hold_end;
        if slot == Slot::Own && lapsed.is_some_and(|end| end <= now) {
            self.lapsed_at = lapsed;
        }
        let v = self.view_mut(slot);
        v.last_ok = Some(now);
        v.fresh_from = Some(start);
        v.held_from = Some(start);
        v.hold_end = Some(start + renew_deadline);
        v.recheck = false;
        v.seen = Seen::Present {
            rv,
            record: Some(record),
            since: now,
        };
        self.end_bootstrap(now);
    }

    /// A bootstrap leader without a witness needs both Leases held at once (two processes both started
    /// with `--ha-mode=active` cannot both win both creates). Once it has, both Leases name it, the flag no
    /// longer matters to anyone (HA.md contract 4: the role comes from the Leases), and it is an ordinary
    /// Active: it keeps its term on its own Lease when the peer becomes unreachable.
    fn end_bootstrap(&mut self, now: Duration) {
        if let HaRole::Leader {
            epoch,
            bootstrap: true,
        } = self.role
        {
            if self.held(Slot::Own, now) && self.held(Slot::Peer, now) {
                self.role = HaRole::Leader {
                    epoch,
                    bootstrap: false,
                };
            }
        }
    }

    fn on_found(
        &mut self,
        slot: Slot,
        rv: String,
        record: Option<Record>,
        now: Duration,
        out: &mut Vec<Transition>,
    ) {
        let keep_since = planted!(self, PRECONDITION_FROM_LATER_READ);
        let v = self.view_mut(slot);
        v.last_ok = Some(now);
        let recheck = std::mem::take(&mut v.recheck);
        let since = match &v.seen {
            Seen::Present { rv: old, since, .. } if *old == rv || keep_since => *since,
            _ => now,
        };
        v.seen = Seen::Present {
            rv,
            record: record.clone(),
            since,
        };
        let Some(r) = record else {
            self.alarm = Some(Alarm::Undecodable(slot));
            out.push(Transition::Alarmed(Alarm::Undecodable(slot)));
            self.step_down(StepDown::Undecodable(slot), now, out);
            return;
        };
        self.max_seen = self.max_seen.max(r.epoch);
        if let HaRole::Leader { epoch, .. } = self.role {
            let mine = self.is_mine(&r, epoch);
            if mine {
                self.adopt(&r);
                if planted!(self, HOLD_FROM_READS) {
                    self.view_mut(slot).held_from = Some(now);
                }
            } else {
                self.view_mut(slot).held_from = None;
            }
            let counts = slot != Slot::Peer || !self.cfg.witness;
            if r.epoch > epoch && counts {
                self.step_down(StepDown::HigherEpoch(slot), now, out);
            } else if recheck && !mine && r.epoch >= epoch && !self.token_source_demoting(&r) {
                // A record at a lower epoch is a deposed writer's late write (its request stalled in
                // the apiserver and committed after this term began): not a reason to step down. The
                // slot is taken back after the full wait, like any lower-epoch record (`write_for`).
                self.step_down(StepDown::Conflict(slot), now, out);
            }
        }
    }

    /// Take the decisions that depend only on what is known and the time: start-up, candidacy, the
    /// no-term limit, and clearing an alarm whose cause is gone.
    fn settle(&mut self, now: Duration, out: &mut Vec<Transition>) {
        if let Some(Alarm::Undecodable(s)) = self.alarm {
            if matches!(&self.view(s).seen, Seen::Present { record: None, .. }) {
                return;
            }
            self.alarm = None;
        }
        // a conflicting configuration holds everything while any Lease shows it (a fixed side rewrites them)
        if self.alarm != Some(Alarm::PeerIsThisCluster) {
            let found = self.misconfiguration();
            if let Some(a) = found.filter(|_| found != self.alarm) {
                out.push(Transition::Alarmed(a));
            }
            if found.is_some()
                || matches!(
                    self.alarm,
                    Some(Alarm::IdentityConflict(_) | Alarm::EqualRank(_))
                )
            {
                self.alarm = found;
            }
        }
        if !self.decided {
            self.decide_start(out);
        }
        match self.role {
            HaRole::Leader { .. } => {
                // "holding a Lease without a term": a candidate still acquiring holds nothing yet
                let holds_some = Slot::ALL.iter().any(|&s| self.held(s, now));
                if self.in_term(now) || !holds_some {
                    self.no_term_since = None;
                } else {
                    let since = *self.no_term_since.get_or_insert(now);
                    if now >= since + self.cfg.timings.lease_duration {
                        self.step_down(StepDown::NoTerm, now, out);
                    }
                }
            }
            HaRole::Standby if self.decided => {
                self.consider_following(out);
                if self.role == HaRole::Standby {
                    self.consider_candidacy(now, out);
                }
            }
            HaRole::Standby => {}
        }
    }

    fn decide_start(&mut self, out: &mut Vec<Transition>) {
        let known = |s: Slot| !matches!(self.view(s).seen, Seen::Unknown);
        let missing = |s: Slot| matches!(self.view(s).seen, Seen::Missing { .. });
        let need: [Slot; 2] = if self.cfg.witness {
            [Slot::Own, Slot::Witness]
        } else {
            [Slot::Own, Slot::Peer]
        };
        if !need.iter().all(|&s| known(s)) {
            let peer = self.view(Slot::Peer);
            let peer_failed =
                peer.last_ok.is_none() && peer.last_sent.is_some() && peer.pending.is_none();
            if !self.cfg.witness && peer_failed && self.alarm.is_none() {
                self.alarm = Some(Alarm::PeerUnreadableAtStart);
                out.push(Transition::Alarmed(Alarm::PeerUnreadableAtStart));
            }
            return;
        }
        if need.iter().all(|&s| missing(s)) {
            // bootstrap needs every Lease seen missing: wait for the peer's answer
            if !self.slots().iter().all(|&s| known(s)) {
                return;
            }
            let every_missing = self.slots().iter().all(|&s| missing(s));
            self.decided = true;
            if self.cfg.bootstrap_active && every_missing {
                if let Ok(e) = self.above().next(self.cfg.rank) {
                    self.lead(e, !self.cfg.witness);
                    out.push(Transition::Bootstrapped(e));
                }
            }
            return;
        }
        if self.alarm == Some(Alarm::PeerUnreadableAtStart) {
            self.alarm = None;
        }
        self.decided = true;
        let resume_slot = if self.cfg.witness {
            Slot::Witness
        } else {
            Slot::Own
        };
        if let Seen::Present {
            record: Some(r), ..
        } = &self.view(resume_slot).seen
        {
            if self.names_us(r) && r.epoch == self.max_seen && self.alarm.is_none() {
                let (e, r) = (r.epoch, r.clone());
                self.lead(e, false);
                self.adopt(&r);
                out.push(Transition::Resumed(e));
            }
        }
    }

    /// [`ElectorConfig::follow`]: lead the term another process of this cluster leads. The record that
    /// names this cluster is the one a restart would resume on (the witness's, or without one the own
    /// Lease's with the peer read and nothing higher seen).
    fn consider_following(&mut self, out: &mut Vec<Transition>) {
        if !self.cfg.follow || self.alarm.is_some() {
            return;
        }
        let slot = if self.cfg.witness {
            Slot::Witness
        } else {
            Slot::Own
        };
        if !self.cfg.witness && self.view(Slot::Peer).last_ok.is_none() {
            return;
        }
        let Seen::Present {
            record: Some(r),
            since,
            ..
        } = &self.view(slot).seen
        else {
            return;
        };
        let fresh = self.stepped_down_at.is_none_or(|t| *since > t);
        if self.names_us(r) && r.epoch == self.max_seen && fresh {
            let (e, r) = (r.epoch, r.clone());
            self.lead(e, false);
            self.adopt(&r);
            out.push(Transition::Resumed(e));
        }
    }

    fn consider_candidacy(&mut self, now: Duration, out: &mut Vec<Transition>) {
        if !self.cfg.witness || !self.auto_promote || self.alarm.is_some() {
            return;
        }
        // only over a witness record (never at bootstrap, when every Lease is missing: the flag decides),
        // and never from a `demoting` one: that holder hands over with a token
        let witness_record = matches!(
            &self.view(Slot::Witness).seen,
            Seen::Present {
                record: Some(r),
                ..
            } if !r.state.demoting
        );
        if witness_record && self.stale(Slot::Witness, now) && self.stale(Slot::Own, now) {
            if let Ok(e) = self.above().next(self.cfg.rank) {
                self.lead(e, false);
                out.push(Transition::Promoted(e));
            }
        }
    }

    /// The requests to send at local time `now` (at most one in flight per slot), after taking the
    /// decisions that are due. Call it every retry period and after every answer.
    pub fn poll(&mut self, now: Duration) -> (Vec<Request>, Vec<Transition>) {
        let mut out = Vec::new();
        self.settle(now, &mut out);
        let mut reqs = Vec::new();
        for &s in self.slots() {
            let v = self.view(s);
            let backing_off = v
                .failed_at
                .is_some_and(|t| now < t + self.cfg.timings.retry_period);
            if v.pending.is_some() || backing_off {
                continue;
            }
            let op = match self.write_for(s, now) {
                Decision::Write(op) => op,
                Decision::NotYet => continue,
                Decision::Read => {
                    let v = self.view(s);
                    let due = v.recheck
                        || matches!(v.seen, Seen::Unknown)
                        || v.last_sent
                            .is_none_or(|t| now >= t + self.cfg.timings.retry_period);
                    if !due {
                        continue;
                    }
                    Op::Read
                }
            };
            let v = self.view_mut(s);
            v.pending = Some(now);
            v.last_sent = Some(now);
            reqs.push(Request { slot: s, op });
        }
        (reqs, out)
    }

    /// The slot's request in flight was abandoned without an answer (the caller's timeout fired): the
    /// same as a `Failed` answer.
    pub fn on_timeout(&mut self, slot: Slot, now: Duration) -> Vec<Transition> {
        self.on_answer(slot, Answer::Failed, now)
    }

    /// Whether a request is in flight for `slot`.
    #[must_use]
    pub fn pending(&self, slot: Slot) -> bool {
        self.view(slot).pending.is_some()
    }

    fn order_allows(&self, s: Slot, epoch: FailoverEpoch, now: Duration) -> bool {
        let own_held = self.held(Slot::Own, now);
        // a token promotion without a witness writes the source's Lease (the peer's) first
        let token_first = self.token.is_some() && !self.cfg.witness && !self.mine(Slot::Own, epoch);
        match s {
            Slot::Own if token_first => self.held(Slot::Peer, now),
            Slot::Own => {
                !self.cfg.witness || self.mine(Slot::Own, epoch) || self.held(Slot::Witness, now)
            }
            Slot::Witness => own_held || !self.mine(Slot::Own, epoch),
            Slot::Peer => own_held || token_first,
        }
    }

    fn write_for(&self, s: Slot, now: Duration) -> Decision {
        let HaRole::Leader { epoch, .. } = self.role else {
            return Decision::Read;
        };
        if self.alarm.is_some() || !self.order_allows(s, epoch, now) {
            return Decision::Read;
        }
        let v = self.view(s);
        let record = self.my_record(epoch);
        match &v.seen {
            Seen::Unknown | Seen::Present { record: None, .. } => Decision::Read,
            Seen::Present {
                rv,
                record: Some(r),
                ..
            } if self.is_mine(r, epoch) && planted!(self, HOLD_FROM_READS) => Decision::Read,
            Seen::Present {
                rv,
                record: Some(r),
                ..
            } if self.is_mine(r, epoch) => {
                let due = v
                    .held_from
                    .is_none_or(|h| now >= h + self.cfg.timings.retry_period);
                if due {
                    Decision::Write(Op::Update {
                        rv: rv.clone(),
                        record,
                    })
                } else {
                    Decision::NotYet
                }
            }
            Seen::Present {
                rv,
                record: Some(r),
                ..
            } => {
                if r.epoch < epoch && (self.stale(s, now) || self.token_matches(r)) {
                    Decision::Write(Op::Update {
                        rv: rv.clone(),
                        record,
                    })
                } else {
                    Decision::Read
                }
            }
            Seen::Missing { .. } if self.stale(s, now) => Decision::Write(Op::Create { record }),
            Seen::Missing { .. } => Decision::Read,
        }
    }
}

enum Decision {
    Write(Op),
    NotYet,
    Read,
}

#[cfg(test)]
mod heal_tests;
