//! The HA demo (`kshard-dev demo ha`) on two real clusters: the whole demo (mirror lag, planned switchover,
//! unplanned failover through the demo's own proxies, heal, failback; Widgets and, under a label scope,
//! ConfigMaps mirrored beside the objects each cluster holds for itself) with `--active-kubeconfig` and
//! `--standby-kubeconfig`, its invariants read from its report; the lost-write oracle shown
//! catching a planted loss on real clusters; and the refusal of a pair that already holds the demo's HA
//! Lease.
//!
//! Needs `KUBECONFIG` (cluster A, the Active) and `KSHARD_E2E_PEER_KUBECONFIG` (cluster B), e.g. two
//! realkube instances. Each run uses a fresh namespace and removes its Leases and freeze at the end.

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::Api;

use crate::support::links::Cluster;
use kube_shard_harness::demo::ha::HaDemoOptions;

use crate::support::{rand_u32, report};

/// The HA demo (`kube_shard_harness::demo::ha`, as `kshard-dev demo ha --quick --objects 100
/// --active-kubeconfig A --standby-kubeconfig B` runs it), optionally with a planted lost write: whether
/// every invariant held, and the report as JSON.
async fn demo_ha(a: &Cluster, b: &Cluster, plant_lost_write: bool) -> (bool, serde_json::Value) {
    let mut o = HaDemoOptions::default();
    o.quick = true;
    o.objects = 100;
    o.real = Some((a.kubeconfig.clone(), b.kubeconfig.clone()));
    o.plant_lost_write = plant_lost_write;
    let r = kube_shard_harness::demo::ha::run(&o)
        .await
        .unwrap_or_else(|e| panic!("the HA demo did not run: {e}"));
    let v = serde_json::to_value(&r).expect("the report as JSON");
    let args = serde_json::json!({"plant_lost_write": plant_lost_write});
    report(serde_json::json!({"scenario": "demo_ha", "args": args, "result": v}));
    (r.invariants_held, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs two real clusters: KUBECONFIG and KSHARD_E2E_PEER_KUBECONFIG"]
async fn kshard_demo_ha_on_two_real_clusters() {
    let Some((a, b)) = Cluster::pair_for_scenario("kshard_demo_ha_on_two_real_clusters") else {
        return;
    };

    let (held, v) = demo_ha(&a, &b, false).await;
    assert!(held, "{v}");
    assert_eq!(v["mode"], "real", "{v}");
    assert_eq!(v["invariants_held"], true, "{v}");
    assert_eq!(v["lost_planned"], 0, "{v}");
    assert_eq!(v["lost_failback"], 0, "{v}");
    assert_eq!(v["two_actives_seconds"], 0.0, "{v}");
    assert_eq!(v["writes_accepted_with_lower_epoch"], 0, "{v}");
    assert_eq!(v["old_active_admissions_after_heal"], 0, "{v}");
    assert!(v["lag_samples"].as_u64().unwrap_or(0) > 0, "{v}");
    assert!(v["failover_seconds"].as_f64().is_some(), "{v}");
    let lost = v["lost_unplanned"].as_u64().expect("lost_unplanned");
    let unmirrored = v["unmirrored_at_failure"]
        .as_u64()
        .expect("unmirrored_at_failure");
    assert!(lost <= unmirrored, "{v}");
    assert_eq!(v["epochs"].as_array().map(Vec::len), Some(4), "{v}");
    // ConfigMaps mirrored under a label scope beside what each cluster holds for itself
    // (kube-root-ca.crt, the default ServiceAccount, another tool's ConfigMap, made before the mirror
    // started): those kept their own content through every phase, and the frozen old Active took
    // writes outside the mirror's scope while refusing one inside it
    assert_eq!(v["cluster_objects_kept"], true, "{v}");
    assert_eq!(v["freeze_kept_to_the_mirrors_scope"], true, "{v}");

    // the lost-write oracle on real clusters: one mirrored write dropped on the new Active is reported
    let (held, v) = demo_ha(&a, &b, true).await;
    assert!(!held, "a planted loss must fail the run: {v}");
    assert_eq!(v["lost_planned"], 1, "{v}");
    assert_eq!(v["invariants_held"], false, "{v}");

    // a pair already holding the demo's HA Lease (another run, or a leftover) is refused up front
    // a namespace of another demo run (the refusal looks there and in the run's own, not in other HA
    // setups' namespaces: the suite's other HA scenarios leave their `widgets-ha` Leases behind)
    let ns = format!("kshard-demo-ha-e2e{:08x}", rand_u32());
    let client = b.client().await;
    let nsapi: Api<Namespace> = Api::all(client.clone());
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    };
    nsapi
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: meta(&ns),
                ..Namespace::default()
            },
        )
        .await
        .expect("create the namespace");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    leases
        .create(
            &PostParams::default(),
            &Lease {
                metadata: meta("widgets-ha"),
                ..Lease::default()
            },
        )
        .await
        .expect("create the leftover Lease");
    let (held, v) = demo_ha(&a, &b, false).await;
    let _ = leases.delete("widgets-ha", &DeleteParams::default()).await;
    let _ = nsapi.delete(&ns, &DeleteParams::default()).await;
    assert!(!held, "{v}");
    let why = v["failures"].to_string();
    assert!(
        why.contains("already has the HA Lease") && why.contains(&ns),
        "{v}"
    );
    assert_eq!(v["lag_samples"], 0, "refused before anything ran: {v}");
}
