//! The minimum-failover-epoch policy (HA.md "Fenced by the server"): when a promoter reaches the old
//! Active's cluster it sets a parameter object holding the minimum failover epoch and the role, and this
//! policy refuses the operator identities' creates and updates below it, and all their deletes while the
//! role is `standby` (deletes carry no stamp). Pure: JSON only.

use serde_json::{json, Value};

use super::{
    messages,
    policies::{failover, Carrier},
    FencePolicyConfig, ParamsRef, PolicyError, TOKEN_PATTERN,
};

/// The suffix of the minimum-epoch policy's and binding's name (`kube-shard-fence-min-epoch` by default).
pub const MIN_EPOCH_SUFFIX: &str = "-min-epoch";

/// The ConfigMap name of the probe write: a dry-run create of it (in any namespace) carrying a token is
/// judged by the minimum-epoch policy whoever sends it, so a promoter can see when a new minimum is in
/// effect (the apiserver loads parameters through an informer, with a lag).
pub const MIN_EPOCH_PROBE: &str = "kube-shard-min-epoch-probe";

/// The parameter key holding the minimum failover epoch (wire form, decimal).
pub const MIN_EPOCH_KEY: &str = "minFailoverEpoch";

/// The parameter key holding the cluster's role: `active` or `standby`.
pub const ROLE_KEY: &str = "role";

/// What the minimum-epoch policy needs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MinEpoch {
    /// The parameter ConfigMap (by convention `<ha-name>-ha-min-epoch` in the HA namespace: what
    /// `kube_shard_ha::min_epoch` writes).
    pub params: ParamsRef,
    /// The operator's identities (`request.userInfo.username`) whose writes are judged.
    pub identities: Vec<String>,
}

impl MinEpoch {
    /// The policy for `identities`, bound to `params`.
    #[must_use]
    pub fn new(params: ParamsRef, identities: Vec<String>) -> Self {
        MinEpoch { params, identities }
    }

    pub(super) fn validate(&self) -> Result<(), PolicyError> {
        if self.identities.is_empty() {
            return Err(PolicyError::Identity(String::new()));
        }
        match self
            .identities
            .iter()
            .find(|i| i.is_empty() || i.contains(['\'', '\\']) || i.len() > 253)
        {
            Some(bad) => Err(PolicyError::Identity(bad.chars().take(128).collect())),
            None => Ok(()),
        }
    }
}

/// The parameter ConfigMap as generated: `role: active`, `minFailoverEpoch: "0"` (no floor).
pub(super) fn initial_params(p: &ParamsRef) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": p.name, "namespace": p.namespace,
                     "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
        "data": {MIN_EPOCH_KEY: "0", ROLE_KEY: "active"},
    })
}

pub(super) fn policy(config: &FencePolicyConfig, name: &str, m: &MinEpoch) -> Value {
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
