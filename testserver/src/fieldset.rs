//! Field sets as `managedFields` stores them (`FieldsV1`): a tree of path elements — `f:<field>`,
//! `k:{<keys>}` (an item of a list-map), `v:<value>` (an item of a set) — where a node is a member
//! when it is a leaf (`{}`) or carries `"."`. The walks below follow sigs.k8s.io/structured-merge-diff:
//! which paths an object has ([`of_value`]) and which changed between two objects ([`compare`]).

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::schema::{ListKind, Schemas, Ty};

/// A set of field paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Set {
    pub(crate) member: bool,
    pub(crate) children: BTreeMap<String, Set>,
}

impl Set {
    pub(crate) fn is_empty(&self) -> bool {
        !self.member && self.children.values().all(Set::is_empty)
    }

    fn child(&mut self, pe: String) -> &mut Set {
        self.children.entry(pe).or_default()
    }

    pub(crate) fn to_json(&self) -> Value {
        let mut m = Map::new();
        if self.member && !self.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &self.children {
            if !c.is_empty() {
                m.insert(k.clone(), c.to_json());
            }
        }
        Value::Object(m)
    }

    pub(crate) fn from_json(v: &Value) -> Set {
        let mut s = Set::default();
        let Some(m) = v.as_object() else {
            return s;
        };
        for (k, c) in m {
            if k == "." {
                s.member = true;
            } else {
                let mut child = Set::from_json(c);
                if c.as_object().is_some_and(Map::is_empty) {
                    child.member = true;
                }
                s.children.insert(k.clone(), child);
            }
        }
        s
    }

    pub(crate) fn union(&mut self, other: &Set) {
        self.member |= other.member;
        for (k, c) in &other.children {
            self.child(k.clone()).union(c);
        }
    }

    pub(crate) fn difference(&mut self, other: &Set) {
        if other.member {
            self.member = false;
        }
        for (k, c) in &other.children {
            if let Some(mine) = self.children.get_mut(k) {
                mine.difference(c);
            }
        }
        self.children.retain(|_, c| !c.is_empty());
    }

    pub(crate) fn intersection(&self, other: &Set) -> Set {
        let mut out = Set {
            member: self.member && other.member,
            children: BTreeMap::new(),
        };
        for (k, c) in &self.children {
            if let Some(o) = other.children.get(k) {
                let i = c.intersection(o);
                if !i.is_empty() {
                    out.children.insert(k.clone(), i);
                }
            }
        }
        out
    }

    /// Every member path, each as its path elements.
    pub(crate) fn paths(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.member {
            out.push(at.clone());
        }
        for (k, c) in &self.children {
            at.push(k.clone());
            c.collect(at, out);
            at.pop();
        }
    }

    /// Remove what the server manages itself: `apiVersion`, `kind` and the metadata it sets.
    pub(crate) fn strip_server_fields(&mut self) {
        self.children.remove("f:apiVersion");
        self.children.remove("f:kind");
        if let Some(meta) = self.children.get_mut("f:metadata") {
            meta.member = false;
            for f in [
                "name",
                "namespace",
                "uid",
                "resourceVersion",
                "generation",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
            ] {
                meta.children.remove(&format!("f:{f}"));
            }
        }
        self.children.retain(|_, c| !c.is_empty());
    }
}

/// The path element of a list item, or `None` when the list is atomic.
pub(crate) fn item_element(kind: &ListKind, item: &Value) -> Option<String> {
    match kind {
        ListKind::Atomic => None,
        ListKind::Set => Some(format!("v:{item}")),
        ListKind::Map(keys) => {
            let mut m: BTreeMap<&str, &Value> = BTreeMap::new();
            for k in keys {
                if let Some(v) = item.get(k) {
                    m.insert(k, v);
                }
            }
            Some(format!(
                "k:{}",
                serde_json::to_string(&m).unwrap_or_default()
            ))
        }
    }
}

/// What a type looks like to the walks: a granular map (declared fields or not), a list, or a leaf.
enum Shape<'a> {
    Fields(Option<&'a crate::schema::Struct>, Ty),
    List(&'a ListKind, Ty),
    Leaf,
}

fn shape<'a>(schemas: &'a Schemas, ty: &'a Ty, v: &Value) -> Shape<'a> {
    match (schemas.resolve(ty), v) {
        (Ty::Struct(s), Value::Object(_)) if !s.atomic => Shape::Fields(Some(s), Ty::Untyped),
        (
            Ty::Map {
                elem,
                atomic: false,
            },
            Value::Object(_),
        ) => Shape::Fields(None, (**elem).clone()),
        (Ty::Untyped, Value::Object(_)) => Shape::Fields(None, Ty::Untyped),
        (Ty::List { elem, kind }, Value::Array(_)) => Shape::List(kind, (**elem).clone()),
        _ => Shape::Leaf,
    }
}

fn field_ty(st: Option<&crate::schema::Struct>, elem: &Ty, k: &str) -> (Ty, bool) {
    match st.and_then(|s| s.fields.get(k)) {
        Some(f) => (f.ty.clone(), true),
        None => (elem.clone(), false),
    }
}

/// The field set of `v` (as applied configuration): structure-merge-diff's `ToFieldSet`.
pub(crate) fn of_value(schemas: &Schemas, ty: &Ty, v: &Value, out: &mut Set) {
    match shape(schemas, ty, v) {
        Shape::Fields(st, elem) => {
            let m = v.as_object().expect("object shape");
            if m.is_empty() {
                out.member = true;
            }
            for (k, cv) in m {
                let (cty, declared) = field_ty(st, &elem, k);
                let child = out.child(format!("f:{k}"));
                of_value(schemas, &cty, cv, child);
                if cv.is_null() || cv.as_object().is_some_and(Map::is_empty) || !declared {
                    child.member = true;
                }
            }
        }
        Shape::List(kind, elem) => match item_elements(kind, v) {
            None => out.member = true,
            Some(items) => {
                for (pe, item) in items {
                    let child = out.child(pe);
                    of_value(schemas, &elem, item, child);
                    child.member = true;
                }
            }
        },
        Shape::Leaf => out.member = true,
    }
}

fn item_elements<'v>(kind: &ListKind, v: &'v Value) -> Option<Vec<(String, &'v Value)>> {
    if *kind == ListKind::Atomic {
        return None;
    }
    v.as_array()?
        .iter()
        .map(|i| item_element(kind, i).map(|pe| (pe, i)))
        .collect()
}

/// The paths added or changed from `old` to `new` (`changed`) and those removed (`removed`).
pub(crate) fn compare(
    schemas: &Schemas,
    ty: &Ty,
    old: Option<&Value>,
    new: Option<&Value>,
    changed: &mut Set,
    removed: &mut Set,
) {
    let old = old.filter(|v| !v.is_null());
    let new = new.filter(|v| !v.is_null());
    match (old, new) {
        (None, None) => {}
        (None, Some(n)) => {
            of_value(schemas, ty, n, changed);
            changed.member = true;
        }
        (Some(o), None) => {
            of_value(schemas, ty, o, removed);
            removed.member = true;
        }
        (Some(o), Some(n)) => match (shape(schemas, ty, o), shape(schemas, ty, n)) {
            (Shape::Fields(st, elem), Shape::Fields(..)) => {
                let (om, nm) = (o.as_object().expect("obj"), n.as_object().expect("obj"));
                let keys: std::collections::BTreeSet<&String> =
                    om.keys().chain(nm.keys()).collect();
                for k in keys {
                    let (cty, _) = field_ty(st, &elem, k);
                    let pe = format!("f:{k}");
                    let (mut c, mut r) = (Set::default(), Set::default());
                    compare(schemas, &cty, om.get(k), nm.get(k), &mut c, &mut r);
                    if !c.is_empty() {
                        changed.children.insert(pe.clone(), c);
                    }
                    if !r.is_empty() {
                        removed.children.insert(pe, r);
                    }
                }
            }
            (Shape::List(kind, elem), Shape::List(..)) => {
                match (item_elements(kind, o), item_elements(kind, n)) {
                    (Some(oi), Some(ni)) => {
                        let om: BTreeMap<String, &Value> = oi.into_iter().collect();
                        let nmap: BTreeMap<String, &Value> = ni.into_iter().collect();
                        let keys: std::collections::BTreeSet<&String> =
                            om.keys().chain(nmap.keys()).collect();
                        for pe in keys {
                            let (mut c, mut r) = (Set::default(), Set::default());
                            compare(
                                schemas,
                                &elem,
                                om.get(pe).copied(),
                                nmap.get(pe).copied(),
                                &mut c,
                                &mut r,
                            );
                            if !c.is_empty() {
                                changed.children.insert(pe.clone(), c);
                            }
                            if !r.is_empty() {
                                removed.children.insert(pe.clone(), r);
                            }
                        }
                    }
                    _ => changed.member |= o != n,
                }
            }
            _ => changed.member |= o != n,
        },
    }
}

/// A path as the real server prints it in conflicts: `.data.a`, `.spec.containers[name="web"].image`,
/// `.metadata.finalizers[="f"]`.
pub(crate) fn path_string(path: &[String]) -> String {
    let mut out = String::new();
    for pe in path {
        if let Some(f) = pe.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(v) = pe.strip_prefix("v:") {
            out.push_str(&format!("[={v}]"));
        } else if let Some(k) = pe.strip_prefix("k:") {
            let keys: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            let inner: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
            out.push_str(&format!("[{}]", inner.join(",")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_round_trip_and_set_algebra() {
        let j = json!({"f:data": {".": {}, "f:a": {}}, "f:metadata": {"f:labels": {"f:x": {}}}});
        let s = Set::from_json(&j);
        assert_eq!(s.to_json(), j);
        assert_eq!(s.paths().len(), 3);
        let mut t = s.clone();
        t.difference(&Set::from_json(&json!({"f:data": {"f:a": {}}})));
        assert_eq!(
            t.to_json(),
            json!({"f:data": {}, "f:metadata": {"f:labels": {"f:x": {}}}})
        );
        let i = s.intersection(&Set::from_json(
            &json!({"f:metadata": {"f:labels": {"f:x": {}}}}),
        ));
        assert_eq!(
            i.paths(),
            vec![vec![
                "f:metadata".to_string(),
                "f:labels".into(),
                "f:x".into()
            ]]
        );
    }

    #[test]
    fn sets_of_objects_follow_the_schema() {
        let s = Schemas::builtin();
        let ty = s.kind("apps", "v1", "Deployment");
        let d = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"replicas": 1,
            "selector": {"matchLabels": {"a": "1"}},
            "template": {"spec": {"containers": [{"name": "web", "image": "x"}]}}}});
        let mut set = Set::default();
        of_value(s, &ty, &d, &mut set);
        assert_eq!(
            set.to_json(),
            json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {
            "f:replicas": {}, "f:selector": {}, "f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}})
        );
        let mut d2 = d.clone();
        d2["spec"]["replicas"] = json!(2);
        d2["metadata"]["labels"] = json!(null);
        let (mut c, mut r) = (Set::default(), Set::default());
        compare(s, &ty, Some(&d), Some(&d2), &mut c, &mut r);
        assert_eq!(c.to_json(), json!({"f:spec": {"f:replicas": {}}}));
        assert_eq!(
            r.to_json(),
            json!({"f:metadata": {"f:labels": {".": {}, "f:a": {}}}})
        );
        let p = vec![
            "f:spec".to_string(),
            "f:template".into(),
            "f:spec".into(),
            "f:containers".into(),
            "k:{\"name\":\"web\"}".into(),
            "f:image".into(),
        ];
        assert_eq!(
            path_string(&p),
            ".spec.template.spec.containers[name=\"web\"].image"
        );
    }
}
