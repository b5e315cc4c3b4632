//! `read`: what each replica reads. N group members, each with one sharded read stream (on its own
//! client identity, so group traffic is not counted), in **server mode** (the apiserver evaluates the
//! `shardSelector`) and in **fallback** (gate off: each replica lists everything and filters locally),
//! beside the **static** baseline (the project's static mode: contiguous ranges, server filtered) and one
//! **unsharded** stock `kube_runtime::watcher` replica reading everything.
//!
//! Per replica: read amplification (distinct uids delivered ÷ the objects of the shards it owns), response
//! bytes ÷ the unsharded replica's, objects held in its store. With [`Options::replica`] set (`kshard
//! bench` sets it when `kshard-bench-replica` is built beside it), also memory per replica in server mode
//! with replicas as processes ([`crate::memory`]).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use kube::api::ListParams;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use kube_shard::{Ownership, OwnershipConfig, ShardCount, ShardKey, ShardSet, ShardedWatcher};
use kube_shard_testserver::{Scope, TestServer};
use serde_json::json;
use tokio::time::Instant;

use crate::failover::Timings;
use crate::members::{kill, start_settled, until_balanced, Member};
use crate::recovery::cluster::{self, item_resource, items, Ledger};
use crate::stats::{f2, ratio, verdict};
use crate::{BenchError, Options, Report, Table};

/// One replica's reads.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Replica {
    /// Objects of the shards it owns.
    pub owned: u64,
    /// Distinct uids delivered to it.
    pub delivered: u64,
    /// Response bytes it received.
    pub bytes: u64,
    /// Objects in its store at the end.
    pub held: u64,
}

impl Replica {
    /// Distinct uids delivered ÷ owned.
    #[must_use]
    pub fn amplification(&self) -> f64 {
        ratio(self.delivered as f64, self.owned as f64)
    }
}

/// The shard of every object, by uid.
async fn shards_of(server: &TestServer, s: ShardCount) -> Result<Vec<u32>, BenchError> {
    let list = items(server.client(cluster::WRITER))
        .list(&ListParams::default())
        .await
        .map_err(|e| BenchError::Cluster(format!("read: list: {e}")))?;
    list.items
        .iter()
        .map(|o| {
            ShardKey::Uid
                .hash_meta(&o.metadata)
                .map(|h| s.shard_of(h))
                .map_err(|e| BenchError::Cluster(format!("read: {e}")))
        })
        .collect()
}

fn owned_objects(shards: &[u32], owned: &ShardSet) -> u64 {
    shards.iter().filter(|s| owned.contains(**s)).count() as u64
}

async fn until(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
) -> Result<(), BenchError> {
    let began = Instant::now();
    while !done() {
        if began.elapsed() > limit {
            return Err(BenchError::Cluster(format!(
                "read: {what} within {limit:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// One stock `kube_runtime::watcher` reflector reading everything, until its initial list is in.
async fn unsharded(server: &TestServer, objects: usize) -> Result<Replica, BenchError> {
    let id = "unsharded-read";
    let writer = reflector::store::Writer::new(item_resource());
    let reader = writer.as_reader();
    let stream = watcher(items(server.client(id)), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    let limit = Duration::from_secs(120);
    until(limit, "the unsharded replica did not sync", || {
        reader.state().len() >= objects
    })
    .await?;
    task.abort();
    let acc = server.accounting(id);
    Ok(Replica {
        owned: objects as u64,
        delivered: acc.distinct_uids,
        bytes: acc.bytes_written,
        held: reader.state().len() as u64,
    })
}

/// Each member's reads so far.
fn reads(server: &TestServer, members: &[Member], shards: &[u32]) -> Vec<Replica> {
    members
        .iter()
        .map(|m| {
            let acc = server.accounting(&m.reader);
            Replica {
                owned: owned_objects(shards, &m.group.status().owned),
                delivered: acc.distinct_uids,
                bytes: acc.bytes_written,
                held: m.store.state().len() as u64,
            }
        })
        .collect()
}

/// N group members in one mode: each member's reads from its cold start until the group is balanced
/// and every stream synced; then what each reads in one relist (history compacted, every watch ended:
/// the relist after an apiserver outage).
async fn grouped(
    server: &TestServer,
    n: usize,
    t: Timings,
) -> Result<(Vec<Replica>, Vec<Replica>), BenchError> {
    let s = ShardCount::DEFAULT;
    let mut members = Vec::new();
    for i in 0..n {
        // a cold start that waits for every replica (as pods of one rollout): what each reads then is
        // what it owns, not a first share it hands on
        members.push(start_settled(
            server,
            &format!("member-{i}"),
            n,
            t,
            t.lease * 3,
        )?);
    }
    let limit = t.lease * 10 + Duration::from_secs(60);
    until_balanced(&members, s.get(), limit).await?;
    until(limit, "the members' streams did not initialise", || {
        members.iter().all(|m| m.stats.initialized())
    })
    .await?;
    // the last activations' barrier LISTs
    tokio::time::sleep(t.barrier + t.lease).await;
    let shards = shards_of(server, s).await?;
    let cold = reads(server, &members, &shards);
    // one relist: the resourceVersion moves on, the history is compacted, every watch ends; a relist
    // delivers at least every object a member owns
    server.reset_accounting();
    cluster::tick(server).await?;
    server.faults().compact();
    server.faults().close_watches(Scope::All);
    let owned: Vec<u64> = cold.iter().map(|r| r.owned).collect();
    until(limit, "the members did not relist", || {
        members
            .iter()
            .zip(&owned)
            .all(|(m, o)| server.accounting(&m.reader).distinct_uids >= *o)
    })
    .await?;
    tokio::time::sleep(t.lease).await;
    let relist = reads(server, &members, &shards);
    for m in members {
        kill(server, m);
    }
    Ok((cold, relist))
}

/// N static-mode replicas (contiguous ranges, server filtered).
async fn fixed(server: &TestServer, n: usize) -> Result<Vec<Replica>, BenchError> {
    let s = ShardCount::DEFAULT;
    let shards = shards_of(server, s).await?;
    let mut running = Vec::new();
    for i in 0..n as u32 {
        let ownership = Ownership::new_static(OwnershipConfig::default(), i, n as u32)
            .map_err(|e| BenchError::Library(format!("static mode: {e}")))?;
        let owned = kube_shard::ownership::static_shards(s, i, n as u32)
            .map_err(|e| BenchError::Library(format!("static mode: {e}")))?;
        let id = format!("static-{i}-read");
        let sharded = ShardedWatcher::new_with(
            items(server.client(&id)),
            watcher::Config::default(),
            ownership,
            item_resource(),
        )
        .build_reflector();
        let (stats, store, mut events) = (sharded.stats, sharded.store, sharded.events);
        let task = tokio::spawn(async move { while events.next().await.is_some() {} });
        running.push((id, owned, stats, store, task));
    }
    until(
        Duration::from_secs(120),
        "the static replicas did not sync",
        || {
            running.iter().all(|(_, owned, stats, store, _)| {
                stats.initialized() && store.state().len() as u64 >= owned_objects(&shards, owned)
            })
        },
    )
    .await?;
    let mut out = Vec::new();
    for (id, owned, _, store, task) in running {
        task.abort();
        let acc = server.accounting(&id);
        out.push(Replica {
            owned: owned_objects(&shards, &owned),
            delivered: acc.distinct_uids,
            bytes: acc.bytes_written,
            held: store.state().len() as u64,
        });
    }
    Ok(out)
}

/// Every configuration on one object count: configuration → replicas, plus the unsharded replica's
/// initial list on the same server. Configurations: `server` and `fallback` (cold start), `server
/// relist` and `fallback relist`, `static` (cold start).
pub async fn measure(
    n: usize,
    objects: usize,
    t: Timings,
) -> Result<BTreeMap<&'static str, (Vec<Replica>, Replica)>, BenchError> {
    let mut out = BTreeMap::new();
    for gate in [true, false] {
        let ledger = Ledger::default();
        let server = cluster::setup_with(objects, &ledger, gate).await?;
        let base = unsharded(&server, objects).await?;
        if gate {
            out.insert("static", (fixed(&server, n).await?, base.clone()));
        }
        let (cold, relist) = grouped(&server, n, t).await?;
        let (a, b) = if gate {
            ("server", "server relist")
        } else {
            ("fallback", "fallback relist")
        };
        out.insert(a, (cold, base.clone()));
        out.insert(b, (relist, base));
    }
    Ok(out)
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    ratio(v.iter().sum(), v.len() as f64)
}

/// The scenario.
pub fn run(opts: &Options) -> Result<Report, BenchError> {
    let rt = crate::runtime()?;
    let (t, objects) = if opts.quick {
        (Timings::quick(), 5_000)
    } else {
        (Timings::full(), 20_000)
    };
    let objects = opts.objects.unwrap_or(objects);
    let n = opts.replicas.unwrap_or(4).max(2);
    let all = rt.block_on(measure(n, objects, t))?;
    let quiet = Duration::from_secs(if opts.quick { 5 } else { 30 });
    let memory = match &opts.replica {
        Some(cmd) => Some(rt.block_on(crate::memory::measure(cmd, n, objects, t, quiet))?),
        None => None,
    };
    let mut table = Table::new(
        format!("read: N={n} replicas over {objects} objects, after sync; bytes are response bytes of the read stream alone"),
        &["mode", "amplification (mean, max)", "bytes ÷ unsharded (mean)", "× N", "held per replica (mean)", "held ÷ owned"],
    );
    let mut rows = Vec::new();
    let mut amp_server: f64 = 0.0;
    for (mode, (replicas, base)) in &all {
        let amp_mean = mean(replicas.iter().map(Replica::amplification));
        let amp_max = replicas
            .iter()
            .map(Replica::amplification)
            .fold(0.0, f64::max);
        let bytes = mean(
            replicas
                .iter()
                .map(|r| ratio(r.bytes as f64, base.bytes as f64)),
        );
        let held = mean(replicas.iter().map(|r| r.held as f64));
        let held_owned = mean(
            replicas
                .iter()
                .map(|r| ratio(r.held as f64, r.owned as f64)),
        );
        if mode.starts_with("server") {
            amp_server = amp_server.max(amp_max);
        }
        table.row(vec![
            (*mode).into(),
            format!("{}, {}", f2(amp_mean), f2(amp_max)),
            f2(bytes),
            f2(bytes * n as f64),
            format!("{held:.0}"),
            f2(held_owned),
        ]);
        rows.push(json!({
            "mode": mode, "amplification_mean": amp_mean, "amplification_max": amp_max,
            "bytes_vs_unsharded": bytes, "held_mean": held, "held_vs_owned": held_owned,
            "replicas": replicas.iter().map(|r| json!({
                "owned": r.owned, "delivered": r.delivered, "bytes": r.bytes, "held": r.held,
            })).collect::<Vec<_>>(),
            "unsharded": {"delivered": base.delivered, "bytes": base.bytes, "held": base.held},
        }));
    }
    let met = amp_server <= 1.05;
    let mut tables = vec![table];
    let mut memory_json = serde_json::Value::Null;
    let mut memory_note = "memory per replica (smaps_rollup, replicas as processes) not measured: run through `kshard-dev bench` with `kshard-bench-replica` built beside it (`cargo build -p kshard-dev`)".to_owned();
    let mut memory_met = None;
    if let Some(m) = &memory {
        let (t, j, met) = memory_table(m, n, objects);
        memory_note = format!(
            "memory per replica (server mode, object memory ÷ the unsharded replica's) ≤ 1.2/N = {}, by allocator live bytes and by RSS both: {}",
            f2(1.2 / n as f64),
            verdict(met)
        );
        tables.push(t);
        memory_json = j;
        memory_met = Some(met);
    }
    Ok(Report {
        scenario: "read",
        tables,
        notes: vec![
            format!("read amplification ≤ 1.05 in server mode, cold start and relist (max over replicas): {}", verdict(met)),
            "cold start bytes: a relist's, plus one limit=1 barrier LIST per shard (each activating shard's sub-watch LIST is its barrier; before, a targeted LIST per shard doubled them)".into(),
            "fallback lists everything and filters locally: amplification ≈ N, by design; what it holds is its own shards".into(),
            memory_note,
        ],
        json: json!({
            "scenario": "read", "replicas": n, "objects": objects, "rows": rows,
            "memory": memory_json,
            "targets_met": met && memory_met != Some(false),
        }),
    })
}

fn mib(bytes: f64) -> String {
    format!("{:.1}", bytes / (1024.0 * 1024.0))
}

/// The memory table: one row per replica process, its object memory (minus the zero-object mean of
/// its kind), and the ratio against the target `1.2 / N`.
fn memory_table(
    m: &crate::memory::Memory,
    n: usize,
    objects: usize,
) -> (Table, serde_json::Value, bool) {
    use crate::memory::{Usage, ALLOCATOR};
    let mut table = Table::new(
        format!(
            "read: memory per replica in server mode, replicas as processes (kshard-bench-replica, 2 tokio workers, {ALLOCATOR}), {objects} objects, N={n}; after sync + {} s quiet; \"objects\" = minus the same binary with zero objects",
            m.quiet.as_secs()
        ),
        &["replica", "objects held", "index copies", "threads", "RSS MiB", "RSS objects MiB", "live MiB", "live objects MiB"],
    );
    let zero = |v: &[Usage], f: fn(&Usage) -> u64| {
        v.iter().map(|u| f(u) as f64).sum::<f64>() / v.len().max(1) as f64
    };
    let (rss0, live0) = (
        zero(&m.members_zero, |u| u.rss),
        zero(&m.members_zero, |u| u.live),
    );
    let mut row = |name: String, u: &Usage, rss0: f64, live0: f64| {
        table.row(vec![
            name,
            u.held.to_string(),
            u.index_copies.to_string(),
            u.threads.to_string(),
            mib(u.rss as f64),
            mib(u.rss as f64 - rss0),
            mib(u.live as f64),
            mib(u.live as f64 - live0),
        ]);
    };
    for (i, u) in m.members.iter().enumerate() {
        row(format!("member {i}"), u, rss0, live0);
    }
    for (i, u) in m.members_zero.iter().enumerate() {
        row(format!("member {i}, zero objects"), u, rss0, live0);
    }
    let (urss0, ulive0) = (m.unsharded_zero.rss as f64, m.unsharded_zero.live as f64);
    row("unsharded".into(), &m.unsharded, urss0, ulive0);
    row(
        "unsharded, zero objects".into(),
        &m.unsharded_zero,
        urss0,
        ulive0,
    );
    let (rss, live) = (m.ratio(|u| u.rss), m.ratio(|u| u.live));
    let target = 1.2 / n as f64;
    // both: the allocator's live bytes (the objects proper) and RSS (also what malloc keeps)
    let met = live <= target && rss <= target;
    table.row(vec![
        format!("member ÷ unsharded (target ≤ 1.2/N = {})", f2(target)),
        f2(ratio(zero(&m.members, |u| u.held), m.unsharded.held as f64)),
        String::new(),
        String::new(),
        String::new(),
        format!("{} {}", f2(rss), verdict(rss <= target)),
        String::new(),
        format!("{} {}", f2(live), verdict(live <= target)),
    ]);
    let u = |u: &Usage| json!({"held": u.held, "index_copies": u.index_copies, "rss": u.rss, "anonymous": u.anonymous, "live": u.live, "threads": u.threads});
    let j = json!({
        "quiet_s": m.quiet.as_secs(), "allocator": ALLOCATOR,
        "members": m.members.iter().map(u).collect::<Vec<_>>(),
        "members_zero": m.members_zero.iter().map(u).collect::<Vec<_>>(),
        "unsharded": u(&m.unsharded), "unsharded_zero": u(&m.unsharded_zero),
        "rss_ratio": rss, "live_ratio": live, "target": target, "met": met,
    });
    (table, j, met)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn server_mode_reads_about_what_it_owns_and_fallback_reads_everything() {
        let all = measure(2, 200, Timings::quick()).await.unwrap();
        let (server, _) = &all["server relist"];
        let (fallback, _) = &all["fallback"];
        for r in server {
            assert!(
                r.owned > 0 && r.delivered == r.owned,
                "a relist reads what it owns: {server:?}"
            );
        }
        for r in fallback {
            assert!(r.delivered >= 200, "fallback lists every object: {r:?}");
        }
        for r in &all["static"].0 {
            assert_eq!(
                r.delivered, r.owned,
                "static ranges read exactly their block: {r:?}"
            );
        }
    }
}
