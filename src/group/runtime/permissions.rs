//! Refusals of the group's own requests (401, 403) on its Leases and ConfigMaps: each is recorded per
//! request until that request next succeeds, logged at `error!` when first seen, published to [`Health`],
//! the status and this member's Lease, and — once one has lasted a renew deadline — the end of the task
//! ([`GroupError::Forbidden`]). Other failures (5xx, timeouts) are not recorded: they are retried as before.

use super::parts::PermissionKey as Key;
use super::*;
use crate::group::permission::{refused_watch, PermissionError, CONFIGMAPS, LEASES};

/// One of the group's requests, as RBAC sees it: a verb on a resource, maybe naming an object.
#[derive(Clone, Debug)]
pub(super) struct Access {
    verb: &'static str,
    resource: &'static str,
    name: Option<String>,
}

impl Access {
    fn key(&self) -> Key {
        (self.verb, self.resource, self.name.clone())
    }
}

/// An answer with this status passed authorization: a client error other than 401, 403 and 429.
fn authorized(code: u16) -> bool {
    (400..500).contains(&code) && !matches!(code, 401 | 403 | 429)
}

impl Runtime {
    /// `verb` on this member's own Lease.
    pub(super) fn own_lease(&self, verb: &'static str) -> Access {
        self.lease_named(verb, self.cfg.member_lease())
    }

    /// `verb` on the Lease `name` in the group namespace (the coordinator's, another member's).
    pub(super) fn lease_named(&self, verb: &'static str, name: String) -> Access {
        Access {
            verb,
            resource: LEASES,
            name: Some(name),
        }
    }

    /// `verb` on the assignment ConfigMap.
    pub(super) fn assignment_access(&self, verb: &'static str) -> Access {
        self.configmap_named(verb, self.cfg.assignment_name())
    }

    /// `verb` on the ConfigMap `name` in the group namespace (the fence parameters).
    pub(super) fn configmap_named(&self, verb: &'static str, name: String) -> Access {
        Access {
            verb,
            resource: CONFIGMAPS,
            name: Some(name),
        }
    }

    /// One request of a longer sequence ([`bounded`](Self::bounded)), its answer noted against `access`.
    pub(super) async fn checked<T>(
        &mut self,
        access: Access,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        let result = self.bounded(fut).await;
        self.noted(access, &result);
        result
    }

    /// Note the answer to a request: a 401 or 403 is recorded; an answer that shows the request was
    /// authorized (a success, a 404, a conflict, a refusal of its content) clears that request's refusal;
    /// anything else (5xx, 429, a timeout) changes nothing.
    pub(super) fn noted<T>(&mut self, access: Access, result: &Result<T, kube::Error>) {
        match result {
            Ok(_) => self.answered(&access),
            Err(kube::Error::Api(s)) if authorized(s.code) => self.answered(&access),
            Err(err) => self.refused(access, err),
        }
    }

    /// Record `err` against `access` when it is a 401 or 403 (anything else is left to the retries).
    pub(super) fn refused(&mut self, access: Access, err: &kube::Error) {
        let (verb, resource, name) = (access.verb, access.resource, access.name.as_deref());
        if let Some(p) = PermissionError::from_error(err, verb, resource, &self.cfg.namespace, name)
        {
            self.record(access.key(), p);
        }
    }

    /// `access` succeeded: its refusal, if any, is over.
    pub(super) fn answered(&mut self, access: &Access) {
        if self.permissions.denied.remove(&access.key()).is_some() {
            info!(
                verb = access.verb,
                resource = access.resource,
                name = access.name.as_deref().unwrap_or(""),
                "permission restored"
            );
            self.publish_permissions();
        }
    }

    /// Note an item of the group's Lease watch (`name: None`) or of the assignment watch: a LIST or WATCH
    /// refused is recorded; any event clears both.
    pub(super) fn watch_noted<K>(
        &mut self,
        resource: &'static str,
        name: Option<String>,
        item: &watcher::Result<Event<K>>,
    ) {
        match item {
            Ok(_) => {
                for verb in ["list", "watch"] {
                    let access = Access {
                        verb,
                        resource,
                        name: name.clone(),
                    };
                    self.answered(&access);
                }
            }
            Err(err) => {
                let Some((verb, code, message)) = refused_watch(err) else {
                    return;
                };
                let ns = &self.cfg.namespace;
                let p = PermissionError::new(verb, resource, ns, name.as_deref(), (code, message));
                self.record((verb, resource, name), p);
            }
        }
    }

    fn record(&mut self, key: Key, p: PermissionError) {
        let first = !self.permissions.denied.contains_key(&key);
        let since = self
            .permissions
            .denied
            .get(&key)
            .map_or_else(Instant::now, |(_, t)| *t);
        if first {
            error!(
                verb = %p.verb,
                resource = %p.resource,
                namespace = %p.namespace,
                name = p.name.as_deref().unwrap_or(""),
                "{p}"
            );
            let about = format!(
                "{} {} {}",
                p.verb,
                p.resource,
                p.name.as_deref().unwrap_or("")
            );
            self.events
                .emit_about(Kind::Warning, "PermissionDenied", &about, p.to_string());
        }
        self.permissions.denied.insert(key, (p, since));
        if first {
            self.publish_permissions();
        }
    }

    /// The refusal seen first, with when: the one that ends the task first.
    pub(super) fn oldest_refusal(&self) -> Option<&(PermissionError, Instant)> {
        self.permissions.denied.values().min_by_key(|(_, t)| *t)
    }

    fn publish_permissions(&self) {
        self.health
            .set_permission_error(self.oldest_refusal().cloned());
    }

    /// When the oldest refusal will have lasted a renew deadline (the task ends then).
    pub(super) fn forbidden_due(&self) -> Option<Instant> {
        self.oldest_refusal()
            .map(|(_, since)| *since + self.cfg.renew_deadline)
    }

    /// End the task for `e`: nothing is admitted from here (its fences would lapse by themselves anyway),
    /// and singleton work stops. The Lease stays, naming the refusal when it was writable, until it expires.
    pub(super) fn stop_forbidden(&mut self, e: GroupError) -> GroupError {
        error!("{e}");
        self.ownership.mark_self_fenced();
        self.step_down();
        e
    }

    /// A refusal has lasted a renew deadline: the error the task ends with.
    pub(super) fn forbidden(&self, now: Instant) -> Option<GroupError> {
        let (p, since) = self.oldest_refusal()?;
        (now.duration_since(*since) >= self.cfg.renew_deadline).then(|| GroupError::forbidden(p))
    }
}
