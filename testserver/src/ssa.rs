//! `managedFields` and server-side apply, after sigs.k8s.io/structured-merge-diff as kube-apiserver
//! runs it: every write records who set which fields (an `Update` entry per manager, from the
//! `fieldManager` parameter or the User-Agent); an apply (`application/apply-patch+json`) merges the
//! applied configuration into the object (maps by key, list-maps by their keys, sets by value, atomic
//! values whole), removes the fields its manager applied before and no longer applies (unless another
//! manager owns them), and refuses with a 409 naming the fields and managers when it would change a
//! field another manager owns, unless `force=true` takes it over.

use serde_json::{json, Value};

use crate::{
    fieldset::{self, Set},
    schema::{ListKind, Schemas, Ty},
    status::ApiError,
};

/// One `managedFields` entry.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    subresource: Option<String>,
    time: String,
    set: Set,
}

impl Entry {
    fn from_json(v: &Value) -> Option<Entry> {
        Some(Entry {
            manager: v["manager"].as_str().unwrap_or_default().to_string(),
            operation: v["operation"].as_str()?.to_string(),
            api_version: v["apiVersion"].as_str().unwrap_or_default().to_string(),
            subresource: v["subresource"].as_str().map(str::to_string),
            time: v["time"].as_str().unwrap_or_default().to_string(),
            set: Set::from_json(&v["fieldsV1"]),
        })
    }

    fn to_json(&self) -> Value {
        let mut v = json!({
            "apiVersion": self.api_version, "fieldsType": "FieldsV1", "fieldsV1": self.set.to_json(),
            "manager": self.manager, "operation": self.operation, "time": self.time,
        });
        if let Some(s) = &self.subresource {
            v["subresource"] = json!(s);
        }
        v
    }

    fn is(&self, w: &Writer<'_>, operation: &str) -> bool {
        self.manager == w.manager
            && self.operation == operation
            && self.subresource.as_deref() == w.subresource
            && self.api_version == w.api_version
    }

    /// How the real server names a manager in conflicts: `"m"` for an apply, `"m" using v1` else.
    fn printed(&self) -> String {
        if self.operation == "Apply" {
            format!("{:?}", self.manager)
        } else {
            format!("{:?} using {}", self.manager, self.api_version)
        }
    }
}

/// Who writes, for `managedFields`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writer<'a> {
    pub(crate) manager: &'a str,
    pub(crate) subresource: Option<&'a str>,
    pub(crate) api_version: &'a str,
    pub(crate) now: &'a str,
}

fn entries(obj: &Value) -> Vec<Entry> {
    obj["metadata"]["managedFields"]
        .as_array()
        .map(|a| a.iter().filter_map(Entry::from_json).collect())
        .unwrap_or_default()
}

/// Store `entries` in `obj` (none: the field is left out). Applies first, then by time, as the
/// real server sorts them.
fn store(obj: &mut Value, mut list: Vec<Entry>) {
    list.retain(|e| !e.set.is_empty());
    list.sort_by(|a, b| {
        (a.operation != "Apply", &a.time, &a.manager).cmp(&(
            b.operation != "Apply",
            &b.time,
            &b.manager,
        ))
    });
    if let Some(m) = obj["metadata"].as_object_mut() {
        if list.is_empty() {
            m.remove("managedFields");
        } else {
            m.insert(
                "managedFields".into(),
                Value::Array(list.iter().map(Entry::to_json).collect()),
            );
        }
    }
}

/// Record a non-apply write from `old` (`None`: a create) to `new` in `new`'s `managedFields`: the
/// writer's `Update` entry gains what changed, other entries lose it.
pub(crate) fn record_update(
    ty: &Ty,
    w: &Writer<'_>,
    old: Option<&Value>,
    new: &mut Value,
    builtin: bool,
) {
    let schemas = Schemas::builtin();
    let skeleton = create_skeleton(new, builtin);
    let old_v = old.unwrap_or(&skeleton);
    let (mut changed, mut removed) = (Set::default(), Set::default());
    fieldset::compare(
        schemas,
        ty,
        Some(old_v),
        Some(new),
        &mut changed,
        &mut removed,
    );
    changed.strip_server_fields();
    removed.strip_server_fields();
    changed.member = false;
    let mut list = old.map(entries).unwrap_or_default();
    if changed.is_empty() && removed.is_empty() {
        store(new, list);
        return;
    }
    for e in &mut list {
        e.set.difference(&changed);
        e.set.difference(&removed);
    }
    match list.iter_mut().find(|e| e.is(w, "Update")) {
        Some(e) => {
            e.set.union(&changed);
            e.time = w.now.to_string();
        }
        None => list.push(Entry {
            manager: w.manager.to_string(),
            operation: "Update".into(),
            api_version: w.api_version.to_string(),
            subresource: w.subresource.map(str::to_string),
            time: w.now.to_string(),
            set: changed,
        }),
    }
    store(new, list);
}

/// What a create is compared with: the typed empty object kube-apiserver compares with, whose
/// `metadata`, `spec` and `status` exist (empty) for built-in kinds.
fn create_skeleton(new: &Value, builtin: bool) -> Value {
    let mut s = json!({"metadata": {}});
    if builtin {
        for f in ["spec", "status"] {
            if new.get(f).is_some_and(Value::is_object) {
                s[f] = json!({});
            }
        }
    }
    s
}

/// The outcome of an apply: the object to store (its `managedFields` set).
pub(crate) fn apply(
    ty: &Ty,
    w: &Writer<'_>,
    live: Option<&Value>,
    config: &Value,
    force: bool,
    status_only: Option<bool>,
) -> Result<Value, ApiError> {
    let schemas = Schemas::builtin();
    let mut applied = Set::default();
    fieldset::of_value(schemas, ty, config, &mut applied);
    applied.strip_server_fields();
    applied.member = false;
    match status_only {
        Some(true) => applied.children.retain(|k, _| k == "f:status"),
        Some(false) => {
            applied.children.remove("f:status");
        }
        None => {}
    }
    let empty = json!({"metadata": {}});
    let live_v = live.unwrap_or(&empty);
    let mut list = live.map(entries).unwrap_or_default();
    let mine = list.iter().position(|e| e.is(w, "Apply"));
    let previous = mine.map(|i| list[i].set.clone()).unwrap_or_default();
    let mut merged = merge(schemas, ty, live_v.clone(), config);
    // Fields this manager applied before and applies no more: gone, unless another manager owns them.
    let mut gone = previous;
    gone.difference(&applied);
    for (i, e) in list.iter().enumerate() {
        if Some(i) != mine {
            gone.difference(&e.set);
        }
    }
    for path in gone.paths() {
        remove_path(&mut merged, &path);
    }
    let (mut changed, mut removed) = (Set::default(), Set::default());
    fieldset::compare(
        schemas,
        ty,
        Some(live_v),
        Some(&merged),
        &mut changed,
        &mut removed,
    );
    changed.union(&removed);
    changed.strip_server_fields();
    let mut conflicts = Vec::new();
    for (i, e) in list.iter().enumerate() {
        if Some(i) == mine {
            continue;
        }
        for p in e.set.intersection(&changed).intersection(&applied).paths() {
            conflicts.push((e.printed(), fieldset::path_string(&p)));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(&conflicts));
    }
    for (i, e) in list.iter_mut().enumerate() {
        if Some(i) != mine && force {
            let taken = e.set.intersection(&changed).intersection(&applied);
            e.set.difference(&taken);
        }
    }
    match mine {
        Some(i) => {
            list[i].set = applied;
            list[i].time = w.now.to_string();
        }
        None => list.push(Entry {
            manager: w.manager.to_string(),
            operation: "Apply".into(),
            api_version: w.api_version.to_string(),
            subresource: w.subresource.map(str::to_string),
            time: w.now.to_string(),
            set: applied,
        }),
    }
    store(&mut merged, list);
    Ok(merged)
}

/// The real server's 409: `Apply failed with N conflict(s): ...`, one cause per field.
fn conflict_error(conflicts: &[(String, String)]) -> ApiError {
    let n = conflicts.len();
    let message = if n == 1 {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            conflicts[0].0, conflicts[0].1
        )
    } else {
        let mut lines = Vec::new();
        let mut managers: Vec<&String> = conflicts.iter().map(|c| &c.0).collect();
        managers.dedup();
        for m in managers {
            lines.push(format!("conflicts with {m}:"));
            for (_, p) in conflicts.iter().filter(|c| &c.0 == m) {
                lines.push(format!("- {p}"));
            }
        }
        format!("Apply failed with {n} conflicts: {}", lines.join("\n"))
    };
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, p)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {m}"), "field": p}))
        .collect();
    ApiError::new(409, Some("Conflict"), message).with_details(json!({"causes": causes}))
}

/// Structured merge of an applied configuration into `live`.
fn merge(schemas: &Schemas, ty: &Ty, live: Value, config: &Value) -> Value {
    match (schemas.resolve(ty), live, config) {
        (Ty::Struct(st), Value::Object(mut l), Value::Object(c)) if !st.atomic => {
            for (k, cv) in c {
                let fty = st.fields.get(k).map_or(Ty::Untyped, |f| f.ty.clone());
                let lv = l.remove(k).unwrap_or(Value::Null);
                l.insert(k.clone(), merge(schemas, &fty, lv, cv));
            }
            Value::Object(l)
        }
        (
            Ty::Map {
                elem,
                atomic: false,
            },
            Value::Object(mut l),
            Value::Object(c),
        ) => {
            for (k, cv) in c {
                let lv = l.remove(k).unwrap_or(Value::Null);
                l.insert(k.clone(), merge(schemas, elem, lv, cv));
            }
            Value::Object(l)
        }
        (Ty::Untyped, Value::Object(mut l), Value::Object(c)) => {
            for (k, cv) in c {
                let lv = l.remove(k).unwrap_or(Value::Null);
                l.insert(k.clone(), merge(schemas, &Ty::Untyped, lv, cv));
            }
            Value::Object(l)
        }
        (Ty::List { elem, kind }, Value::Array(mut l), Value::Array(c))
            if *kind != ListKind::Atomic =>
        {
            for item in c {
                let pe = fieldset::item_element(kind, item);
                match l.iter().position(|x| fieldset::item_element(kind, x) == pe) {
                    Some(i) => {
                        let old = std::mem::take(&mut l[i]);
                        l[i] = merge(schemas, elem, old, item);
                    }
                    None => l.push(item.clone()),
                }
            }
            Value::Array(l)
        }
        (_, _, c) => c.clone(),
    }
}

/// Remove the value at `path` (path elements as in field sets).
fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut at = obj;
    for pe in parents {
        match step(at, pe) {
            Some(next) => at = next,
            None => return,
        }
    }
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(m) = at.as_object_mut() {
            m.remove(f);
        }
    } else if let Value::Array(items) = at {
        items.retain(|i| !item_matches(i, last));
    }
}

fn item_matches(item: &Value, pe: &str) -> bool {
    if let Some(v) = pe.strip_prefix("v:") {
        return serde_json::from_str::<Value>(v).is_ok_and(|v| &v == item);
    }
    if let Some(k) = pe.strip_prefix("k:") {
        let keys: serde_json::Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
        return !keys.is_empty() && keys.iter().all(|(k, v)| item.get(k) == Some(v));
    }
    false
}

fn step<'v>(at: &'v mut Value, pe: &str) -> Option<&'v mut Value> {
    if let Some(f) = pe.strip_prefix("f:") {
        return at.get_mut(f);
    }
    at.as_array_mut()?.iter_mut().find(|i| item_matches(i, pe))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writer(m: &str) -> Writer<'_> {
        Writer {
            manager: m,
            subresource: None,
            api_version: "v1",
            now: "2026-01-01T00:00:00Z",
        }
    }

    fn fields(obj: &Value, manager: &str) -> Value {
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["manager"] == manager)
            .map_or(Value::Null, |e| e["fieldsV1"].clone())
    }

    #[test]
    fn two_appliers_conflict_share_and_force() {
        let ty = Schemas::builtin().kind("", "v1", "ConfigMap");
        let c1 = json!({"metadata": {"name": "c", "labels": {"app": "x"}}, "data": {"a": "1", "b": "2"}});
        let obj = apply(&ty, &writer("m1"), None, &c1, false, None).unwrap();
        assert_eq!(
            fields(&obj, "m1"),
            json!({"f:data": {"f:a": {}, "f:b": {}}, "f:metadata": {"f:labels": {"f:app": {}}}})
        );
        let c2 = json!({"data": {"a": "9", "c": "3"}});
        let err = apply(&ty, &writer("m2"), Some(&obj), &c2, false, None).unwrap_err();
        assert_eq!(
            (err.code, err.message.as_str()),
            (
                409,
                "Apply failed with 1 conflict: conflict with \"m1\": .data.a"
            )
        );
        // Same value: shared, no conflict.
        let shared = apply(
            &ty,
            &writer("m2"),
            Some(&obj),
            &json!({"data": {"a": "1"}}),
            false,
            None,
        )
        .unwrap();
        assert_eq!(fields(&shared, "m2"), json!({"f:data": {"f:a": {}}}));
        assert_eq!(
            fields(&shared, "m1")["f:data"],
            json!({"f:a": {}, "f:b": {}})
        );
        let forced = apply(&ty, &writer("m2"), Some(&obj), &c2, true, None).unwrap();
        assert_eq!(forced["data"], json!({"a": "9", "b": "2", "c": "3"}));
        assert_eq!(fields(&forced, "m1")["f:data"], json!({"f:b": {}}));
        // m1 drops b: removed, as nobody else owns it.
        let dropped = apply(
            &ty,
            &writer("m1"),
            Some(&forced),
            &json!({"metadata": {"labels": {"app": "x"}}}),
            false,
            None,
        )
        .unwrap();
        assert_eq!(dropped["data"], json!({"a": "9", "c": "3"}));
    }

    #[test]
    fn updates_take_what_they_change() {
        let ty = Schemas::builtin().kind("", "v1", "ConfigMap");
        let mut created = json!({"metadata": {"name": "c"}, "data": {"a": "1"}});
        record_update(&ty, &writer("kubectl-create"), None, &mut created, true);
        assert_eq!(
            fields(&created, "kubectl-create"),
            json!({"f:data": {".": {}, "f:a": {}}})
        );
        let mut next = created.clone();
        next["data"]["a"] = json!("2");
        next["metadata"]["labels"] = json!({"z": "1"});
        record_update(&ty, &writer("edit"), Some(&created), &mut next, true);
        assert_eq!(
            fields(&next, "edit"),
            json!({"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {".": {}, "f:z": {}}}})
        );
        assert_eq!(fields(&next, "kubectl-create"), json!({"f:data": {}}));
    }
}
