//! The per-shard fence level on a real kube-apiserver (issue 16, test 2 at the server), the same writes and
//! answers as testserver's `admission` tests, and the **parameter lag**: the time from the parameter
//! ConfigMap write to the first refused probe write.
//! `KUBECONFIG=$(../shared/realkube/realkube start) cargo test -p kube-shard-e2e --test e2e fence_params -- --ignored --nocapture`.
//! Installs the cluster-wide per-shard policy `kube-shard-fence-e2e-params-shard` (removed at the end),
//! bound to a parameter ConfigMap in the test's own namespace; it concerns only ConfigMaps whose fence names
//! shard 7 (the only key published).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::{
    api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams},
    core::Status,
    Api, Client,
};
use kube_shard::fence_policy::FencePolicyConfig;
use kube_shard::testing::fence_messages as messages;
use serde_json::json;

use crate::fence_support::{self as support, status};

const NAME: &str = "kube-shard-fence-e2e-params";
const SHARD_POLICY: &str = "kube-shard-fence-e2e-params-shard";
const PARAMS: &str = "fence-params";
const NO_PARAMS: &str =
    "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction";

fn assert_refused(s: &Status, name: &str, msg: &str) {
    support::assert_refused(s, "configmaps", name, SHARD_POLICY, msg);
}

fn fenced(name: &str, token: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some([("kube-shard.io/fence".to_string(), token.to_string())].into()),
            ..Default::default()
        },
        data: Some([("k".to_string(), "v".to_string())].into()),
        ..Default::default()
    }
}

async fn publish(params: &Api<ConfigMap>, shard: &str, epoch: &str) {
    params
        .patch(
            PARAMS,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {shard: epoch}})),
        )
        .await
        .unwrap();
}

/// Only the per-shard policy and binding (the per-object one is `fence_policy_on_real_server`'s, which may
/// run at the same time), after the parameter ConfigMap.
async fn install(client: &Client, ns: &str) {
    support::keep_param_informer(client).await;
    let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
        .name(NAME)
        .params(format!("{ns}/{PARAMS}").parse().unwrap())
        .generate()
        .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), set.params.as_ref().unwrap())
        .await
        .unwrap();
    support::install_policies(
        client,
        &[support::scoped(&set.policies[1], ns)],
        &set.bindings[1..2],
    )
    .await;
}

async fn uninstall(client: &Client) {
    support::remove_policies(client, &[SHARD_POLICY]).await;
}

/// A dry-run CREATE with `token` until it is refused (at most `limit`): when.
async fn until_refused(api: &Api<ConfigMap>, token: &str, limit: Duration) -> Instant {
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let start = Instant::now();
    let mut i = 0;
    loop {
        i += 1;
        if let Err(e) = api
            .create(&dry, &fenced(&format!("probe-{i}"), token))
            .await
        {
            let s = status(e);
            assert_refused(&s, &format!("probe-{i}"), messages::SHARD_STALE);
            return Instant::now();
        }
        assert!(
            start.elapsed() < limit,
            "{token} not refused within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The median round trip of 200 sequential fenced merge patches of `cost` (shard 7, epoch 5000).
async fn write_cost(api: &Api<ConfigMap>) -> Duration {
    let mut times = Vec::new();
    for i in 0..200 {
        let patch = Patch::Merge(json!({
            "metadata": {"annotations": {"kube-shard.io/fence": "0:7/5000"}},
            "data": {"n": i.to_string()},
        }));
        let t = Instant::now();
        api.patch("cost", &PatchParams::default(), &patch)
            .await
            .unwrap();
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

/// Policies unload asynchronously too: a dry-run CREATE with `token` until it passes (at most 30 s), so that
/// the next test (cluster-wide policies) does not meet this one's.
async fn until_unloaded(api: &Api<ConfigMap>, token: &str) {
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for i in 0..300 {
        if api
            .create(&dry, &fenced(&format!("gone-{i}"), token))
            .await
            .is_ok()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the per-shard policy still refuses {token} 30 s after its removal");
}

#[tokio::test]
#[ignore = "needs a cluster: KUBECONFIG=... cargo test -p kube-shard-e2e --test e2e fence_params -- --ignored"]
async fn fence_params_on_real_server() {
    let client = Client::try_default().await.expect("KUBECONFIG");
    let ns = support::fresh_namespace(&client, "fence-params").await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let params: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &fenced("cost", "0:7/5000"))
        .await
        .unwrap();
    let without = write_cost(&api).await;
    install(&client, &ns).await;
    // policies load asynchronously: wait until a probe below a published epoch is refused
    publish(&params, "7", "100").await;
    until_refused(&api, "0:7/99", Duration::from_secs(30)).await;
    let post = PostParams::default();

    // test 2: the deposed owner (epoch 100) wrote t1; the coordinator publishes the new owner's epoch 200;
    // the deposed owner's delayed write to t1 (which the new owner never wrote: preconditions and the
    // per-object policy pass it) is refused, and so is its CREATE
    let t1 = api.create(&post, &fenced("t1", "0:7/100")).await.unwrap();
    publish(&params, "7", "200").await;
    until_refused(&api, "0:7/100", Duration::from_secs(30)).await;
    let mut late = t1.clone();
    late.data = Some([("late".to_string(), "write".to_string())].into());
    let s = status(api.replace("t1", &post, &late).await.unwrap_err());
    assert_refused(&s, "t1", messages::SHARD_STALE);
    println!(
        "real server, late UPDATE: {} {} {}",
        s.code, s.reason, s.message
    );
    let s = status(
        api.create(&post, &fenced("t2", "0:7/150"))
            .await
            .unwrap_err(),
    );
    assert_refused(&s, "t2", messages::SHARD_STALE);
    println!(
        "real server, stale CREATE: {} {} {}",
        s.code, s.reason, s.message
    );
    // the current owner, other shards, unfenced objects pass
    api.create(&post, &fenced("t2", "0:7/200")).await.unwrap();
    let mut current = api.get("t1").await.unwrap();
    current
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("kube-shard.io/fence".into(), "0:7/200".into());
    api.replace("t1", &post, &current).await.unwrap();
    api.create(&post, &fenced("t3", "0:8/1")).await.unwrap();
    // a malformed parameter
    publish(&params, "9", "x").await;
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut malformed = None;
    for _ in 0..1000 {
        if let Err(e) = api.create(&dry, &fenced("t4", "0:9/1")).await {
            malformed = Some(status(e));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_refused(
        &malformed.expect("refused"),
        "t4",
        messages::PARAM_MALFORMED,
    );

    let with = write_cost(&api).await;
    println!(
        "real server, fenced UPDATE round trip (median of 200): without the per-shard policy {:.2} ms, with it {:.2} ms",
        without.as_secs_f64() * 1000.0,
        with.as_secs_f64() * 1000.0
    );

    // the parameter lag: from the start of the parameter write to the first refused probe
    let mut lags = Vec::new();
    for round in 0..20u64 {
        let epoch = 1000 + round * 10;
        let t0 = Instant::now();
        publish(&params, "7", &epoch.to_string()).await;
        let written = t0.elapsed();
        let refused =
            until_refused(&api, &format!("7/{}", epoch - 1), Duration::from_secs(30)).await;
        lags.push((refused.duration_since(t0), written));
    }
    lags.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "parameter lag over {} rounds (write start -> first refused probe): min {:.1} ms, median {:.1} ms, max {:.1} ms (the parameter write itself: median {:.1} ms)",
        lags.len(),
        ms(lags[0].0),
        ms(lags[lags.len() / 2].0),
        ms(lags[lags.len() - 1].0),
        ms({
            let mut w: Vec<Duration> = lags.iter().map(|l| l.1).collect();
            w.sort();
            w[w.len() / 2]
        })
    );

    // the parameter ConfigMap deleted: every covered write is refused (Deny)
    params
        .delete(PARAMS, &DeleteParams::default())
        .await
        .unwrap();
    let mut missing = None;
    for i in 0..1000 {
        if let Err(e) = api.create(&dry, &fenced(&format!("m{i}"), "0:8/1")).await {
            missing = Some((i, status(e)));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (i, s) = missing.expect("refused without its parameter");
    uninstall(&client).await;
    until_unloaded(&api, "0:8/1").await;
    assert_refused(&s, &format!("m{i}"), NO_PARAMS);
    println!(
        "real server, missing parameter: {} {} {}",
        s.code, s.reason, s.message
    );
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
}

const GROUP_POLICY: &str = "kube-shard-fence-e2e-group";

fn owned(handle: &kube_shard::group::GroupHandle) -> Vec<(u32, u64)> {
    kube_shard::testing::member_state(&handle.ownership())
        .shards()
        .filter(|(_, st)| matches!(st, kube_shard::ownership::ShardState::Owned { .. }))
        .map(|(s, st)| (s, st.epoch().unwrap_or(0)))
        .collect()
}

async fn wait(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Test 2 with a real coordinator on the real server: members `a` then `b` of a group that keeps the
/// parameter ConfigMap; `a` owns everything and reads an object, `b` joins and takes half the shards; `a`'s
/// write built from its read — delayed in flight until after the handoff — to an object `b` never wrote is
/// refused, and so is a CREATE with `a`'s epoch. Run with `--test-threads=1` beside `fence_params_on_real_server`
/// (that test deletes its own parameter ConfigMap at the end, which refuses every ConfigMap write meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: KUBECONFIG=... cargo test -p kube-shard-e2e --test e2e fence_params -- --ignored --test-threads=1"]
async fn fence_params_with_a_coordinator_on_real_server() {
    use kube_shard::group::ShardGroup;
    let client = Client::try_default().await.expect("KUBECONFIG");
    let ns = support::fresh_namespace(&client, "fence-group").await;
    support::keep_param_informer(&client).await;
    let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
        .name(GROUP_POLICY)
        .params(format!("{ns}/{PARAMS}").parse().unwrap())
        .generate()
        .unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), set.params.as_ref().unwrap())
        .await
        .unwrap();
    let shard_policy = format!("{GROUP_POLICY}-shard");
    support::install_policies(
        &client,
        &[support::scoped(&set.policies[1], &ns)],
        &set.bindings[1..2],
    )
    .await;
    let member = |name: &str| {
        ShardGroup::builder(client.clone(), "fence", &ns)
            .member(name)
            .shards(kube_shard::ShardCount::new(16).unwrap())
            .timings(
                Duration::from_secs(6),
                Duration::from_secs(4),
                Duration::from_secs(1),
            )
            .drain_timeout(Duration::from_secs(4))
            .settle(Duration::from_secs(1), Duration::from_millis(500))
            .fence_params(PARAMS)
            .build()
            .unwrap()
            .start()
    };
    let (a, a_task) = member("a");
    let a_task = tokio::spawn(a_task);
    wait(Duration::from_secs(60), "a owns every shard", || {
        owned(&a).len() == 16
    })
    .await;
    // an object in the group namespace; a reads it and stamps it once (its own fence on the stored object)
    let mut unfenced = fenced("obj", "");
    unfenced.metadata.annotations = None;
    let obj = api.create(&PostParams::default(), &unfenced).await.unwrap();
    let shard = kube_shard::ShardCount::new(16)
        .unwrap()
        .shard_of(kube_shard::fnv1a64(
            obj.metadata.uid.as_ref().unwrap().as_bytes(),
        ));
    let a_epoch = owned(&a).into_iter().find(|(s, _)| *s == shard).unwrap().1;
    let a_token = format!("{shard}/{a_epoch}");
    let mut stamped = obj.clone();
    stamped
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("kube-shard.io/fence".into(), a_token.clone());
    let a_read = api
        .replace("obj", &PostParams::default(), &stamped)
        .await
        .unwrap();
    let (b, b_task) = member("b");
    let b_task = tokio::spawn(b_task);
    wait(Duration::from_secs(90), "b takes half the shards", || {
        owned(&b).len() == 8 && owned(&a).len() == 8
    })
    .await;
    // the object's shard must be one that moved: else leave a, so that all move to b
    if !owned(&b).iter().any(|(s, _)| *s == shard) {
        a.leave();
        wait(Duration::from_secs(60), "a hands its set to b", || {
            owned(&b).len() == 16
        })
        .await;
    }
    let b_epoch = owned(&b).into_iter().find(|(s, _)| *s == shard).unwrap().1;
    assert!(b_epoch > a_epoch);
    let published = api.get(PARAMS).await.unwrap().data.unwrap_or_default();
    println!(
        "shard {shard}: a's epoch {a_epoch}, b's {b_epoch}, published {:?}",
        published.get(&shard.to_string())
    );
    // a's write, built from its read before the handoff, arrives now: refused at the first attempt
    let mut late = a_read.clone();
    late.data = Some([("late".to_string(), "write".to_string())].into());
    let s = match api.replace("obj", &PostParams::default(), &late).await {
        Err(e) => status(e),
        Ok(_) => panic!("the deposed owner's late write committed"),
    };
    let refused = |s: &Status, name| {
        support::assert_refused(s, "configmaps", name, &shard_policy, messages::SHARD_STALE)
    };
    refused(&s, "obj");
    println!(
        "real server, coordinator-published, late UPDATE: {} {} {}",
        s.code, s.reason, s.message
    );
    let s = status(
        api.create(&PostParams::default(), &fenced("child", &a_token))
            .await
            .unwrap_err(),
    );
    refused(&s, "child");
    println!(
        "real server, coordinator-published, stale CREATE: {} {} {}",
        s.code, s.reason, s.message
    );
    api.create(
        &PostParams::default(),
        &fenced("child", &format!("{shard}/{b_epoch}")),
    )
    .await
    .unwrap();
    a_task.abort();
    b_task.abort();
    support::remove_policies(&client, &[&shard_policy]).await;
    let _ = Api::<Namespace>::all(client.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
}
