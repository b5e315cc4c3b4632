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

/// Thirty seeds, every fault kind drawn at random, no violation. (Seeds 9 and 19 found the singleton that
/// never restarted after its term lapsed and was renewed: `group::singleton` test
/// `cancelled_work_starts_again_when_a_lapsed_term_is_renewed`.)
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
    assert!(summary.checks >= 30 * 6);
    assert!(
        summary.violations.is_empty(),
        "violations {:?} on seeds {:?}",
        summary.violations,
        summary.failing
    );
}

/// The event log with the lines of each simulated millisecond sorted: kube-runtime's `Controller` picks
/// the reconciles due at one instant in std-`HashMap` order (a documented limit), so only the order
/// *within* an instant may differ between runs; everything else must be identical.
fn canonical(log: &[String]) -> Vec<String> {
    let mut out = log.to_vec();
    out.sort_by(|x, y| {
        let t = |l: &String| {
            l.split_whitespace()
                .next()
                .and_then(|t| t.parse::<u64>().ok())
        };
        t(x).cmp(&t(y)).then_with(|| x.cmp(y))
    });
    out
}

/// One seed run twice gives an identical event log (faults, starts, every reconcile with its member,
/// object and generation at its simulated time, every assignment version's owners), up to the order of
/// events at one simulated instant.
///
/// Ignored: it fails today. Uids, incarnations, fault choice, hook draws, stamps and (within a process) the
/// reflector store's order repeat, but the set of reconciles done at one instant does not (seed 7: at
/// 3000 ms one run reconciles `w-17`, the other `w-1`): kube-runtime's scheduler picks the next held
/// reconcile from a hashbrown set whose foldhash seed comes from the stack address, with no API to fix it.
/// See docs/testing.md, "Determinism and its limits".
#[test]
#[ignore = "kube-runtime's scheduler picks held reconciles in unseeded hash order (docs/testing.md)"]
fn one_seed_twice_gives_an_identical_event_log() {
    let opts = quick();
    let a = run_seed(7, &opts, None);
    let b = run_seed(7, &opts, None);
    let (a_log, b_log) = (canonical(&a.log), canonical(&b.log));
    assert!(a.log.len() > 20, "a real run: {} events", a.log.len());
    if a_log != b_log {
        let first = a_log
            .iter()
            .zip(&b_log)
            .position(|(x, y)| x != y)
            .unwrap_or(a_log.len().min(b_log.len()));
        panic!(
            "the logs differ at event {first} of {}/{}:\n  {:?}\n  {:?}",
            a_log.len(),
            b_log.len(),
            a_log.get(first),
            b_log.get(first)
        );
    }
    assert_eq!(a.simulated_ms, b.simulated_ms);
}

/// Run seeds `0..budget` drawing only `kinds`, with `bug` planted and without: every seed must pass
/// without it (else a catch proves nothing), and the planted run must fail on one of them. Returns how
/// many seeds it took and the violation kinds of the catch.
fn seeds_to_catch(bug: &str, kinds: &'static [&'static str], budget: u64) -> (u64, Vec<String>) {
    let clean = Options {
        kinds,
        max_faults: 3,
        ..quick()
    };
    let planted = Options {
        plant: Some(bug.to_owned()),
        ..clean.clone()
    };
    for seed in 0..budget {
        let without = run_seed(seed, &clean, None);
        assert!(
            without.findings.is_empty(),
            "seed {seed} fails without {bug}: {:?}\n  {}",
            without.findings,
            kube_shard_chaos::replay_command(&without, &clean, false)
        );
        let with = run_seed(seed, &planted, None);
        if !with.findings.is_empty() {
            let mut found: Vec<String> = with.findings.iter().map(|f| f.kind.clone()).collect();
            found.dedup();
            eprintln!(
                "{bug}: caught on seed {seed} ({} seed(s)): {found:?}; first: {}",
                seed + 1,
                with.findings[0].detail
            );
            return (seed + 1, found);
        }
    }
    panic!("{bug} not caught within {budget} seeds of {kinds:?}");
}

/// A drain that releases at once (without waiting for its requests in flight) is caught by the fence
/// oracle: slow-handoff leaves or scales up while the member's writes are unanswered.
#[test]
fn planted_skip_drain_wait_is_caught() {
    let (n, kinds) = seeds_to_catch("skip-drain-wait", &["slow-handoff"], 6);
    assert!(kinds.iter().any(|k| k == "fences"), "{kinds:?} after {n}");
}

/// A shard activated without the barrier acts on a stale cache: lagging-join's frozen Widget watch makes
/// the new owner write an older spec into a child (`regressed`).
#[test]
fn planted_skip_activation_barrier_is_caught() {
    let (n, kinds) = seeds_to_catch("skip-activation-barrier", &["lagging-join"], 30);
    assert!(
        kinds.iter().any(|k| k == "regressed"),
        "{kinds:?} after {n}"
    );
}

/// A coordinator that counts an unobserved owner gone (no wait after its Lease was deleted or claimed)
/// reassigns while the owner's requests are in flight: the fence oracle.
#[test]
fn planted_unobserved_is_gone_is_caught() {
    let (n, kinds) = seeds_to_catch("unobserved-is-gone", &["delete-lease-under-load"], 6);
    assert!(kinds.iter().any(|k| k == "fences"), "{kinds:?} after {n}");
}

/// A member that follows a lower epoch (a restored backup of the assignment) fences with it: epochs go
/// back.
#[test]
fn planted_accept_lower_epoch_is_caught() {
    let (n, kinds) = seeds_to_catch("accept-lower-epoch", &["stale-assignment"], 6);
    assert!(
        kinds.iter().any(|k| k == "fences" || k == "epochs"),
        "{kinds:?} after {n}"
    );
}

/// Library regression (found by seed 13, shrunk): a burst of 429s, then the coordinator is killed. A
/// member whose renewal returned after `missed_renewal` had already judged the renew deadline passed (a
/// slow renewal started before the deadline, or one landing exactly on it) did not count that as a gap:
/// `continuous_since` stayed empty, the member never had a lease period of continuous renewals, and as the
/// next coordinator it never took the dead one over — its shards stayed unowned for good. Fails without the
/// fix in `runtime/membership.rs` (`renewed`).
#[test]
fn a_coordinator_after_a_429_burst_still_takes_the_dead_one_over() {
    use kube_shard_chaos::fault::{Fault, Timed};
    let faults = vec![
        Timed {
            at_ms: 45_378,
            fault: Fault::ErrorBurst {
                code: 429,
                times: 29,
            },
        },
        Timed {
            at_ms: 51_197,
            fault: Fault::KillCoordinator,
        },
    ];
    let o = run_seed(13, &quick(), Some(faults));
    assert!(
        o.log.iter().any(|l| l.contains("kill m")),
        "a coordinator was killed"
    );
    assert!(o.findings.is_empty(), "{:?}", o.findings);
}

/// Five seeds with the writer only (spec changes, creates, deletes, delete + re-create) and no faults pass
/// every check. Before the group's clock judged leadership terms, the singleton never ran under the
/// simulator's clock, orphaned children were never collected, and a re-created Widget's reconcile conflicted
/// on its namesake's child forever (missed-reconcile on every seed).
#[test]
fn the_writer_alone_passes_the_oracle_on_five_seeds() {
    let opts = quick();
    for seed in 100..105 {
        let o = run_seed(seed, &opts, Some(Vec::new()));
        assert!(o.faults.is_empty());
        assert_eq!(o.checks, 6);
        assert!(
            o.simulated_ms >= 60_000,
            "ran the window: {}",
            o.simulated_ms
        );
        assert!(
            o.log.iter().filter(|l| l.contains(" reconciled ")).count() >= 20,
            "seed {seed}: the members reconciled"
        );
        assert!(o.findings.is_empty(), "seed {seed}: {:?}", o.findings);
    }
}

/// Library regression (found by seeds 0, 48, 813 and 840; this is seed 48 shrunk): a restored backup of
/// the assignment (every epoch one lower, at a higher generation), then an outage and a graceful leave.
/// The members keep the epochs they hold (a lower one is never followed), so every handoff the
/// coordinator planned at the backup's epochs waited for a release the owner never gave, until
/// `drain_stall_timeout` (60 s) cancelled it: "unsettled, shard 0 unowned" at the settle bound. Members
/// now report the shards named to them at an epoch they are past (`MemberReport::stale`) and the
/// coordinator re-grants them above it (`coordinator::stale_regrant`). Failed on every run before.
#[test]
fn a_restored_backup_of_the_assignment_settles_without_waiting_for_the_stall_timeout() {
    let faults = serde_json::from_str(
        r#"[{"at_ms":32117,"fault":{"kind":"stale-assignment"}},{"at_ms":52699,"fault":{"kind":"outage","secs":6}},{"at_ms":54794,"fault":{"kind":"leave","member":9}}]"#,
    )
    .unwrap();
    let o = run_seed(48, &quick(), Some(faults));
    assert!(o.findings.is_empty(), "{:?}", o.findings);
}

/// Library regression (seed 556 of the default options, shrunk): a leave whose handoff is slow, the
/// assignment corrupted (the heal deletes it, as an admin would), two members killed. The next
/// coordinator, which never saw the assignment, re-created it from the members' reports at once — before
/// taking the dead members over — and left out the shards a dead member held without admitting them
/// (still activating): "shard 6 dropped from its owner m0 … with neither a released ack nor a takeover
/// mark". A blind re-creation now waits until every member that stopped renewing is taken over, and
/// plans nothing until every live member applied it (`runtime/coordination.rs`,
/// `blind_rebuild_holds`). Failed on about one run in three before (the interleaving varies: see
/// docs/testing.md, determinism), so it runs three times.
#[test]
fn a_blind_re_creation_of_the_assignment_drops_no_shard_without_evidence() {
    for _ in 0..3 {
        let faults = serde_json::from_str(
            r#"[{"at_ms":33555,"fault":{"kind":"slow-handoff","leave":true,"member":10,"ms":5530}},{"at_ms":34516,"fault":{"kind":"corrupt-assignment"}},{"at_ms":35444,"fault":{"kind":"kill","member":4}},{"at_ms":50913,"fault":{"kind":"kill","member":11}}]"#,
        )
        .unwrap();
        let o = run_seed(556, &Options::default(), Some(faults));
        assert!(o.findings.is_empty(), "{:?}", o.findings);
    }
}
