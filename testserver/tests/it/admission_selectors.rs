//! ValidatingAdmissionPolicy `namespaceSelector` and `objectSelector`, in a policy's `matchConstraints` and in
//! a binding's `matchResources`: each table is the one kube-apiserver v1.36.2 gave to the same writes
//! (recorded by hand on `../shared/realkube` with kubectl and curl, policies with `expression: "false"`).

use kube::Client;
use kube_shard_testserver::TestServer;
use serde_json::{json, Value};

use crate::admission::install;

use Write::*;

/// What a write got: `None` when it committed, else the refusal's `<code> <message>`.
type Answer = Option<String>;

type Labels = &'static [(&'static str, &'static str)];

const FROZEN: Labels = &[("frozen", "yes")];
const SEL_A: Labels = &[("sel", "a")];
const SEL_A_FROZEN: Labels = &[("sel", "a"), ("frozen", "yes")];

/// One write, as `admin`.
#[derive(Debug)]
enum Write {
    /// A ConfigMap: namespace, name, labels.
    CreateCm(&'static str, &'static str, Labels),
    DryRunCreateCm(&'static str, &'static str, Labels),
    /// A merge patch of a ConfigMap.
    PatchCm(&'static str, &'static str, Value),
    DeleteCm(&'static str, &'static str),
    DryRunDeleteCm(&'static str, &'static str),
    CreateNs(&'static str, Labels),
    PatchNs(&'static str, Value),
    DeleteNs(&'static str),
    CreateClusterRole(&'static str, Labels),
    /// Any body to any path.
    Post(&'static str, Value),
}

impl Write {
    async fn send(&self, c: &Client) -> Answer {
        let cms = |ns: &str| format!("/api/v1/namespaces/{ns}/configmaps");
        let (method, uri, body) = match self {
            CreateCm(ns, name, l) => ("POST", cms(ns), cm_doc(ns, name, l)),
            DryRunCreateCm(ns, name, l) => (
                "POST",
                format!("{}?dryRun=All", cms(ns)),
                cm_doc(ns, name, l),
            ),
            PatchCm(ns, name, p) => ("PATCH", format!("{}/{name}", cms(ns)), p.clone()),
            DeleteCm(ns, name) => ("DELETE", format!("{}/{name}", cms(ns)), json!({})),
            DryRunDeleteCm(ns, name) => {
                let uri = format!("{}/{name}?dryRun=All", cms(ns));
                ("DELETE", uri, json!({}))
            }
            CreateNs(name, l) => ("POST", "/api/v1/namespaces".into(), ns_doc(name, l)),
            PatchNs(name, p) => ("PATCH", format!("/api/v1/namespaces/{name}"), p.clone()),
            DeleteNs(name) => ("DELETE", format!("/api/v1/namespaces/{name}"), json!({})),
            CreateClusterRole(name, l) => {
                let doc = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                                 "metadata": {"name": name, "labels": labels(l)}, "rules": []});
                let uri = "/apis/rbac.authorization.k8s.io/v1/clusterroles";
                ("POST", uri.into(), doc)
            }
            Post(uri, doc) => ("POST", uri.to_string(), doc.clone()),
        };
        send(c, method, &uri, body).await
    }
}

async fn send(c: &Client, method: &str, uri: &str, body: Value) -> Answer {
    let kind = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", kind)
        .body(serde_json::to_vec(&body).unwrap())
        .unwrap();
    match c.request_text(req).await {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(format!("{} {}", s.code, s.message)),
        Err(e) => panic!("{method} {uri}: {e}"),
    }
}

fn labels(pairs: Labels) -> Value {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect()
}

fn cm_doc(ns: &str, name: &str, l: Labels) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "data": {"k": "v"},
           "metadata": {"name": name, "namespace": ns, "labels": labels(l)}})
}

fn ns_doc(name: &str, l: Labels) -> Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels(l)}})
}

fn set_label(k: &str, v: Option<&str>) -> Value {
    json!({"metadata": {"labels": {k: v}}})
}

fn data_edit() -> Value {
    json!({"data": {"x": "y"}})
}

/// Writes that must commit (fixtures).
async fn given(c: &Client, writes: Vec<Write>) {
    for w in writes {
        assert_eq!(w.send(c).await, None, "fixture {w:?}");
    }
}

/// Send each write in order; report every answer that differs from the recorded one.
async fn table(c: &Client, rows: Vec<(Write, Answer)>) {
    let mut diffs = Vec::new();
    for (w, want) in rows {
        let got = w.send(c).await;
        if got != want {
            diffs.push(format!("{w:?}:\n   got  {got:?}\n   want {want:?}"));
        }
    }
    assert!(
        diffs.is_empty(),
        "differs from kube-apiserver v1.36.2:\n{}",
        diffs.join("\n")
    );
}

/// The 422 of a failing validation.
fn refused(what: &str, name: &str, policy: &str, binding: &str, msg: &str) -> Answer {
    Some(format!(
        "422 {what} \"{name}\" is forbidden: ValidatingAdmissionPolicy '{policy}' with binding \
         '{binding}' denied request: {msg}"
    ))
}

/// The 422 of a configuration error of a policy (`binding: None`) or of a binding, for a ConfigMap.
fn misconfigured(name: &str, policy: &str, binding: Option<&str>, err: &str) -> Answer {
    let inner = match binding {
        Some(b) => format!(
            "ValidatingAdmissionPolicy '{policy}' with binding '{b}' denied request: failed to \
             configure binding: {err}"
        ),
        None => format!(
            "ValidatingAdmissionPolicy '{policy}' denied request: failed to configure policy: {err}"
        ),
    };
    Some(format!("422 configmaps \"{name}\" is forbidden: {inner}"))
}

fn rule(resources: &[&str], operations: &[&str]) -> Value {
    json!({"apiGroups": [""], "apiVersions": ["*"], "resources": resources, "operations": operations})
}

fn policy(name: &str, failure: &str, constraints: Value, message: &str) -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
           "metadata": {"name": name},
           "spec": {"failurePolicy": failure, "matchConstraints": constraints,
                    "validations": [{"expression": "false", "message": message}]}})
}

fn binding(name: &str, policy: &str, actions: &[&str], match_resources: Option<Value>) -> Value {
    let mut b = json!({"apiVersion": "admissionregistration.k8s.io/v1",
                       "kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": name},
                       "spec": {"policyName": policy, "validationActions": actions}});
    if let Some(m) = match_resources {
        b["spec"]["matchResources"] = m;
    }
    b
}

/// `vap-a`: ConfigMaps, Namespaces and ClusterRoles (every operation) in namespaces labelled `sel=a`
/// (Namespaces by their own labels), of objects labelled `frozen=yes`; `false` with message `frozen`.
fn policy_a(failure: &str) -> Value {
    let rules = json!([
        rule(&["configmaps", "namespaces"], &["*"]),
        {"apiGroups": ["rbac.authorization.k8s.io"], "apiVersions": ["*"],
         "resources": ["clusterroles"], "operations": ["*"]},
    ]);
    let constraints = json!({
        "resourceRules": rules,
        "namespaceSelector": {"matchLabels": {"sel": "a"}},
        "objectSelector": {"matchExpressions": [{"key": "frozen", "operator": "In", "values": ["yes"]}]},
    });
    policy("vap-a", failure, constraints, "frozen")
}

/// `vap-a` with a binding of `actions`.
fn with_binding_a(failure: &str, actions: &[&str]) -> Vec<Value> {
    vec![policy_a(failure), binding("vap-a", "vap-a", actions, None)]
}

/// `vap-a`'s refusal of a `what` (`<plural>.<group>`) named `name`.
fn frozen(what: &str, name: &str) -> Answer {
    refused(what, name, "vap-a", "vap-a", "frozen")
}

/// `vap-b`: every write of ConfigMaps and Secrets, no selectors; `false` with message `b`.
fn policy_b() -> Value {
    let rules = json!({"resourceRules": [rule(&["configmaps", "secrets"], &["*"])]});
    policy("vap-b", "Fail", rules, "b")
}

/// `vap-b`'s first binding: namespaces `sel in (b)`, objects with a `frozen` label, ConfigMap creates and
/// updates only, except the one named `exempt`.
fn binding_b() -> Value {
    let exempt = json!({"apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                        "operations": ["*"], "resourceNames": ["exempt"]});
    let resources = json!({
        "namespaceSelector": {"matchExpressions": [{"key": "sel", "operator": "In", "values": ["b"]}]},
        "objectSelector": {"matchExpressions": [{"key": "frozen", "operator": "Exists"}]},
        "resourceRules": [rule(&["configmaps"], &["CREATE", "UPDATE"])],
        "excludeResourceRules": [exempt],
    });
    binding("vap-b", "vap-b", &["Deny"], Some(resources))
}

/// `vap-b`'s second binding: namespaces `sel=b`, no `resourceRules` (whatever the policy selects) but
/// creates and updates excluded: the deletes.
fn binding_b2() -> Value {
    let resources = json!({
        "namespaceSelector": {"matchLabels": {"sel": "b"}},
        "excludeResourceRules": [rule(&["configmaps", "secrets"], &["CREATE", "UPDATE"])],
    });
    binding("vap-b2", "vap-b", &["Deny"], Some(resources))
}

/// `vap-b`'s refusal through `binding` of a ConfigMap named `name`.
fn by_b(binding: &str, name: &str) -> Answer {
    refused("configmaps", name, "vap-b", binding, "b")
}

/// `vap-c`: the ConfigMaps named `c-target`, no selectors; `false` with message `c`.
fn with_binding_c(failure: &str, actions: &[&str]) -> Vec<Value> {
    let rules = json!([{"apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                        "operations": ["*"], "resourceNames": ["c-target"]}]);
    let p = policy("vap-c", failure, json!({ "resourceRules": rules }), "c");
    vec![p, binding("vap-c", "vap-c", actions, None)]
}

/// A server with `ns-a` (`sel=a`), `ns-b` (no labels) and `ns-sb` (`sel=b`), then `fixtures`, then `policies`.
async fn cluster(fixtures: Vec<Write>, policies: Vec<Value>) -> (TestServer, Client) {
    let server = TestServer::new();
    let c = server.client("admin");
    let mut all = vec![
        CreateNs("ns-a", SEL_A),
        CreateNs("ns-b", &[]),
        CreateNs("ns-sb", &[("sel", "b")]),
    ];
    all.extend(fixtures);
    given(&c, all).await;
    install(&server, policies).await;
    (server, c)
}

/// A ConfigMap is selected by its Namespace's labels and by its own labels or its old ones (either): a
/// create by the new object, a delete by the stored one, an update by both.
#[tokio::test]
async fn configmaps_are_selected_by_namespace_and_object_labels() {
    let fixtures = vec![
        CreateCm("ns-a", "cm-frozen", FROZEN),
        CreateCm("ns-a", "cm-frozen2", FROZEN),
        CreateCm("ns-a", "cm-plain", &[]),
        CreateCm("ns-a", "cm-plain2", &[]),
        CreateCm("ns-b", "cm-frozen", FROZEN),
    ];
    let (_server, c) = cluster(fixtures, with_binding_a("Fail", &["Deny"])).await;
    let no = |name| frozen("configmaps", name);
    let rows = vec![
        (CreateCm("ns-a", "new-plain", &[]), None),
        (CreateCm("ns-a", "new-frozen", FROZEN), no("new-frozen")),
        (CreateCm("ns-a", "new-no", &[("frozen", "no")]), None),
        (CreateCm("ns-b", "new-frozen", FROZEN), None),
        (CreateCm("ns-sb", "new-frozen", FROZEN), None),
        (DryRunCreateCm("ns-a", "dry", FROZEN), no("dry")),
        (
            PatchCm("ns-a", "cm-plain", set_label("frozen", Some("yes"))),
            no("cm-plain"),
        ),
        (
            PatchCm("ns-a", "cm-frozen", set_label("frozen", None)),
            no("cm-frozen"),
        ),
        (PatchCm("ns-a", "cm-frozen", data_edit()), no("cm-frozen")),
        (PatchCm("ns-a", "cm-plain2", data_edit()), None),
        (DeleteCm("ns-a", "cm-frozen2"), no("cm-frozen2")),
        (DeleteCm("ns-a", "cm-plain2"), None),
        (DeleteCm("ns-b", "cm-frozen"), None),
    ];
    table(&c, rows).await;
}

/// A Namespace is its own namespace: the namespace selector reads its new labels on create and update
/// (so removing the selected label escapes it) and its stored labels on delete.
#[tokio::test]
async fn namespaces_are_selected_by_their_own_labels() {
    let fixtures = vec![
        CreateNs("nso-both", SEL_A_FROZEN),
        CreateNs("nso-both2", SEL_A_FROZEN),
        CreateNs("nso-both3", SEL_A_FROZEN),
        CreateNs("nso-sel", SEL_A),
        CreateNs("nso-frozen", FROZEN),
        CreateNs("nso-frozen2", FROZEN),
    ];
    let (_server, c) = cluster(fixtures, with_binding_a("Fail", &["Deny"])).await;
    let no = |name| frozen("namespaces", name);
    let rows = vec![
        (CreateNs("nsn-both", SEL_A_FROZEN), no("nsn-both")),
        (CreateNs("nsn-frozen", FROZEN), None),
        (CreateNs("nsn-sel", SEL_A), None),
        (
            PatchNs("nso-sel", set_label("frozen", Some("yes"))),
            no("nso-sel"),
        ),
        (PatchNs("nso-both", set_label("sel", None)), None),
        (
            PatchNs("nso-both2", set_label("frozen", None)),
            no("nso-both2"),
        ),
        (
            PatchNs("nso-frozen", set_label("sel", Some("a"))),
            no("nso-frozen"),
        ),
        (DeleteNs("nso-both3"), no("nso-both3")),
        (DeleteNs("nso-frozen2"), None),
    ];
    table(&c, rows).await;
}

/// Other cluster-scoped objects always pass the namespace selector; the object selector still applies.
#[tokio::test]
async fn cluster_scoped_objects_pass_the_namespace_selector() {
    let (_server, c) = cluster(vec![], with_binding_a("Fail", &["Deny"])).await;
    let rows = vec![
        (
            CreateClusterRole("cr-frozen", FROZEN),
            frozen("clusterroles.rbac.authorization.k8s.io", "cr-frozen"),
        ),
        (CreateClusterRole("cr-plain", &[]), None),
    ];
    table(&c, rows).await;
}

/// A binding's `matchResources` narrows its policy: its selectors, its `resourceRules` (none: whatever the
/// policy selects) and its `excludeResourceRules` must all select the write as well.
#[tokio::test]
async fn binding_match_resources_narrow_the_policy() {
    let fixtures = vec![
        CreateCm("ns-sb", "pre-frozen", FROZEN),
        CreateCm("ns-sb", "pre-plain", &[]),
    ];
    let (server, c) = cluster(fixtures, vec![policy_b(), binding_b()]).await;
    let f1: Labels = &[("frozen", "1")];
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "s1", "labels": {"frozen": "1"}}});
    let rows = vec![
        (
            CreateCm("ns-sb", "new-frozen", f1),
            by_b("vap-b", "new-frozen"),
        ),
        (CreateCm("ns-sb", "exempt", f1), None),
        (CreateCm("ns-sb", "new-plain", &[]), None),
        (CreateCm("ns-b", "new-frozen-b", f1), None),
        (CreateCm("ns-a", "new-frozen-b", f1), None),
        (
            PatchCm("ns-sb", "pre-frozen", data_edit()),
            by_b("vap-b", "pre-frozen"),
        ),
        (
            PatchCm("ns-sb", "pre-plain", set_label("frozen", Some("1"))),
            by_b("vap-b", "pre-plain"),
        ),
        (Post("/api/v1/namespaces/ns-sb/secrets", secret), None),
        (DryRunDeleteCm("ns-sb", "pre-frozen"), None),
    ];
    table(&c, rows).await;
    install(&server, vec![binding_b2()]).await;
    let rows = vec![
        (
            DeleteCm("ns-sb", "pre-frozen"),
            by_b("vap-b2", "pre-frozen"),
        ),
        (CreateCm("ns-sb", "new-plain2", &[]), None),
        (DeleteCm("ns-b", "new-frozen-b"), None),
    ];
    table(&c, rows).await;
}

/// A server whose `ns-gone` (labelled `sel=a`) was deleted and finalized without the namespace controller,
/// as on a bare kube-apiserver, leaving its ConfigMaps behind; then `policies`.
async fn gone_namespace(policies: Vec<Value>) -> (TestServer, Client) {
    let fixtures = vec![
        CreateNs("ns-gone", SEL_A),
        CreateCm("ns-gone", "cm-frozen", FROZEN),
        CreateCm("ns-gone", "c-target", FROZEN),
        CreateCm("ns-gone", "b-target", FROZEN),
        CreateCm("ns-gone", "cm-plain", &[]),
        DeleteNs("ns-gone"),
    ];
    let (server, c) = cluster(fixtures, vec![]).await;
    let uri = "/api/v1/namespaces/ns-gone";
    let mut ns = crate::common::get_json(&c, uri).await.unwrap();
    ns["spec"]["finalizers"] = json!([]);
    assert_eq!(send(&c, "PUT", &format!("{uri}/finalize"), ns).await, None);
    let gone = crate::common::get_json(&c, uri).await.unwrap_err();
    assert_eq!(
        crate::common::code(&gone),
        Some(404),
        "the namespace is gone"
    );
    install(&server, policies).await;
    (server, c)
}

/// A delete in a namespace that no longer exists. A selector that needs it is a configuration error of
/// the policy or binding: refused under `Fail` whatever the binding's actions, skipped under `Ignore`, no
/// error when the rest does not select the write. Once a binding applies, the answer is the Namespace's
/// 404, whatever the failurePolicy, the actions, or a refusal before.
#[tokio::test]
async fn missing_namespace_is_a_configuration_error_or_a_404() {
    let not_found = r#"namespaces "ns-gone" not found"#;
    let policy_error = misconfigured("cm-frozen", "vap-a", None, not_found);
    let gone_404 = Some(format!("404 {not_found}"));
    let mut a_then_c = with_binding_a("Fail", &["Deny"]);
    a_then_c.extend(with_binding_c("Fail", &["Deny"]));
    let cases: Vec<(Vec<Value>, &str, Answer)> = vec![
        (
            with_binding_a("Fail", &["Deny"]),
            "cm-frozen",
            policy_error.clone(),
        ),
        (with_binding_a("Fail", &["Deny"]), "cm-plain", None),
        (with_binding_a("Ignore", &["Deny"]), "cm-frozen", None),
        (with_binding_a("Fail", &["Warn"]), "cm-frozen", policy_error),
        (
            with_binding_c("Fail", &["Deny"]),
            "c-target",
            gone_404.clone(),
        ),
        (
            with_binding_c("Ignore", &["Deny"]),
            "c-target",
            gone_404.clone(),
        ),
        (
            with_binding_c("Fail", &["Warn"]),
            "c-target",
            gone_404.clone(),
        ),
        (a_then_c, "c-target", gone_404),
        (vec![policy_b(), binding_b()], "b-target", None),
        (
            vec![policy_b(), binding_b(), binding_b2()],
            "b-target",
            misconfigured("b-target", "vap-b", Some("vap-b2"), not_found),
        ),
    ];
    let mut diffs = Vec::new();
    for (policies, name, want) in cases {
        let names: Vec<String> = policies
            .iter()
            .map(|p| p["metadata"]["name"].to_string())
            .collect();
        let (_server, c) = gone_namespace(policies).await;
        let got = DeleteCm("ns-gone", name).send(&c).await;
        if got != want {
            diffs.push(format!(
                "{names:?} delete {name}:\n   got  {got:?}\n   want {want:?}"
            ));
        }
    }
    assert!(
        diffs.is_empty(),
        "differs from kube-apiserver v1.36.2:\n{}",
        diffs.join("\n")
    );
}

/// A binding whose parameter is missing (`parameterNotFoundAction: Deny`) is a configuration error like a
/// selector's: refused under `failurePolicy: Fail`, skipped under `Ignore`.
#[tokio::test]
async fn missing_parameter_follows_the_failure_policy() {
    let no_params = "no params found for policy binding with `Deny` parameterNotFoundAction";
    for (failure, want) in [
        ("Ignore", None),
        (
            "Fail",
            misconfigured("p-target", "vap-p", Some("vap-p"), no_params),
        ),
    ] {
        let rules = json!({"resourceRules": [rule(&["configmaps"], &["*"])]});
        let mut p = policy("vap-p", failure, rules, "p");
        p["spec"]["paramKind"] = json!({"apiVersion": "v1", "kind": "ConfigMap"});
        let mut b = binding("vap-p", "vap-p", &["Deny"], None);
        b["spec"]["paramRef"] = json!({"name": "missing-param", "namespace": "ns-b",
                                       "parameterNotFoundAction": "Deny"});
        let (_server, c) = cluster(vec![], vec![p, b]).await;
        table(&c, vec![(DryRunCreateCm("ns-b", "p-target", &[]), want)]).await;
    }
}

/// Resource rules as the real server reads them: `plural/*` includes the main resource, and `scope:
/// Cluster` selects cluster-scoped objects and Namespaces but not namespaced objects.
#[tokio::test]
async fn resource_rules_read_subresource_wildcards_and_scope_like_the_real_server() {
    let rules = json!([
        rule(&["configmaps/*"], &["*"]),
        {"apiGroups": [""], "apiVersions": ["*"], "resources": ["secrets"], "operations": ["*"],
         "scope": "Cluster"},
    ]);
    let r = vec![
        policy("vap-r", "Fail", json!({ "resourceRules": rules }), "r"),
        binding("vap-r", "vap-r", &["Deny"], None),
    ];
    let (_server, c) = cluster(vec![], r).await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s9"}});
    let rows = vec![
        (
            DryRunCreateCm("ns-b", "r1", &[]),
            refused("configmaps", "r1", "vap-r", "vap-r", "r"),
        ),
        (
            Post("/api/v1/namespaces/ns-b/secrets?dryRun=All", secret),
            None,
        ),
    ];
    table(&c, rows).await;
    let (_server, c) = cluster(vec![], refuse_every_cluster_scoped_write()).await;
    let no = |what, name| refused(what, name, "vap-all", "vap-all", "all");
    let rows = vec![
        (
            CreateClusterRole("cr-x", &[]),
            no("clusterroles.rbac.authorization.k8s.io", "cr-x"),
        ),
        (CreateNs("nsx", &[]), no("namespaces", "nsx")),
        (CreateCm("ns-b", "e3", &[]), None),
    ];
    table(&c, rows).await;
}

/// A policy and binding refusing every write of a cluster-scoped object (`vap-all`, message "all").
fn refuse_every_cluster_scoped_write() -> Vec<Value> {
    let all = json!([{"apiGroups": ["*"], "apiVersions": ["*"], "resources": ["*"],
                      "operations": ["*"], "scope": "Cluster"}]);
    vec![
        policy("vap-all", "Fail", json!({ "resourceRules": all }), "all"),
        binding("vap-all", "vap-all", &["Deny"], None),
    ]
}

/// Writes of admission configuration are never subject to policies, not even to one selecting everything.
#[tokio::test]
async fn admission_configuration_is_exempt_from_policies() {
    let (_server, c) = cluster(vec![], refuse_every_cluster_scoped_write()).await;
    let group = "/apis/admissionregistration.k8s.io/v1";
    let policy_uri = format!("{group}/validatingadmissionpolicies/vap-all");
    let binding_uri = format!("{group}/validatingadmissionpolicybindings/vap-all");
    assert_eq!(
        send(&c, "PATCH", &policy_uri, set_label("x", Some("y"))).await,
        None
    );
    assert_eq!(send(&c, "DELETE", &binding_uri, json!({})).await, None);
}

/// testserver stores policies and bindings as sent, so a malformed selector (which the real server refuses
/// to store) can be there: a configuration error, never a panic: refused under `Fail` when the rest
/// selects the write, skipped under `Ignore`, nothing when the rules do not select it.
#[tokio::test]
async fn malformed_stored_selector_is_a_configuration_error() {
    let bad = json!({"matchExpressions": [{"key": "frozen", "operator": "Foo", "values": ["x"]}]});
    let creates = json!({"resourceRules": [rule(&["configmaps"], &["CREATE"])]});
    let mut constrained = creates.clone();
    constrained["objectSelector"] = bad.clone();
    let why = "Internal error occurred: \"Foo\" is not a valid label selector operator";
    let in_binding = Some(json!({ "namespaceSelector": bad }));
    let cases = [
        (
            policy("vap-m", "Fail", constrained.clone(), "m"),
            None,
            misconfigured("m1", "vap-m", None, why),
        ),
        (policy("vap-m", "Ignore", constrained, "m"), None, None),
        (
            policy("vap-m", "Fail", creates, "m"),
            in_binding,
            misconfigured("m1", "vap-m", Some("vap-m"), why),
        ),
    ];
    for (p, match_resources, want) in cases {
        let b = binding("vap-m", "vap-m", &["Deny"], match_resources);
        let (_server, c) = cluster(vec![CreateCm("ns-a", "m0", &[])], vec![p, b]).await;
        let rows = vec![
            (CreateCm("ns-a", "m1", &[]), want),
            (PatchCm("ns-a", "m0", data_edit()), None),
        ];
        table(&c, rows).await;
    }
}
