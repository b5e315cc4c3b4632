//! The resources the server serves: the built-in ones and those registered by CRDs.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::Value;

/// One served resource at one version.
#[derive(Debug)]
pub(crate) struct ResourceInfo {
    pub(crate) group: String,
    pub(crate) version: String,
    pub(crate) plural: String,
    pub(crate) singular: String,
    pub(crate) kind: String,
    pub(crate) list_kind: String,
    pub(crate) namespaced: bool,
    /// Serves a `/status` subresource (and a main-resource write ignores `.status`).
    pub(crate) status: bool,
    /// Serves a `/scale` subresource (`autoscaling/v1` `Scale` over `spec.replicas`).
    pub(crate) scale: bool,
    /// Built into kube-apiserver (not from a CRD): only these echo `shardInfo` on LIST.
    pub(crate) builtin: bool,
    /// Kept in storage (lists and watches); `false` for create-only review resources.
    pub(crate) stored: bool,
    /// The verbs discovery lists.
    pub(crate) verbs: Vec<String>,
    /// `metadata.generation` is maintained (custom resources and CRDs).
    pub(crate) generation: bool,
    pub(crate) short_names: Vec<String>,
    pub(crate) categories: Vec<String>,
    /// Objects of all versions of one resource share this store key (`group/plural`).
    pub(crate) store_key: Arc<str>,
    /// Its structure for strategic merge and server-side apply.
    pub(crate) ty: crate::schema::Ty,
}

impl ResourceInfo {
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub(crate) fn builtin(k: &crate::kinds::Kind) -> Self {
        let strings = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        ResourceInfo {
            group: k.group.into(),
            version: k.version.into(),
            plural: k.plural.into(),
            singular: k.singular.into(),
            kind: k.kind.into(),
            list_kind: format!("{}List", k.kind),
            namespaced: k.namespaced,
            status: k.subresources.contains(&"status"),
            scale: k.subresources.contains(&"scale"),
            builtin: true,
            generation: k.generation,
            stored: k.verbs.contains(&"list"),
            verbs: strings(k.verbs),
            short_names: strings(k.short_names),
            categories: strings(k.categories),
            store_key: store_key(k.group, k.plural),
            ty: crate::schema::Ty::Named(std::sync::Arc::from(
                format!("{}/{}/{}", k.group, k.version, k.kind).as_str(),
            )),
        }
    }
}

pub(crate) fn store_key(group: &str, plural: &str) -> Arc<str> {
    Arc::from(format!("{group}/{plural}"))
}

pub(crate) const CRD_GROUP: &str = "apiextensions.k8s.io";

/// The verbs of a custom resource.
const CRD_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The resource registry. Keyed by (group, version, plural).
#[derive(Debug)]
pub(crate) struct Registry {
    by_gvr: BTreeMap<(String, String, String), Arc<ResourceInfo>>,
}

impl Registry {
    /// Every resource of the generated table ([`crate::kinds::KINDS`]).
    pub(crate) fn with_builtins() -> Self {
        let mut r = Registry {
            by_gvr: BTreeMap::new(),
        };
        for k in crate::kinds::KINDS {
            r.insert(ResourceInfo::builtin(k));
        }
        r
    }

    fn insert(&mut self, info: ResourceInfo) {
        self.by_gvr.insert(
            (
                info.group.clone(),
                info.version.clone(),
                info.plural.clone(),
            ),
            Arc::new(info),
        );
    }

    pub(crate) fn get(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceInfo>> {
        self.by_gvr
            .get(&(group.to_string(), version.to_string(), plural.to_string()))
            .cloned()
    }

    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<ResourceInfo>> {
        self.by_gvr.values()
    }

    /// Any version of the resource stored under `key`.
    pub(crate) fn by_store_key(&self, key: &str) -> Option<Arc<ResourceInfo>> {
        self.by_gvr.values().find(|i| &*i.store_key == key).cloned()
    }

    /// Served groups with their versions, preferred first: the built-in groups in the real server's
    /// order, then the groups of CRDs by name (versions in registration order).
    pub(crate) fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = crate::kinds::GROUPS
            .iter()
            .map(|(g, vs)| (g.to_string(), vs.iter().map(|v| v.to_string()).collect()))
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for info in self.by_gvr.values().filter(|i| !i.builtin) {
            if out.iter().any(|(g, _)| *g == info.group) {
                continue;
            }
            let versions = extra.entry(info.group.clone()).or_default();
            if !versions.contains(&info.version) {
                versions.push(info.version.clone());
            }
        }
        out.extend(extra);
        out
    }

    /// Serve (or re-serve) every served version of a CRD. Returns the store key.
    pub(crate) fn register_crd(&mut self, crd: &Value) -> Option<Arc<str>> {
        let spec = crd.get("spec")?;
        let group = spec.get("group")?.as_str()?.to_string();
        let names = spec.get("names")?;
        let plural = names.get("plural")?.as_str()?.to_string();
        let kind = names.get("kind")?.as_str()?.to_string();
        let singular = names
            .get("singular")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_lowercase());
        let list_kind = names
            .get("listKind")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("{kind}List"));
        let strings = |v: Option<&Value>| -> Vec<String> {
            v.and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        let short_names = strings(names.get("shortNames"));
        let categories = strings(names.get("categories"));
        let namespaced = spec.get("scope").and_then(Value::as_str) != Some("Cluster");
        self.unregister(&group, &plural);
        let key = store_key(&group, &plural);
        for v in spec.get("versions")?.as_array()? {
            if v.get("served").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            let Some(version) = v.get("name").and_then(Value::as_str) else {
                continue;
            };
            let status = v
                .pointer("/subresources/status")
                .is_some_and(|s| !s.is_null());
            self.insert(ResourceInfo {
                group: group.clone(),
                version: version.to_string(),
                plural: plural.clone(),
                singular: singular.clone(),
                kind: kind.clone(),
                list_kind: list_kind.clone(),
                namespaced,
                status,
                scale: false,
                builtin: false,
                stored: true,
                verbs: CRD_VERBS.iter().map(|v| v.to_string()).collect(),
                generation: true,
                short_names: short_names.clone(),
                categories: categories.clone(),
                store_key: key.clone(),
                ty: crate::schema::crd_ty(v.pointer("/schema/openAPIV3Schema")),
            });
        }
        Some(key)
    }

    pub(crate) fn unregister(&mut self, group: &str, plural: &str) {
        self.by_gvr
            .retain(|(g, _, p), info| info.builtin || !(g == group && p == plural));
    }
}
