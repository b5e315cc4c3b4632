//! Status-field fences on a real kube-apiserver (issue 16): a CRD's `/status` write copies the stored
//! metadata, so the fence travels in `.status.kubeShardFence`, stamped by `FencedApi::status_fence_field`
//! and compared by the generated `-status` policies — the same writes and answers as testserver's
//! `admission_status` tests and `tests/it/fences/policy.rs`:
//! `KUBECONFIG=$(../shared/realkube/realkube start NAME --fresh) cargo test -p kube-shard-e2e --test e2e fence_status -- --ignored --nocapture`.
//! Installs the status policies `kube-shard-fence-e2e-status` and `-status-shard` narrowed to the test's
//! namespace (removed at the end), on the e2e Widget CRD (`widgets.example.kube-shard.io`).

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams},
    core::Status,
    Api, Client,
};
use kube_shard::{
    fence_policy::FencePolicyConfig,
    group::assignment::{AssignmentView, ShardAssignment},
    ownership::{
        fenced_write::{self, FencedApi},
        MemberId, Ownership, OwnershipConfig,
    },
    testing::{self, fence_messages as messages},
    ShardCount, ShardKey,
};
use serde_json::json;

use crate::fence_support::{self as support, status};
use crate::support::{install_widgets, widget_resource};

const NAME: &str = "kube-shard-fence-e2e";
const STATUS_POLICY: &str = "kube-shard-fence-e2e-status";
const STATUS_SHARD_POLICY: &str = "kube-shard-fence-e2e-status-shard";
const FIELD: &str = ".status.kubeShardFence";
const PARAMS: &str = "fence-params";
const WHAT: &str = "widgets.example.kube-shard.io";

fn shards() -> ShardCount {
    ShardCount::new(16).unwrap()
}

/// A member that owns `shard` at `epoch` (its own view; never told when it loses it).
fn owner(name: &str, shard: u32, epoch: u64) -> Ownership {
    let me = MemberId::new(name, "i1");
    let (o, d) = testing::driver(OwnershipConfig::new(shards(), ShardKey::Uid), me.clone());
    d.renew();
    d.apply(&AssignmentView::new(epoch).with(shard, ShardAssignment::owned(me, epoch)));
    d.activate(shard, epoch);
    o
}

/// A fenced `/status` merge patch of `name` by `who` from a fresh read.
async fn status_write(
    fenced: &FencedApi<DynamicObject>,
    who: &Ownership,
    name: &str,
    phase: &str,
) -> Result<DynamicObject, fenced_write::Error> {
    let cur = fenced.api().get(name).await.unwrap();
    let fence = who.admit(&cur).unwrap().fence().unwrap();
    let patch = json!({"status": {"phase": phase}});
    fenced
        .patch_status(
            &fence,
            &cur,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
}

fn refusal(e: fenced_write::Error) -> Box<Status> {
    assert!(e.is_fence_refused(), "{e:?}");
    match e {
        fenced_write::Error::Api(e) => status(e),
        other => panic!("{other:?}"),
    }
}

/// A raw `/status` merge patch setting the field to `token`.
async fn raw(api: &Api<DynamicObject>, name: &str, token: Option<&str>) -> Result<(), kube::Error> {
    let patch = Patch::Merge(json!({"status": {"kubeShardFence": token}}));
    api.patch_status(name, &PatchParams::default(), &patch)
        .await
        .map(|_| ())
}

/// Policies load asynchronously: stamp `1/100` then `1/50` on `probe` until the second is refused.
async fn wait_until_enforced(api: &Api<DynamicObject>) {
    for _ in 0..120 {
        raw(api, "probe", Some("0:1/100")).await.unwrap();
        if raw(api, "probe", Some("0:1/50")).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the status fence policy was not enforced within 30 s");
}

async fn widget(api: &Api<DynamicObject>, name: &str) -> DynamicObject {
    let mut w = DynamicObject::new(name, &widget_resource());
    w.data = json!({"spec": {"size": 1}});
    api.create(&PostParams::default(), &w).await.unwrap()
}

#[tokio::test]
#[ignore = "needs a cluster: KUBECONFIG=... cargo test -p kube-shard-e2e --test e2e fence_status -- --ignored"]
async fn status_fence_on_real_server() {
    let client = Client::try_default().await.expect("KUBECONFIG");
    let ns = support::fresh_namespace(&client, "fence-status").await;
    let api = install_widgets(&client, &ns).await;
    support::keep_param_informer(&client).await;
    let set = FencePolicyConfig::new(vec![WHAT.parse().unwrap()])
        .name(NAME)
        .params(format!("{ns}/{PARAMS}").parse().unwrap())
        .status_field(FIELD.parse().unwrap())
        .generate()
        .unwrap();
    let params: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    params
        .create(&PostParams::default(), set.params.as_ref().unwrap())
        .await
        .unwrap();
    // only the status-field policies, narrowed to this namespace
    let scoped: Vec<_> = set.policies[2..]
        .iter()
        .map(|p| support::scoped(p, &ns))
        .collect();
    support::install_policies(&client, &scoped, &set.bindings[2..]).await;
    widget(&api, "probe").await;
    wait_until_enforced(&api).await;

    // per object: the deposed owner (epoch 7) re-reads after the new owner's (epoch 9) status write
    let w = widget(&api, "w1").await;
    let shard = shards().shard_of(kube_shard::fnv1a64(
        w.metadata.uid.as_deref().unwrap().as_bytes(),
    ));
    let (old, new) = (owner("old", shard, 7), owner("new", shard, 9));
    let fenced = FencedApi::new(api.clone()).status_fence_field(FIELD.parse().unwrap());
    status_write(&fenced, &old, "w1", "old").await.unwrap();
    let current = status_write(&fenced, &new, "w1", "new").await.unwrap();
    assert_eq!(
        current.data["status"]["kubeShardFence"],
        format!("0:{shard}/9")
    );
    let s = refusal(
        status_write(&fenced, &old, "w1", "old-late")
            .await
            .unwrap_err(),
    );
    support::assert_refused(&s, WHAT, "w1", STATUS_POLICY, messages::STALE);
    println!(
        "real server, stale status write: {} {} {}",
        s.code, s.reason, s.message
    );
    for (bad, msg) in [
        (Some(format!("{}/9", (shard + 1) % 16)), messages::SHARD),
        (Some("x/9".to_owned()), messages::STATUS_MALFORMED),
        (None, messages::STATUS_REMOVED),
    ] {
        let s = status(raw(&api, "w1", bad.as_deref()).await.unwrap_err());
        support::assert_refused(&s, WHAT, "w1", STATUS_POLICY, msg);
        println!(
            "real server, status field {bad:?}: {} {} {}",
            s.code, s.reason, s.message
        );
    }
    status_write(&fenced, &new, "w1", "new-again")
        .await
        .unwrap();

    // per shard: the coordinator published epoch 9 for the shard; w2 was never stamped by the new owner
    let w2 = widget(&api, "w2").await;
    let shard2 = shards().shard_of(kube_shard::fnv1a64(
        w2.metadata.uid.as_deref().unwrap().as_bytes(),
    ));
    let (old2, new2) = (owner("old2", shard2, 7), owner("new2", shard2, 9));
    status_write(&fenced, &old2, "w2", "old").await.unwrap();
    params
        .patch(
            PARAMS,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {shard2.to_string(): "9"}})),
        )
        .await
        .unwrap();
    let mut refused = None;
    for _ in 0..500 {
        match status_write(&fenced, &old2, "w2", "old-late").await {
            Err(e) => {
                refused = Some(refusal(e));
                break;
            }
            // the parameter informer lags: the probe committed at epoch 7 (the stored fence stays 7)
            Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let s = refused.expect("the deposed owner's status write refused per shard");
    support::assert_refused(&s, WHAT, "w2", STATUS_SHARD_POLICY, messages::SHARD_STALE);
    println!(
        "real server, status write below the shard's epoch: {} {} {}",
        s.code, s.reason, s.message
    );
    status_write(&fenced, &new2, "w2", "new").await.unwrap();

    // without the policies the same late status write commits (removal propagates asynchronously)
    support::remove_policies(&client, &[STATUS_POLICY, STATUS_SHARD_POLICY]).await;
    let mut committed = None;
    for _ in 0..120 {
        if let Ok(w) = status_write(&fenced, &old, "w1", "old-late").await {
            committed = Some(w);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let w = committed.expect("without the policy the late status write commits");
    assert_eq!(w.data["status"]["kubeShardFence"], format!("0:{shard}/7"));
    println!("real server, without the policy: the status write with epoch 7 committed");
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
}
