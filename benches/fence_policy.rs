//! The per-write cost of the fence policies on testserver (issue 16): one fenced ConfigMap UPDATE (a JSON
//! merge patch stamping the fence annotation, through kube's client over testserver's in-process service)
//! without a policy, with the per-object policy, and with both levels (the per-shard one bound to a
//! parameter ConfigMap with 256 keys). Run with
//! `cargo bench -p kube-shard --bench fence_policy` (or `--profile dev` to reuse the test build); the figures
//! are in docs/fence-policy.md. testserver compiles the policies' CEL on every write (the real server
//! compiles them once): this measures testserver's evaluation, an upper bound of what CEL adds there.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;
use kube_shard::fence_policy::FencePolicyConfig;
use kube_shard_testserver::TestServer;
use serde_json::json;

#[derive(Clone, Copy)]
enum Level {
    None,
    PerObject,
    Both,
}

async fn setup(level: Level) -> Api<ConfigMap> {
    let server = TestServer::new();
    let client = server.client("admin");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut config = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()]);
    if matches!(level, Level::Both) {
        config = config.params("default/fence-params".parse().unwrap());
    }
    let set = config.generate().unwrap();
    if let Some(cm) = &set.params {
        let mut cm = cm.clone();
        cm.data = Some(
            (0..256)
                .map(|s| (s.to_string(), "1000".to_string()))
                .collect(),
        );
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    if !matches!(level, Level::None) {
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
            let req =
                http::Request::post(format!("/apis/admissionregistration.k8s.io/v1/{plural}"))
                    .header("content-type", "application/json")
                    .body(body)
                    .unwrap();
            client.request_text(req).await.unwrap();
        }
    }
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("obj".into()),
            annotations: Some([("kube-shard.io/fence".to_string(), "17/1000".to_string())].into()),
            ..ObjectMeta::default()
        },
        data: Some([("n".to_string(), "0".to_string())].into()),
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &cm).await.unwrap();
    api
}

fn fenced_update(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("fenced_update");
    for (name, level) in [
        ("no_policy", Level::None),
        ("per_object", Level::PerObject),
        ("per_object_and_per_shard", Level::Both),
    ] {
        let api = rt.block_on(setup(level));
        let pp = PatchParams::default();
        let mut n = 0u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                n += 1;
                let patch = Patch::Merge(json!({
                    "metadata": {"annotations": {"kube-shard.io/fence": "17/1000"}},
                    "data": {"n": n.to_string()},
                }));
                black_box(rt.block_on(api.patch("obj", &pp, &patch)).unwrap());
            })
        });
    }
    group.finish();
}

criterion_group!(benches, fenced_update);
criterion_main!(benches);
