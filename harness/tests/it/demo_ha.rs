//! Cross-cluster Active/Standby end to end (two embedded API servers, mirror lag, a planned
//! switchover, an unplanned failover, the old Active's return, a failback).

use kube_shard_harness::demo::ha::{self, HaDemoOptions, HaDemoReport};

fn run(stall_mirror: f64) -> HaDemoReport {
    let _guard = super::serial();
    let mut o = HaDemoOptions::default();
    o.quick = true;
    o.objects = 100;
    o.stall_mirror = stall_mirror;
    let rt = super::runtime();
    let r = rt
        .block_on(ha::run(&o))
        .expect("the HA demo runs to its verdict");
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    eprintln!("demo ha (stall {stall_mirror}): {r:?}");
    r
}

/// One run of the whole scenario (lag, planned switchover, unplanned failover, the old Active's return,
/// failback) with the mirror's watch held for 2 s before the failure: every invariant holds; the planned
/// switchover and the failback lose nothing; the failover loses writes, never more than were unmirrored
/// at the failure; the old Active returns with divergent objects, which the failback pairing counts and
/// prunes. (The free-running mirror is the CLI's default, run on two real clusters by the e2e case
/// `kshard_demo_ha_on_two_real_clusters`.)
#[test]
fn the_ha_demo_with_a_held_mirror_keeps_every_invariant_and_loses_at_most_the_unmirrored() {
    let r = run(2.0);
    assert!(r.invariants_held, "{:?}", r.failures);
    assert_eq!(r.objects, 100);
    assert_eq!(r.lost_planned, Some(0), "{r:?}");
    assert_eq!(r.lost_failback, Some(0), "{r:?}");
    assert_eq!(r.divergent_objects_after_planned, Some(0), "{r:?}");
    assert_eq!(r.writes_accepted_with_lower_epoch, 0, "{r:?}");
    assert_eq!(r.two_actives_seconds, 0.0, "{r:?}");
    assert_eq!(r.old_active_admissions_after_heal, Some(0), "{r:?}");
    let (p50, p99) = (r.lag_p50_ms.unwrap(), r.lag_p99_ms.unwrap());
    assert!(r.lag_samples > 10, "{r:?}");
    assert!(0.0 <= p50 && p50 <= p99 && p99 > 0.0, "{r:?}");
    // the held watch: writes unmirrored at the failure, at least one a second old, and only those lost
    let lost = r.lost_unplanned.unwrap();
    assert!(
        lost > 0 && lost <= r.unmirrored_at_failure.unwrap(),
        "{r:?}"
    );
    assert!(
        r.oldest_unmirrored_at_failure_ms.unwrap() >= 1000.0,
        "{r:?}"
    );
    assert!(r
        .lost
        .iter()
        .all(|l| l.phase == "unplanned" && l.acked_by == "b"));
    assert!(r.divergent_objects_at_failback.unwrap() > 0, "{r:?}");
    // the Standby cannot take over before the old Active's term has certainly ended
    let failover = r.failover_seconds.unwrap();
    assert!(
        failover > r.renew_deadline_seconds && failover < 30.0,
        "{r:?}"
    );
    assert!(r.operator_status_writes > 0, "{r:?}");
    // a → b → a → b, epochs rising
    let epochs: Vec<(String, u64)> = r
        .epochs
        .iter()
        .map(|e| {
            let (c, n) = e.split_once('/').unwrap();
            (c.to_owned(), n.parse().unwrap())
        })
        .collect();
    let who: Vec<&str> = epochs.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(who, ["a", "b", "a", "b"], "{r:?}");
    assert!(epochs.windows(2).all(|w| w[0].1 < w[1].1), "{r:?}");
}

#[test]
fn contradicting_options_are_refused_before_anything_starts() {
    let mut o = HaDemoOptions::default();
    o.stall_mirror = -1.0;
    assert!(o.validate().is_err());
    o.stall_mirror = 1.0;
    o.real = Some(("a".into(), "b".into()));
    let e = o.validate().unwrap_err().to_string();
    assert!(
        e.contains("--stall-mirror needs the embedded servers"),
        "{e}"
    );
    let mut o = HaDemoOptions::default();
    o.objects = 0;
    assert!(o.validate().is_err());
}
