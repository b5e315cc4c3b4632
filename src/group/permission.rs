//! Requests of the group the API server refuses for who sent them (401, 403): which verb, on which resource,
//! where — said so a person can grant it, instead of surfacing later as a self-fence.
//!
//! Pure: no I/O, no async. The runtime records each refusal (`runtime/permissions.rs`), [`Health`] and
//! [`GroupStatus`] carry it, the member's own Lease shows it when that Lease is writable
//! ([`PERMISSION_ERROR`]), and a refusal that persists for one renew deadline ends the member's task with
//! [`GroupError::Forbidden`].
//!
//! [`Health`]: super::Health
//! [`GroupStatus`]: super::GroupStatus
//! [`GroupError::Forbidden`]: super::GroupError::Forbidden

use std::fmt;

/// Member Lease annotation: the permission error this member has, while it has one (the text of
/// [`PermissionError`]'s `Display`), so `kshard status` can show a refusal of another object — the
/// assignment ConfigMap, the coordinator Lease — that the member's own logs would otherwise hold alone.
pub const PERMISSION_ERROR: &str = "kube-shard.io/permission-error";

/// The resource of the group's Leases, as RBAC names it (`apiGroups: ["coordination.k8s.io"]`, `leases`).
pub(crate) const LEASES: &str = "coordination.k8s.io/leases";
/// The resource of the group's ConfigMaps (the core group: `apiGroups: [""]`, `configmaps`).
pub(crate) const CONFIGMAPS: &str = "configmaps";

/// A request of the group that the API server refused with 401 Unauthorized or 403 Forbidden.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermissionError {
    /// The verb as RBAC names it: `get`, `list`, `watch`, `create`, `update` or `delete`.
    pub verb: &'static str,
    /// `group/plural` (`coordination.k8s.io/leases`), or the plural alone for the core group
    /// (`configmaps`).
    pub resource: &'static str,
    /// The namespace of the request (the group's).
    pub namespace: String,
    /// The object named, if the request named one (a LIST or WATCH of the group's Leases names none).
    pub name: Option<String>,
    /// 401 or 403.
    pub code: u16,
    /// What the API server said (it names the user it refused).
    pub message: String,
}

impl PermissionError {
    /// The refusal in `err` of `verb` on `resource` in `namespace` (`name`), if `err` is a 401 or 403.
    pub(crate) fn from_error(
        err: &kube::Error,
        verb: &'static str,
        resource: &'static str,
        namespace: &str,
        name: Option<&str>,
    ) -> Option<Self> {
        refused(err).map(|answer| Self::new(verb, resource, namespace, name, answer))
    }

    /// `verb` on `resource` in `namespace` (`name`) refused with `answer` (its status and message).
    pub(crate) fn new(
        verb: &'static str,
        resource: &'static str,
        namespace: &str,
        name: Option<&str>,
        (code, message): (u16, String),
    ) -> Self {
        PermissionError {
            verb,
            resource,
            namespace: namespace.to_owned(),
            name: name.map(str::to_owned),
            code,
            message,
        }
    }
}

impl fmt::Display for PermissionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe(
            self.verb,
            self.resource,
            &self.namespace,
            self.name.as_deref(),
            self.code,
            &self.message,
        ))
    }
}

/// The text of a refusal: what was refused, where, and what to grant (a 403) or check (a 401).
pub(crate) fn describe(
    verb: &str,
    resource: &str,
    ns: &str,
    name: Option<&str>,
    code: u16,
    message: &str,
) -> String {
    let what = name.map(|n| format!(" ({n})")).unwrap_or_default();
    if code == 401 {
        return format!(
            "unauthorized: the API server refused the credentials used to {verb} {resource} in namespace {ns}{what}: check the client's token or certificate; it said: {message}"
        );
    }
    let (api_group, plural) = resource.rsplit_once('/').unwrap_or(("", resource));
    format!(
        "forbidden: cannot {verb} {resource} in namespace {ns}{what}: grant the group's Role verb {verb:?} on resource {plural:?} in API group {api_group:?} there (see deploy/rbac.yaml); the API server said: {message}"
    )
}

/// The status and message of a 401 or 403 answer.
pub(crate) fn refused(err: &kube::Error) -> Option<(u16, String)> {
    match err {
        kube::Error::Api(s) if s.code == 401 || s.code == 403 => Some((s.code, s.message.clone())),
        _ => None,
    }
}

/// The status and message of a watch error that is a 401 or 403, with the verb that failed (`list` for
/// the initial or a re-list, `watch` otherwise).
pub(crate) fn refused_watch(
    err: &kube::runtime::watcher::Error,
) -> Option<(&'static str, u16, String)> {
    use kube::runtime::watcher::Error as W;
    match err {
        W::InitialListFailed(e) => refused(e).map(|(c, m)| ("list", c, m)),
        W::WatchStartFailed(e) | W::WatchFailed(e) => refused(e).map(|(c, m)| ("watch", c, m)),
        W::WatchError(s) if s.code == 401 || s.code == 403 => {
            Some(("watch", s.code, s.message.clone()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "message": message, "reason": "Forbidden", "code": code,
        }))
        .expect("a Status");
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn a_403_names_the_verb_resource_namespace_and_object() {
        let err = api_error(403, "leases.coordination.k8s.io \"w-a\" is forbidden: User \"sa\" cannot update resource \"leases\"");
        let p = PermissionError::from_error(&err, "update", LEASES, "ns", Some("w-a")).unwrap();
        let text = p.to_string();
        assert!(
            text.starts_with(
                "forbidden: cannot update coordination.k8s.io/leases in namespace ns (w-a): "
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "verb \"update\" on resource \"leases\" in API group \"coordination.k8s.io\""
            ),
            "{text}"
        );
        assert!(text.contains("deploy/rbac.yaml") && text.contains("User \"sa\""));
        let cm = PermissionError::from_error(&err, "create", CONFIGMAPS, "ns", None).unwrap();
        assert!(cm.to_string().contains("in API group \"\""), "{cm}");
    }

    #[test]
    fn a_401_says_the_credentials_were_refused() {
        let p =
            PermissionError::from_error(&api_error(401, "Unauthorized"), "get", LEASES, "ns", None)
                .unwrap();
        assert!(p.to_string().starts_with("unauthorized: "), "{p}");
    }

    #[test]
    fn other_errors_are_not_permission_errors() {
        for code in [404, 409, 429, 500, 503] {
            assert!(
                PermissionError::from_error(&api_error(code, "x"), "get", LEASES, "ns", None)
                    .is_none()
            );
        }
        let timeout = kube::Error::Service("request timed out".into());
        assert!(refused(&timeout).is_none());
        let watch = kube::runtime::watcher::Error::InitialListFailed(api_error(403, "no"));
        assert_eq!(refused_watch(&watch).map(|r| r.0), Some("list"));
    }
}
