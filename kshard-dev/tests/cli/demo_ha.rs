//! `kshard-dev demo ha --json --quick`: the output contract (one JSON object, exit 1 when an invariant was
//! violated) shown on the lost-write oracle catching a planted loss, and bad flags refused. The
//! invariants of a clean run are asserted on the typed report in the harness crate's tests.

use std::process::{Command, Output};

use serde_json::Value;

fn run(extra: &[&str]) -> (Output, Value) {
    let args = [
        &["demo", "ha", "--json", "--quick", "--objects", "100"],
        extra,
    ]
    .concat();
    let (out, v, _) = crate::one_json(&args);
    (out, v)
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
    let out = Command::new(env!("CARGO_BIN_EXE_kshard-dev"))
        .args(args)
        .output()
        .expect("run kshard-dev demo ha");
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
