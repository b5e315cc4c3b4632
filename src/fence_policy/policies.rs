//! The policy and binding objects, as JSON. Pure.
//!
//! Each level (per object, per shard) is one function; what differs between the annotation on main
//! resources and a status field on `/status` is the [`Carrier`]: where the token is read, which
//! subresource is matched, and the wording of the removed/malformed refusals.

use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::config::{FencePolicyConfig, PolicySet};
use super::min_epoch::{MinEpoch, MIN_EPOCH_KEY, MIN_EPOCH_PROBE, MIN_EPOCH_SUFFIX, ROLE_KEY};
use super::status_field::StatusFenceField;
use super::types::{
    messages, ParamsRef, PolicyError, EPOCH_PATTERN, SHARD_POLICY_SUFFIX, STATUS_POLICY_SUFFIX,
    TOKEN_PATTERN,
};
use crate::token::MIRROR;

/// Where a policy finds the fence token.
#[derive(Clone, Copy, Debug)]
pub(super) enum Carrier<'a> {
    /// The annotation `key` (main resources; the per-object level also matches `/status`, where a
    /// built-in kind's status write may change annotations).
    Annotation(&'a str),
    /// A status field (a CRD's `/status` writes only).
    Status(&'a StatusFenceField),
}

impl Carrier<'_> {
    /// The token on `obj` (`object`, `oldObject`), `''` when absent.
    pub(super) fn read(self, obj: &str) -> String {
        match self {
            // `key` is validated: no quote or backslash can reach the CEL string literal
            Carrier::Annotation(key) => format!(
                "has({obj}.metadata.annotations) && '{key}' in {obj}.metadata.annotations ? {obj}.metadata.annotations['{key}'] : ''"
            ),
            Carrier::Status(f) => f.read(obj),
        }
    }

    /// The resources to match for `plural`, at the per-object (`per_shard == false`) or per-shard level.
    fn resources(self, plural: &str, per_shard: bool) -> Value {
        match (self, per_shard) {
            // `/status` too: a built-in kind's status write may change annotations (a CRD's copies the
            // stored metadata, so the fence compares equal there and passes)
            (Carrier::Annotation(_), false) => json!([plural, format!("{plural}/status")]),
            (Carrier::Annotation(_), true) => json!([plural]),
            (Carrier::Status(_), _) => json!([format!("{plural}/status")]),
        }
    }

    /// The operations to match: a subresource has no CREATE.
    fn operations(self, per_shard: bool) -> Value {
        match (self, per_shard) {
            (Carrier::Annotation(_), true) => json!(["CREATE", "UPDATE"]),
            _ => json!(["UPDATE"]),
        }
    }

    fn removed(self) -> &'static str {
        match self {
            Carrier::Annotation(_) => messages::REMOVED,
            Carrier::Status(_) => messages::STATUS_REMOVED,
        }
    }

    fn malformed(self) -> &'static str {
        match self {
            Carrier::Annotation(_) => messages::MALFORMED,
            Carrier::Status(_) => messages::STATUS_MALFORMED,
        }
    }
}

/// A generated object as its typed form (the generator's own JSON: always well-formed).
pub(super) fn typed<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a well-formed generated object")
}

pub(super) fn binding(name: &str, params: Option<&ParamsRef>) -> Value {
    let mut b = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    });
    if let Some(p) = params {
        // Deny: a missing parameter ConfigMap refuses every covered write (fail closed)
        b["spec"]["paramRef"] = json!({
            "name": p.name, "namespace": p.namespace, "parameterNotFoundAction": "Deny",
        });
    }
    b
}

fn rules(config: &FencePolicyConfig, carrier: Carrier<'_>, per_shard: bool) -> Vec<Value> {
    config
        .resources
        .iter()
        .map(|r| {
            json!({
                "apiGroups": [r.group],
                "apiVersions": ["*"],
                "resources": carrier.resources(&r.plural, per_shard),
                "operations": carrier.operations(per_shard),
            })
        })
        .collect()
}

/// Per shard: a fenced write whose shard epoch is lower than `params.data["<shard>"]` is refused, whatever
/// its failover epoch (the floors are one group's shard epochs, compared only with shard epochs). A token
/// that is absent or malformed is left to the per-object policy; a mirror token and a shard without a key
/// have no floor. The
/// parameter ConfigMap itself is excluded (its own writes would otherwise need it).
pub(super) fn per_shard_policy(
    config: &FencePolicyConfig,
    name: &str,
    params: &ParamsRef,
    carrier: Carrier<'_>,
) -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {
                "resourceRules": rules(config, carrier, true),
                "excludeResourceRules": [{
                    "apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                    "operations": ["*"], "resourceNames": [params.name],
                }],
            },
            "variables": [
                {"name": "fence", "expression": carrier.read("object")},
                {"name": "ok", "expression": format!("variables.fence.matches('{TOKEN_PATTERN}')")},
                {"name": "part", "expression": shard_part("fence", "ok")},
                // a mirror token has no shard: no floor
                {"name": "shard", "expression": format!("variables.ok && variables.part != '{MIRROR}' ? string(int(variables.part.split('/')[0])) : ''")},
                {"name": "floor", "expression": "variables.shard != '' && has(params.data) && variables.shard in params.data ? params.data[variables.shard] : ''"},
                {"name": "floorOk", "expression": format!("variables.floor.matches('{EPOCH_PATTERN}')")},
            ],
            "validations": [
                {
                    "expression": "variables.floor == '' || variables.floorOk",
                    "message": messages::PARAM_MALFORMED,
                    "reason": "Invalid",
                },
                {
                    "expression": "!variables.floorOk || int(variables.part.split('/')[1]) >= int(variables.floor)",
                    "message": messages::SHARD_STALE,
                    "reason": "Invalid",
                },
            ],
        },
    })
}

/// The CEL of a token's failover epoch (`0` for a legacy token), from the variables `fence` and `ok`.
pub(super) fn failover(fence: &str, ok: &str) -> String {
    format!("variables.{ok} && variables.{fence}.contains(':') ? int(variables.{fence}.split(':')[0]) : 0")
}

/// The CEL of a token's shard part (`<shard>/<epoch>` or `mirror`, `''` when malformed).
pub(super) fn shard_part(fence: &str, ok: &str) -> String {
    format!("!variables.{ok} ? '' : (variables.{fence}.contains(':') ? variables.{fence}.split(':')[1] : variables.{fence})")
}

/// Per object: an UPDATE whose token has a lower failover epoch than the stored one, or an equal failover
/// epoch and (neither being a mirror token) another shard or a lower shard epoch, or that removes the stored
/// token, or is malformed, is refused. A failover epoch is never compared with a shard epoch.
pub(super) fn per_object_policy(
    config: &FencePolicyConfig,
    name: &str,
    carrier: Carrier<'_>,
) -> Value {
    let both = "!(variables.oldOk && variables.newOk)";
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules(config, carrier, false)},
            "variables": [
                {"name": "oldFence", "expression": carrier.read("oldObject")},
                {"name": "newFence", "expression": carrier.read("object")},
                {"name": "oldOk", "expression": format!("variables.oldFence.matches('{TOKEN_PATTERN}')")},
                {"name": "newOk", "expression": format!("variables.newFence.matches('{TOKEN_PATTERN}')")},
                {"name": "oldF", "expression": failover("oldFence", "oldOk")},
                {"name": "newF", "expression": failover("newFence", "newOk")},
                {"name": "oldPart", "expression": shard_part("oldFence", "oldOk")},
                {"name": "newPart", "expression": shard_part("newFence", "newOk")},
                // equal failover epochs and no mirror token: the shard rules apply
                {"name": "shardRules", "expression": format!("variables.oldOk && variables.newOk && variables.newF == variables.oldF && variables.newPart != '{MIRROR}' && variables.oldPart != '{MIRROR}'")},
            ],
            "validations": [
                {
                    "expression": "variables.oldFence == '' || variables.newFence != ''",
                    "message": carrier.removed(),
                    "reason": "Invalid",
                },
                {
                    "expression": "variables.newFence == '' || variables.newOk",
                    "message": carrier.malformed(),
                    "reason": "Invalid",
                },
                {
                    "expression": format!("{both} || variables.newF >= variables.oldF"),
                    "message": messages::FAILOVER_STALE,
                    "reason": "Invalid",
                },
                {
                    "expression": "!variables.shardRules || int(variables.newPart.split('/')[0]) == int(variables.oldPart.split('/')[0])",
                    "message": messages::SHARD,
                    "reason": "Invalid",
                },
                {
                    "expression": "!variables.shardRules || int(variables.newPart.split('/')[1]) >= int(variables.oldPart.split('/')[1])",
                    "message": messages::STALE,
                    "reason": "Invalid",
                },
            ],
        },
    })
}

/// The parameter ConfigMap as generated: `role: active`, `minFailoverEpoch: "0"` (no floor).
pub(super) fn min_epoch_params(p: &ParamsRef) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": p.name, "namespace": p.namespace,
                     "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
        "data": {MIN_EPOCH_KEY: "0", ROLE_KEY: "active"},
    })
}

pub(super) fn min_epoch_policy(config: &FencePolicyConfig, name: &str, m: &MinEpoch) -> Value {
    let mut rules: Vec<Value> = config
        .resources
        .iter()
        .map(|r| {
            json!({
                "apiGroups": [r.group], "apiVersions": ["*"],
                "resources": [r.plural, format!("{}/status", r.plural)],
                "operations": ["CREATE", "UPDATE", "DELETE"],
            })
        })
        .collect();
    rules.push(json!({
        "apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
        "operations": ["CREATE"], "resourceNames": [MIN_EPOCH_PROBE],
    }));
    let ids: Vec<String> = m.identities.iter().map(|i| format!("'{i}'")).collect();
    let annotation = Carrier::Annotation(&config.annotation).read("object");
    // on a CRD's `/status` the annotation is the stored one: only the status field carries the writer's token
    let on_status = match &config.status_field {
        Some(f) => Carrier::Status(f).read("object"),
        None => annotation.clone(),
    };
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {
                "resourceRules": rules,
                "excludeResourceRules": [{
                    "apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                    "operations": ["*"], "resourceNames": [m.params.name],
                }],
            },
            "variables": [
                {"name": "probe", "expression": format!("request.resource.group == '' && request.resource.resource == 'configmaps' && request.name == '{MIN_EPOCH_PROBE}'")},
                {"name": "mine", "expression": format!("variables.probe || request.userInfo.username in [{}]", ids.join(", "))},
                {"name": "min", "expression": format!("has(params.data) && '{MIN_EPOCH_KEY}' in params.data ? params.data['{MIN_EPOCH_KEY}'] : ''")},
                {"name": "minOk", "expression": "variables.min.matches('^[0-9]{1,10}$')"},
                {"name": "standby", "expression": format!("has(params.data) && '{ROLE_KEY}' in params.data && params.data['{ROLE_KEY}'] == 'standby'")},
                {"name": "fence", "expression": format!("request.operation == 'DELETE' ? '' : (request.subResource == 'status' ? ({on_status}) : ({annotation}))")},
                {"name": "ok", "expression": format!("variables.fence.matches('{TOKEN_PATTERN}')")},
                {"name": "f", "expression": failover("fence", "ok")},
            ],
            "validations": [
                {
                    "expression": "!variables.mine || variables.min == '' || variables.minOk",
                    "message": messages::MIN_EPOCH_MALFORMED,
                    "reason": "Invalid",
                },
                {
                    "expression": "!variables.mine || request.operation != 'DELETE' || !variables.standby",
                    "message": messages::MIN_EPOCH_DELETE,
                    "reason": "Forbidden",
                },
                {
                    // an unfenced (or malformed) write passes while active, and is refused while standby
                    "expression": "!variables.mine || request.operation == 'DELETE' || !variables.minOk || (variables.ok ? variables.f >= int(variables.min) : !variables.standby)",
                    "message": messages::MIN_EPOCH_STALE,
                    "reason": "Forbidden",
                },
            ],
        },
    })
}

impl FencePolicyConfig {
    /// The policies and their bindings.
    pub fn generate(&self) -> Result<PolicySet, PolicyError> {
        self.validate()?;
        let annotation = Carrier::Annotation(&self.annotation);
        let mut set = PolicySet {
            policies: vec![typed(per_object_policy(self, &self.name, annotation))],
            bindings: vec![typed(binding(&self.name, None))],
            params: None,
            min_epoch_params: None,
        };
        if let Some(p) = &self.params {
            let name = format!("{}{SHARD_POLICY_SUFFIX}", self.name);
            set.policies
                .push(typed(per_shard_policy(self, &name, p, annotation)));
            set.bindings.push(typed(binding(&name, Some(p))));
        }
        if let Some(field) = &self.status_field {
            let status = Carrier::Status(field);
            let name = format!("{}{STATUS_POLICY_SUFFIX}", self.name);
            set.policies
                .push(typed(per_object_policy(self, &name, status)));
            set.bindings.push(typed(binding(&name, None)));
            if let Some(p) = &self.params {
                let name = format!("{name}{SHARD_POLICY_SUFFIX}");
                set.policies
                    .push(typed(per_shard_policy(self, &name, p, status)));
                set.bindings.push(typed(binding(&name, Some(p))));
            }
        }
        if let Some(m) = &self.min_epoch {
            let name = format!("{}{MIN_EPOCH_SUFFIX}", self.name);
            set.policies.push(typed(min_epoch_policy(self, &name, m)));
            set.bindings.push(typed(binding(&name, Some(&m.params))));
            set.min_epoch_params = Some(typed(min_epoch_params(&m.params)));
        }
        if let Some(p) = &self.params {
            set.params = Some(typed(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": p.name, "namespace": p.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
            })));
        }
        Ok(set)
    }
}
