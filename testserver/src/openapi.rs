//! A minimal OpenAPI v3 (`/openapi/v3`, `/openapi/v3/api/v1`, `/openapi/v3/apis/GROUP/VERSION`): one
//! PATCH operation per resource, tagged with its group/version/kind and declaring the `fieldValidation`
//! query parameter. That is what kubectl reads to learn that the server validates fields itself
//! (`--validate=strict`, its default), so `kubectl create -f` needs no schema. No schemas are served:
//! `kubectl explain` and client-side validation do not work.

use serde_json::{json, Map, Value};

use crate::resources::Registry;

/// `/openapi/v3`: the group versions, each with its document's URL.
pub(crate) fn root(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, versions) in reg.groups() {
        for v in versions {
            let gv = gv_path(&group, &v);
            paths.insert(
                gv.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash=0")}),
            );
        }
    }
    json!({"paths": paths})
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// The document of one group version (`None` if it is not served).
pub(crate) fn group_version(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let mut paths = Map::new();
    for i in reg
        .all()
        .filter(|i| i.group == group && i.version == version && i.stored)
    {
        let base = format!("/{}", gv_path(group, version));
        let path = if i.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}/{{name}}", i.plural)
        } else {
            format!("{base}/{}/{{name}}", i.plural)
        };
        let op = json!({
            "operationId": format!("patch{}", i.kind),
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            ],
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": i.group, "version": i.version, "kind": i.kind},
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(path, json!({"patch": op}));
    }
    if paths.is_empty() {
        return None;
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kube-shard-testserver)", "version": crate::kinds::SERVER_GIT_VERSION},
        "paths": paths,
        "components": {"schemas": {}},
    }))
}
