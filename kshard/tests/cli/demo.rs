//! `kshard demo --json`: the main job end to end (embedded API server, replica processes, scale-up, a
//! SIGKILL under load), with the invariants read from its one JSON object.

use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// The demos start replica processes with real-time leases: run them one at a time.
pub(crate) static SERIAL: Mutex<()> = Mutex::new(());

fn demo(extra: &[&str]) -> Value {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(["demo", "--json", "--objects", "600", "--replicas", "3"])
        .args(extra)
        .output()
        .expect("run kshard demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one JSON object on stdout:\n{stdout}\n{stderr}"
    );
    let v: Value = serde_json::from_str(lines[0]).expect("JSON");
    eprintln!("kshard demo {extra:?}: {v}");
    assert!(out.status.success(), "exit {:?}: {v}\n{stderr}", out.status);
    v
}

fn common_invariants(v: &Value) {
    assert_eq!(v["replicas"], 3);
    assert_eq!(v["objects"], 600);
    assert_eq!(v["shards"], 256);
    assert_eq!(v["fence_violations"], 0, "{v}");
    assert!(v["fenced_writes"].as_u64().unwrap() > 600, "{v}");
    assert_eq!(v["unowned_shards_after_settle"], 0, "{v}");
    assert_eq!(v["unreconciled_objects"], 0, "{v}");
    assert_eq!(
        v["scale_moved_shards"], v["scale_optimal_moved_shards"],
        "{v}"
    );
    assert!(v["scale_moved_shards"].as_u64().unwrap() > 0, "{v}");
    let lease = v["lease_duration_seconds"].as_f64().unwrap();
    assert_eq!(lease, 5.0);
    let failover = v["failover_seconds"].as_f64().unwrap();
    assert!(failover >= lease && failover < 3.0 * lease, "{v}");
    let fractions = v["owned_fraction"].as_array().unwrap();
    assert_eq!(fractions.len(), 3);
    let total: f64 = fractions.iter().map(|f| f.as_f64().unwrap()).sum();
    assert!(
        (total - 1.0).abs() < 1e-3,
        "the replicas own every Widget: {v}"
    );
    assert_eq!(v["read_amplification"].as_array().unwrap().len(), 3);
    // the embedded server enforces the fence policies: it may refuse deposed members' writes, never a
    // current owner's
    let refused = &v["server_refused"];
    assert_eq!(refused["current_owner"], 0, "{v}");
    assert!(refused["deposed"].as_u64().is_some(), "{v}");
    assert_eq!(v["invariants_held"], true);
}

#[test]
fn demo_server_mode_keeps_every_invariant_and_reads_only_what_it_owns() {
    let v = demo(&[]);
    common_invariants(&v);
    assert_eq!(v["mode"], "server", "{v}");
    for a in v["read_amplification"].as_array().unwrap() {
        let a = a.as_f64().unwrap();
        assert!((0.95..=1.05).contains(&a), "read amplification {a}: {v}");
    }
}

#[test]
fn demo_with_the_gate_off_falls_back_and_keeps_every_invariant() {
    let v = demo(&["--shard-selector", "off"]);
    common_invariants(&v);
    assert_eq!(v["mode"], "fallback", "{v}");
    // every replica reads everything: about N times what it owns
    for a in v["read_amplification"].as_array().unwrap() {
        assert!(a.as_f64().unwrap() > 2.0, "{v}");
    }
}
