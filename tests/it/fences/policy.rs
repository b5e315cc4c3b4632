//! Fences enforced by the apiserver (issue 16, per-object level): a deposed owner that re-read the object
//! after the new owner's fenced write passes the uid and resourceVersion preconditions, and only the fence
//! policy refuses its write; the reconcile wrapper requeues it as a lost shard and counts it. The same for a
//! CRD's `/status` write through a status fence field.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{core::DynamicObject, runtime::controller::Action, Api};
use kube_shard::{
    fence_policy::FencePolicyConfig,
    group::assignment::AssignmentView,
    ownership::{fenced_write, fenced_write::FencedApi, reconcile, Permit},
};
use kube_shard_testserver::TestServer;

use crate::read_path::watcher::{grant, member, seed, shard_of_uid, NS};

async fn install_policy(server: &TestServer) {
    let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
        .generate()
        .unwrap();
    post_policies(server, &set).await;
}

/// The deposed owner `old` (epoch 7, never told it lost the shard: its own view still admits) writes after the
/// new owner (epoch 9) with a fresh read. Returns the deposed owner's result.
async fn late_write(server: &TestServer) -> Result<ConfigMap, fenced_write::Error> {
    let (name, uid) = seed(&server.client("admin"), 1)
        .await
        .into_iter()
        .next()
        .unwrap();
    let shard = shard_of_uid(&uid);
    let (me_old, old, d_old) = member("old");
    d_old.apply(&grant(AssignmentView::new(7), &me_old, [shard], 7));
    d_old.activate(shard, 7);
    let (me_new, new, d_new) = member("new");
    d_new.apply(&grant(AssignmentView::new(9), &me_new, [shard], 9));
    d_new.activate(shard, 9);
    let api: Api<ConfigMap> = Api::namespaced(server.client("writer"), NS);
    let fenced = FencedApi::new(api.clone());
    let cm = api.get(&name).await.unwrap();
    let old_fence = old.admit(&cm).unwrap().fence().unwrap();
    fenced.replace(&old_fence, &cm).await.unwrap(); // the deposed owner's last write, epoch 7
    let cm = api.get(&name).await.unwrap();
    let new_fence = new.admit(&cm).unwrap().fence().unwrap();
    fenced.replace(&new_fence, &cm).await.unwrap(); // the new owner's write, epoch 9
    let fresh = api.get(&name).await.unwrap(); // the deposed owner re-reads: preconditions pass
    fenced.replace(&old_fence, &fresh).await
}

#[tokio::test(start_paused = true)]
async fn stale_epoch_passes_preconditions_and_is_refused_by_the_policy() {
    let server = TestServer::builder().build();
    install_policy(&server).await;
    let err = late_write(&server).await.unwrap_err();
    assert!(err.is_fence_refused(), "{err:?}");
    assert!(!err.is_conflict() && !err.is_fenced());
    // without the policy, the same write commits (the audit's job to flag it)
    let server = TestServer::builder().build();
    let committed = late_write(&server).await.unwrap();
    let token = &committed.metadata.annotations.unwrap()["kube-shard.io/fence"];
    assert!(token.starts_with("0:") && token.ends_with("/7"), "{token}");
}

#[tokio::test(start_paused = true)]
async fn reconcile_wrapper_requeues_a_refused_write_and_counts_it() {
    let server = TestServer::builder().build();
    install_policy(&server).await;
    let refusal = late_write(&server).await.unwrap_err();
    let server = TestServer::builder().build(); // the object this reconcile is about
    let (name, uid) = seed(&server.client("admin"), 1)
        .await
        .into_iter()
        .next()
        .unwrap();
    let (me, o, d) = member("m");
    let shard = shard_of_uid(&uid);
    d.apply(&grant(AssignmentView::new(3), &me, [shard], 3));
    d.activate(shard, 3);
    let cm = Arc::new(
        Api::<ConfigMap>::namespaced(server.client("m"), NS)
            .get(&name)
            .await
            .unwrap(),
    );
    let metrics = reconcile::FenceMetrics::default();
    let refusal = Arc::new(std::sync::Mutex::new(Some(refusal)));
    let mut wrapped = reconcile::wrap_fenced(
        o,
        metrics.clone(),
        move |_: Arc<ConfigMap>, _: Arc<()>, _: Permit| {
            let e = refusal.lock().unwrap().take();
            async move {
                match e {
                    Some(e) => Err(e),
                    None => Err(fenced_write::Error::PatchNotObject), // any other failure
                }
            }
        },
    );
    let action = wrapped(cm.clone(), Arc::new(())).await.unwrap();
    assert_ne!(action, Action::await_change());
    assert_eq!((metrics.refused(), metrics.lost()), (1, 0));
    // a failure that is not a lost shard stays a reconcile error
    assert!(wrapped(cm, Arc::new(())).await.is_err());
    assert_eq!(metrics.refused(), 1);
}

// === status-field fences: a CRD's `/status` writes carry the token in `.status.kubeShardFence` ===

const STATUS_FIELD: &str = ".status.kubeShardFence";

fn widget_resource() -> kube::core::ApiResource {
    kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("example.com", "v1", "Widget"),
        "widgets",
    )
}

/// The Widget CRD with a status subresource whose schema declares the fence field (as the docs require).
async fn install_widgets(server: &TestServer) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "properties": {
                        "phase": {"type": "string"},
                        "kubeShardFence": {"type": "string"}
                    }}
                }}}
            }]
        }
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(server.client("admin"))
        .create(&Default::default(), &crd)
        .await
        .unwrap();
}

async fn install_status_policy(server: &TestServer) {
    let set = FencePolicyConfig::new(vec!["widgets.example.com".parse().unwrap()])
        .status_field(STATUS_FIELD.parse().unwrap())
        .generate()
        .unwrap();
    post_policies(server, &set).await;
}

pub(crate) use crate::harness::post_policies;

/// The status write of a deposed owner (epoch 7) after the new owner's (epoch 9), from a fresh read, both
/// through `FencedApi` with the status fence field. Returns (the new owner's result, the deposed one's).
async fn late_status_write(
    server: &TestServer,
) -> (
    Result<DynamicObject, fenced_write::Error>,
    Result<DynamicObject, fenced_write::Error>,
) {
    install_widgets(server).await;
    crate::read_path::watcher::seed(&server.client("admin"), 0).await; // the namespace
    let ar = widget_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(server.client("writer"), NS, &ar);
    let mut w = DynamicObject::new("w1", &ar).within(NS);
    w.data = serde_json::json!({"spec": {"size": 1}});
    let w = api.create(&Default::default(), &w).await.unwrap();
    let shard = shard_of_uid(w.metadata.uid.as_deref().unwrap());
    let (me_old, old, d_old) = member("old");
    d_old.apply(&grant(AssignmentView::new(7), &me_old, [shard], 7));
    d_old.activate(shard, 7);
    let (me_new, new, d_new) = member("new");
    d_new.apply(&grant(AssignmentView::new(9), &me_new, [shard], 9));
    d_new.activate(shard, 9);
    let fenced = FencedApi::new(api.clone()).status_fence_field(STATUS_FIELD.parse().unwrap());
    let status = |who: &str| serde_json::json!({"status": {"phase": who}});
    let old_fence = old.admit(&w).unwrap().fence().unwrap();
    // the deposed owner's last status write while it owned the shard: a first stamp, epoch 7
    fenced
        .patch_status(
            &old_fence,
            &w,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status("old")),
        )
        .await
        .unwrap();
    let cur = api.get("w1").await.unwrap();
    let new_fence = new.admit(&cur).unwrap().fence().unwrap();
    let current = fenced
        .patch_status(
            &new_fence,
            &cur,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status("new")),
        )
        .await;
    let fresh = api.get("w1").await.unwrap(); // the deposed owner re-reads: preconditions pass
    let late = fenced
        .patch_status(
            &old_fence,
            &fresh,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&status("old-late")),
        )
        .await;
    (current, late)
}

#[tokio::test(start_paused = true)]
async fn stale_status_write_is_refused_by_the_status_field_policy() {
    let server = TestServer::builder().build();
    install_status_policy(&server).await;
    let (current, late) = late_status_write(&server).await;
    let current = current.expect("the current owner's status write passes");
    assert_eq!(
        current.data["status"]["kubeShardFence"],
        // standalone: failover epoch 0
        format!(
            "0:{}/9",
            shard_of_uid(current.metadata.uid.as_deref().unwrap())
        )
    );
    let err = late.unwrap_err();
    assert!(err.is_fence_refused(), "{err:?}");
    let fenced_write::Error::Api(kube::Error::Api(s)) = &err else {
        panic!("{err:?}")
    };
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        s.message,
        format!(
            "widgets.example.com \"w1\" is forbidden: ValidatingAdmissionPolicy 'kube-shard-fence-status' with binding 'kube-shard-fence-status' denied request: {}",
            kube_shard::testing::fence_messages::STALE
        )
    );
    // without the policy, the same write commits: the field goes back to epoch 7
    let server = TestServer::builder().build();
    let (current, late) = late_status_write(&server).await;
    current.unwrap();
    let committed = late.unwrap();
    let token = committed.data["status"]["kubeShardFence"].as_str().unwrap();
    assert!(token.starts_with("0:") && token.ends_with("/7"), "{token}");
    assert_eq!(committed.data["status"]["phase"], "old-late");
}
