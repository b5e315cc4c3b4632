//! `kshard-dev demo --json`: the output contract of the main job (one JSON object on stdout, exit 0 only
//! when every invariant held). The invariants themselves are asserted on the typed report in the
//! harness crate's tests (`kube_shard_harness::demo`).

use std::process::Command;

/// The fields of the report, as they were before the scenario moved into the harness.
const FIELDS: [&str; 24] = [
    "replicas",
    "objects",
    "shards",
    "hash_key",
    "shard_selector",
    "mode",
    "owned_fraction",
    "read_amplification",
    "fence_violations",
    "fence_audit_violations",
    "fence_order_violations",
    "fence_log_violations",
    "fenced_writes",
    "server_refused",
    "unowned_shards_after_settle",
    "unreconciled_objects",
    "scale_moved_shards",
    "scale_optimal_moved_shards",
    "failover_seconds",
    "lease_duration_seconds",
    "reconciles",
    "duration_seconds",
    "invariants_held",
    "failures",
];

#[test]
fn demo_prints_one_json_object_and_exits_by_its_verdict() {
    let (out, v, stderr) =
        crate::one_json(&["demo", "--json", "--objects", "200", "--replicas", "2"]);
    for f in FIELDS {
        assert!(v.get(f).is_some(), "field {f} missing: {v}");
    }
    assert_eq!(
        (v["replicas"].clone(), v["objects"].clone()),
        (2.into(), 200.into())
    );
    assert_eq!(
        out.status.success(),
        v["invariants_held"] == true,
        "{v}\n{stderr}"
    );
    assert!(out.status.success(), "exit {:?}: {v}\n{stderr}", out.status);
    assert!(
        stderr.contains("kshard-dev demo: "),
        "progress goes to stderr: {stderr}"
    );
}

#[test]
fn demo_refuses_an_unknown_gate_word_with_exit_2() {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard-dev"))
        .args(["demo", "--shard-selector", "maybe"])
        .output()
        .expect("run kshard-dev demo");
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
}
