//! The per-write cost of the fence policies on a real kube-apiserver (issue 16): the round trip of one
//! fenced ConfigMap merge patch with no policy, with the per-object policy, and with both levels (a
//! parameter ConfigMap of 256 keys), measured one after the other on the same object, then without any
//! again (the drift of the run). A benchmark figure printed, not a timed assertion:
//! `KUBECONFIG=$(../shared/realkube/realkube start NAME --fresh) cargo test -p kube-shard-e2e --test e2e fence_write_cost -- --ignored --nocapture`.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    Api, Client,
};
use kube_shard::fence_policy::FencePolicyConfig;
use serde_json::json;

use crate::fence_support as support;

const NAME: &str = "kube-shard-fence-e2e-cost";
const WRITES: usize = 400;

fn fenced(name: &str, token: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some([("kube-shard.io/fence".to_string(), token.to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// `WRITES` sequential fenced merge patches of `cost` (shard 7, epoch 5000): sorted round trips.
async fn writes(api: &Api<ConfigMap>) -> Vec<Duration> {
    let mut times = Vec::with_capacity(WRITES);
    for i in 0..WRITES {
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
    times
}

fn line(label: &str, t: &[Duration]) -> String {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mean = t.iter().map(|d| ms(*d)).sum::<f64>() / t.len() as f64;
    format!(
        "{label:<40} median {:.2} ms, p90 {:.2} ms, mean {:.2} ms ({} writes)",
        ms(t[t.len() / 2]),
        ms(t[t.len() * 9 / 10]),
        mean,
        t.len()
    )
}

/// A dry-run CREATE with `token` until `refused` says so (at most 30 s): the policies are loaded (or gone).
async fn until(api: &Api<ConfigMap>, token: &str, refused: bool) {
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    for i in 0..300 {
        let res = api
            .create(&dry, &fenced(&format!("probe-{i}"), token))
            .await;
        if res.is_err() == refused {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{token}: refused {refused} not reached within 30 s");
}

#[tokio::test]
#[ignore = "needs a cluster: KUBECONFIG=... cargo test -p kube-shard-e2e --test e2e fence_write_cost -- --ignored --nocapture"]
async fn fence_write_cost_on_real_server() {
    let client = Client::try_default().await.expect("KUBECONFIG");
    let ns = support::fresh_namespace(&client, "fence-cost").await;
    support::keep_param_informer(&client).await;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
        .name(NAME)
        .params(format!("{ns}/fence-params").parse().unwrap())
        .generate()
        .unwrap();
    // 256 shards published (shard 7 at 4000, below the writes' 5000)
    let mut params = set.params.clone().unwrap();
    params.data = Some(
        (0..256)
            .map(|s| (s.to_string(), "4000".to_string()))
            .collect(),
    );
    api.create(&PostParams::default(), &params).await.unwrap();
    api.create(&PostParams::default(), &fenced("cost", "0:7/5000"))
        .await
        .unwrap();
    let scoped: Vec<_> = set
        .policies
        .iter()
        .map(|p| support::scoped(p, &ns))
        .collect();
    let _ = writes(&api).await; // warm-up
    let none = writes(&api).await;
    // per object: a probe UPDATE with a lower epoch is refused once it is loaded
    support::install_policies(&client, &scoped[..1], &set.bindings[..1]).await;
    api.create(&PostParams::default(), &fenced("probe", "0:7/100"))
        .await
        .unwrap();
    let stamp =
        |t: &str| Patch::Merge(json!({"metadata": {"annotations": {"kube-shard.io/fence": t}}}));
    for i in 0.. {
        assert!(
            i < 300,
            "the per-object policy was not enforced within 30 s"
        );
        let pp = PatchParams::default();
        api.patch("probe", &pp, &stamp("0:7/100")).await.unwrap();
        if api.patch("probe", &pp, &stamp("0:7/50")).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let per_object = writes(&api).await;
    // both levels: a CREATE below shard 7's published 4000 is refused once the per-shard one is loaded
    support::install_policies(&client, &scoped[1..2], &set.bindings[1..2]).await;
    until(&api, "0:7/3999", true).await;
    let both = writes(&api).await;
    support::remove_policies(&client, &[NAME, &format!("{NAME}-shard")]).await;
    until(&api, "0:7/3999", false).await;
    tokio::time::sleep(Duration::from_secs(2)).await; // the per-object one unloads too
    let none_again = writes(&api).await;
    println!("fenced ConfigMap merge patch round trip on the real server:");
    println!("{}", line("no policy", &none));
    println!("{}", line("per-object policy", &per_object));
    println!("{}", line("per-object and per-shard (256 keys)", &both));
    println!("{}", line("no policy again (drift)", &none_again));
    let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .delete(&ns, &Default::default())
        .await;
}
