//! `coordination`: what the group costs the API server at rest — write requests and response bytes
//! per member per minute — for two object counts and two group sizes. The target: writes at rest do
//! not grow with the object count (they are Lease renewals; the assignment is written only on change).
//! Writes per handoff are in the `handoff` scenario.

use std::time::Duration;

use kube_shard::ShardCount;
use serde_json::json;

use crate::failover::Timings;
use crate::members::{bytes, kill, start, until_balanced, writes};
use crate::recovery::cluster::{self, Ledger};
use crate::stats::{f2, ratio, verdict};
use crate::{BenchError, Options, Report, Table};

/// At-rest cost of one configuration.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Figures {
    /// Write requests per member per minute.
    pub writes_per_member_min: f64,
    /// All requests per member per minute.
    pub requests_per_member_min: f64,
    /// Response bytes per member per minute.
    pub bytes_per_member_min: f64,
}

/// `n` members over `objects` objects, balanced and settled, measured for `window`.
pub async fn measure(
    n: usize,
    objects: usize,
    t: Timings,
    window: Duration,
) -> Result<Figures, BenchError> {
    let ledger = Ledger::default();
    let server = cluster::setup(objects, &ledger).await?;
    let s = ShardCount::DEFAULT.get();
    let mut members = Vec::new();
    for i in 0..n {
        members.push(start(&server, &format!("member-{i}"), n, t)?);
    }
    let ids: Vec<String> = members.iter().map(|m| m.identity.clone()).collect();
    until_balanced(&members, s, t.lease * 10 + Duration::from_secs(30)).await?;
    // let the last handoff's acknowledgements and Events settle
    tokio::time::sleep(t.lease).await;
    let requests = |server: &kube_shard_testserver::TestServer| -> u64 {
        ids.iter()
            .map(|id| server.accounting(id).total_requests())
            .sum()
    };
    let (w0, b0, r0) = (
        writes(&server, &ids),
        bytes(&server, &ids),
        requests(&server),
    );
    tokio::time::sleep(window).await;
    let (w1, b1, r1) = (
        writes(&server, &ids),
        bytes(&server, &ids),
        requests(&server),
    );
    for m in members {
        kill(&server, m);
    }
    let per = |d: u64| d as f64 / n as f64 / (window.as_secs_f64() / 60.0);
    Ok(Figures {
        writes_per_member_min: per(w1 - w0),
        requests_per_member_min: per(r1 - r0),
        bytes_per_member_min: per(b1 - b0),
    })
}

/// The scenario.
pub fn run(opts: &Options) -> Result<Report, BenchError> {
    let rt = crate::runtime()?;
    let (t, window, sizes, groups) = if opts.quick {
        (
            Timings::quick(),
            Duration::from_secs(12),
            [500, 5_000],
            [4, 8],
        )
    } else {
        (
            Timings::full(),
            Duration::from_secs(60),
            [1_000, 20_000],
            [4, 16],
        )
    };
    let mut table = Table::new(
        format!(
            "coordination at rest: per member per minute over {window:?}, after balance; lease {:?}, renew every {:?}",
            t.lease, t.retry
        ),
        &["N", "objects", "writes", "requests", "response KiB", "writes ÷ fewer objects'", "target ≈ 1"],
    );
    let mut rows = Vec::new();
    let mut met_all = true;
    for n in groups {
        let mut first: Option<f64> = None;
        for objects in sizes {
            let f = rt.block_on(measure(n, objects, t, window))?;
            let base = *first.get_or_insert(f.writes_per_member_min);
            let growth = ratio(f.writes_per_member_min, base);
            // Lease renewals are periodic: allow one renewal period's jitter either way
            let met = growth <= 1.25;
            met_all &= met;
            table.row(vec![
                n.to_string(),
                objects.to_string(),
                f2(f.writes_per_member_min),
                f2(f.requests_per_member_min),
                f2(f.bytes_per_member_min / 1024.0),
                f2(growth),
                verdict(met).into(),
            ]);
            rows.push(json!({
                "replicas": n, "objects": objects,
                "writes_per_member_min": f.writes_per_member_min,
                "requests_per_member_min": f.requests_per_member_min,
                "bytes_per_member_min": f.bytes_per_member_min,
                "writes_vs_fewer_objects": growth,
            }));
        }
    }
    let renewals = 60.0 / t.retry.as_secs_f64();
    Ok(Report {
        scenario: "coordination",
        tables: vec![table],
        notes: vec![
            format!("writes at rest independent of the object count (≤ 1.25 × the smaller count's): {}", verdict(met_all)),
            format!("one Lease renewal per retry period is {renewals:.0} writes per member per minute at these timings; the coordinator also renews its own Lease, shared out over N: {renewals:.0} × (N + 1) / N"),
        ],
        json: json!({
            "scenario": "coordination", "window_s": window.as_secs_f64(),
            "lease_s": t.lease.as_secs_f64(), "retry_s": t.retry.as_secs_f64(),
            "rows": rows, "targets_met": met_all,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_settled_group_writes_only_its_renewals() {
        let t = Timings::quick();
        let f = measure(2, 20, t, Duration::from_secs(4)).await.unwrap();
        // each member's Lease, plus the coordinator's own Lease shared out over the 2 members
        let renewals = 60.0 / t.retry.as_secs_f64() * 3.0 / 2.0;
        assert!(f.writes_per_member_min > 0.0, "{f:?}");
        // renewals, plus at most a few writes more (a late Event): never a write per object
        assert!(
            f.writes_per_member_min <= renewals * 1.15,
            "{f:?} vs {renewals} renewals/min"
        );
    }
}
