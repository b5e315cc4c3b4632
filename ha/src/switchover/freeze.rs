//! The freeze of a demoting cluster: a ValidatingAdmissionPolicy (and its binding) refusing writes to the
//! covered kinds from everyone but the exempt identities (pure).

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use serde_json::json;

use super::error::SwitchError;
use crate::checkpoint::Kind;
use crate::record;

/// Every freeze refusal message contains this.
pub const FREEZE_MARK: &str = "kube-shard HA freeze";

/// The freeze policy and its binding (pure).
pub fn freeze_objects(
    name: &str,
    kinds: &[Kind],
    exempt: &[String],
) -> Result<(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding), SwitchError> {
    if let Some(bad) = exempt
        .iter()
        .find(|e| e.contains(['\'', '\\']) || e.is_empty())
    {
        return Err(SwitchError::Input(format!(
            "freeze-exempt identity {bad:?}"
        )));
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
                "expression": format!("request.userInfo.username in [{}]", list.join(", ")),
                "message": format!("{FREEZE_MARK}: this cluster is being demoted (planned switchover); write to the new Active"),
                "reason": "Forbidden",
            }],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {record::HA_LABEL: name}},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    });
    let de = |e: serde_json::Error| SwitchError::Input(e.to_string());
    Ok((
        serde_json::from_value(policy).map_err(de)?,
        serde_json::from_value(binding).map_err(de)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_freeze_refuses_all_but_the_exempt_and_rejects_quotes() {
        let k: Kind = "widgets.example.com/v1".parse().unwrap();
        let (p, b) = freeze_objects(
            "w-ha-freeze",
            std::slice::from_ref(&k),
            &["system:gc".into()],
        )
        .unwrap();
        let v = p.spec.unwrap().validations.unwrap();
        assert_eq!(
            v[0].expression,
            "request.userInfo.username in ['system:gc']"
        );
        assert_eq!(b.spec.policy_name, "w-ha-freeze");
        assert!(freeze_objects("n", &[k], &["x'y".into()]).is_err());
    }
}
