//! The HA mirror's RBAC sample (`deploy/ha/mirror-rbac.yaml`) exactly as shipped, on two real apiservers
//! (issue 21): the sample is applied to both clusters with only its subjects changed, the mirror runs with
//! the **remote reader** identity in cluster A (the Active) and the operator's **ServiceAccount** in
//! cluster B (the Standby), copies converge, and every write the reader should not have is refused with a
//! real 403. testserver enforces no RBAC, so only a real apiserver can check this.
//!
//! Needs `KUBECONFIG` (cluster A) and `KSHARD_E2E_PEER_KUBECONFIG` (cluster B). The remote reader is
//! realkube's `remote-reader` user when its kubeconfig lies beside cluster A's (`kubeconfig-remote-reader`);
//! on other clusters (kind) it is a ServiceAccount `kube-shard-ha-peer` in `ops`, with a TokenRequest token.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{
    ApiResource, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch, PatchParams,
    PostParams,
};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use kube_shard_ha::mirror::{KindSet, KindStatus, Mirror, MirrorConfig, MirrorWiring};
use kube_shard_ha::switchover::{checkpoint_name, Kind};
use kube_shard_ha::{HaConfig, HaMode};
use serde_json::json;

use crate::support::links::Cluster;
use crate::support::{install_widgets, namespace, report, widgets_api};

const SAMPLE: &str = include_str!("../../../deploy/ha/mirror-rbac.yaml");
/// The sample's namespace and identities.
const OPS: &str = "ops";
const SAMPLE_USER: &str = "kube-shard-ha-peer";
const WRITER_SA: &str = "widgets";
const WIDGETS: &str = "widgets.example.kube-shard.io";

/// Who reads cluster A: realkube's `remote-reader` user, or a ServiceAccount elsewhere.
enum Reader {
    User(String),
    ServiceAccount(String),
}

impl Reader {
    fn subject(&self) -> serde_json::Value {
        match self {
            Reader::User(u) => {
                json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u})
            }
            Reader::ServiceAccount(n) => {
                json!({"kind": "ServiceAccount", "name": n, "namespace": OPS})
            }
        }
    }
}

/// The sample's documents, with the placeholder User replaced by `reader` (nothing else changes).
fn sample_documents(reader: &Reader) -> Vec<serde_json::Value> {
    let mut docs = Vec::new();
    for d in serde_yaml::Deserializer::from_str(SAMPLE) {
        let mut v: serde_json::Value =
            serde::Deserialize::deserialize(d).expect("deploy/ha/mirror-rbac.yaml parses");
        if v.is_null() {
            continue;
        }
        if let Some(subjects) = v.get_mut("subjects").and_then(|s| s.as_array_mut()) {
            for s in subjects.iter_mut() {
                if s["kind"] == "User" && s["name"] == SAMPLE_USER {
                    *s = reader.subject();
                }
            }
        }
        docs.push(v);
    }
    docs
}

fn rbac_resource(kind: &str) -> ApiResource {
    let plural = match kind {
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        other => panic!("the sample holds an unexpected kind {other}"),
    };
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind),
        plural,
    )
}

/// Server-side apply every document (idempotent across runs on the same cluster).
async fn apply_sample(client: &Client, docs: &[serde_json::Value]) {
    for d in docs {
        let kind = d["kind"].as_str().expect("a kind");
        let name = d["metadata"]["name"].as_str().expect("a name");
        let ar = rbac_resource(kind);
        let api: Api<DynamicObject> = match d["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            name,
            &PatchParams::apply("kshard-e2e").force(),
            &Patch::Apply(d),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
    }
}

async fn ensure_namespace(client: &Client, name: &str) {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// A client for the ServiceAccount `ops/<sa>` of `cluster` (created if missing), by a TokenRequest.
async fn service_account_client(cluster: &Cluster, sa: &str) -> Client {
    let admin = cluster.client().await;
    let api: Api<ServiceAccount> = Api::namespaced(admin, OPS);
    let obj = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(sa.into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create ServiceAccount {sa}: {e}"),
    }
    let req = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = api
        .create_token_request(sa, &PostParams::default(), &req)
        .await
        .unwrap_or_else(|e| panic!("a token for {sa}: {e}"))
        .status
        .and_then(|s| s.token)
        .expect("a token in the answer");
    token_client(&cluster.kubeconfig, &token).await
}

/// A client for `kubeconfig`'s cluster that authenticates with `token` only.
async fn token_client(kubeconfig: &Path, token: &str) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read the kubeconfig");
    let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("a config");
    cfg.auth_info = serde_json::from_value::<AuthInfo>(json!({ "token": token })).expect("auth");
    Client::try_from(cfg).expect("a client")
}

/// The reader identity and its client for cluster `a`.
async fn reader(a: &Cluster) -> (Reader, Client) {
    let path = a
        .kubeconfig
        .parent()
        .map(|d| d.join("kubeconfig-remote-reader"));
    if let Some(p) = path.filter(|p| p.exists()) {
        let kc = Kubeconfig::read_from(&p).expect("read the remote-reader kubeconfig");
        let cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("a config");
        return (
            Reader::User("remote-reader".into()),
            Client::try_from(cfg).expect("a client"),
        );
    }
    let c = service_account_client(a, SAMPLE_USER).await;
    (Reader::ServiceAccount(SAMPLE_USER.into()), c)
}

/// The HTTP status of a request's error (`None`: it succeeded).
fn code<T>(r: Result<T, kube::Error>) -> Option<u16> {
    match r {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => Some(s.code),
        Err(e) => panic!("a transport error where an API answer was expected: {e}"),
    }
}

fn widget(name: &str, size: u64) -> DynamicObject {
    let ar = crate::support::widget_resource();
    let mut w = DynamicObject::new(name, &ar);
    w.data = json!({"spec": {"size": size}});
    w
}

fn mirror_config(ns: &str) -> MirrorConfig {
    let ha = HaConfig::builder("widgets")
        .mode(HaMode::Standby)
        .cluster("b", 2)
        .namespace(OPS)
        .kubeconfigs(None, Some("/peer".into()), None)
        .build()
        .expect("an HA config");
    let kind: Kind = format!("{WIDGETS}/v1").parse().expect("a kind");
    let set = KindSet::builder()
        .mirrored(kind.clone())
        .build(&[kind])
        .expect("a kind set");
    MirrorConfig::new(ha, "a", set)
        .namespaces([ns])
        .probe_period(Duration::from_secs(1))
}

/// Poll `check` every 250 ms for at most `secs`.
async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < end {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{what}: not within {secs} s");
}

/// The copy of `name` in cluster B: its spec size and status phase.
async fn copy_of(b: &Api<DynamicObject>, name: &str) -> Option<(u64, Option<String>)> {
    let o = b.get_opt(name).await.ok()??;
    let size = o.data["spec"]["size"].as_u64()?;
    let phase = o.data["status"]["phase"].as_str().map(str::to_string);
    Some((size, phase))
}

/// The copy is gone, or its Orphan delete is under way: a bare apiserver has no garbage collector to
/// remove the `orphan` finalizer, so there the copy stays terminating.
async fn deleted(b: &Api<DynamicObject>, name: &str) -> bool {
    match b.get_opt(name).await {
        Ok(None) => true,
        Ok(Some(o)) => o.metadata.deletion_timestamp.is_some(),
        Err(_) => false,
    }
}

/// What the reader may not do in cluster A, and the writer in cluster B: each refused with a real 403.
async fn check_refusals(reader: &Client, writer: &Client, ns: &str) -> usize {
    let mut checked = 0;
    let mut refused = |what: &str, c: Option<u16>| {
        assert_eq!(c, Some(403), "{what}: expected 403 Forbidden");
        checked += 1;
    };
    let rw = widgets_api(reader, ns);
    refused(
        "reader creates a Widget",
        code(
            rw.create(&PostParams::default(), &widget("intruder", 1))
                .await,
        ),
    );
    let patch = json!({"metadata": {"labels": {"x": "y"}}});
    refused(
        "reader patches a Widget",
        code(
            rw.patch("w-0", &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        ),
    );
    refused(
        "reader lists Secrets",
        code(
            Api::<Secret>::namespaced(reader.clone(), ns)
                .list(&ListParams::default())
                .await,
        ),
    );
    refused(
        "reader lists ConfigMaps in ops",
        code(
            Api::<ConfigMap>::namespaced(reader.clone(), OPS)
                .list(&ListParams::default())
                .await,
        ),
    );
    refused(
        "reader reads namespace default",
        code(Api::<Namespace>::all(reader.clone()).get("default").await),
    );
    let leases: Api<Lease> = Api::namespaced(reader.clone(), OPS);
    refused(
        "reader reads another Lease",
        code(leases.get("not-widgets-ha").await),
    );
    refused(
        "reader updates the HA Lease",
        code(
            leases
                .patch("widgets-ha", &PatchParams::default(), &Patch::Merge(&patch))
                .await,
        ),
    );
    refused(
        "writer lists Secrets",
        code(
            Api::<Secret>::namespaced(writer.clone(), ns)
                .list(&ListParams::default())
                .await,
        ),
    );
    refused(
        "writer patches another ConfigMap in ops",
        code(
            Api::<ConfigMap>::namespaced(writer.clone(), OPS)
                .patch(
                    "not-the-checkpoint",
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await,
        ),
    );
    refused(
        "writer deletes a namespace",
        code(
            Api::<Namespace>::all(writer.clone())
                .delete(ns, &Default::default())
                .await,
        ),
    );
    checked
}

#[tokio::test]
#[ignore = "needs two clusters: KUBECONFIG and KSHARD_E2E_PEER_KUBECONFIG"]
async fn ha_real_mirror_rbac_sample_as_shipped() {
    let Some((a, b)) = Cluster::pair_for_scenario("ha_real_mirror_rbac_sample_as_shipped") else {
        return;
    };
    let (admin_a, admin_b) = (a.client().await, b.client().await);
    for c in [&admin_a, &admin_b] {
        ensure_namespace(c, OPS).await;
    }
    let (who, reader) = reader(&a).await;
    let docs = sample_documents(&who);
    assert_eq!(docs.len(), 8, "the sample's documents");
    for c in [&admin_a, &admin_b] {
        apply_sample(c, &docs).await;
    }
    let writer = service_account_client(&b, WRITER_SA).await;
    // a fresh namespace of the same name on both sides, and no checkpoint of an earlier run
    let ns = namespace(&admin_a, "e2e-hamr").await;
    ensure_namespace(&admin_b, &ns).await;
    let src = install_widgets(&admin_a, &ns).await;
    let dst = install_widgets(&admin_b, &ns).await;
    let cps: Api<ConfigMap> = Api::namespaced(admin_b.clone(), OPS);
    let _ = cps
        .delete(
            &checkpoint_name(&mirror_config(&ns).ha),
            &Default::default(),
        )
        .await;

    // the reader's grants: the HA Lease by name (a 404 here still proves the get is allowed)
    let lease = Api::<Lease>::namespaced(reader.clone(), OPS)
        .get("widgets-ha")
        .await;
    assert!(
        matches!(code(lease), None | Some(404)),
        "reader reads the HA Lease"
    );

    for i in 0..4 {
        src.create(&PostParams::default(), &widget(&format!("w-{i}"), i))
            .await
            .expect("create a Widget on A");
    }
    // RBAC bindings take effect within a moment on a real apiserver: retry the start for a few seconds
    let mut mirror = None;
    for _ in 0..20 {
        match Mirror::start(
            mirror_config(&ns),
            reader.clone(),
            writer.clone(),
            MirrorWiring::default(),
        )
        .await
        {
            Ok(m) => {
                mirror = Some(m);
                break;
            }
            Err(e) => {
                eprintln!("e2e: mirror start: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    let mirror = mirror.expect("the mirror starts with the sample's grants");
    let started = tokio::time::Instant::now();
    eventually(60, "the four copies", || async {
        let mut n = 0;
        for i in 0..4 {
            n += usize::from(copy_of(&dst, &format!("w-{i}")).await == Some((i, None)));
        }
        n == 4
    })
    .await;
    let converged = started.elapsed();

    // an update, a status write and a delete on A: the copies follow (status through /status)
    let spec = json!({"spec": {"size": 10}});
    src.patch("w-1", &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .expect("update on A");
    let status = json!({"status": {"phase": "Ready"}});
    src.patch_status("w-2", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status on A");
    src.delete("w-3", &Default::default())
        .await
        .expect("delete on A");
    eventually(60, "the update, the status and the delete", || async {
        copy_of(&dst, "w-1").await == Some((10, None))
            && copy_of(&dst, "w-2").await == Some((2, Some("Ready".into())))
            && deleted(&dst, "w-3").await
    })
    .await;
    // the writer wrote the checkpoint
    eventually(30, "the checkpoint", || async {
        cps.get_opt(&checkpoint_name(&mirror_config(&ns).ha))
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await;
    let st: Vec<KindStatus> = mirror.status();
    assert!(
        st.iter()
            .all(|k| k.failed.is_empty() && k.stopped.is_none()),
        "no failed objects and no stopped kind: {st:?}"
    );
    let refusals = check_refusals(&reader, &writer, &ns).await;
    mirror.stop().await;
    report(json!({
        "scenario": "ha_real_mirror_rbac_sample",
        "reader": match who { Reader::User(_) => "user remote-reader", Reader::ServiceAccount(_) => "service account" },
        "copies_converged_ms": converged.as_millis() as u64,
        "refusals_checked": refusals,
    }));
    crate::support::drop_namespace(&admin_a, &ns).await;
    crate::support::drop_namespace(&admin_b, &ns).await;
}
