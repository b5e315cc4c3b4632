//! The runtime's state, one part per concept, each owning its fields: what `Runtime` holds besides what
//! every part shares (the config, the API handles, the ownership, the metrics and Events).

use super::*;
use crate::group::permission::PermissionError;

/// This member's own Lease: renewals, self-fencing, the report it publishes, hints it follows (`membership.rs`).
pub(super) struct Membership {
    pub(super) own: Option<Lease>,
    pub(super) last_renew_ok: Option<Instant>,
    pub(super) continuous_since: Option<Instant>,
    pub(super) seen_generation: u64,
    pub(super) fenced_since: Option<Instant>,
    /// The report in the Lease as last written: an early renewal is only worth it when it changes.
    pub(super) published: String,
    /// Times this member self-fenced (renew deadline passed, or taken over).
    pub(super) self_fences: u64,
    /// Times this member rejoined as a new incarnation.
    pub(super) rejoins: u64,
    /// Member: the highest assignment hint we followed (read the assignment directly for).
    pub(super) hint_followed: u64,
    /// Joining over another incarnation's Lease: the resourceVersion we read, and when we first read it.
    pub(super) claim_seen: Option<(String, Instant)>,
    /// A renewal of our Lease is in flight.
    pub(super) renewal_in_flight: bool,
    /// When the last renewal of our Lease was sent (on our clock).
    pub(super) renewal_started: Option<Instant>,
    /// Our Lease was written or read back since we last looked for an assignment hint in it.
    pub(super) hint_due: bool,
}

/// What this member observes of the others' Leases, on its own clock (`observe.rs`).
pub(super) struct Observations {
    pub(super) observed: BTreeMap<String, Obs>,
    pub(super) last_membership_change: Instant,
    /// When the lease watch last listed (or its view last had a gap), on our clock: an owner not observed
    /// since is unknown until `lease_duration + grace` later.
    pub(super) leases_synced_at: Option<Instant>,
    /// During a relist of the lease watch: the Lease names in it (the others were deleted meanwhile).
    pub(super) leases_relisted: Option<BTreeSet<String>>,
    /// When the lease watch last delivered anything (a gap in it is a gap in our observations).
    pub(super) last_lease_event: Option<Instant>,
    /// Incarnations replaced on their Lease by another one of the same name: when their renewal was last
    /// seen to change, and whether they were taken over.
    pub(super) displaced: BTreeMap<MemberId, (Instant, bool)>,
    /// The origin of the planner's join order (ms since this instant).
    pub(super) origin: Instant,
    /// Group Leases ignored for an invalid member identity (warned about once).
    pub(super) invalid_leases: BTreeSet<String>,
    /// Group Leases whose member report is of another format (another build): why, per Lease name.
    pub(super) foreign_formats: BTreeMap<String, String>,
    /// Reading members' Pods was refused: the Pod evidence is not used (`pods.rs`).
    pub(super) pods_forbidden: bool,
}

/// The coordinator Lease: whether this member leads, its term, its writes (`election.rs`).
pub(super) struct Election {
    pub(super) leader: bool,
    /// Our term on the coordinator Lease while we lead, published to singleton work.
    pub(super) term: Option<LeaderTerm>,
    pub(super) leadership: watch::Sender<Option<LeaderTerm>>,
    /// resourceVersions of our recent writes to the coordinator Lease, newest last.
    pub(super) coordinator_writes: VecDeque<String>,
    /// A write of the coordinator Lease is in flight.
    pub(super) elect_in_flight: bool,
    /// When our last write of the coordinator Lease was sent.
    pub(super) elected_at: Option<Instant>,
}

/// The assignment as read, and the coordinator's memory between passes (`coordinator_pass.rs`, `channel.rs`, `fence_params.rs`).
pub(super) struct Coordination {
    pub(super) assignment: Option<Assignment>,
    pub(super) assignment_cm: Option<ConfigMap>,
    pub(super) assignment_missing: bool,
    /// An assignment we rebuilt (re-created without a view of the one before it, or written over a
    /// rolled-back one): no planning until every live member applied it and the fences they held before
    /// can no longer be valid (see `coordinator_pass.rs`, `rebuild_holds`).
    pub(super) rebuild: Option<Rebuild>,
    /// The generation of the last rebuild whose hold we served (or saw end): not held again.
    pub(super) rebuild_served: u64,
    /// The stored assignment is older than our view (written back over it): our view goes back over it.
    pub(super) stored_behind: bool,
    /// Times we found a rolled-back assignment (metric).
    pub(super) rollbacks: u64,
    /// Members whose reported generations were refused as out of reach (alarmed once each).
    pub(super) reports_refused: BTreeSet<MemberId>,
    /// When we first saw each move in flight in its phase (`true`: `Draining`).
    pub(super) move_first_seen: BTreeMap<(MoveId, bool), Instant>,
    pub(super) takeovers: VecDeque<Instant>,
    pub(super) handoffs: u64,
    pub(super) takeovers_done: u64,
    /// The assignment watch listed once: from then on, no ConfigMap means it is absent.
    pub(super) assignment_listed: bool,
    /// The ConfigMap present is not one this member can apply (another `S`/key/format, corrupt, an absurd
    /// generation): why. A coordinator never writes over it.
    pub(super) assignment_refused: Option<String>,
    /// During a relist of the assignment watch: whether the ConfigMap was in it.
    pub(super) assignment_relisted: Option<bool>,
    /// The fence parameters as last read or written (`fence_params`).
    pub(super) fence_floors: floors::Floors,
    /// Coordinator: since when each live member is behind the assignment, and the generation (then the
    /// newest) it has to apply to stop the clock.
    pub(super) lag_since: BTreeMap<MemberId, (Instant, u64)>,
    /// Coordinator: when we last told each lagging member through its Lease.
    pub(super) nudged: BTreeMap<MemberId, Instant>,
    /// Something the lease watch delivered, or a takeover just written, asks the coordinator to look again.
    pub(super) coordinate_soon: bool,
}

/// The admission gates this runtime sets: the legacy leader gate and the hold (`gates.rs`).
pub(super) struct Gates {
    /// The legacy leader Lease: (renewTime last seen, when it last changed on our clock).
    pub(super) legacy: Option<(Option<String>, Instant)>,
    /// The legacy leader Lease cannot be read (alarm raised, admission held).
    pub(super) legacy_alarm: bool,
    /// The legacy leader Lease has a live holder (or cannot be read).
    pub(super) legacy_live: bool,
    /// The admission hold this runtime set (see [`Runtime::update_hold`]).
    pub(super) hold: Option<Hold>,
}

pub(super) struct Obs {
    pub(super) id: MemberId,
    pub(super) rv: String,
    pub(super) renew_time: Option<String>,
    pub(super) last_change: Instant,
    pub(super) first_seen: Instant,
    pub(super) report: Option<MemberReport>,
    pub(super) taken_over: bool,
    pub(super) deleted_at: Option<Instant>,
    pub(super) role_coordinator: bool,
    pub(super) holder: Option<String>,
    pub(super) lease: Lease,
    /// The Pod this incarnation published was observed deleted or replaced since its last renewal
    /// (evidence it is gone: [`crate::group::report::POD`]).
    pub(super) pod_gone: bool,
    /// When its Pod was last read (at most once a lease period: a brownout's stalled members keep their
    /// Pods, and reading each at every pass would slow the pass that must take them over).
    pub(super) pod_read_at: Option<Instant>,
}

/// A rebuilt assignment the coordinator waits on before planning: its generation, and since when every live
/// member has reported it applied (on our clock).
#[derive(Debug, Clone, Copy)]
pub(super) struct Rebuild {
    pub(super) generation: u64,
    pub(super) all_applied_at: Option<Instant>,
}

/// A request as RBAC sees it: the verb, the resource, the object named (if any).
pub(super) type PermissionKey = (&'static str, &'static str, Option<String>);

/// The group's requests the API server refused (401, 403) and has not answered since, each with its refusal
/// and when it was first seen (`permissions.rs`).
#[derive(Default)]
pub(super) struct Permissions {
    pub(super) denied: BTreeMap<PermissionKey, (PermissionError, Instant)>,
}
