//! The two-level fence token `<failover-epoch>:<shard>/<shard-epoch>` (HA.md "Fenced by the server") under
//! the generated per-object and per-shard policies, evaluated by testserver's CEL: failover epochs first
//! (lower refused, higher accepted whatever the shard part), equal → the shard rules, `mirror` skips them;
//! and, over every pair of a small token grid, the policy decides exactly as the library's model
//! (`FenceToken::refusal_over`).

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Patch, PatchParams, PostParams},
    Api,
};
use kube_shard::{
    fence_policy::FencePolicyConfig,
    testing::fence_messages as messages,
    token::{FenceToken, Refusal, FENCE_ANNOTATION},
};
use kube_shard_testserver::TestServer;
use serde_json::{json, Value};

use crate::common::cm;

async fn install(server: &TestServer, config: FencePolicyConfig) {
    let set = config.generate().unwrap();
    let client = server.client("admin");
    let docs = set
        .policies
        .iter()
        .map(|p| {
            (
                "validatingadmissionpolicies",
                serde_json::to_vec(p).unwrap(),
            )
        })
        .chain(set.bindings.iter().map(|b| {
            (
                "validatingadmissionpolicybindings",
                serde_json::to_vec(b).unwrap(),
            )
        }));
    for (plural, body) in docs {
        let req = http::Request::post(format!("/apis/admissionregistration.k8s.io/v1/{plural}"))
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        client.request_text(req).await.unwrap();
    }
    if let Some(p) = &set.params {
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        api.create(&PostParams::default(), p).await.unwrap();
    }
}

fn configmaps() -> FencePolicyConfig {
    FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
}

fn fence(token: &str) -> Patch<Value> {
    Patch::Merge(json!({"metadata": {"annotations": {FENCE_ANNOTATION: token}}}))
}

fn fenced_cm(name: &str, token: &str) -> ConfigMap {
    let mut c = cm(name);
    c.metadata.annotations = Some([(FENCE_ANNOTATION.to_string(), token.to_string())].into());
    c
}

/// The refusal message of a failed write.
fn refusal(r: Result<ConfigMap, kube::Error>) -> Option<String> {
    match r {
        Ok(_) => None,
        Err(kube::Error::Api(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
            Some(s.message)
        }
        Err(e) => panic!("not an API error: {e}"),
    }
}

#[tokio::test]
async fn failover_epochs_first_then_the_shard_rules_and_mirror_skips_them() {
    let server = TestServer::new();
    install(&server, configmaps()).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let pp = PatchParams::default();
    api.create(&PostParams::default(), &fenced_cm("t", "1001:3/500"))
        .await
        .unwrap();
    let write = |token: &'static str| {
        let api = api.clone();
        async move { refusal(api.patch("t", &PatchParams::default(), &fence(token)).await) }
    };
    // equal failover epochs: the shard rules
    assert_eq!(write("1001:3/600").await, None);
    assert!(write("1001:3/599")
        .await
        .unwrap()
        .ends_with(messages::STALE));
    assert!(write("1001:4/900")
        .await
        .unwrap()
        .ends_with(messages::SHARD));
    // higher: accepted whatever the shard part says (B's group's epochs are older)
    assert_eq!(write("2002:9/1").await, None);
    // lower: refused whatever the shard part says
    let m = write("1001:9/999999").await.unwrap();
    assert!(m.ends_with(messages::FAILOVER_STALE), "{m}");
    // a legacy token is failover epoch 0: below every HA term
    assert!(write("9/5")
        .await
        .unwrap()
        .ends_with(messages::FAILOVER_STALE));
    // the mirror at the stored failover epoch skips the shard rules, and so does the next shard write
    assert_eq!(write("2002:mirror").await, None);
    assert_eq!(write("2002:4/0").await, None);
    assert_eq!(write("2002:mirror").await, None);
    // the mirror of an older term is refused
    assert!(write("1001:mirror")
        .await
        .unwrap()
        .ends_with(messages::FAILOVER_STALE));
    // malformed: a failover epoch above 10 digits, a shard part that is neither, two colons
    for bad in [
        "12345678901:4/1",
        "3003:mirror/1",
        "3003:4:1/1",
        ":4/1",
        "3003:",
    ] {
        let m = write(bad).await.unwrap();
        assert!(m.ends_with(messages::MALFORMED), "{bad}: {m}");
    }
    api.patch("t", &pp, &Patch::Merge(json!({"data": {"kept": "fence"}})))
        .await
        .unwrap();
}

/// The per-shard floor compares shard epochs only, whatever the failover epoch; mirror tokens have no floor.
#[tokio::test]
async fn the_per_shard_floor_ignores_the_failover_epoch_and_mirror_tokens() {
    let server = TestServer::new();
    install(
        &server,
        configmaps().params("default/fence-params".parse().unwrap()),
    )
    .await;
    let params: Api<ConfigMap> = Api::namespaced(server.client("coordinator"), "default");
    params
        .patch(
            "fence-params",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"3": "2000"}})),
        )
        .await
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let post = PostParams::default();
    for (name, token, refused) in [
        ("a", "2002:3/1999", true),
        ("b", "0:3/1999", true),
        ("c", "3/1999", true),
        ("d", "1001:3/2000", false),
        ("e", "2002:mirror", false),
        ("f", "2002:4/1", false),
    ] {
        let m = refusal(api.create(&post, &fenced_cm(name, token)).await);
        assert_eq!(m.is_some(), refused, "{token}: {m:?}");
        if let Some(m) = m {
            assert!(m.ends_with(messages::SHARD_STALE), "{m}");
        }
    }
}

/// Every (stored, written) pair of a grid over failover epochs (legacy, 0, 1001, 2002), shards, shard
/// epochs and mirror tokens: the policy refuses exactly what `FenceToken::refusal_over` refuses, with its
/// message.
#[tokio::test]
async fn the_policy_decides_as_the_token_model_on_every_pair() {
    let server = TestServer::new();
    install(&server, configmaps()).await;
    let api: Api<ConfigMap> = Api::namespaced(server.client("a"), "default");
    let mut grid: Vec<String> = vec!["3/5".into(), "4/9".into()];
    for f in ["0", "1001", "2002"] {
        grid.push(format!("{f}:mirror"));
        for (s, e) in [(3, 5), (3, 9), (4, 5)] {
            grid.push(format!("{f}:{s}/{e}"));
        }
    }
    let (mut pairs, mut refused) = (0, 0);
    for (i, stored) in grid.iter().enumerate() {
        let name = format!("g{i}");
        api.create(&PostParams::default(), &fenced_cm(&name, stored))
            .await
            .unwrap();
        for written in &grid {
            let model = written
                .parse::<FenceToken>()
                .unwrap()
                .refusal_over(&stored.parse().unwrap());
            let got = refusal(
                api.patch(&name, &PatchParams::default(), &fence(written))
                    .await,
            );
            let want = model.map(|r| match r {
                Refusal::FailoverEpoch => messages::FAILOVER_STALE,
                Refusal::Shard => messages::SHARD,
                Refusal::ShardEpoch => messages::STALE,
                _ => unreachable!("a refusal the policy does not know"),
            });
            match (&got, want) {
                (None, None) => {}
                (Some(m), Some(w)) if m.ends_with(w) => refused += 1,
                _ => panic!("{written} over {stored}: policy {got:?}, model {model:?}"),
            }
            pairs += 1;
            if got.is_none() {
                // start the next pair from the stored token again
                api.delete(&name, &Default::default()).await.unwrap();
                api.create(&PostParams::default(), &fenced_cm(&name, stored))
                    .await
                    .unwrap();
            }
        }
    }
    assert_eq!(pairs, grid.len() * grid.len());
    // the grid exercises both outcomes
    assert!(refused > 50 && refused < pairs - 50, "{refused} of {pairs}");
}
