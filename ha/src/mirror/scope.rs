//! The mirror's scope (pure): which objects of a mirrored kind it copies, pairs and may delete.
//!
//! An object is in scope when it is in a configured namespace (a Namespace by its own name, any other
//! cluster-scoped object always: a namespace scope names namespaces, and a cluster-scoped kind has none,
//! so it is mirrored whole, never silently left out), its labels match the configured label selector,
//! and it is neither kube-shard's own nor an object every cluster makes for itself
//! (`kinds::per_cluster`).
//!
//! Built-in kinds (the core group and the `*.k8s.io` groups, and the unqualified groups such as `apps`)
//! hold objects the cluster's own controllers and other tools create in every namespace; a mirror of one
//! needs a label selector ([`check_builtin_selectors`]) unless a person says the whole kind in scope is the
//! operator's.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{DynamicObject, ObjectMeta};
use kube::core::{Selector, SelectorExt};

use super::config::MirrorConfig;
use super::error::MirrorError;
use crate::checkpoint::Kind;

/// In the configured namespaces, matching the label selector, and neither kube-shard's own nor an object
/// every cluster makes for itself.
pub(crate) fn in_scope(cfg: &MirrorConfig, kind: &Kind, o: &DynamicObject) -> bool {
    let m = &o.metadata;
    selected(cfg.namespaces.as_ref(), cfg.labels.as_ref(), kind, m)
        && !cfg.own.is_own(kind, m)
        && !super::kinds::per_cluster(kind, m)
}

/// In `namespaces` (a Namespace by its name, another cluster-scoped object always) and matching
/// `labels`, where `None` selects everything: the scope without its exclusions (the freeze's too).
pub(crate) fn selected(
    namespaces: Option<&BTreeSet<String>>,
    labels: Option<&Selector>,
    kind: &Kind,
    m: &ObjectMeta,
) -> bool {
    let ns_ok = namespaces.is_none_or(|set| match &m.namespace {
        Some(n) => set.contains(n),
        None if is_namespace_kind(kind) => m.name.as_ref().is_some_and(|n| set.contains(n)),
        None => true,
    });
    let empty = BTreeMap::new();
    ns_ok && labels.is_none_or(|s| s.matches(m.labels.as_ref().unwrap_or(&empty)))
}

fn is_namespace_kind(kind: &Kind) -> bool {
    kind.group.is_empty() && kind.plural == "namespaces"
}

/// A kind the Kubernetes project serves (the core group, `*.k8s.io`, or a group without a dot such as
/// `apps`, `batch`, `policy`, `autoscaling`): its objects are made by more than the operator.
#[must_use]
pub fn is_builtin(kind: &Kind) -> bool {
    kind.group.is_empty() || !kind.group.contains('.') || kind.group.ends_with(".k8s.io")
}

/// Refuse a mirror of a built-in kind without a label selector, unless `cfg` says the whole kind in scope
/// is the operator's ([`MirrorConfig::whole_builtin_kinds`]).
pub fn check_builtin_selectors(cfg: &MirrorConfig) -> Result<(), MirrorError> {
    if cfg.labels.as_ref().is_some_and(|s| !s.selects_all()) || cfg.whole_builtin_kinds {
        return Ok(());
    }
    match cfg.kinds.mirrored().find(|k| is_builtin(k)) {
        Some(k) => Err(MirrorError::Kind(
            k.key(),
            "a built-in kind is mirrored only with a label selector (--mirror-labels, \
             MirrorConfig::labels): the cluster's own controllers and other tools create objects of it \
             in every namespace, and those must be neither copied over the peer's nor deleted at failback"
                .into(),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_kinds_are_the_core_unqualified_and_k8s_io_groups() {
        for k in [
            "configmaps/v1",
            "deployments.apps/v1",
            "ingresses.networking.k8s.io/v1",
        ] {
            assert!(is_builtin(&k.parse().unwrap()), "{k}");
        }
        assert!(!is_builtin(&"widgets.example.com/v1".parse().unwrap()));
    }
}
