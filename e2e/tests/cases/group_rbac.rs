//! A member whose Role lacks a Lease permission, on a real apiserver with RBAC: the real 403 is named (verb,
//! resource, namespace, Lease) and ends the member's task with `GroupError::Forbidden` within one renew
//! deadline, where it used to look like a timing problem (a self-fence, then a liveness restart); and
//! `kshard status` says which rule is likely missing when no member could create its Lease. testserver
//! enforces no RBAC, so only a real apiserver can check the answer the library classifies.
//!
//! Needs `KUBECONFIG` for an identity that may impersonate (realkube's admin, kind's admin). The member
//! runs as a ServiceAccount of a fresh namespace, impersonated (`kube::Config`'s `auth_info.impersonate`),
//! through `ShardGroup::from_config` (the application's client and the renewal thread's both from it).

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client, Config};
use kube_shard::group::{GroupError, ShardGroup};
use serde_json::json;

use crate::support::{drop_namespace, kshard_binary, namespace, report};

const GROUP: &str = "rbacgroup";
const SA: &str = "member";
const LEASE: Duration = Duration::from_secs(6);
const RENEW: Duration = Duration::from_secs(4);
const RETRY: Duration = Duration::from_secs(1);

/// The member's Role: everything the group needs but creating, updating and deleting Leases.
fn role_without_lease_writes(ns: &str) -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "group-without-lease-writes", "namespace": ns},
        "rules": [
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch", "create", "update", "patch"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
        ],
    })
}

fn binding(ns: &str) -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "group-without-lease-writes", "namespace": ns},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "group-without-lease-writes"},
        "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": ns}],
    })
}

async fn apply(client: &Client, ns: &str, kind: &str, plural: &str, doc: &serde_json::Value) {
    let gvk = GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
    let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    let name = doc["metadata"]["name"].as_str().expect("a name");
    api.patch(
        name,
        &PatchParams::apply("kshard-e2e").force(),
        &Patch::Apply(doc),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
}

/// The ServiceAccount `ns/member` and its Role, bound.
async fn grant(admin: &Client, ns: &str) {
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": ns}});
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("", "v1", "ServiceAccount"),
        "serviceaccounts",
    );
    Api::<DynamicObject>::namespaced_with(admin.clone(), ns, &ar)
        .patch(
            SA,
            &PatchParams::apply("kshard-e2e").force(),
            &Patch::Apply(&sa),
        )
        .await
        .expect("the ServiceAccount");
    apply(admin, ns, "Role", "roles", &role_without_lease_writes(ns)).await;
    apply(admin, ns, "RoleBinding", "rolebindings", &binding(ns)).await;
}

/// The admin's config, impersonating the member's ServiceAccount.
async fn member_config(ns: &str) -> Config {
    let mut cfg = Config::infer().await.expect("a config from KUBECONFIG");
    cfg.auth_info.impersonate = Some(format!("system:serviceaccount:{ns}:{SA}"));
    cfg
}

/// RBAC takes a moment to see a new binding: wait until the member may read Leases (a 404, not a 403).
async fn wait_for_grants(member: &Client, ns: &str) {
    let leases: Api<Lease> = Api::namespaced(member.clone(), ns);
    for _ in 0..60 {
        match leases.get_opt("probe").await {
            Ok(_) => return,
            Err(e) => eprintln!("e2e: the member's grants are not in effect yet: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the member's Role never took effect");
}

/// `kshard status` on a group without any member Lease: it fails, naming the Lease rule likely missing.
fn status_without_members(ns: &str) -> String {
    let out = std::process::Command::new(kshard_binary())
        .args(["status", "-n", ns, "--group", GROUP])
        .output()
        .expect("run kshard status");
    assert!(
        !out.status.success(),
        "kshard status succeeded without a group"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
#[ignore = "needs a real apiserver with RBAC: KUBECONFIG (an identity that may impersonate)"]
async fn group_member_without_lease_rbac_stops_with_forbidden() {
    let admin = crate::support::client().await;
    let ns = namespace(&admin, "e2e-grbac").await;
    grant(&admin, &ns).await;
    let cfg = member_config(&ns).await;
    wait_for_grants(&Client::try_from(cfg.clone()).expect("a client"), &ns).await;

    let group = ShardGroup::from_config(cfg, GROUP)
        .namespace(&ns)
        .member("m-0")
        .timings(LEASE, RENEW, RETRY)
        .build()
        .expect("a valid group");
    let (handle, task) = group.start();
    let started = Instant::now();
    let result = tokio::time::timeout(RENEW * 3, task)
        .await
        .expect("the member's task did not end within three renew deadlines");
    let took = started.elapsed();
    let lease = format!("{GROUP}-m-0");
    match &result {
        Err(GroupError::Forbidden {
            verb,
            resource,
            namespace,
            name,
            code,
            ..
        }) => {
            assert_eq!(
                (*verb, *resource, namespace.as_str()),
                ("create", "coordination.k8s.io/leases", ns.as_str())
            );
            assert_eq!((name.as_deref(), *code), (Some(lease.as_str()), 403));
        }
        other => panic!("ended with {other:?}, not Forbidden"),
    }
    // one renew deadline after the first refusal, which follows the start by a GET and a POST
    assert!(
        took >= RENEW && took < RENEW + RETRY,
        "ended after {took:?}, not within one renew deadline ({RENEW:?})"
    );
    let text = result.unwrap_err().to_string();
    assert!(
        text.contains(&format!("system:serviceaccount:{ns}:{SA}")),
        "the server's answer is kept: {text}"
    );
    assert!(!handle.health().is_live() && !handle.health().is_ready());
    assert!(handle.health().permission_error().is_some());

    let status = status_without_members(&ns);
    assert!(
        status.contains("no member Lease")
            && status.contains("leases in API group coordination.k8s.io"),
        "{status}"
    );
    report(json!({
        "scenario": "group_member_without_lease_rbac",
        "forbidden_after_ms": took.as_millis() as u64,
        "renew_deadline_ms": RENEW.as_millis() as u64,
        "error": text,
    }));
    drop_namespace(&admin, &ns).await;
}
