//! Rendering objects as the client asked (`Accept`): whole objects, `PartialObjectMetadata`, or `Table`.

use http::HeaderMap;
use serde_json::{json, Value};

use crate::{resources::ResourceInfo, store::Obj};

/// The representation the client asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum As {
    Full,
    /// `application/json;as=PartialObjectMetadata[List];g=meta.k8s.io;v=v1`
    Metadata,
    /// `application/json;as=Table;v=v1;g=meta.k8s.io` (kubectl get)
    Table,
}

impl As {
    /// The first supported entry of the `Accept` header wins.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Self {
        let Some(accept) = headers
            .get(http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
        else {
            return As::Full;
        };
        for entry in accept.split(',') {
            let params: Vec<&str> = entry.split(';').map(str::trim).collect();
            let has = |p: &str| params.iter().any(|x| x.eq_ignore_ascii_case(p));
            if has("as=PartialObjectMetadata") || has("as=PartialObjectMetadataList") {
                if has("v=v1") || has("v=v1beta1") {
                    return As::Metadata;
                }
                continue;
            }
            if has("as=Table") {
                if has("v=v1") {
                    return As::Table;
                }
                continue;
            }
            let media = params.first().copied().unwrap_or_default();
            if media == "application/json" || media == "*/*" || media.is_empty() {
                return As::Full;
            }
        }
        As::Full
    }
}

/// The whole object, `apiVersion` of the version requested.
pub(crate) fn full(info: &ResourceInfo, obj: &Obj, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"apiVersion\":");
    serde_json::to_writer(&mut *out, &info.api_version()).ok();
    out.extend_from_slice(b",\"kind\":");
    serde_json::to_writer(&mut *out, &info.kind).ok();
    if obj.rest.len() > 2 {
        out.push(b',');
        out.extend_from_slice(&obj.rest[1..]);
    } else {
        out.push(b'}');
    }
}

/// A list item: built-in lists carry no `apiVersion`/`kind` per item, CRD lists do.
pub(crate) fn item(info: &ResourceInfo, obj: &Obj, out: &mut Vec<u8>) {
    if info.builtin {
        out.extend_from_slice(&obj.rest);
    } else {
        full(info, obj, out);
    }
}

pub(crate) fn partial(obj: &Obj) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.value["metadata"],
    })
}

pub(crate) fn metadata(obj: &Obj, out: &mut Vec<u8>) {
    serde_json::to_writer(out, &partial(obj)).ok();
}

/// `now` is the server's wall clock (for a Table's ages).
pub(crate) fn object(info: &ResourceInfo, obj: &Obj, as_: As, now: jiff::Timestamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(obj.rest.len() + 64);
    match as_ {
        As::Metadata => metadata(obj, &mut out),
        As::Full => full(info, obj, &mut out),
        As::Table => {
            serde_json::to_writer(
                &mut out,
                &table(info, std::slice::from_ref(&obj), "", None, now),
            )
            .ok();
        }
    }
    out
}

/// A `meta.k8s.io/v1` Table of objects, rows carrying `PartialObjectMetadata` (kubectl's default
/// `includeObject=Metadata`).
pub(crate) fn table<O: std::ops::Deref<Target = Obj>>(
    info: &ResourceInfo,
    objs: &[O],
    rv: &str,
    cont: Option<&str>,
    now: jiff::Timestamp,
) -> Value {
    let (before, after) = crate::columns::of(info);
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    columns.extend(before.iter().map(|c| c.definition()));
    columns.push(json!({"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
    columns.extend(after.iter().map(|c| c.definition()));
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let mut cells = vec![json!(o.name())];
            cells.extend(before.iter().map(|c| (c.cell)(&o.value)));
            cells.push(json!(age(now, &o.value)));
            cells.extend(after.iter().map(|c| (c.cell)(&o.value)));
            json!({"cells": cells, "object": partial(o)})
        })
        .collect();
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

fn age(now: jiff::Timestamp, obj: &Value) -> String {
    let Some(created) = obj["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
    else {
        return "<unknown>".into();
    };
    let secs = now.as_second().saturating_sub(created.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s if s < 172_800 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}
