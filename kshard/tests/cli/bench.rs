//! `kshard bench`: the JSON contract (one object per scenario, one per line) and the exit code for a
//! scenario that does not exist or is not built.

use std::process::Command;

use serde_json::Value;

fn kshard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(args)
        .output()
        .expect("kshard runs")
}

#[test]
fn bench_scale_json_prints_one_object_with_every_configuration() {
    let out = kshard(&["bench", "scale", "--quick", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let v: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(v["scenario"], "scale");
    let rows = v["rows"].as_array().unwrap();
    assert!(rows
        .iter()
        .any(|r| r["shards"] == 4096 && r["members"] == 128));
    // every S = 4096 configuration fits the ConfigMap limit; the S = 16384 one does not
    for r in rows {
        let fits = r["shards"].as_u64().unwrap() <= 4096;
        assert_eq!(r["within_limits"].as_bool(), Some(fits), "{r}");
    }
}

#[test]
fn bench_unknown_scenario_exits_2_naming_the_scenarios() {
    let out = kshard(&["bench", "nosuch"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown scenario"), "{err}");
    for name in ["read", "handoff", "coordination"] {
        assert!(err.contains(name), "the error lists {name}: {err}");
    }
}
