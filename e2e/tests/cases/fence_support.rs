//! What the fence e2e cases share (`fence_policy`, `fence_params`, `fence_status`): the refusal's shape,
//! installing and removing generated policies by name, a fresh namespace, a policy narrowed to it.

use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    core::v1::Namespace,
};
use kube::{
    api::{DeleteParams, PostParams},
    core::Status,
    Api, Client,
};
use serde_json::json;

pub fn status(e: kube::Error) -> Box<Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("not an API error: {other}"),
    }
}

/// kube-apiserver's refusal by `policy` (bound by a binding of the same name) of a write to `what`
/// (`configmaps`, `widgets.example.com`) `name`: 422 Invalid, `<what> "<name>" is forbidden: ...`, one cause.
pub fn assert_refused(s: &Status, what: &str, name: &str, policy: &str, msg: &str) {
    let inner = format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: {msg}"
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert_eq!(
        s.message,
        format!("{what} \"{name}\" is forbidden: {inner}")
    );
    let d = s.details.as_ref().expect("details");
    let (plural, group) = what.split_once('.').unwrap_or((what, ""));
    assert_eq!(
        (d.name.as_str(), d.kind.as_str(), d.group.as_str()),
        (name, plural, group)
    );
    assert_eq!(d.causes.len(), 1);
    assert_eq!(d.causes[0].message, inner);
}

/// A namespace `<prefix>-<ms since the epoch>`, created.
pub async fn fresh_namespace(client: &Client, prefix: &str) -> String {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    let ns = format!("{prefix}-{ms}");
    let nsobj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &nsobj)
        .await
        .unwrap();
    ns
}

/// Create `policies` and `bindings`, after deleting any of the same names (a previous run's).
pub async fn install_policies(
    client: &Client,
    policies: &[ValidatingAdmissionPolicy],
    bindings: &[ValidatingAdmissionPolicyBinding],
) {
    let names: Vec<String> = policies
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    remove_policies(client, &names).await;
    let pp = PostParams::default();
    for p in policies {
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&pp, p)
            .await
            .unwrap();
    }
    for b in bindings {
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&pp, b)
            .await
            .unwrap();
    }
}

/// Delete the policies `names` and their bindings (the same names); missing ones are fine.
pub async fn remove_policies(client: &Client, names: &[impl AsRef<str>]) {
    for name in names {
        let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .delete(name.as_ref(), &DeleteParams::default())
            .await;
        let _ = Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .delete(name.as_ref(), &DeleteParams::default())
            .await;
    }
}

/// `policy` narrowed to namespace `ns` (a namespaceSelector on its matchConstraints), so that it cannot
/// refuse another test's writes while it unloads, which takes a while after its removal.
pub fn scoped(policy: &ValidatingAdmissionPolicy, ns: &str) -> ValidatingAdmissionPolicy {
    let mut v = serde_json::to_value(policy).unwrap();
    v["spec"]["matchConstraints"]["namespaceSelector"] =
        json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
    serde_json::from_value(v).unwrap()
}

/// kube-apiserver v1.36.2 stops its parameter informer for `ConfigMap` when the last policy with that
/// `paramKind` goes, and one started again later never sees ConfigMaps created after the first stopped (every
/// `Deny` binding to such a ConfigMap then refuses with "no params found" until the apiserver restarts:
/// found with these tests, see docs/fence-policy.md). This keeper — a policy with the same `paramKind` that
/// matches nothing, never deleted — keeps the informer running between the tests. Start the apiserver
/// afresh before the first run.
pub async fn keep_param_informer(client: &Client) {
    let keeper = "kube-shard-e2e-param-informer";
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "metadata": {"name": keeper},
        "spec": {"failurePolicy": "Ignore", "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                 "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                     "resources": ["configmaps"], "operations": ["CREATE"], "resourceNames": [keeper]}]},
                 "validations": [{"expression": "true"}]}}))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "metadata": {"name": keeper},
        "spec": {"policyName": keeper, "validationActions": ["Deny"],
                 "paramRef": {"name": keeper, "namespace": "default", "parameterNotFoundAction": "Allow"}}}))
    .unwrap();
    let _ = Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .create(&PostParams::default(), &policy)
        .await;
    let _ = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await;
}
