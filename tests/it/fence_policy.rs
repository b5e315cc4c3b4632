//! Fences enforced by the apiserver (issue 16, per-object level): a deposed owner that re-read the object
//! after the new owner's fenced write passes the uid and resourceVersion preconditions, and only the fence
//! policy refuses its write; the reconcile wrapper requeues it as a lost shard and counts it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{runtime::controller::Action, Api};
use kube_shard::{
    fence_policy::FencePolicyConfig,
    ownership::{fenced_write, fenced_write::FencedApi, reconcile, AssignmentView, Permit},
};
use kube_shard_testserver::TestServer;

use crate::watcher::{grant, member, seed, shard_of_uid, NS};

async fn install_policy(server: &TestServer) {
    let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
        .generate()
        .unwrap();
    let client = server.client("admin");
    let docs = [
        (
            "validatingadmissionpolicies",
            serde_json::to_vec(&set.policies[0]).unwrap(),
        ),
        (
            "validatingadmissionpolicybindings",
            serde_json::to_vec(&set.bindings[0]).unwrap(),
        ),
    ];
    for (plural, body) in docs {
        let req = http::Request::post(format!("/apis/admissionregistration.k8s.io/v1/{plural}"))
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        client.request_text(req).await.unwrap();
    }
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
    fenced.replace(&old_fence, &name, &cm).await.unwrap(); // the deposed owner's last write, epoch 7
    let cm = api.get(&name).await.unwrap();
    let new_fence = new.admit(&cm).unwrap().fence().unwrap();
    fenced.replace(&new_fence, &name, &cm).await.unwrap(); // the new owner's write, epoch 9
    let fresh = api.get(&name).await.unwrap(); // the deposed owner re-reads: preconditions pass
    fenced.replace(&old_fence, &name, &fresh).await
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
    assert!(token.ends_with("/7"), "{token}");
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
