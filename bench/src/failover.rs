//! `failover`: SIGKILL of one member (not the coordinator), repeated: the time until every shard it held
//! is admitted by another member, p50/p99, as a ratio to `lease_duration` and to the floor
//! `lease_duration + takeover_grace + retry_period + barrier_timeout` on a quiet collection (the issue's
//! floor: no event passes a `limit=1` barrier version there, so it once waited the barrier timeout and a
//! targeted LIST; a successor now starts a sub-watch for the shards it gains, whose consistent LIST is their
//! barrier, so a quiet failover comes in under it), or `lease_duration + takeover_grace + retry_period`
//! (plus one watch round trip) under writes.
//!
//! In process, on the embedded in-memory server: each member is a `ShardGroup` with one sharded read
//! stream (so activation waits for its barrier) whose events are drained; a kill aborts its tasks and
//! cuts its client identity off. After each repetition a fresh member (a new name, as a Deployment's
//! replacement pod) joins and the group rebalances before the next kill.

use std::time::Duration;

use kube_shard::{ShardCount, ShardSet};
use serde_json::json;
use tokio::time::Instant;

use crate::members::{kill, spawn_writer, start, until_balanced};
use crate::recovery::cluster::{self, Ledger};
use crate::stats::{f2, percentile, ratio, verdict};
use crate::{BenchError, Options, Report, Table};

/// The group's timings for this scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Timings {
    /// `lease_duration`.
    pub lease: Duration,
    /// `renew_deadline`.
    pub renew: Duration,
    /// `retry_period`.
    pub retry: Duration,
    /// `takeover_grace`.
    pub grace: Duration,
    /// The read stream's activation `barrier_timeout`.
    pub barrier: Duration,
}

impl Timings {
    /// Lease 6 s, renew 4 s, retry 0.5 s, grace 0.5 s, barrier 2 s (the library's default barrier).
    #[must_use]
    pub fn full() -> Self {
        Timings {
            lease: Duration::from_secs(6),
            renew: Duration::from_secs(4),
            retry: Duration::from_millis(500),
            grace: Duration::from_millis(500),
            barrier: Duration::from_secs(2),
        }
    }

    /// Everything scaled by 1/3 (the barrier timeout too).
    #[must_use]
    pub fn quick() -> Self {
        let f = Self::full();
        Timings {
            lease: f.lease / 3,
            renew: f.renew / 3,
            retry: f.retry / 3,
            grace: f.grace / 3,
            barrier: f.barrier / 3,
        }
    }

    /// The floor on a quiet collection.
    #[must_use]
    pub fn floor_quiet(&self) -> Duration {
        self.lease + self.grace + self.retry + self.barrier
    }

    /// The floor under writes (without the watch round trip, which is measured, not assumed).
    #[must_use]
    pub fn floor_writes(&self) -> Duration {
        self.lease + self.grace + self.retry
    }
}

/// One configuration: `reps` kills of a non-coordinator member of `n`; seconds per kill.
pub async fn measure(
    n: usize,
    objects: usize,
    reps: usize,
    t: Timings,
    writes: bool,
) -> Result<Vec<f64>, BenchError> {
    let ledger = Ledger::default();
    let server = cluster::setup(objects, &ledger).await?;
    let s = ShardCount::DEFAULT.get();
    let mut members = Vec::new();
    for i in 0..n {
        members.push(start(&server, &format!("member-{i}"), n, t)?);
    }
    let limit = t.lease * 10 + Duration::from_secs(30);
    until_balanced(&members, s, limit).await?;
    let writer = writes.then(|| spawn_writer(&server, objects));
    let mut out = Vec::new();
    for rep in 0..reps {
        let Some(victim) = members.iter().position(|m| !m.group.status().coordinator) else {
            return Err(BenchError::Cluster(
                "failover: no member but the coordinator".into(),
            ));
        };
        let victim = members.remove(victim);
        let shards: ShardSet = victim.group.status().owned;
        kill(&server, victim);
        let killed = Instant::now();
        loop {
            let covered = shards.iter().all(|x| {
                members
                    .iter()
                    .any(|m| m.group.ownership().admit_shard(x).is_ok())
            });
            if covered {
                out.push(killed.elapsed().as_secs_f64());
                break;
            }
            if killed.elapsed() > limit {
                return Err(BenchError::Cluster(format!(
                    "failover: the killed member's shards were not all admitted within {limit:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        members.push(start(&server, &format!("member-r{rep}"), n, t)?);
        until_balanced(&members, s, limit).await?;
    }
    if let Some(w) = writer {
        w.abort();
    }
    for m in members {
        kill(&server, m);
    }
    Ok(out)
}

/// The scenario.
pub fn run(opts: &Options) -> Result<Report, BenchError> {
    let rt = crate::runtime()?;
    let (t, reps, objects) = if opts.quick {
        (Timings::quick(), 5, 500)
    } else {
        (Timings::full(), 20, 2_000)
    };
    let n = opts.replicas.unwrap_or(4).max(2);
    let mut table = Table::new(
        format!(
            "failover: SIGKILL of one of N={n} members (not the coordinator), {reps} repetitions, {objects} objects; lease {:?}, grace {:?}, retry {:?}, barrier_timeout {:?}",
            t.lease, t.grace, t.retry, t.barrier
        ),
        &["collection", "p50 s", "p99 s", "p50 ÷ lease", "p99 ÷ lease", "floor s", "p99 ÷ floor", "target ≤ 1.2"],
    );
    let mut json_rows = Vec::new();
    let mut met_all = true;
    let mut quiet_p99 = f64::NAN;
    for writes in [false, true] {
        let times = rt.block_on(measure(n, objects, reps, t, writes))?;
        let p50 = percentile(&times, 50.0).unwrap_or(f64::NAN);
        let p99 = percentile(&times, 99.0).unwrap_or(f64::NAN);
        let floor = if writes {
            t.floor_writes()
        } else {
            t.floor_quiet()
        }
        .as_secs_f64();
        let lease = t.lease.as_secs_f64();
        if !writes {
            quiet_p99 = p99;
        }
        let per_floor = ratio(p99, floor);
        let met = per_floor <= 1.2;
        met_all &= met;
        table.row(vec![
            if writes {
                "under writes (~200/s)"
            } else {
                "quiet"
            }
            .into(),
            f2(p50),
            f2(p99),
            f2(ratio(p50, lease)),
            f2(ratio(p99, lease)),
            if writes {
                format!("{} (+ 1 watch round trip)", f2(floor))
            } else {
                f2(floor)
            },
            f2(per_floor),
            verdict(met).into(),
        ]);
        json_rows.push(json!({
            "writes": writes, "seconds": times, "p50_s": p50, "p99_s": p99, "floor_s": floor,
            "p99_per_floor": per_floor, "p99_per_lease": ratio(p99, lease),
        }));
    }
    Ok(Report {
        scenario: "failover",
        tables: vec![table],
        notes: vec![
            format!("failover p99 ≤ 1.2 × floor in both: {}", verdict(met_all)),
            format!(
                "quiet: the floor keeps its barrier_timeout term, but a takeover's new owner starts a sub-watch for the shards it gains, and that sub-watch's consistent LIST is their activation barrier, so a quiet failover no longer waits barrier_timeout: p99 ÷ (lease + grace + retry) = {}",
                f2(ratio(quiet_p99, t.floor_writes().as_secs_f64()))
            ),
        ],
        json: json!({
            "scenario": "failover", "replicas": n, "repetitions": reps, "objects": objects,
            "lease_s": t.lease.as_secs_f64(), "grace_s": t.grace.as_secs_f64(),
            "retry_s": t.retry.as_secs_f64(), "barrier_timeout_s": t.barrier.as_secs_f64(),
            "rows": json_rows, "targets_met": met_all,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_killed_members_shards_are_admitted_elsewhere_after_the_lease() {
        let t = Timings::quick();
        let times = measure(3, 30, 1, t, false).await.unwrap();
        assert_eq!(times.len(), 1);
        // nobody may admit a dead member's shards before its lease ran out
        assert!(times[0] >= t.lease.as_secs_f64(), "{times:?}");
    }
}
