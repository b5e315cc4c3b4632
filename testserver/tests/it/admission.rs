//! ValidatingAdmissionPolicies: the answers kube-apiserver v1.36.2 gave to the same writes (recorded by hand
//! on `../shared/realkube`, and by the ignored e2e test `fence_policy_on_real_server`).

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kube::{
    api::{Patch, PatchParams, PostParams},
    core::Status,
    Api,
};
use kube_shard::fence_policy::FencePolicyConfig;
use kube_shard::testing::fence_messages as messages;
use kube_shard_testserver::TestServer;
use serde_json::{json, Value};

use crate::common::cm;

const PREFIX: &str =
    "ValidatingAdmissionPolicy 'kube-shard-fence' with binding 'kube-shard-fence' denied request: ";

/// Create policies and bindings (JSON documents) as `admin`.
pub(crate) async fn install(server: &TestServer, docs: Vec<Value>) {
    let client = server.client("admin");
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap();
        let plural = if kind == "ValidatingAdmissionPolicy" {
            "validatingadmissionpolicies"
        } else {
            "validatingadmissionpolicybindings"
        };
        let req = http::Request::post(format!("/apis/admissionregistration.k8s.io/v1/{plural}"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&doc).unwrap())
            .unwrap();
        client.request_text(req).await.unwrap();
    }
}

async fn install_fence_policy(server: &TestServer, resources: &[&str]) {
    let set = FencePolicyConfig::new(resources.iter().map(|r| r.parse().unwrap()).collect())
        .generate()
        .unwrap();
    let mut docs: Vec<Value> = set
        .policies
        .iter()
        .map(|p| serde_json::to_value(p).unwrap())
        .collect();
    docs.extend(
        set.bindings
            .iter()
            .map(|b| serde_json::to_value(b).unwrap()),
    );
    install(server, docs).await;
}

fn status(e: kube::Error) -> Box<Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("not an API error: {other}"),
    }
}

/// The real server's refusal: 422 Invalid, `<what> "<name>" is forbidden: <prefix><msg>`, one cause.
fn assert_refused(s: &Status, what: &str, name: &str, msg: &str) {
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert_eq!(
        s.message,
        format!("{what} \"{name}\" is forbidden: {PREFIX}{msg}")
    );
    let d = s.details.as_ref().expect("details");
    assert_eq!(d.name, name);
    assert_eq!(d.kind, what.split('.').next().unwrap());
    assert_eq!(d.causes.len(), 1);
    assert_eq!(d.causes[0].message, format!("{PREFIX}{msg}"));
}

fn fence(token: Option<&str>) -> Patch<Value> {
    Patch::Merge(json!({"metadata": {"annotations": {"kube-shard.io/fence": token}}}))
}

#[tokio::test]
async fn trivial_policy_denies_like_the_real_server() {
    let server = TestServer::new();
    install(
        &server,
        vec![
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                   "metadata": {"name": "trivial"},
                   "spec": {"failurePolicy": "Fail",
                            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["*"],
                                "resources": ["configmaps"], "operations": ["CREATE"]}]},
                            "validations": [{"expression": "!object.metadata.name.startsWith('deny-')",
                                             "message": "names starting with deny- are refused"}]}}),
            json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
                   "metadata": {"name": "trivial-binding"},
                   "spec": {"policyName": "trivial", "validationActions": ["Deny"]}}),
        ],
    )
    .await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let s = status(
        api.create(&PostParams::default(), &cm("deny-x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        s.message,
        "configmaps \"deny-x\" is forbidden: ValidatingAdmissionPolicy 'trivial' with binding 'trivial-binding' denied request: names starting with deny- are refused"
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    api.create(&PostParams::default(), &cm("allow-x"))
        .await
        .unwrap();
}

/// Test 1 of issue 16: a write that passes the uid and resourceVersion preconditions but carries a lower
/// epoch is refused; the same write without the policy commits.
#[tokio::test]
async fn lower_epoch_with_fresh_preconditions_is_refused() {
    for with_policy in [true, false] {
        let server = TestServer::new();
        if with_policy {
            install_fence_policy(&server, &["configmaps"]).await;
        }
        let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
        api.create(&PostParams::default(), &cm("t1")).await.unwrap();
        let pp = PatchParams::default();
        api.patch("t1", &pp, &fence(Some("3/1000"))).await.unwrap(); // the deposed owner's last write
        api.patch("t1", &pp, &fence(Some("3/2000"))).await.unwrap(); // the new owner's fenced write
                                                                     // the deposed owner re-reads (fresh uid and resourceVersion) and writes with its old fence
        let mut late = api.get("t1").await.unwrap();
        late.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("kube-shard.io/fence".into(), "3/1000".into());
        let res = api.replace("t1", &PostParams::default(), &late).await;
        if with_policy {
            assert_refused(
                &status(res.unwrap_err()),
                "configmaps",
                "t1",
                messages::STALE,
            );
            let stored = api.get("t1").await.unwrap();
            assert_eq!(
                stored.metadata.annotations.unwrap()["kube-shard.io/fence"],
                "3/2000"
            );
        } else {
            assert_eq!(
                res.unwrap().metadata.annotations.unwrap()["kube-shard.io/fence"],
                "3/1000"
            );
        }
    }
}

/// The same matrix as on the real server: owners' writes pass; other shard, malformed, oversized and removed
/// fences are refused with their messages; a stale resourceVersion is a 409 before admission runs.
#[tokio::test]
async fn fence_policy_matrix() {
    let server = TestServer::new();
    install_fence_policy(&server, &["configmaps", "deployments.apps"]).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let pp = PatchParams::default();
    let first = api.create(&PostParams::default(), &cm("t1")).await.unwrap();
    for ok in ["3/1000", "3/1000", "3/2000", "3/02000"] {
        api.patch("t1", &pp, &fence(Some(ok))).await.unwrap();
    }
    for (bad, msg) in [
        (Some("3/1500"), messages::STALE),
        (Some("4/3000"), messages::SHARD),
        (Some("x/3000"), messages::MALFORMED),
        (Some("3/1234567890123456789"), messages::MALFORMED),
        (None, messages::REMOVED),
    ] {
        let s = status(api.patch("t1", &pp, &fence(bad)).await.unwrap_err());
        assert_refused(&s, "configmaps", "t1", msg);
    }
    // an edit that keeps the fence (kubectl edit/patch) passes
    api.patch("t1", &pp, &Patch::Merge(json!({"data": {"b": "2"}})))
        .await
        .unwrap();
    // preconditions first: a stale resourceVersion is a 409 even with a stale fence
    let mut stale = first.clone();
    stale.metadata.annotations =
        Some([("kube-shard.io/fence".to_string(), "3/1".to_string())].into());
    let s = status(
        api.replace("t1", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(s.code, 409);
    // unfenced objects are not concerned
    api.create(&PostParams::default(), &cm("t2")).await.unwrap();
    api.patch("t2", &pp, &Patch::Merge(json!({"data": {"x": "y"}})))
        .await
        .unwrap();

    let deploys: Api<Deployment> = Api::namespaced(server.client("a"), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "d1", "annotations": {"kube-shard.io/fence": "2/500"}},
        "spec": {"selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}
    }))
    .unwrap();
    deploys.create(&PostParams::default(), &d).await.unwrap();
    let s = status(
        deploys
            .patch("d1", &pp, &fence(Some("2/400")))
            .await
            .unwrap_err(),
    );
    assert_refused(&s, "deployments.apps", "d1", messages::STALE);
    assert_eq!(s.details.unwrap().group, "apps");
}

// === the per-shard level: paramKind ConfigMap, paramRef ===

const SHARD_POLICY: &str = "kube-shard-fence-shard";

/// The real server's refusal by the per-shard policy.
fn assert_refused_by_shard(s: &Status, name: &str, msg: &str) {
    let inner =
        format!("ValidatingAdmissionPolicy '{SHARD_POLICY}' with binding '{SHARD_POLICY}' denied request: {msg}");
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert_eq!(
        s.message,
        format!("configmaps \"{name}\" is forbidden: {inner}")
    );
    let d = s.details.as_ref().expect("details");
    assert_eq!((d.name.as_str(), d.kind.as_str()), (name, "configmaps"));
    assert_eq!(d.causes.len(), 1);
    assert_eq!(d.causes[0].message, inner);
}

/// Both levels for ConfigMaps, bound to the parameter ConfigMap `default/fence-params`; the parameter
/// ConfigMap is created (empty) when `with_params`.
async fn install_both_levels(server: &TestServer, with_params: bool) {
    let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
        .params("default/fence-params".parse().unwrap())
        .generate()
        .unwrap();
    let mut docs: Vec<Value> = set
        .policies
        .iter()
        .map(|p| serde_json::to_value(p).unwrap())
        .collect();
    docs.extend(
        set.bindings
            .iter()
            .map(|b| serde_json::to_value(b).unwrap()),
    );
    install(server, docs).await;
    if with_params {
        let api: Api<ConfigMap> = Api::namespaced(server.client("admin"), "default");
        api.create(&PostParams::default(), set.params.as_ref().unwrap())
            .await
            .unwrap();
    }
}

fn fenced_cm(name: &str, token: &str) -> ConfigMap {
    let mut c = cm(name);
    c.metadata.annotations = Some([("kube-shard.io/fence".to_string(), token.to_string())].into());
    c
}

fn publish(epochs: &[(&str, &str)]) -> Patch<Value> {
    let data: serde_json::Map<String, Value> = epochs
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    Patch::Merge(json!({ "data": data }))
}

/// Test 2 of issue 16 at the server: once the shard's epoch is published, a deposed owner's write to an
/// object the new owner never wrote (its stored fence is the deposed owner's own: the per-object policy
/// passes it) is refused, and so is a CREATE with a stale epoch; the current owner's writes pass.
#[tokio::test]
async fn per_shard_policy_refuses_epochs_below_the_published_one() {
    let server = TestServer::new();
    install_both_levels(&server, true).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let params: Api<ConfigMap> = Api::namespaced(server.client("coordinator"), "default");
    let (pp, post) = (PatchParams::default(), PostParams::default());
    // no key for shard 3 yet: any epoch passes
    api.create(&post, &fenced_cm("t1", "3/1000")).await.unwrap();
    // the coordinator publishes shard 3's new epoch (the parameter ConfigMap itself is not policed)
    params
        .patch("fence-params", &pp, &publish(&[("3", "2000")]))
        .await
        .unwrap();
    let late = Patch::Merge(
        json!({"metadata": {"annotations": {"kube-shard.io/fence": "3/1000"}},
                                   "data": {"late": "write"}}),
    );
    let s = status(api.patch("t1", &pp, &late).await.unwrap_err());
    assert_refused_by_shard(&s, "t1", messages::SHARD_STALE);
    let s = status(
        api.create(&post, &fenced_cm("t2", "3/1999"))
            .await
            .unwrap_err(),
    );
    assert_refused_by_shard(&s, "t2", messages::SHARD_STALE);
    // leading zeros name the same shard
    let s = status(
        api.create(&post, &fenced_cm("t2", "03/1500"))
            .await
            .unwrap_err(),
    );
    assert_refused_by_shard(&s, "t2", messages::SHARD_STALE);
    // the current owner, other shards and unfenced objects pass
    api.create(&post, &fenced_cm("t2", "3/2000")).await.unwrap();
    api.patch("t1", &pp, &fence(Some("3/2000"))).await.unwrap();
    api.create(&post, &fenced_cm("t3", "4/5")).await.unwrap();
    api.create(&post, &cm("t4")).await.unwrap();
    // a parameter that is not an epoch refuses with its own message
    params
        .patch("fence-params", &pp, &publish(&[("5", "x")]))
        .await
        .unwrap();
    let s = status(
        api.create(&post, &fenced_cm("t5", "5/1"))
            .await
            .unwrap_err(),
    );
    assert_refused_by_shard(&s, "t5", messages::PARAM_MALFORMED);
    // without the parameter (what a coordinator that does not publish leaves), the late write commits
    params
        .patch(
            "fence-params",
            &pp,
            &Patch::Merge(json!({"data": {"3": null}})),
        )
        .await
        .unwrap();
    api.create(&post, &fenced_cm("t6", "3/1999")).await.unwrap();
}

/// A `Deny` binding whose parameter is missing refuses every covered write with kube-apiserver v1.36.2's
/// message (recorded on `../shared/realkube`); the parameter ConfigMap itself is excluded, so it can be
/// created, and then writes pass.
#[tokio::test]
async fn missing_parameter_refuses_like_the_real_server() {
    let server = TestServer::new();
    install_both_levels(&server, false).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let post = PostParams::default();
    let s = status(api.create(&post, &cm("x")).await.unwrap_err());
    assert_refused_by_shard(
        &s,
        "x",
        "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction",
    );
    api.create(&post, &cm("fence-params")).await.unwrap();
    api.create(&post, &cm("x")).await.unwrap();
}

/// paramRef by selector: every matching parameter is evaluated and any refusal refuses; none matching with
/// `Allow` skips the binding (the answers the real server gave to the same policy, see the module doc).
#[tokio::test]
async fn param_selector_and_not_found_actions() {
    let server = TestServer::new();
    let policy = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "ptest"},
        "spec": {"failurePolicy": "Fail", "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
                 "matchConstraints": {
                     "resourceRules": [{"apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                                        "operations": ["CREATE", "UPDATE"]}],
                     "excludeResourceRules": [{"apiGroups": [""], "apiVersions": ["*"], "resources": ["configmaps"],
                                               "operations": ["*"], "resourceNames": ["params", "params2"]}]},
                 "validations": [{"expression": "!has(object.data) || !('v' in object.data) || int(object.data['v']) >= int(params.data['min'])",
                                  "message": "too low", "reason": "Invalid"}]}});
    let binding = |labels: &str, action: &str| {
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": "ptest"},
               "spec": {"policyName": "ptest", "validationActions": ["Deny"],
                        "paramRef": {"selector": {"matchLabels": {"p": labels}}, "namespace": "default",
                                     "parameterNotFoundAction": action}}})
    };
    install(&server, vec![policy, binding("yes", "Deny")]).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let post = PostParams::default();
    let with_v = |name: &str, v: &str| {
        let mut c = cm(name);
        c.data = Some([("v".to_string(), v.to_string())].into());
        c
    };
    let s = status(api.create(&post, &with_v("d", "7")).await.unwrap_err());
    assert!(s.message.ends_with("denied request: failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"), "{}", s.message);
    for (name, min) in [("params", "5"), ("params2", "100")] {
        let mut p = crate::common::cm_labeled(name, "p", "yes");
        p.data = Some([("min".to_string(), min.to_string())].into());
        api.create(&post, &p).await.unwrap();
    }
    let s = status(api.create(&post, &with_v("e", "50")).await.unwrap_err());
    assert_eq!(
        s.message,
        "configmaps \"e\" is forbidden: ValidatingAdmissionPolicy 'ptest' with binding 'ptest' denied request: too low"
    );
    api.create(&post, &with_v("f", "150")).await.unwrap();
    // none matching, Allow: the binding is skipped
    let bindings: Api<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    > = Api::all(server.client("admin"));
    bindings
        .replace("ptest", &post, &{
            let mut b: k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding =
                serde_json::from_value(binding("no", "Allow")).unwrap();
            b.metadata.resource_version = bindings.get("ptest").await.unwrap().metadata.resource_version;
            b
        })
        .await
        .unwrap();
    api.create(&post, &with_v("g", "1")).await.unwrap();
}
