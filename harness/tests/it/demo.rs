//! The main job end to end (embedded API server, replica processes, scale-up, a SIGKILL under load).

use kube_shard_harness::demo::{self, DemoOptions, DemoReport};
use kube_shard_harness::operator::ReplicaProgram;

fn run(shard_selector: bool) -> DemoReport {
    let _guard = super::serial();
    let mut o = DemoOptions::new(ReplicaProgram::new(
        env!("CARGO_BIN_EXE_kube-shard-replica"),
        &[],
    ));
    o.objects = 600;
    o.replicas = 3;
    o.shard_selector = shard_selector;
    let r = super::runtime()
        .block_on(demo::run(&o))
        .expect("the demo runs to its verdict");
    eprintln!("demo (shard selector {shard_selector}): {r:?}");
    r
}

fn common_invariants(r: &DemoReport) {
    assert!(r.invariants_held, "{:?}", r.failures);
    assert!(r.failures.is_empty());
    assert_eq!((r.replicas, r.objects, r.shards), (3, 600, 256));
    assert_eq!(r.fence_violations, 0, "{r:?}");
    assert!(r.fenced_writes > 600, "{r:?}");
    assert_eq!(r.unowned_shards_after_settle, 0, "{r:?}");
    assert_eq!(r.unreconciled_objects, 0, "{r:?}");
    assert_eq!(r.scale_moved_shards, r.scale_optimal_moved_shards, "{r:?}");
    assert!(r.scale_moved_shards > 0, "{r:?}");
    assert_eq!(r.lease_duration_seconds, 5.0);
    let lease = r.lease_duration_seconds;
    assert!(
        r.failover_seconds >= lease && r.failover_seconds < 3.0 * lease,
        "{r:?}"
    );
    assert_eq!(r.owned_fraction.len(), 3);
    let total: f64 = r.owned_fraction.iter().sum();
    assert!(
        (total - 1.0).abs() < 1e-3,
        "the replicas own every Widget: {r:?}"
    );
    assert_eq!(r.read_amplification.len(), 3);
    // the embedded server enforces the fence policies: it may refuse deposed members' writes, never a
    // current owner's
    let refused = r.server_refused.expect("counted on the embedded server");
    assert_eq!(refused.current_owner, 0, "{r:?}");
}

#[test]
fn the_demo_in_server_mode_keeps_every_invariant_and_reads_only_what_it_owns() {
    let r = run(true);
    common_invariants(&r);
    assert_eq!(r.mode, "server", "{r:?}");
    for a in &r.read_amplification {
        let a = a.expect("every replica answers");
        assert!((0.95..=1.05).contains(&a), "read amplification {a}: {r:?}");
    }
}

#[test]
fn the_demo_with_the_gate_off_falls_back_and_keeps_every_invariant() {
    let r = run(false);
    common_invariants(&r);
    assert_eq!(r.mode, "fallback", "{r:?}");
    // every replica reads everything: about N times what it owns
    for a in &r.read_amplification {
        assert!(a.expect("every replica answers") > 2.0, "{r:?}");
    }
}
