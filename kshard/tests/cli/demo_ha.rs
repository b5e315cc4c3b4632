//! `kshard demo ha --json --quick`: cross-cluster Active/Standby end to end (two embedded API servers,
//! mirror lag, a planned switchover, an unplanned failover, the old Active's return, a failback), with
//! the invariants read from its one JSON object; and the lost-write oracle shown catching a planted loss.

use std::process::{Command, Output};

use serde_json::Value;

fn run(extra: &[&str]) -> (Output, Value) {
    let _guard = crate::demo::SERIAL
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(["demo", "ha", "--json", "--quick", "--objects", "100"])
        .args(extra)
        .output()
        .expect("run kshard demo ha");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one JSON object on stdout:\n{stdout}\n{stderr}"
    );
    let v: Value = serde_json::from_str(lines[0]).expect("JSON");
    eprintln!("kshard demo ha {extra:?}: {v}");
    (out, v)
}

const FIELDS: [&str; 29] = [
    "mode",
    "namespace",
    "objects",
    "write_rate",
    "lease_duration_seconds",
    "renew_deadline_seconds",
    "lag_p50_ms",
    "lag_p99_ms",
    "lag_samples",
    "lost_planned",
    "lost_unplanned",
    "lost_failback",
    "unmirrored_at_failure",
    "oldest_unmirrored_at_failure_ms",
    "failover_seconds",
    "planned_switchover_seconds",
    "failback_switchover_seconds",
    "divergent_objects_at_failback",
    "divergent_objects_after_planned",
    "deleted_by_new_active_at_rejoin",
    "old_active_admissions_after_heal",
    "writes_acknowledged",
    "writes_refused_and_retried",
    "writes_unknown_outcome",
    "writes_accepted_with_lower_epoch",
    "two_actives_seconds",
    "epochs",
    "lost",
    "invariants_held",
];

#[test]
fn demo_ha_quick_keeps_every_invariant_and_reports_every_field() {
    let (out, v) = run(&[]);
    assert!(out.status.success(), "exit {:?}: {v}", out.status);
    for f in FIELDS {
        assert!(!v[f].is_null(), "field {f} missing or null: {v}");
    }
    assert_eq!(v["invariants_held"], true, "{v}");
    assert_eq!(v["failures"], serde_json::json!([]), "{v}");
    assert_eq!(v["objects"], 100);
    assert_eq!(v["lost_planned"], 0, "{v}");
    assert_eq!(v["lost_failback"], 0, "{v}");
    assert_eq!(v["divergent_objects_after_planned"], 0, "{v}");
    assert_eq!(v["writes_accepted_with_lower_epoch"], 0, "{v}");
    assert_eq!(v["two_actives_seconds"], 0.0, "{v}");
    assert_eq!(v["old_active_admissions_after_heal"], 0, "{v}");
    let (p50, p99) = (
        v["lag_p50_ms"].as_f64().unwrap(),
        v["lag_p99_ms"].as_f64().unwrap(),
    );
    assert!(v["lag_samples"].as_u64().unwrap() > 10, "{v}");
    assert!(0.0 <= p50 && p50 <= p99 && p99 > 0.0, "{v}");
    let lost = v["lost_unplanned"].as_u64().unwrap();
    assert!(lost <= v["unmirrored_at_failure"].as_u64().unwrap(), "{v}");
    // the Standby cannot take over before the old Active's term has certainly ended
    let failover = v["failover_seconds"].as_f64().unwrap();
    let renew = v["renew_deadline_seconds"].as_f64().unwrap();
    assert!(failover > renew && failover < 30.0, "{v}");
    assert!(v["operator_status_writes"].as_u64().unwrap() > 0, "{v}");
    // a → b → a → b, epochs rising
    let epochs: Vec<(String, u64)> = v["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let (c, n) = e.as_str().unwrap().split_once('/').unwrap();
            (c.to_owned(), n.parse().unwrap())
        })
        .collect();
    let who: Vec<&str> = epochs.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(who, ["a", "b", "a", "b"], "{v}");
    assert!(epochs.windows(2).all(|w| w[0].1 < w[1].1), "{v}");
}

/// The planted bug: one mirrored write dropped on the new Active after the planned switchover.
#[test]
fn demo_ha_lost_write_oracle_catches_a_planted_loss() {
    let (out, v) = run(&["--plant-lost-write"]);
    assert!(!out.status.success(), "a planted loss passed: {v}");
    assert_eq!(v["lost_planned"], 1, "{v}");
    assert_eq!(v["invariants_held"], false, "{v}");
    let failures = v["failures"].to_string();
    assert!(failures.contains("planned switchover"), "{v}");
    assert_eq!(v["lost"][0]["phase"], "planned", "{v}");
}

fn kshard(args: &[&str]) -> (Output, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(args)
        .output()
        .expect("run kshard demo ha");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

/// Real clusters need both kubeconfigs: one alone is a usage error (exit 2) naming the other; an
/// unreadable kubeconfig fails before anything starts, naming the file; `--stall-mirror` (testserver's
/// frozen watches) is refused on real clusters. The real run itself is the e2e case
/// `kshard_demo_ha_on_two_real_clusters`.
#[test]
fn demo_ha_real_cluster_flags_refuse_bad_input() {
    for (given, missing) in [
        ("--active-kubeconfig", "--standby-kubeconfig"),
        ("--standby-kubeconfig", "--active-kubeconfig"),
    ] {
        let (out, stdout, stderr) = kshard(&["demo", "ha", "--json", given, "/tmp/x"]);
        assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
        assert!(stderr.contains(missing), "{given} alone: {stderr}");
        assert!(stdout.trim().is_empty(), "{stdout}");
    }

    let (out, stdout, stderr) = kshard(&[
        "demo",
        "ha",
        "--json",
        "--active-kubeconfig",
        "/nonexistent/a",
        "--standby-kubeconfig",
        "/nonexistent/b",
    ]);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(v["mode"], "real", "{v}");
    assert_eq!(v["invariants_held"], false, "{v}");
    assert!(
        v["failures"]
            .to_string()
            .contains("kubeconfig /nonexistent/a"),
        "{v}"
    );

    let (out, stdout, stderr) = kshard(&[
        "demo",
        "ha",
        "--stall-mirror",
        "2",
        "--active-kubeconfig",
        "/tmp/a",
        "--standby-kubeconfig",
        "/tmp/b",
    ]);
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains("--stall-mirror needs the embedded servers"),
        "{stderr}"
    );
}

/// The mirror's watch held for 2 s before the failure: the failover loses writes, never more than were
/// unmirrored at the failure; the old Active returns with divergent objects, which the failback pairing
/// counts and prunes, and the failback still loses nothing.
#[test]
fn demo_ha_a_held_mirror_loses_at_most_what_was_unmirrored_and_fails_back_clean() {
    let (out, v) = run(&["--stall-mirror", "2"]);
    assert!(out.status.success(), "exit {:?}: {v}", out.status);
    assert_eq!(v["invariants_held"], true, "{v}");
    let lost = v["lost_unplanned"].as_u64().unwrap();
    let unmirrored = v["unmirrored_at_failure"].as_u64().unwrap();
    assert!(lost > 0 && lost <= unmirrored, "{v}");
    assert!(
        v["oldest_unmirrored_at_failure_ms"].as_f64().unwrap() >= 1000.0,
        "{v}"
    );
    assert!(v["lost"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["phase"] == "unplanned" && l["acked_by"] == "b"));
    assert!(
        v["divergent_objects_at_failback"].as_u64().unwrap() > 0,
        "{v}"
    );
    assert_eq!(v["lost_failback"], 0, "{v}");
    assert_eq!(v["two_actives_seconds"], 0.0, "{v}");
    assert_eq!(v["writes_accepted_with_lower_epoch"], 0, "{v}");
}
