//! `handoff`: a planned move of every shard of one member (a graceful leave) under writes. Per shard,
//! the stall is the time from the old owner's last admission to the new owner's first; the API writes
//! the group makes during the handoff are counted beside those it makes at rest over as long.
//!
//! Admission is sampled every 2 ms on each member's ownership handle (the sampling step bounds the
//! stall's resolution). An admission by the new owner before the old owner's last one would be two
//! owners at once: counted as `overlaps` and reported (it must be 0).

use std::collections::BTreeMap;
use std::time::Duration;

use kube_shard::ShardCount;
use serde_json::json;
use tokio::time::Instant;

use crate::failover::Timings;
use crate::members::{kill, spawn_writer, start, until_balanced, writes, Member};
use crate::recovery::cluster::{self, Ledger};
use crate::stats::{f2, percentile};
use crate::{BenchError, Options, Report, Table};

/// What one handoff measured.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Figures {
    /// Shards moved.
    pub shards: usize,
    /// Per-shard stall, seconds.
    pub stalls: Vec<f64>,
    /// Shards admitted by the new owner before the old owner's last admission (must be 0).
    pub overlaps: usize,
    /// From the leave to the last shard admitted elsewhere, seconds.
    pub duration_s: f64,
    /// Member writes during the handoff.
    pub writes_during: u64,
    /// Member writes at rest over a window as long as the handoff.
    pub writes_at_rest: f64,
}

#[derive(Default)]
struct Track {
    last_old: Option<Instant>,
    first_new: Option<Instant>,
}

/// Sample admission until every shard of the leaver is admitted elsewhere and the leaver admits none.
async fn sample(
    leaver: &Member,
    others: &[Member],
    shards: &[u32],
    limit: Duration,
) -> Result<BTreeMap<u32, Track>, BenchError> {
    let mut track: BTreeMap<u32, Track> = shards.iter().map(|s| (*s, Track::default())).collect();
    let old = leaver.group.ownership();
    let new: Vec<_> = others.iter().map(|m| m.group.ownership()).collect();
    let began = Instant::now();
    loop {
        let now = Instant::now();
        let mut done = true;
        for (s, t) in &mut track {
            let old_admits = old.admit_shard(*s).is_ok();
            if old_admits {
                t.last_old = Some(now);
            }
            if t.first_new.is_none() && new.iter().any(|o| o.admit_shard(*s).is_ok()) {
                t.first_new = Some(now);
            }
            done &= t.first_new.is_some() && !old_admits;
        }
        if done {
            return Ok(track);
        }
        if began.elapsed() > limit {
            return Err(BenchError::Cluster(format!(
                "handoff: the leaver's shards were not all admitted elsewhere within {limit:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One handoff: `n` members, `objects` objects under writes; the non-coordinator member with the most
/// shards leaves.
pub async fn measure(n: usize, objects: usize, t: Timings) -> Result<Figures, BenchError> {
    let ledger = Ledger::default();
    let server = cluster::setup(objects, &ledger).await?;
    let s = ShardCount::DEFAULT.get();
    let mut members = Vec::new();
    for i in 0..n {
        members.push(start(&server, &format!("member-{i}"), n, t)?);
    }
    let ids: Vec<String> = members.iter().map(|m| m.identity.clone()).collect();
    let limit = t.lease * 10 + Duration::from_secs(30);
    until_balanced(&members, s, limit).await?;
    let writer = spawn_writer(&server, objects);
    // at rest, under the same writes, for a window as long as a handoff is expected to take
    let rest_window = t.lease * 2;
    let before = writes(&server, &ids);
    tokio::time::sleep(rest_window).await;
    let rest_rate = (writes(&server, &ids) - before) as f64 / rest_window.as_secs_f64();

    let Some(at) = members.iter().position(|m| !m.group.status().coordinator) else {
        return Err(BenchError::Cluster(
            "handoff: no member but the coordinator".into(),
        ));
    };
    let leaver = members.remove(at);
    let shards: Vec<u32> = leaver.group.status().owned.iter().collect();
    let before = writes(&server, &ids);
    let began = Instant::now();
    leaver.group.leave();
    let track = sample(&leaver, &members, &shards, limit).await?;
    let duration = began.elapsed();
    let writes_during = writes(&server, &ids) - before;
    writer.abort();
    let mut figures = Figures {
        shards: shards.len(),
        duration_s: duration.as_secs_f64(),
        writes_during,
        writes_at_rest: rest_rate * duration.as_secs_f64(),
        ..Figures::default()
    };
    for t in track.values() {
        let (Some(first_new), Some(last_old)) = (t.first_new, t.last_old) else {
            continue; // never admitted by the leaver while sampled: no stall to measure
        };
        if first_new <= last_old {
            figures.overlaps += 1;
        } else {
            figures.stalls.push((first_new - last_old).as_secs_f64());
        }
    }
    kill(&server, leaver);
    for m in members {
        kill(&server, m);
    }
    Ok(figures)
}

/// The scenario.
pub fn run(opts: &Options) -> Result<Report, BenchError> {
    let rt = crate::runtime()?;
    let (t, sizes) = if opts.quick {
        (Timings::quick(), vec![1_000, 5_000])
    } else {
        (Timings::full(), vec![1_000, 20_000])
    };
    let sizes = opts.objects.map_or(sizes, |o| vec![o]);
    let n = opts.replicas.unwrap_or(4).max(2);
    let mut table = Table::new(
        format!(
            "handoff: one of N={n} members leaves gracefully under ~200 writes/s; lease {:?}, drain_timeout {:?}, barrier_timeout {:?}; admission sampled every 2 ms",
            t.lease, t.renew, t.barrier
        ),
        &["objects", "shards moved", "stall p50 s", "stall p99 s", "overlaps", "handoff s", "member writes", "at rest over as long", "writes per shard above rest"],
    );
    let mut rows = Vec::new();
    let mut overlaps = 0;
    for objects in sizes {
        let f = rt.block_on(measure(n, objects, t))?;
        let p50 = percentile(&f.stalls, 50.0).unwrap_or(f64::NAN);
        let p99 = percentile(&f.stalls, 99.0).unwrap_or(f64::NAN);
        let above = (f.writes_during as f64 - f.writes_at_rest) / f.shards.max(1) as f64;
        overlaps += f.overlaps;
        table.row(vec![
            objects.to_string(),
            f.shards.to_string(),
            f2(p50),
            f2(p99),
            f.overlaps.to_string(),
            f2(f.duration_s),
            f.writes_during.to_string(),
            f2(f.writes_at_rest),
            f2(above),
        ]);
        rows.push(json!({
            "objects": objects, "shards": f.shards, "stall_p50_s": p50, "stall_p99_s": p99,
            "stalls_s": f.stalls, "overlaps": f.overlaps, "handoff_s": f.duration_s,
            "member_writes": f.writes_during, "member_writes_at_rest": f.writes_at_rest,
            "writes_per_shard_above_rest": above,
        }));
    }
    Ok(Report {
        scenario: "handoff",
        tables: vec![table],
        notes: vec![
            format!("two owners at once (new admits before the old one's last admission): {overlaps} (must be 0)"),
            "the stall includes the drain wait and the new owner's activation barrier; writes are leases, the assignment and Events".into(),
        ],
        json: json!({
            "scenario": "handoff", "replicas": n, "lease_s": t.lease.as_secs_f64(),
            "drain_timeout_s": t.renew.as_secs_f64(), "barrier_timeout_s": t.barrier.as_secs_f64(),
            "rows": rows, "overlaps": overlaps,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_graceful_leave_moves_every_shard_without_two_owners() {
        let f = measure(3, 40, Timings::quick()).await.unwrap();
        assert!(f.shards > 0);
        assert_eq!(f.overlaps, 0, "{f:?}");
        assert_eq!(f.stalls.len(), f.shards, "{f:?}");
        assert!(
            f.writes_during > 0,
            "a handoff writes the assignment: {f:?}"
        );
    }
}
