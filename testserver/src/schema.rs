//! The structure of objects as strategic merge and server-side apply see it: for each field, its type,
//! its patch strategy and merge key (strategic merge), and its list and map semantics (server-side
//! apply). Built-in kinds take it from the captured `/openapi/v2` (`x-kubernetes-patch-strategy`,
//! `x-kubernetes-patch-merge-key`, `x-kubernetes-list-type`, `x-kubernetes-list-map-keys`,
//! `x-kubernetes-map-type`), custom resources from their CRD's `openAPIV3Schema`. Nothing is typed by
//! hand.

use std::{
    collections::HashMap,
    sync::{Arc, OnceLock},
};

use serde_json::Value;

/// How server-side apply merges a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListKind {
    /// Replaced whole.
    Atomic,
    /// A set of scalars: union.
    Set,
    /// Items identified by these keys: merged item by item.
    Map(Vec<String>),
}

/// A type: named (a definition of the captured document), or inline.
#[derive(Debug, Clone)]
pub(crate) enum Ty {
    Named(Arc<str>),
    Struct(Arc<Struct>),
    /// A map of string keys to `elem` (labels, data); atomic ones are replaced whole.
    Map {
        elem: Box<Ty>,
        atomic: bool,
    },
    List {
        elem: Box<Ty>,
        kind: ListKind,
    },
    Scalar,
    /// Unknown structure (no schema, `x-kubernetes-preserve-unknown-fields`, `RawExtension`):
    /// maps are granular, lists atomic.
    Untyped,
}

/// An object with declared fields.
#[derive(Debug, Default)]
pub(crate) struct Struct {
    pub(crate) fields: HashMap<String, Field>,
    /// `x-kubernetes-map-type: atomic` (a `LabelSelector`): replaced whole.
    pub(crate) atomic: bool,
}

/// One declared field.
#[derive(Debug, Clone)]
pub(crate) struct Field {
    pub(crate) ty: Ty,
    /// `x-kubernetes-patch-strategy` (`merge`, `replace`, `retainKeys`, `merge,retainKeys`).
    pub(crate) strategy: Option<String>,
    /// `x-kubernetes-patch-merge-key`.
    pub(crate) merge_key: Option<String>,
}

impl Field {
    pub(crate) fn strategy_has(&self, s: &str) -> bool {
        self.strategy
            .as_deref()
            .is_some_and(|x| x.split(',').any(|p| p == s))
    }
}

/// The definitions of the captured `/openapi/v2`, and which one each kind is.
#[derive(Debug, Default)]
pub(crate) struct Schemas {
    defs: HashMap<String, Ty>,
    /// `group/version/kind` → definition name.
    kinds: HashMap<String, String>,
}

fn gvk_key(group: &str, version: &str, kind: &str) -> String {
    format!("{group}/{version}/{kind}")
}

impl Schemas {
    /// Those of the captured document (parsed once per process).
    pub(crate) fn builtin() -> &'static Schemas {
        static S: OnceLock<Schemas> = OnceLock::new();
        S.get_or_init(|| {
            let v2: Value = serde_json::from_slice(&crate::openapi::v2()).unwrap_or(Value::Null);
            Schemas::from_v2(&v2)
        })
    }

    pub(crate) fn from_v2(doc: &Value) -> Self {
        let mut s = Schemas::default();
        let Some(defs) = doc["definitions"].as_object() else {
            return s;
        };
        for (name, def) in defs {
            s.defs.insert(name.clone(), ty_of(def));
            for gvk in def["x-kubernetes-group-version-kind"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let key = gvk_key(
                    gvk["group"].as_str().unwrap_or_default(),
                    gvk["version"].as_str().unwrap_or_default(),
                    gvk["kind"].as_str().unwrap_or_default(),
                );
                s.kinds.entry(key).or_insert_with(|| name.clone());
            }
        }
        s
    }

    /// The type of a built-in kind (`Untyped` if unknown).
    #[cfg(test)]
    pub(crate) fn kind(&self, group: &str, version: &str, kind: &str) -> Ty {
        self.kinds
            .get(&gvk_key(group, version, kind))
            .map_or(Ty::Untyped, |n| Ty::Named(Arc::from(n.as_str())))
    }

    /// The type of a built-in kind by kind name alone (the first group version that has it).
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn kind_by_name(&self, kind: &str) -> Option<Ty> {
        let mut names: Vec<(&String, &String)> = self
            .kinds
            .iter()
            .filter(|(k, _)| k.rsplit('/').next() == Some(kind))
            .collect();
        names.sort();
        names.first().map(|(_, n)| Ty::Named(Arc::from(n.as_str())))
    }

    /// Follow names to a structural type.
    pub(crate) fn resolve<'a>(&'a self, ty: &'a Ty) -> &'a Ty {
        let mut t = ty;
        for _ in 0..8 {
            match t {
                Ty::Named(n) => match self
                    .defs
                    .get(&**n)
                    .or_else(|| self.kinds.get(&**n).and_then(|d| self.defs.get(d)))
                {
                    Some(d) => t = d,
                    None => return &Ty::Untyped,
                },
                _ => return t,
            }
        }
        &Ty::Untyped
    }
}

/// The type of a JSON schema (OpenAPI v2 or v3, or a CRD's structural schema).
pub(crate) fn ty_of(s: &Value) -> Ty {
    if let Some(r) = s["$ref"]
        .as_str()
        .or_else(|| s["allOf"][0]["$ref"].as_str())
    {
        let name = r.rsplit('/').next().unwrap_or(r);
        return Ty::Named(Arc::from(name));
    }
    if s["x-kubernetes-int-or-string"] == true {
        return Ty::Scalar;
    }
    let typ = s["type"].as_str().unwrap_or_default();
    if let Some(props) = s["properties"].as_object() {
        let fields = props
            .iter()
            .map(|(k, v)| {
                let field = Field {
                    ty: ty_of(v),
                    strategy: v["x-kubernetes-patch-strategy"]
                        .as_str()
                        .map(str::to_string),
                    merge_key: v["x-kubernetes-patch-merge-key"]
                        .as_str()
                        .map(str::to_string),
                };
                (k.clone(), with_list_kind(field, v))
            })
            .collect();
        return Ty::Struct(Arc::new(Struct {
            fields,
            atomic: s["x-kubernetes-map-type"] == "atomic",
        }));
    }
    match typ {
        "array" => {
            let elem = ty_of(&s["items"]);
            let kind = list_kind(s, None, None);
            Ty::List {
                elem: Box::new(elem),
                kind,
            }
        }
        "object" => match &s["additionalProperties"] {
            Value::Object(a) if !a.is_empty() => Ty::Map {
                elem: Box::new(ty_of(&s["additionalProperties"])),
                atomic: s["x-kubernetes-map-type"] == "atomic",
            },
            _ => Ty::Untyped,
        },
        "" => Ty::Untyped,
        _ => Ty::Scalar,
    }
}

/// A list field's kind: `x-kubernetes-list-type`, else (built-in kinds) derived from the patch
/// strategy as kube-openapi's schema conversion does: `merge` with a key is a map, `merge` without one
/// a set, anything else atomic.
fn list_kind(s: &Value, strategy: Option<&str>, merge_key: Option<&str>) -> ListKind {
    match s["x-kubernetes-list-type"].as_str() {
        Some("set") => ListKind::Set,
        Some("map") => ListKind::Map(
            s["x-kubernetes-list-map-keys"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|k| k.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        ),
        Some(_) => ListKind::Atomic,
        None => match (strategy.is_some_and(|x| x.contains("merge")), merge_key) {
            (true, Some(k)) => ListKind::Map(vec![k.to_string()]),
            (true, None) => ListKind::Set,
            _ => ListKind::Atomic,
        },
    }
}

fn with_list_kind(mut f: Field, s: &Value) -> Field {
    if let Ty::List { kind, .. } = &mut f.ty {
        *kind = list_kind(s, f.strategy.as_deref(), f.merge_key.as_deref());
    }
    f
}

/// The type of a custom resource from its CRD version's schema (`Untyped` without one).
pub(crate) fn crd_ty(schema: Option<&Value>) -> Ty {
    match schema {
        Some(s)
            if s["x-kubernetes-preserve-unknown-fields"] != true
                || s.get("properties").is_some() =>
        {
            ty_of(s)
        }
        _ => Ty::Untyped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field<'a>(s: &'a Schemas, ty: &'a Ty, name: &str) -> &'a Field {
        match s.resolve(ty) {
            Ty::Struct(st) => st.fields.get(name).unwrap_or_else(|| panic!("no {name}")),
            other => panic!("not a struct: {other:?}"),
        }
    }

    #[test]
    fn captured_schema_has_the_real_merge_keys_and_list_types() {
        let s = Schemas::builtin();
        let deploy = s.kind("apps", "v1", "Deployment");
        let spec = field(s, &deploy, "spec");
        let template = field(s, &spec.ty, "template");
        let pod = field(s, &template.ty, "spec");
        let containers = field(s, &pod.ty, "containers");
        assert_eq!(containers.merge_key.as_deref(), Some("name"));
        assert!(containers.strategy_has("merge"));
        assert!(
            matches!(&containers.ty, Ty::List { kind: ListKind::Map(k), .. } if k == &["name"])
        );
        let selector = field(s, &spec.ty, "selector");
        assert!(matches!(s.resolve(&selector.ty), Ty::Struct(st) if st.atomic));
        let fins = field(s, &field(s, &deploy, "metadata").ty, "finalizers");
        assert!(matches!(
            &fins.ty,
            Ty::List {
                kind: ListKind::Set,
                ..
            }
        ));
        let cm = s.kind("", "v1", "ConfigMap");
        assert!(matches!(
            s.resolve(&field(s, &cm, "data").ty),
            Ty::Map { atomic: false, .. }
        ));
        assert!(s.kind_by_name("Deployment").is_some());
    }
}
