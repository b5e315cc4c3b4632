//! `kshard demo|bench|testserver` are the developer tool's: without `kshard-dev` beside `kshard` they
//! exit 2 and say where the command went.

use std::process::Command;

#[test]
fn a_developer_command_without_kshard_dev_beside_says_where_it_went() {
    let dir = tempfile::tempdir().unwrap();
    let alone = dir.path().join("kshard");
    std::fs::copy(env!("CARGO_BIN_EXE_kshard"), &alone).unwrap();
    for command in ["demo", "bench", "testserver"] {
        let out = Command::new(&alone)
            .args([command, "--json"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{command}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("cargo run -p kshard-dev -- {command}")),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    }
}
