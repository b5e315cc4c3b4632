//! Paths to routes: `/api/v1/...`, `/apis/GROUP/VERSION/...`, `[namespaces/NS/]RESOURCE[/NAME[/SUB]]`,
//! the legacy `/watch/` prefix, and the non-resource paths.

use std::sync::Arc;

use http::Method;

use crate::{
    accounting::Verb,
    query::Query,
    resources::ResourceInfo,
    server::Inner,
    status::{ApiError, ApiResult},
};

#[derive(Debug)]
pub(crate) struct ResourceRoute {
    pub(crate) info: Arc<ResourceInfo>,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) sub: Option<String>,
    pub(crate) legacy_watch: bool,
}

#[derive(Debug)]
pub(crate) enum Route {
    /// Discovery, version, health: the path segments.
    NonResource(Vec<String>),
    Resource(ResourceRoute),
}

pub(crate) fn route(inner: &Inner, path: &str) -> ApiResult<Route> {
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let (group, version, rest): (&str, &str, &[String]) = match segs.first().map(String::as_str) {
        Some("api") if segs.len() >= 3 => ("", segs[1].as_str(), &segs[2..]),
        Some("apis") if segs.len() >= 4 => (segs[1].as_str(), segs[2].as_str(), &segs[3..]),
        _ => return Ok(Route::NonResource(segs)),
    };
    let (legacy_watch, rest) = match rest.first().map(String::as_str) {
        Some("watch") => (true, &rest[1..]),
        _ => (false, rest),
    };
    if rest.is_empty() {
        return Err(ApiError::no_route());
    }
    let ns_path = rest[0] == "namespaces"
        && rest.len() >= 3
        && !(rest.len() == 3 && (rest[2] == "status" || rest[2] == "finalize"));
    let (namespace, plural, name, sub, extra) = if ns_path {
        (
            Some(rest[1].clone()),
            rest[2].as_str(),
            rest.get(3).cloned(),
            rest.get(4).cloned(),
            rest.len() > 5,
        )
    } else {
        (
            None,
            rest[0].as_str(),
            rest.get(1).cloned(),
            rest.get(2).cloned(),
            rest.len() > 3,
        )
    };
    if extra {
        return Err(ApiError::no_route());
    }
    let info = inner
        .lock_store()
        .registry
        .get(group, version, plural)
        .ok_or_else(ApiError::no_route)?;
    if namespace.is_some() && !info.namespaced {
        return Err(ApiError::no_route());
    }
    if info.namespaced && namespace.is_none() && name.is_some() {
        return Err(ApiError::no_route());
    }
    if let Some(s) = &sub {
        let ok = (s == "status" && info.status)
            || (s == "scale" && info.scale)
            || (s == "finalize" && info.builtin && info.plural == "namespaces");
        if !ok || legacy_watch {
            return Err(ApiError::no_route());
        }
    }
    Ok(Route::Resource(ResourceRoute {
        info,
        namespace,
        name,
        sub,
        legacy_watch,
    }))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push(h * 16 + l);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The verb of a resource request.
pub(crate) fn verb_of(method: &Method, r: &ResourceRoute, q: &Query) -> ApiResult<Verb> {
    let has_name = r.name.is_some();
    if let Some(sub) = &r.sub {
        return match (method.as_str(), sub.as_str()) {
            ("GET", "status" | "scale") => Ok(Verb::Get),
            ("PUT", _) => Ok(Verb::Update),
            ("PATCH", "status" | "scale") => Ok(Verb::Patch),
            _ => Err(ApiError::method_not_allowed()),
        };
    }
    if !r.info.stored {
        // Review resources (TokenReview, SubjectAccessReview, ...) answer a create and nothing else.
        return match (method.as_str(), has_name) {
            ("POST", false) => Ok(Verb::Create),
            _ => Err(ApiError::method_not_allowed()),
        };
    }
    Ok(match (method.as_str(), has_name) {
        ("GET", _) if r.legacy_watch => Verb::Watch,
        ("GET", true) => Verb::Get,
        ("GET", false) if q.flag("watch") => Verb::Watch,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        _ => return Err(ApiError::method_not_allowed()),
    })
}

/// A rough verb for requests that could not be routed (for accounting only).
pub(crate) fn method_verb(method: &Method) -> Verb {
    match method.as_str() {
        "POST" => Verb::Create,
        "PUT" => Verb::Update,
        "PATCH" => Verb::Patch,
        "DELETE" => Verb::Delete,
        _ => Verb::Get,
    }
}
