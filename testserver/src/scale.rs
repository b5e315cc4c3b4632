//! The `/scale` subresource of Deployments, ReplicaSets, StatefulSets and ReplicationControllers: an
//! `autoscaling/v1` `Scale` over `spec.replicas` (and `status.replicas`, the selector as a string).

use std::sync::Arc;

use serde_json::{json, Value};

use crate::{
    resources::ResourceInfo,
    rest::{apply_patch, finish_update, parse_body, publish_rv, PatchType, Reply, WriteCtx},
    server::Inner,
    status::{ApiError, ApiResult},
    store::obj_key,
};

/// GET `/scale`.
pub(crate) fn get(
    inner: &Inner,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    name: &str,
) -> ApiResult<Reply> {
    let obj = inner
        .lock_store()
        .get(&info.store_key, &obj_key(namespace, name))
        .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
    Ok(Reply::Json {
        code: 200,
        value: scale_of(&obj.value),
    })
}

/// PUT (`patch` is `None`) or PATCH `/scale`: the new `spec.replicas` is written into the object.
pub(crate) fn write(
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    name: &str,
    patch: Option<PatchType>,
    body: &[u8],
) -> ApiResult<Reply> {
    let key = obj_key(namespace, name);
    let mut store = ctx.inner.lock_store();
    let old = store
        .get(&info.store_key, &key)
        .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
    let scale = match patch {
        None => parse_body(body)?,
        Some(ptype) => {
            let p: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            let mut scale = scale_of(&old.value);
            apply_patch(
                &mut scale,
                ptype,
                p,
                &crate::schema::Ty::Named("autoscaling/v1/Scale".into()),
            )?;
            scale
        }
    };
    let next = apply_scale(info, &old.value, &scale)?;
    let fence = crate::rest::header_fence(ctx);
    let obj = finish_update(&mut store, ctx, info, key, &old, next, fence.as_ref());
    drop(store);
    publish_rv(ctx.inner);
    Ok(Reply::Json {
        code: 200,
        value: scale_of(&obj.value),
    })
}

/// The `autoscaling/v1` `Scale` of an object with `spec.replicas`.
fn scale_of(obj: &Value) -> Value {
    let meta = &obj["metadata"];
    let mut m = json!({});
    for f in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta.get(f) {
            m[f] = v.clone();
        }
    }
    let mut status = json!({"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0)});
    let selector = selector_string(&obj["spec"]["selector"]);
    if !selector.is_empty() {
        status["selector"] = json!(selector);
    }
    json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": m,
        "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(0)},
        "status": status,
    })
}

/// `spec.replicas` of a written `Scale` set into the object, checking the Scale's preconditions.
fn apply_scale(info: &ResourceInfo, obj: &Value, scale: &Value) -> ApiResult<Value> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let replicas = scale["spec"]["replicas"].as_i64().unwrap_or(0);
    if replicas < 0 {
        return Err(ApiError::invalid(
            "autoscaling",
            "Scale",
            name,
            "spec.replicas",
            &format!("Invalid value: {replicas}: must be greater than or equal to 0"),
        ));
    }
    if let Some(rv) = scale["metadata"]["resourceVersion"]
        .as_str()
        .filter(|r| !r.is_empty())
    {
        if Some(rv) != obj["metadata"]["resourceVersion"].as_str() {
            return Err(ApiError::conflict_modified(&info.group, &info.plural, name));
        }
    }
    let mut next = obj.clone();
    next["spec"]["replicas"] = json!(replicas);
    Ok(next)
}

/// `matchLabels`/`matchExpressions` (or a plain map, as ReplicationControllers have) as a selector string.
pub(crate) fn selector_string(sel: &Value) -> String {
    let Some(m) = sel.as_object() else {
        return String::new();
    };
    let plain = !m.contains_key("matchLabels") && !m.contains_key("matchExpressions");
    let labels = if plain {
        Some(m)
    } else {
        sel["matchLabels"].as_object()
    };
    let mut parts: Vec<String> = labels
        .map(|l| {
            l.iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default();
        let vals: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e["operator"].as_str().unwrap_or_default() {
            "In" => format!("{key} in ({})", vals.join(",")),
            "NotIn" => format!("{key} notin ({})", vals.join(",")),
            "Exists" => key.to_string(),
            _ => format!("!{key}"),
        });
    }
    parts.sort();
    parts.join(",")
}
