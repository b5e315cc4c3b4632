//! OpenAPI: `/openapi/v2` and `/openapi/v3` as the real server serves them, from documents captured from
//! kube-apiserver v1.36.2 (`testserver/openapi/`, refreshed by its `capture.sh`), so `kubectl explain`,
//! kubectl's client-side apply and its `--validate=strict` check work. Group versions of custom resources
//! get a minimal v3 document of our own: one PATCH operation per resource declaring the `fieldValidation`
//! parameter (what kubectl reads to leave validation to the server), no schemas.

use std::{collections::HashMap, io::Read, sync::OnceLock};

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::resources::Registry;

const V2_GZ: &[u8] = include_bytes!("../openapi/v2.json.gz");
const V3_GZ: &[u8] = include_bytes!("../openapi/v3.json.gz");

fn gunzip(gz: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut out)
        .expect("the captured OpenAPI documents are valid gzip");
    out
}

/// `/openapi/v2`, as captured (JSON).
pub(crate) fn v2() -> Bytes {
    static V2: OnceLock<Bytes> = OnceLock::new();
    V2.get_or_init(|| Bytes::from(gunzip(V2_GZ))).clone()
}

/// The captured `/openapi/v3` documents by path (`api/v1`, `apis/apps/v1`, ...), the index under `""`.
fn v3() -> &'static HashMap<String, Bytes> {
    static V3: OnceLock<HashMap<String, Bytes>> = OnceLock::new();
    V3.get_or_init(|| {
        let all: HashMap<String, Value> = serde_json::from_slice(&gunzip(V3_GZ))
            .expect("the captured OpenAPI v3 documents are JSON");
        all.into_iter()
            .map(|(k, v)| (k, Bytes::from(serde_json::to_vec(&v).unwrap_or_default())))
            .collect()
    })
}

/// `/openapi/v3`: the captured index, plus the group versions of custom resources.
pub(crate) fn root(reg: &Registry) -> Value {
    let index: Value = v3()
        .get("")
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or_else(|| json!({"paths": {}}));
    let mut paths = index["paths"].as_object().cloned().unwrap_or_default();
    for (group, versions) in reg.groups() {
        for v in versions {
            let gv = gv_path(&group, &v);
            paths.entry(gv.clone()).or_insert_with(
                || json!({"serverRelativeURL": format!("/openapi/v3/{gv}?hash=0")}),
            );
        }
    }
    json!({"paths": paths})
}

/// `/openapi/v3/PATH`: a captured document, or ours for a custom resource group version.
pub(crate) fn document(reg: &Registry, path: &str) -> Option<Bytes> {
    if let Some(doc) = v3().get(path).filter(|_| !path.is_empty()) {
        return Some(doc.clone());
    }
    let segs: Vec<&str> = path.split('/').collect();
    let doc = match segs.as_slice() {
        ["api", v] => group_version(reg, "", v),
        ["apis", g, v] => group_version(reg, g, v),
        _ => None,
    }?;
    Some(Bytes::from(serde_json::to_vec(&doc).unwrap_or_default()))
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// Our document of one group version (`None` if it is not served).
fn group_version(reg: &Registry, group: &str, version: &str) -> Option<Value> {
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
