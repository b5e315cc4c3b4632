//! Kubernetes `Status` failures as kube-apiserver writes them (`metav1.Status`, `apierrors`).

use serde_json::{json, Value};

/// An error answered as a `Status` object with an HTTP code.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: u16,
    /// Omitted from the body when `None` (the KEP-5866 invalid-selector 500 has no reason).
    pub(crate) reason: Option<&'static str>,
    pub(crate) message: String,
    pub(crate) details: Option<Value>,
    /// `Retry-After` header and `details.retryAfterSeconds`.
    pub(crate) retry_after: Option<u64>,
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub(crate) fn new(code: u16, reason: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
        }
    }

    pub(crate) fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, Some("BadRequest"), message)
    }

    /// The 404 for a path that names no resource.
    pub(crate) fn no_route() -> Self {
        Self::new(
            404,
            Some("NotFound"),
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub(crate) fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            404,
            Some("NotFound"),
            format!("{what} \"{name}\" not found"),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    pub(crate) fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            409,
            Some("AlreadyExists"),
            format!("{what} \"{name}\" already exists"),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// A stale resourceVersion on update.
    pub(crate) fn conflict_modified(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub(crate) fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let what = qualified(group, plural);
        Self::new(
            409,
            Some("Conflict"),
            format!("Operation cannot be fulfilled on {what} \"{name}\": {why}"),
        )
        .with_details(json!({"name": name, "group": group, "kind": plural}))
    }

    /// 422 with one field cause.
    pub(crate) fn invalid(group: &str, kind: &str, name: &str, field: &str, why: &str) -> Self {
        let gk = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        Self::new(
            422,
            Some("Invalid"),
            format!("{gk} \"{name}\" is invalid: {field}: {why}"),
        )
        .with_details(json!({
            "name": name, "group": group, "kind": kind,
            "causes": [{"reason": cause_reason(why), "message": why, "field": field}],
        }))
    }

    pub(crate) fn method_not_allowed() -> Self {
        Self::new(
            405,
            Some("MethodNotAllowed"),
            "the server does not allow this method on the requested resource",
        )
        .with_details(json!({}))
    }

    pub(crate) fn unsupported_media(ct: &str) -> Self {
        Self::new(
            415,
            Some("UnsupportedMediaType"),
            format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {ct:?})"),
        )
    }

    /// `resourceVersion` ahead of the server (the cacher waits 3 s, then answers this).
    pub(crate) fn too_large_rv(requested: u64, current: u64) -> Self {
        Self::new(
            504,
            Some("Timeout"),
            format!("Too large resource version: {requested}, current: {current}"),
        )
        .with_details(json!({
            "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
            "retryAfterSeconds": 1,
        }))
    }

    /// 410 for a resourceVersion older than the retained history.
    pub(crate) fn expired(message: impl Into<String>) -> Self {
        Self::new(410, Some("Expired"), message)
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(401, Some("Unauthorized"), "Unauthorized")
    }

    /// An injected failure with the reason kube-apiserver uses for that code.
    pub(crate) fn injected(code: u16, retry_after: Option<u64>) -> Self {
        let (reason, message) = match code {
            400 => (Some("BadRequest"), "injected by testserver: bad request"),
            401 => (Some("Unauthorized"), "Unauthorized"),
            403 => (Some("Forbidden"), "forbidden: injected by testserver"),
            404 => (Some("NotFound"), "the server could not find the requested resource"),
            409 => (Some("Conflict"), "injected by testserver: conflict"),
            410 => (Some("Expired"), "injected by testserver: resource version expired"),
            429 => (Some("TooManyRequests"), "Too many requests, please try again later."),
            500 => (Some("InternalError"), "Internal error occurred: injected by testserver"),
            503 => (Some("ServiceUnavailable"), "the server is currently unable to handle the request"),
            504 => (Some("Timeout"), "the server was unable to return a response in the time allotted, but may still be processing the request"),
            _ => (None, "injected by testserver"),
        };
        let mut e = Self::new(code, reason, message);
        if let Some(secs) = retry_after {
            e.retry_after = Some(secs);
            e.details = Some(json!({"retryAfterSeconds": secs}));
        }
        e
    }

    /// The `Status` object.
    pub(crate) fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if let Some(reason) = self.reason {
            s["reason"] = json!(reason);
        }
        if let Some(details) = &self.details {
            let mut d = details.clone();
            if let Some(m) = d.as_object_mut() {
                // Go's omitempty: an empty name or group is left out.
                for k in ["name", "group"] {
                    if m.get(k).is_some_and(|v| v == "") {
                        m.remove(k);
                    }
                }
            }
            s["details"] = d;
        }
        s
    }
}

/// The cause reason of a field error, from its message's prefix (as `field.Error` types print).
fn cause_reason(why: &str) -> &'static str {
    if why.starts_with("Required value") {
        "FieldValueRequired"
    } else if why.starts_with("Forbidden") {
        "FieldValueForbidden"
    } else {
        "FieldValueInvalid"
    }
}

/// `configmaps` or `widgets.example.com`, as in error messages.
pub(crate) fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}
