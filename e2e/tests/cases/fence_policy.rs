//! The fence policy on a real kube-apiserver (issue 16, per-object level), the same writes and answers as
//! testserver's `admission` tests:
//! `KUBECONFIG=$(../shared/realkube/realkube start) cargo test --workspace --test e2e fence_policy -- --ignored`.
//! Installs a cluster-wide policy named `kube-shard-fence-e2e` (removed at the end); it concerns only
//! ConfigMaps that carry a fence annotation.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    core::Status,
    Api, Client,
};
use kube_shard::fence_policy::FencePolicyConfig;
use kube_shard::testing::fence_messages as messages;
use serde_json::{json, Value};

use crate::fence_support::{self as support, status};

const NAME: &str = "kube-shard-fence-e2e";

fn fence(token: Option<&str>) -> Patch<Value> {
    Patch::Merge(json!({"metadata": {"annotations": {"kube-shard.io/fence": token}}}))
}

fn assert_refused(s: &Status, name: &str, msg: &str) {
    support::assert_refused(s, "configmaps", name, NAME, msg);
}

async fn install(client: &Client) {
    let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
        .name(NAME)
        .generate()
        .unwrap();
    support::install_policies(client, &set.policies, &set.bindings).await;
}

async fn uninstall(client: &Client) {
    support::remove_policies(client, &[NAME]).await;
}

/// Policies load asynchronously: write a lower epoch until it is refused (at most 30 s).
async fn wait_until_enforced(api: &Api<ConfigMap>) {
    let pp = PatchParams::default();
    api.create(&PostParams::default(), &cm("probe"))
        .await
        .unwrap();
    for _ in 0..60 {
        api.patch("probe", &pp, &fence(Some("0:1/100")))
            .await
            .unwrap();
        if api
            .patch("probe", &pp, &fence(Some("0:1/50")))
            .await
            .is_err()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the fence policy was not enforced within 30 s");
}

fn cm(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some([("k".to_string(), "v".to_string())].into()),
        ..Default::default()
    }
}

#[tokio::test]
#[ignore = "needs a cluster: KUBECONFIG=... cargo test --workspace --test e2e fence_policy -- --ignored"]
async fn fence_policy_on_real_server() {
    let client = Client::try_default().await.expect("KUBECONFIG");
    let ns = support::fresh_namespace(&client, "fence-policy").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    install(&client).await;
    wait_until_enforced(&api).await;
    let pp = PatchParams::default();

    // test 1: a write with fresh preconditions but a lower epoch
    api.create(&PostParams::default(), &cm("t1")).await.unwrap();
    for ok in ["0:3/1000", "0:3/1000", "0:3/2000", "0:3/02000"] {
        api.patch("t1", &pp, &fence(Some(ok))).await.unwrap();
    }
    let mut late = api.get("t1").await.unwrap();
    late.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("kube-shard.io/fence".into(), "0:3/1000".into());
    let s = status(
        api.replace("t1", &PostParams::default(), &late)
            .await
            .unwrap_err(),
    );
    assert_refused(&s, "t1", messages::STALE);

    for (bad, msg) in [
        (Some("0:3/1500"), messages::STALE),
        (Some("0:4/3000"), messages::SHARD),
        (Some("x/3000"), messages::MALFORMED),
        (Some("0:3/1234567890123456789"), messages::MALFORMED),
        (None, messages::REMOVED),
    ] {
        let s = status(api.patch("t1", &pp, &fence(bad)).await.unwrap_err());
        assert_refused(&s, "t1", msg);
    }
    api.patch("t1", &pp, &Patch::Merge(json!({"data": {"b": "2"}})))
        .await
        .unwrap();

    // the two-level token (HA.md "Fenced by the server"): failover epochs first, whatever the shard part;
    // equal → the shard rules, which a mirror token skips; a legacy token is failover epoch 0
    for ok in [
        "1001:9/1",
        "1001:9/1",
        "2002:mirror",
        "2002:4/0",
        "2002:mirror",
    ] {
        api.patch("t1", &pp, &fence(Some(ok))).await.unwrap();
    }
    for (bad, msg) in [
        (Some("1001:9/999999"), messages::FAILOVER_STALE),
        (Some("1001:mirror"), messages::FAILOVER_STALE),
        (Some("0:3/9999"), messages::FAILOVER_STALE),
        (Some("3/9999"), messages::FAILOVER_STALE),
        (Some("12345678901:4/1"), messages::MALFORMED),
        (Some("2002:4:1/1"), messages::MALFORMED),
    ] {
        let s = status(api.patch("t1", &pp, &fence(bad)).await.unwrap_err());
        assert_refused(&s, "t1", msg);
    }
    api.patch("t1", &pp, &fence(Some("2002:4/5")))
        .await
        .unwrap();
    for (bad, msg) in [
        (Some("2002:4/4"), messages::STALE),
        (Some("2002:5/6"), messages::SHARD),
    ] {
        let s = status(api.patch("t1", &pp, &fence(bad)).await.unwrap_err());
        assert_refused(&s, "t1", msg);
    }

    uninstall(&client).await;
    // without the policy the same late write commits (poll: removal also propagates asynchronously)
    let mut committed = false;
    for _ in 0..60 {
        let mut late = api.get("t1").await.unwrap();
        late.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("kube-shard.io/fence".into(), "0:3/1000".into());
        if api
            .replace("t1", &PostParams::default(), &late)
            .await
            .is_ok()
        {
            committed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(committed, "without the policy the late write commits");
}
