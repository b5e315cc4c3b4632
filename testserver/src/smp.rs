//! Strategic merge patch (`application/strategic-merge-patch+json`) for built-in kinds, as
//! k8s.io/apimachinery's `strategicpatch` applies it on the server: maps merge, `null` deletes, lists
//! merge by `x-kubernetes-patch-merge-key` where the patch strategy is `merge` (scalar lists: union),
//! other lists are replaced; the directives `$patch: replace|delete` (on maps and list items),
//! `$setElementOrder/<list>`, `$deleteFromPrimitiveList/<list>` and `$retainKeys`.

use serde_json::{Map, Value};

use crate::schema::{Field, Schemas, Ty};

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Apply `patch` to `original` (an object of type `ty`). An error is a message for a 422/400.
pub(crate) fn apply(
    schemas: &Schemas,
    ty: &Ty,
    original: &Value,
    patch: &Value,
) -> Result<Value, String> {
    let (Value::Object(o), Value::Object(p)) = (original, patch) else {
        return Err("strategic merge patch: the patch and the object must be JSON objects".into());
    };
    merge_map(schemas, ty, o.clone(), p).map(Value::Object)
}

/// The declared field `name` of `ty`, if any.
fn field_of(schemas: &Schemas, ty: &Ty, name: &str) -> Option<Field> {
    match schemas.resolve(ty) {
        Ty::Struct(s) => s.fields.get(name).cloned(),
        Ty::Map { elem, .. } => Some(Field {
            ty: (**elem).clone(),
            strategy: None,
            merge_key: None,
        }),
        _ => None,
    }
}

fn untyped_field() -> Field {
    Field {
        ty: Ty::Untyped,
        strategy: None,
        merge_key: None,
    }
}

fn merge_map(
    schemas: &Schemas,
    ty: &Ty,
    mut original: Map<String, Value>,
    patch: &Map<String, Value>,
) -> Result<Map<String, Value>, String> {
    match patch.get(PATCH).map(|v| v.as_str()) {
        None => {}
        Some(Some("replace")) => return Ok(strip(patch)),
        Some(Some("delete")) => return Ok(Map::new()),
        Some(other) => return Err(format!("Unknown patch type: {other:?}")),
    }
    if let Some(keep) = patch.get(RETAIN_KEYS) {
        let keep: Vec<&str> = keep
            .as_array()
            .ok_or("$retainKeys must be a list")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        original.retain(|k, _| keep.contains(&k.as_str()));
    }
    // The server's order of each list before merging, for the final ordering.
    let server_order: Vec<(String, Vec<Value>)> = original
        .iter()
        .filter_map(|(k, v)| {
            let key = field_of(schemas, ty, k).and_then(|f| f.merge_key);
            v.as_array().map(|a| {
                (
                    k.clone(),
                    a.iter().map(|x| item_id(x, key.as_deref())).collect(),
                )
            })
        })
        .collect();
    for (k, pv) in patch {
        if let Some(list) = k.strip_prefix(DELETE_PRIMITIVE) {
            let gone = pv
                .as_array()
                .ok_or("$deleteFromPrimitiveList must be a list")?;
            if let Some(Value::Array(items)) = original.get_mut(list) {
                items.retain(|x| !gone.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        if pv.is_null() {
            original.remove(k);
            continue;
        }
        let field = field_of(schemas, ty, k).unwrap_or_else(untyped_field);
        let merged = match original.remove(k) {
            None => clean(pv),
            Some(ov) => merge_value(schemas, &field, ov, pv)?,
        };
        if let Some(v) = merged {
            original.insert(k.clone(), v);
        }
    }
    for (list, server) in server_order {
        let field = field_of(schemas, ty, &list).unwrap_or_else(untyped_field);
        let key = field.merge_key.as_deref();
        let order: Vec<Value> = match patch.get(&format!("{SET_ORDER}{list}")) {
            Some(o) => o
                .as_array()
                .ok_or("$setElementOrder must be a list")?
                .iter()
                .map(|x| item_id(x, key))
                .collect(),
            // Scalar lists are the original then the new values (no reordering).
            None => match patch.get(&list) {
                Some(Value::Array(p)) if field.strategy_has("merge") && key.is_some() => p
                    .iter()
                    .filter(|x| x.get(PATCH).is_none())
                    .map(|x| item_id(x, key))
                    .collect(),
                _ => continue,
            },
        };
        if let Some(Value::Array(items)) = original.get_mut(&list) {
            normalize_order(items, &order, &server, key);
        }
    }
    Ok(original)
}

/// What identifies a list item: its merge key's value, or itself.
fn item_id(v: &Value, key: Option<&str>) -> Value {
    match key {
        Some(k) => v.get(k).cloned().unwrap_or(Value::Null),
        None => v.clone(),
    }
}

/// strategicpatch's `normalizeElementOrder`: the items the patch names, in the patch's order (or its
/// `$setElementOrder`), merged with the server-only items in the server's order; where both sides'
/// items were on the server their server order decides, else the patch's item comes first.
fn normalize_order(
    items: &mut Vec<Value>,
    patch_order: &[Value],
    server: &[Value],
    key: Option<&str>,
) {
    let (mut named, mut server_only): (Vec<Value>, Vec<Value>) = std::mem::take(items)
        .into_iter()
        .partition(|x| patch_order.contains(&item_id(x, key)));
    let pos = |order: &[Value], x: &Value| order.iter().position(|o| *o == item_id(x, key));
    named.sort_by_key(|x| pos(patch_order, x).unwrap_or(usize::MAX));
    server_only.sort_by_key(|x| pos(server, x).unwrap_or(usize::MAX));
    let (mut l, mut r) = (
        named.into_iter().peekable(),
        server_only.into_iter().peekable(),
    );
    loop {
        let take_right = match (l.peek(), r.peek()) {
            (None, None) => break,
            (None, Some(_)) => true,
            (Some(_), None) => false,
            (Some(a), Some(b)) => match (pos(server, a), pos(server, b)) {
                (Some(i), Some(j)) => j < i,
                _ => false,
            },
        };
        items.extend(if take_right { r.next() } else { l.next() });
    }
}

/// A merged value; `None` when a `$patch: delete` removed it.
fn merge_value(
    schemas: &Schemas,
    field: &Field,
    original: Value,
    patch: &Value,
) -> Result<Option<Value>, String> {
    Ok(match (original, patch) {
        (Value::Object(o), Value::Object(p)) => {
            if p.get(PATCH).and_then(Value::as_str) == Some("delete") {
                return Ok(None);
            }
            Some(Value::Object(merge_map(schemas, &field.ty, o, p)?))
        }
        (Value::Array(o), Value::Array(p)) if field.strategy_has("merge") => {
            Some(Value::Array(merge_list(schemas, field, o, p)?))
        }
        (_, p) => clean(p),
    })
}

fn list_elem(schemas: &Schemas, ty: &Ty) -> Ty {
    match schemas.resolve(ty) {
        Ty::List { elem, .. } => (**elem).clone(),
        _ => Ty::Untyped,
    }
}

fn merge_list(
    schemas: &Schemas,
    field: &Field,
    mut original: Vec<Value>,
    patch: &[Value],
) -> Result<Vec<Value>, String> {
    let replace = patch
        .iter()
        .any(|x| x.get(PATCH).and_then(Value::as_str) == Some("replace"));
    if replace {
        return Ok(patch
            .iter()
            .filter(|x| x.get(PATCH).is_none())
            .filter_map(clean)
            .collect());
    }
    let Some(key) = field.merge_key.as_deref() else {
        // A set of scalars: union, in order.
        for p in patch {
            if !original.contains(p) {
                original.push(p.clone());
            }
        }
        return Ok(original);
    };
    let elem = Field {
        ty: list_elem(schemas, &field.ty),
        strategy: None,
        merge_key: None,
    };
    for p in patch {
        let Some(id) = p.get(key) else {
            return Err(format!(
                "map: {p} does not contain declared merge key: {key}"
            ));
        };
        let at = original.iter().position(|o| o.get(key) == Some(id));
        if p.get(PATCH).and_then(Value::as_str) == Some("delete") {
            if let Some(i) = at {
                original.remove(i);
            }
            continue;
        }
        match at {
            Some(i) => {
                let o = original.remove(i);
                if let Some(m) = merge_value(schemas, &elem, o, p)? {
                    original.insert(i, m);
                }
            }
            None => original.extend(clean(p)),
        }
    }
    Ok(original)
}

/// A patch value without directives or nulls, as it lands where the original had nothing.
fn clean(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Object(m) => {
            if m.get(PATCH).and_then(Value::as_str) == Some("delete") {
                return None;
            }
            Some(Value::Object(strip(m)))
        }
        Value::Array(a) => Some(Value::Array(a.iter().filter_map(clean).collect())),
        other => Some(other.clone()),
    }
}

fn strip(m: &Map<String, Value>) -> Map<String, Value> {
    m.iter()
        .filter(|(k, _)| !k.starts_with('$'))
        .filter_map(|(k, v)| clean(v).map(|v| (k.clone(), v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deploy(patch: Value) -> Value {
        let s = Schemas::builtin();
        let ty = s.kind("apps", "v1", "Deployment");
        let original = json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "b", "image": "b:1"},
        ]}}}, "metadata": {"finalizers": ["f1"], "labels": {"x": "1", "y": "2"}}});
        apply(s, &ty, &original, &patch).unwrap()
    }

    #[test]
    fn containers_merge_by_name_and_scalar_lists_union() {
        let out = deploy(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "b", "image": "b:2"}, {"name": "c", "image": "c:1"}]}}},
            "metadata": {"finalizers": ["f2"], "labels": {"x": null}}}));
        let cs = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(cs[0]["env"][0]["name"], "X", "a kept whole");
        assert_eq!(cs[1], json!({"name": "b", "image": "b:2"}));
        assert_eq!(cs[2]["name"], "c");
        assert_eq!(out["metadata"]["labels"], json!({"y": "2"}));
        // finalizers merge (a set); container args have no strategy: replaced.
        assert_eq!(out["metadata"]["finalizers"], json!(["f1", "f2"]));
        let out = deploy(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "args": ["x"]}]}}}}));
        let out = apply(Schemas::builtin(), &Schemas::builtin().kind("apps", "v1", "Deployment"), &out,
            &json!({"spec": {"template": {"spec": {"containers": [{"name": "a", "args": ["y"]}]}}}})).unwrap();
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"][0]["args"],
            json!(["y"])
        );
    }

    #[test]
    fn directives() {
        let out = deploy(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "a", "$patch": "delete"}]}}}}));
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        let out = deploy(json!({"spec": {"template": {"spec": {"containers": [
            {"name": "z", "image": "z"}, {"$patch": "replace"}]}}}}));
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "z", "image": "z"}])
        );
        let out = deploy(json!({"spec": {"template": {"spec": {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [{"name": "a", "image": "a:2"}]}}}}));
        let cs = &out["spec"]["template"]["spec"]["containers"];
        assert_eq!(
            (cs[0]["name"].as_str(), cs[1]["image"].as_str()),
            (Some("b"), Some("a:2"))
        );
        let out = deploy(json!({"metadata": {"labels": {"$patch": "replace", "n": "1"}}}));
        assert_eq!(out["metadata"]["labels"], json!({"n": "1"}));
        let out = deploy(json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["f1"]}}));
        assert_eq!(out["metadata"]["finalizers"], json!([]));
        let s = Schemas::builtin();
        let err = apply(
            s,
            &Ty::Untyped,
            &json!({}),
            &json!({"a": {"$patch": "bogus"}, "b": 1}),
        );
        assert!(apply(
            s,
            &Ty::Untyped,
            &json!({"a": {}}),
            &json!({"a": {"$patch": "bogus"}})
        )
        .is_err());
        assert!(err.is_ok(), "a directive in a new subtree is dropped");
    }
}
