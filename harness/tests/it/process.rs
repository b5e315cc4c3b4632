//! The replica-process launcher: the start-up contract, a failed start, signals.

use std::time::Duration;

use kube_shard_harness::process::{Launch, ProcessError, ProcessSignal, ReplicaProcess};

fn dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kshard-harness-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[tokio::test]
async fn a_process_whose_first_line_is_not_the_metrics_endpoint_did_not_start() {
    let log = dir().join("not-ready.log");
    let launch = Launch::new("/bin/sh").args(["-c", "echo hello; sleep 5"]);
    let e = ReplicaProcess::start("p", &launch, &log, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, ProcessError::NotReady { first: Some(l), .. } if l == "hello"),
        "{e}"
    );
}

#[tokio::test]
async fn a_started_process_names_its_endpoint_and_leaves_on_sigterm() {
    let log = dir().join("ready.log");
    let launch = Launch::new("/bin/sh").args([
        "-c",
        "trap 'exit 7' TERM; echo to-log >&2; echo 'metrics http://127.0.0.1:1'; while :; do sleep 0.05; done",
    ]);
    let mut p = ReplicaProcess::start("p", &launch, &log, Duration::from_secs(5))
        .await
        .expect("starts");
    assert_eq!(p.metrics_addr(), Some("127.0.0.1:1"));
    p.signal(ProcessSignal::STOP).unwrap();
    p.signal(ProcessSignal::CONT).unwrap();
    let status = p.terminate(Duration::from_secs(5)).await.expect("exits");
    assert_eq!(status.code(), Some(7));
    assert!(std::fs::read_to_string(&log).unwrap().contains("to-log"));
}

#[tokio::test]
async fn a_missing_program_is_a_spawn_error_naming_it() {
    let log = dir().join("missing.log");
    let launch = Launch::new("/nonexistent/kube-shard-replica");
    let e = ReplicaProcess::start("p", &launch, &log, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("/nonexistent/kube-shard-replica"),
        "{e}"
    );
}
