//! The freeze of a demoting cluster: a ValidatingAdmissionPolicy (and its binding) refusing writes to the
//! covered kinds from everyone but the exempt identities (pure).
//!
//! The freeze covers exactly what the mirror copies, never more: the binding's `namespaceSelector` names
//! the mirror's namespaces (the API server matches a Namespace by its own labels, so by its
//! `kubernetes.io/metadata.name`, and never skips another cluster-scoped object: as the mirror, which
//! copies cluster-scoped kinds whole), its `objectSelector` is the mirror's label selector, and the
//! objects each cluster makes for itself (which the mirror never copies) stay writable.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use std::collections::BTreeSet;

use kube::core::Selector;
use serde_json::json;

use super::error::SwitchError;
use crate::checkpoint::Kind;
use crate::mirror::labels::label_selector;
use crate::mirror::{MirrorConfig, OwnObjects};
use crate::record;
use kube_shard::group::report::GROUP_LABEL;

/// What the freeze covers within its kinds: the mirror's scope.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FreezeScope {
    /// Only these namespaces (`None`: every namespace).
    pub namespaces: Option<BTreeSet<String>>,
    /// Only objects whose labels match (`None`: every object).
    pub labels: Option<Selector>,
    /// kube-shard's own objects (the HA Leases, the checkpoint and assignment ConfigMaps, objects with
    /// the group label), never frozen: [`demote`](super::demote) adds the HA configuration's.
    pub own: OwnObjects,
}

impl FreezeScope {
    /// The scope of the mirror `m`.
    #[must_use]
    pub fn of(m: &MirrorConfig) -> Self {
        FreezeScope {
            namespaces: m.namespaces.clone(),
            labels: m.labels.clone(),
            own: m.own.clone(),
        }
    }

    /// The scope of these namespaces and this label selector (`kubectl -l` syntax; `None`: none).
    pub fn new(namespaces: Vec<String>, labels: Option<&str>) -> Result<Self, SwitchError> {
        let labels = match labels {
            Some(t) => {
                let s = crate::mirror::labels::parse_labels(t)
                    .map_err(|e| SwitchError::Input(e.to_string()))?;
                (!s.selects_all()).then_some(s)
            }
            None => None,
        };
        Ok(FreezeScope {
            namespaces: (!namespaces.is_empty()).then(|| namespaces.into_iter().collect()),
            labels,
            own: OwnObjects::default(),
        })
    }

    /// Also never freeze `own` (the HA configuration's own objects beside those the mirror recorded).
    #[must_use]
    pub fn with_own(mut self, own: OwnObjects) -> Self {
        for (list, more) in [
            (&mut self.own.configmaps, own.configmaps),
            (&mut self.own.leases, own.leases),
        ] {
            for o in more {
                if !list.contains(&o) {
                    list.push(o);
                }
            }
        }
        self
    }

    /// Neither a namespace nor a label selector: the whole kind.
    #[must_use]
    pub fn is_whole(&self) -> bool {
        self.namespaces.is_none() && self.labels.is_none()
    }
}

/// A CEL condition true for the objects the mirror never copies among `kinds` — those each cluster makes
/// for itself (`crate::mirror::kinds::per_cluster`) and kube-shard's own — which the freeze lets everyone
/// write.
fn exceptions_cel(kinds: &[Kind], own: &OwnObjects) -> String {
    let labelled = |o: &str| {
        format!(
            "({o} != null && has({o}.metadata.labels) && '{GROUP_LABEL}' in {o}.metadata.labels)"
        )
    };
    let mut any = vec![
        "request.namespace.startsWith('kube-')".to_string(),
        labelled("object"),
        labelled("oldObject"),
    ];
    let named = |group: &str, plural: &str, list: &[(String, String)]| {
        let names: Vec<String> = list.iter().map(|(n, m)| format!("'{n}/{m}'")).collect();
        format!(
            "(request.resource.group == '{group}' && request.resource.resource == '{plural}' && \
             (request.namespace + '/' + request.name) in [{}])",
            names.join(", ")
        )
    };
    for k in kinds {
        match (k.group.as_str(), k.plural.as_str()) {
            ("", "configmaps") if !own.configmaps.is_empty() => {
                any.push(named("", "configmaps", &own.configmaps))
            }
            ("coordination.k8s.io", "leases") if !own.leases.is_empty() => {
                any.push(named("coordination.k8s.io", "leases", &own.leases))
            }
            _ => {}
        }
    }
    let core = |plural: &str, cond: &str| {
        format!(
            "(request.resource.group == '' && request.resource.resource == '{plural}' && {cond})"
        )
    };
    for k in kinds.iter().filter(|k| k.group.is_empty()) {
        let token = |o: &str| {
            format!("({o} != null && has({o}.metadata.annotations) && 'kubernetes.io/service-account.name' in {o}.metadata.annotations)")
        };
        match k.plural.as_str() {
            "namespaces" => any.push(core("namespaces", "request.name.startsWith('kube-')")),
            "configmaps" => any.push(core("configmaps", "request.name == 'kube-root-ca.crt'")),
            "serviceaccounts" => any.push(core("serviceaccounts", "request.name == 'default'")),
            "secrets" => any.push(core(
                "secrets",
                &format!("({} || {})", token("object"), token("oldObject")),
            )),
            _ => {}
        }
    }
    any.join(" || ")
}

/// Every freeze refusal message contains this.
pub const FREEZE_MARK: &str = "kube-shard HA freeze";

/// The freeze policy and its binding (pure).
pub fn freeze_objects(
    name: &str,
    kinds: &[Kind],
    exempt: &[String],
    scope: &FreezeScope,
) -> Result<(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding), SwitchError> {
    if let Some(bad) = exempt
        .iter()
        .find(|e| e.contains(['\'', '\\']) || e.is_empty())
    {
        return Err(SwitchError::Input(format!(
            "freeze-exempt identity {bad:?}"
        )));
    }
    let own = scope.own.configmaps.iter().chain(&scope.own.leases);
    if let Some((n, m)) = own
        .clone()
        .find(|(n, m)| format!("{n}{m}").contains(['\'', '\\']))
    {
        return Err(SwitchError::Input(format!("own object {n}/{m}")));
    }
    let list: Vec<String> = exempt.iter().map(|e| format!("'{e}'")).collect();
    let rules: Vec<_> = kinds
        .iter()
        .map(|k| {
            json!({
                "apiGroups": [k.group], "apiVersions": ["*"],
                "resources": [k.plural, format!("{}/status", k.plural)],
                "operations": ["CREATE", "UPDATE", "DELETE"],
            })
        })
        .collect();
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {record::HA_LABEL: name}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "validations": [{
                "expression": format!("request.userInfo.username in [{}] || {}", list.join(", "), exceptions_cel(kinds, &scope.own)),
                "message": format!("{FREEZE_MARK}: this cluster is being demoted (planned switchover); write to the new Active"),
                "reason": "Forbidden",
            }],
        },
    });
    let mut spec = json!({"policyName": name, "validationActions": ["Deny"]});
    if let Some(ns) = &scope.namespaces {
        spec["matchResources"]["namespaceSelector"] = json!({"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In", "values": ns,
        }]});
    }
    if let Some(l) = &scope.labels {
        spec["matchResources"]["objectSelector"] = serde_json::to_value(label_selector(l))
            .map_err(|e| SwitchError::Input(e.to_string()))?;
    }
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {record::HA_LABEL: name}},
        "spec": spec,
    });
    let de = |e: serde_json::Error| SwitchError::Input(e.to_string());
    Ok((
        serde_json::from_value(policy).map_err(de)?,
        serde_json::from_value(binding).map_err(de)?,
    ))
}

/// Whether the freeze covers `o` (an object of `kind`): in the scope and not one each cluster makes for
/// itself; the same objects the mirror copies.
pub(super) fn covers(kind: &Kind, scope: &FreezeScope, o: &kube::api::DynamicObject) -> bool {
    let m = &o.metadata;
    crate::mirror::scope::selected(scope.namespaces.as_ref(), scope.labels.as_ref(), kind, m)
        && !crate::mirror::kinds::per_cluster(kind, m)
}

/// Labels that satisfy `s` where it can be satisfied by setting labels (equalities, sets, existence).
pub(super) fn satisfying_labels(s: &Selector) -> std::collections::BTreeMap<String, String> {
    use kube::core::Expression as E;
    s.clone()
        .into_iter()
        .filter_map(|e| match e {
            E::Equal(k, v) => Some((k, v)),
            E::In(k, v) => v.into_iter().next().map(|v| (k, v)),
            E::Exists(k) => Some((k, "probe".into())),
            E::NotEqual(..) | E::NotIn(..) | E::DoesNotExist(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_freeze_refuses_all_but_the_exempt_and_rejects_quotes() {
        let k: Kind = "widgets.example.com/v1".parse().unwrap();
        let whole = FreezeScope::default();
        let (p, b) = freeze_objects(
            "w-ha-freeze",
            std::slice::from_ref(&k),
            &["system:gc".into()],
            &whole,
        )
        .unwrap();
        let v = p.spec.unwrap().validations.unwrap();
        assert!(
            v[0].expression.starts_with(
                "request.userInfo.username in ['system:gc'] || request.namespace.startsWith('kube-')"
            ),
            "{}",
            v[0].expression
        );
        assert_eq!(b.spec.policy_name, "w-ha-freeze");
        assert!(b.spec.match_resources.is_none());
        assert!(freeze_objects("n", &[k], &["x'y".into()], &whole).is_err());
    }

    #[test]
    fn the_freeze_binding_selects_the_mirrors_namespaces_and_labels() {
        let k: Kind = "configmaps/v1".parse().unwrap();
        let scope = FreezeScope::new(vec!["apps".into(), "ops".into()], Some("app=shop")).unwrap();
        let (p, b) = freeze_objects("n", &[k], &[], &scope).unwrap();
        let m = b.spec.match_resources.unwrap();
        let ns = m.namespace_selector.unwrap().match_expressions.unwrap();
        assert_eq!(ns[0].key, "kubernetes.io/metadata.name");
        assert_eq!(ns[0].values, Some(vec!["apps".into(), "ops".into()]));
        let obj = m.object_selector.unwrap().match_expressions.unwrap();
        assert_eq!(
            (obj[0].key.as_str(), obj[0].operator.as_str()),
            ("app", "In")
        );
        let e = &p.spec.unwrap().validations.unwrap()[0].expression;
        assert!(e.contains("request.name == 'kube-root-ca.crt'"), "{e}");
        let mut own = scope.clone();
        own.own = OwnObjects::new("w", "ops", "ops", None);
        let (p, _) = freeze_objects("n", &["configmaps/v1".parse().unwrap()], &[], &own).unwrap();
        let e = &p.spec.unwrap().validations.unwrap()[0].expression;
        assert!(e.contains("in ['ops/w-ha-mirror']"), "{e}");
        own.own.configmaps.push(("ops".into(), "x'y".into()));
        assert!(freeze_objects("n", &[], &[], &own).is_err());
    }
}
