//! What a member tells its operator: a status snapshot and health for `/healthz` and `/readyz`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::permission::PermissionError;
use crate::ownership::MemberId;
use crate::shard::ShardSet;

/// A snapshot of one member's view of its group.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStatus {
    /// This member (its current incarnation).
    pub member: MemberId,
    /// The group's namespace (its Leases, ConfigMaps and Events).
    pub namespace: String,
    /// It holds the coordinator Lease.
    pub coordinator: bool,
    /// The assignment generation it applied.
    pub generation: u64,
    /// The shards it owns (admitted or self-fenced).
    pub owned: ShardSet,
    /// Members it sees renewing.
    pub live_members: usize,
    /// Shards moving, per the assignment it holds.
    pub moves_in_flight: usize,
    /// It admits nothing until it renews.
    pub self_fenced: bool,
    /// Its Lease is established.
    pub joined: bool,
    /// A request of the group the API server refuses (401, 403), the first of them while any is: a
    /// missing Role, not a timing problem ([`Health::permission_error`]).
    pub permission_error: Option<PermissionError>,
}

impl GroupStatus {
    pub(crate) fn initial(member: MemberId, namespace: &str) -> Self {
        GroupStatus {
            member,
            namespace: namespace.to_owned(),
            coordinator: false,
            generation: 0,
            owned: ShardSet::new(),
            live_members: 0,
            moves_in_flight: 0,
            self_fenced: true,
            joined: false,
            permission_error: None,
        }
    }
}

#[derive(Debug, Default)]
struct HealthState {
    fenced_since: Option<Instant>,
    collision: bool,
    joined: bool,
    assignment_refused: Option<String>,
    assignment_rollback: Option<String>,
    foreign_format: Option<String>,
    /// The oldest refusal (401, 403) of a request of the group not answered since, and when it was first seen.
    permission: Option<(PermissionError, Instant)>,
    /// Why the member's task ended with an error.
    task_error: Option<String>,
}

/// Liveness and readiness of a member, for `/healthz` and `/readyz`. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Health {
    state: Arc<Mutex<HealthState>>,
    unhealthy_after_fenced: Duration,
    /// A refusal that lasts this long (the renew deadline) is not transient.
    refused_for: Duration,
    namespace: Arc<str>,
}

impl Health {
    pub(crate) fn new(
        unhealthy_after_fenced: Duration,
        renew_deadline: Duration,
        namespace: &str,
    ) -> Self {
        Health {
            state: Arc::default(),
            unhealthy_after_fenced,
            refused_for: renew_deadline,
            namespace: namespace.into(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HealthState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn set_fenced_since(&self, since: Option<Instant>) {
        let mut s = self.lock();
        s.fenced_since = since;
        if since.is_none() {
            s.joined = true;
        }
    }

    pub(crate) fn set_collision(&self, collision: bool) {
        self.lock().collision = collision;
    }

    pub(crate) fn set_assignment_refused(&self, why: Option<String>) {
        self.lock().assignment_refused = why;
    }

    pub(crate) fn set_assignment_rollback(&self, why: Option<String>) {
        self.lock().assignment_rollback = why;
    }

    pub(crate) fn set_foreign_format(&self, why: Option<String>) {
        self.lock().foreign_format = why;
    }

    pub(crate) fn set_permission_error(&self, p: Option<(PermissionError, Instant)>) {
        self.lock().permission = p;
    }

    pub(crate) fn set_task_error(&self, why: String) {
        self.lock().task_error = Some(why);
    }

    /// `/healthz`: false once the member has been self-fenced for longer than the configured bound (a
    /// restart gets a fresh incarnation and a fresh chance to renew), once a request of the group has been
    /// refused (401, 403) for a renew deadline ([`permission_error`](Self::permission_error)), and once the
    /// member's task ended with an error ([`task_error`](Self::task_error)).
    #[must_use]
    pub fn is_live(&self) -> bool {
        let s = self.lock();
        s.fenced_since
            .is_none_or(|t| t.elapsed() < self.unhealthy_after_fenced)
            && s.permission
                .as_ref()
                .is_none_or(|(_, t)| t.elapsed() < self.refused_for)
            && s.task_error.is_none()
    }

    /// `/readyz`: the member joined (its Lease is established and renewing), no other process holds
    /// its name, it can apply the group's assignment, and none of its requests is refused (401, 403).
    #[must_use]
    pub fn is_ready(&self) -> bool {
        let s = self.lock();
        s.joined
            && !s.collision
            && s.fenced_since.is_none()
            && s.assignment_refused.is_none()
            && s.foreign_format.is_none()
            && s.permission.is_none()
            && s.task_error.is_none()
    }

    /// The group's namespace (its Leases, ConfigMaps and Events).
    #[must_use]
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A request of the group the API server refuses (401 Unauthorized, 403 Forbidden) — the verb, the
    /// resource, the namespace and the object — while any is refused (the one seen first). A missing Role,
    /// not a timing problem: the member is not ready meanwhile, not live once it has lasted a renew
    /// deadline, and then its task ends with [`GroupError::Forbidden`](super::GroupError::Forbidden).
    #[must_use]
    pub fn permission_error(&self) -> Option<PermissionError> {
        self.lock().permission.as_ref().map(|(p, _)| p.clone())
    }

    /// Why the member's task ended with an error, once it has ([`GroupError`](super::GroupError) as text):
    /// the member is neither live nor ready from then on.
    #[must_use]
    pub fn task_error(&self) -> Option<String> {
        self.lock().task_error.clone()
    }

    /// Why this member refuses the group's assignment ConfigMap, while it does: another `S`, key or
    /// format (a mixed rollout: a change of `S` or the key is a new group), corrupt data, or an absurd
    /// generation. The member keeps its last good view, admits nothing it does not hold under that view,
    /// and never writes over the ConfigMap; it is not ready meanwhile.
    #[must_use]
    pub fn assignment_refused(&self) -> Option<String> {
        self.lock().assignment_refused.clone()
    }

    /// Which group Lease carries a member report of another format (a member of another build), and what
    /// it says, while one does: the member admits nothing and is not ready until it is gone
    /// (`docs/protocol.md`, "Formats").
    pub fn foreign_format(&self) -> Option<String> {
        self.lock().foreign_format.clone()
    }

    /// While this member, as coordinator, repairs a rolled-back assignment (the stored one is older than a
    /// generation a live member applied: a restored backup or a re-applied manifest): what it found. It
    /// writes a newer view over it and plans nothing until every live member applied that view. An alarm,
    /// not a readiness condition.
    #[must_use]
    pub fn assignment_rollback(&self) -> Option<String> {
        self.lock().assignment_rollback.clone()
    }

    /// Another live process holds this member's name (an identity collision alarm).
    #[must_use]
    pub fn identity_collision(&self) -> bool {
        self.lock().collision
    }
}
