//! Kind classification (HA.md "Kinds"): every kind the operator's controllers watch is declared *mirrored*
//! (copied to the Standby) or *derived* (re-created by reconcile); an unclassified kind is a build error, and
//! kube-shard's own objects are never mirrored whatever the configuration ([`OwnObjects`]). Pure.

use std::collections::BTreeMap;

use kube::api::ObjectMeta;

use super::error::MirrorError;
use crate::checkpoint::Kind;
use kube_shard::group::report::GROUP_LABEL;

/// How a kind survives a failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KindClass {
    /// Copied to the Standby by the mirror.
    Mirrored,
    /// Re-created by reconcile after a promotion: not copied.
    Derived,
}

/// The classified kinds. Build with [`KindSet::builder`].
#[derive(Clone, Debug, Default)]
pub struct KindSet {
    kinds: BTreeMap<String, (Kind, KindClass)>,
}

/// Builds a [`KindSet`].
#[derive(Clone, Debug, Default)]
pub struct KindSetBuilder {
    declared: Vec<(Kind, KindClass)>,
    allow_secrets: bool,
}

impl KindSet {
    /// An empty builder.
    #[must_use]
    pub fn builder() -> KindSetBuilder {
        KindSetBuilder::default()
    }

    /// The mirrored kinds, in key order.
    pub fn mirrored(&self) -> impl Iterator<Item = &Kind> {
        self.kinds
            .values()
            .filter(|(_, c)| *c == KindClass::Mirrored)
            .map(|(k, _)| k)
    }

    /// The class of the kind with `key` (`<plural>.<group>`).
    #[must_use]
    pub fn class(&self, key: &str) -> Option<KindClass> {
        self.kinds.get(key).map(|(_, c)| *c)
    }
}

impl KindSetBuilder {
    /// Declare `kind` mirrored.
    #[must_use]
    pub fn mirrored(mut self, kind: Kind) -> Self {
        self.declared.push((kind, KindClass::Mirrored));
        self
    }

    /// Declare `kind` derived (re-created by reconcile).
    #[must_use]
    pub fn derived(mut self, kind: Kind) -> Self {
        self.declared.push((kind, KindClass::Derived));
        self
    }

    /// Let Secrets be mirrored (a remote list/watch grant on Secrets exposes every Secret in scope).
    #[must_use]
    pub fn allow_secrets(mut self, allow: bool) -> Self {
        self.allow_secrets = allow;
        self
    }

    /// Validate against `watched`, every kind the operator's controllers watch: each must be declared,
    /// once.
    pub fn build(self, watched: &[Kind]) -> Result<KindSet, MirrorError> {
        let mut kinds = BTreeMap::new();
        for (k, c) in self.declared {
            if c == KindClass::Mirrored
                && k.group.is_empty()
                && k.plural == "secrets"
                && !self.allow_secrets
            {
                return Err(MirrorError::SecretsNotAllowed);
            }
            if kinds.insert(k.key(), (k.clone(), c)).is_some() {
                return Err(MirrorError::Duplicate(k.key()));
            }
        }
        let missing: Vec<String> = watched
            .iter()
            .map(Kind::key)
            .filter(|k| !kinds.contains_key(k))
            .collect();
        if !missing.is_empty() {
            return Err(MirrorError::Unclassified(missing));
        }
        Ok(KindSet { kinds })
    }
}

/// kube-shard's own objects, never mirrored: anything labelled `kube-shard.io/group`, the HA Leases
/// (`<name>-ha` in the HA and witness namespaces), the mirror's checkpoint `<name>-ha-mirror`, and the
/// shard group's assignment ConfigMap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OwnObjects {
    /// (namespace, name) of the HA Leases.
    pub leases: Vec<(String, String)>,
    /// (namespace, name) of ConfigMaps: the assignment and the checkpoint.
    pub configmaps: Vec<(String, String)>,
}

impl OwnObjects {
    /// For the HA name `ha_name` in `namespace` (and the witness namespace), and, with a shard group,
    /// its assignment ConfigMap (namespace, name).
    #[must_use]
    pub fn new(
        ha_name: &str,
        namespace: &str,
        witness_namespace: &str,
        assignment: Option<(String, String)>,
    ) -> Self {
        let lease = format!("{ha_name}-ha");
        let mut configmaps = vec![(namespace.to_string(), format!("{ha_name}-ha-mirror"))];
        configmaps.extend(assignment);
        OwnObjects {
            leases: vec![
                (namespace.to_string(), lease.clone()),
                (witness_namespace.to_string(), lease),
            ],
            configmaps,
        }
    }

    /// Whether the object of `kind` with `meta` is kube-shard's own.
    #[must_use]
    pub fn is_own(&self, kind: &Kind, meta: &ObjectMeta) -> bool {
        if meta
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(GROUP_LABEL))
        {
            return true;
        }
        let at = (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        );
        let named = |list: &[(String, String)]| list.contains(&at);
        match (kind.group.as_str(), kind.plural.as_str()) {
            ("coordination.k8s.io", "leases") => named(&self.leases),
            ("", "configmaps") => named(&self.configmaps),
            _ => false,
        }
    }
}

/// The objects each cluster makes for itself, never mirrored, paired with a copy or deleted: the
/// `kube-root-ca.crt` ConfigMap and the `default` ServiceAccount of every namespace (kube-controller-manager
/// makes them), service-account token Secrets, and the `kube-*` namespaces with everything in them.
#[must_use]
pub(crate) fn per_cluster(kind: &Kind, meta: &ObjectMeta) -> bool {
    let name = meta.name.as_deref().unwrap_or("");
    if meta
        .namespace
        .as_deref()
        .is_some_and(|ns| ns.starts_with("kube-"))
    {
        return true;
    }
    if !kind.group.is_empty() {
        return false;
    }
    match kind.plural.as_str() {
        "namespaces" => name.starts_with("kube-"),
        "configmaps" => name == "kube-root-ca.crt",
        "serviceaccounts" => name == "default",
        "secrets" => meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("kubernetes.io/service-account.name")),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Kind {
        s.parse().unwrap()
    }

    #[test]
    fn objects_every_cluster_makes_for_itself_are_never_mirrored() {
        let m = |ns: Option<&str>, name: &str| ObjectMeta {
            namespace: ns.map(str::to_string),
            name: Some(name.into()),
            ..ObjectMeta::default()
        };
        let (cm, sa, secret, ns) = (
            k("configmaps/v1"),
            k("serviceaccounts/v1"),
            k("secrets/v1"),
            k("namespaces/v1"),
        );
        assert!(per_cluster(&cm, &m(Some("apps"), "kube-root-ca.crt")));
        assert!(per_cluster(&sa, &m(Some("apps"), "default")));
        let mut token = m(Some("apps"), "builder-token-x");
        token.annotations = Some(
            [(
                "kubernetes.io/service-account.name".to_string(),
                "builder".to_string(),
            )]
            .into(),
        );
        assert!(per_cluster(&secret, &token));
        assert!(per_cluster(&ns, &m(None, "kube-system")));
        assert!(per_cluster(&cm, &m(Some("kube-system"), "anything")));
        assert!(per_cluster(
            &k("widgets.example.com/v1"),
            &m(Some("kube-public"), "w")
        ));
        // the user's objects of the same kinds
        assert!(!per_cluster(&cm, &m(Some("apps"), "settings")));
        assert!(!per_cluster(&sa, &m(Some("apps"), "builder")));
        assert!(!per_cluster(&secret, &m(Some("apps"), "tls")));
        assert!(!per_cluster(&ns, &m(None, "apps")));
        assert!(!per_cluster(
            &k("widgets.example.com/v1"),
            &m(Some("apps"), "kube-root-ca.crt")
        ));
    }

    #[test]
    fn every_watched_kind_must_be_classified() {
        let watched = [
            k("widgets.example.com/v1"),
            k("configmaps/v1"),
            k("pods/v1"),
        ];
        let e = KindSet::builder()
            .mirrored(k("widgets.example.com/v1"))
            .derived(k("pods/v1"))
            .build(&watched)
            .unwrap_err();
        assert!(matches!(e, MirrorError::Unclassified(ref m) if m == &["configmaps".to_string()]));
        let ok = KindSet::builder()
            .mirrored(k("widgets.example.com/v1"))
            .mirrored(k("configmaps/v1"))
            .derived(k("pods/v1"))
            .build(&watched)
            .unwrap();
        assert_eq!(ok.mirrored().count(), 2);
        assert_eq!(ok.class("pods"), Some(KindClass::Derived));
        assert_eq!(ok.class("widgets.example.com"), Some(KindClass::Mirrored));
    }

    #[test]
    fn a_kind_is_declared_once_and_secrets_only_when_allowed() {
        let dup = KindSet::builder()
            .mirrored(k("configmaps/v1"))
            .derived(k("configmaps/v1"))
            .build(&[]);
        assert!(matches!(dup, Err(MirrorError::Duplicate(_))));
        let s = KindSet::builder().mirrored(k("secrets/v1")).build(&[]);
        assert!(matches!(s, Err(MirrorError::SecretsNotAllowed)));
        let s = KindSet::builder()
            .mirrored(k("secrets/v1"))
            .allow_secrets(true)
            .build(&[]);
        assert!(s.is_ok());
        // a derived Secret kind needs no grant: nothing is read
        assert!(KindSet::builder()
            .derived(k("secrets/v1"))
            .build(&[])
            .is_ok());
    }

    fn meta(ns: &str, name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn kube_shards_own_objects_are_never_mirrored() {
        let own = OwnObjects::new(
            "op",
            "ops",
            "witness",
            Some(("ops".into(), "g-assignment".into())),
        );
        let (cm, lease) = (k("configmaps/v1"), k("leases.coordination.k8s.io/v1"));
        assert!(own.is_own(&cm, &meta("ops", "g-assignment", &[])));
        assert!(own.is_own(&cm, &meta("ops", "op-ha-mirror", &[])));
        assert!(own.is_own(&lease, &meta("ops", "op-ha", &[])));
        assert!(own.is_own(&lease, &meta("witness", "op-ha", &[])));
        assert!(own.is_own(&lease, &meta("ops", "g-m0", &[(GROUP_LABEL, "g")])));
        assert!(own.is_own(
            &k("widgets.example.com/v1"),
            &meta("x", "w", &[(GROUP_LABEL, "g")])
        ));
        // same names in other kinds or namespaces are user objects
        assert!(!own.is_own(&cm, &meta("other", "g-assignment", &[])));
        assert!(!own.is_own(&lease, &meta("ops", "g-assignment", &[])));
        assert!(!own.is_own(&cm, &meta("ops", "op-ha", &[])));
        assert!(!own.is_own(&cm, &meta("ops", "settings", &[("app", "x")])));
    }
}
