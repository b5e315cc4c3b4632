//! Discovery (`/api`, `/apis`, `/api/v1`, `/apis/GROUP[/VERSION]`), `/version` and health checks, in the
//! legacy (unaggregated) format that kube's discovery and kubectl both read.

use serde_json::{json, Value};

use crate::{
    kinds::{SERVER_GIT_VERSION, SERVER_MINOR},
    resources::{Registry, ResourceInfo},
    server::Inner,
    status::{ApiError, ApiResult},
};

/// What a non-resource path answers.
#[derive(Debug)]
pub(crate) enum NonResource {
    Json(Value),
    /// A JSON document already serialised.
    JsonBytes(bytes::Bytes),
    Text(&'static str),
}

pub(crate) fn serve(inner: &Inner, segs: &[String]) -> ApiResult<NonResource> {
    let parts: Vec<&str> = segs.iter().map(String::as_str).collect();
    let store = inner.lock_store();
    let reg = &store.registry;
    let json = match parts.as_slice() {
        ["healthz" | "livez" | "readyz", ..] => return Ok(NonResource::Text("ok")),
        ["version"] => json!({
            "major": "1", "minor": SERVER_MINOR, "emulationMajor": "1", "emulationMinor": SERVER_MINOR,
            "minCompatibilityMajor": "1", "minCompatibilityMinor": "35",
            "gitVersion": format!("{SERVER_GIT_VERSION}-kube-shard-testserver"), "gitCommit": "", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25", "compiler": "gc",
            "platform": "linux/amd64",
        }),
        ["api"] => {
            let addr = inner
                .address
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_else(|| "127.0.0.1:6443".into());
            json!({
                "kind": "APIVersions", "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}],
            })
        }
        ["apis"] => {
            let groups: Vec<Value> = reg
                .groups()
                .into_iter()
                .filter(|(g, _)| !g.is_empty())
                .map(|(g, vs)| group_json(&g, &vs))
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        }
        ["apis", g] => {
            let (_, vs) = reg
                .groups()
                .into_iter()
                .find(|(name, _)| name == g)
                .ok_or_else(ApiError::no_route)?;
            let mut v = group_json(g, &vs);
            v["kind"] = json!("APIGroup");
            v["apiVersion"] = json!("v1");
            v
        }
        ["openapi", "v2"] => return Ok(NonResource::JsonBytes(crate::openapi::v2())),
        ["openapi", "v3"] => crate::openapi::root(reg),
        ["openapi", "v3", rest @ ..] => {
            return crate::openapi::document(reg, &rest.join("/"))
                .map(NonResource::JsonBytes)
                .ok_or_else(ApiError::no_route)
        }
        ["api", v] => resource_list(reg, "", v)?,
        ["apis", g, v] => resource_list(reg, g, v)?,
        _ => return Err(ApiError::no_route()),
    };
    Ok(NonResource::Json(json))
}

fn group_json(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(json!({}));
    json!({"name": group, "versions": vs, "preferredVersion": preferred})
}

fn resource_list(reg: &Registry, group: &str, version: &str) -> ApiResult<Value> {
    let infos: Vec<&std::sync::Arc<ResourceInfo>> = reg
        .all()
        .filter(|i| i.group == group && i.version == version)
        .collect();
    if infos.is_empty() {
        return Err(ApiError::no_route());
    }
    let mut resources = Vec::new();
    for i in infos {
        let mut r = json!({
            "name": i.plural, "singularName": i.singular, "namespaced": i.namespaced,
            "kind": i.kind, "verbs": i.verbs,
        });
        if !i.short_names.is_empty() {
            r["shortNames"] = json!(i.short_names);
        }
        if !i.categories.is_empty() {
            r["categories"] = json!(i.categories);
        }
        resources.push(r);
        if i.status {
            resources.push(json!({
                "name": format!("{}/status", i.plural), "singularName": "", "namespaced": i.namespaced,
                "kind": i.kind, "verbs": ["get", "patch", "update"],
            }));
        }
        if i.scale {
            resources.push(json!({
                "name": format!("{}/scale", i.plural), "singularName": "", "namespaced": i.namespaced,
                "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": ["get", "patch", "update"],
            }));
        }
        if i.builtin && i.plural == "namespaces" {
            resources.push(json!({
                "name": "namespaces/finalize", "singularName": "", "namespaced": false,
                "kind": "Namespace", "verbs": ["update"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Ok(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}
