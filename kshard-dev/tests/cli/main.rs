//! Tests that run the built `kshard-dev` binary (one integration-test binary for the crate).

mod bench;
mod demo;
mod demo_ha;
mod testserver;

use std::process::{Command, Output};
use std::sync::Mutex;

/// The demos start replica processes with real-time leases: run them one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// `kshard-dev ARGS` (one demo at a time): its exit, the one JSON object it printed on stdout (asserted
/// to be exactly one), and its stderr.
fn one_json(args: &[&str]) -> (Output, serde_json::Value, String) {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_kshard-dev"))
        .args(args)
        .output()
        .expect("run kshard-dev");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one JSON object on stdout:\n{stdout}\n{stderr}"
    );
    let v = serde_json::from_str(lines[0]).expect("JSON");
    eprintln!("kshard-dev {args:?}: {v}");
    (out, v, stderr)
}
