//! `recovery`: every object needs a reconcile at once. kube-shard with N members against one stock
//! `kube_runtime` leader at concurrency 4 and at 4·N (the same total concurrency), in the same run, on
//! the embedded in-memory API server (every replica in this process, on one 2-thread runtime).
//!
//! Phases, each on a fresh server per configuration:
//!
//! - **cold start**: the replicas start and reconcile every object (a warm-up; reported for context);
//! - **burst**: an outage with compaction (the replicas partitioned from the server, a writer changes
//!   every object's spec, the history is compacted and every watch ended, then the partition heals):
//!   the time from the heal until every object has `status.observedGeneration == generation`;
//! - **no change**: the same outage without writes: reconciles run after the heal (work avoided, not a
//!   speedup);
//! - **restart**: every replica killed (tasks aborted, identity cut off), every spec changed, every
//!   replica started again: the time from the restart until every object is reconciled. A stock leader
//!   elected through a Lease would wait for the killed holder's lease to expire: modelled as a wait of
//!   `lease_duration` before it starts; kube-shard members really wait to claim their own Leases.
//!
//! The reconcile: simulated external I/O (default 5 ms; or CPU work), then a status write only when
//! `observedGeneration` is behind — kube-shard's through `FencedApi` with uid and resourceVersion
//! preconditions. Completion is tracked by a ledger of committed writes and checked on the server's own
//! store at the end of every configuration.

pub(crate) mod cluster;
mod deploy;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::time::Instant;

pub use deploy::{Side, Timings, Workload};

use crate::stats::{build_profile, f2, ratio, verdict};
use crate::{BenchError, Options, Report, Table};
use cluster::Ledger;

/// Which phases to run after the cold start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Phases {
    /// Outage with compaction and a change of every object.
    pub burst: bool,
    /// Outage with compaction and no change.
    pub no_change: bool,
    /// Kill and restart every replica after a change of every object (kube-shard members under new
    /// names, as a Deployment's pods).
    pub restart: bool,
    /// Kill and restart every kube-shard member under the same names (a StatefulSet): reported as not
    /// finished instead of failing when it does not finish within the limit.
    pub restart_same_names: bool,
}

/// One configuration's figures (seconds; `None`: not run or not finished within the limit).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Outcome {
    /// Cold start until every object was reconciled.
    pub cold: Option<f64>,
    /// Burst: heal until every object was reconciled.
    pub burst: Option<f64>,
    /// Burst: objects never reconciled (progress stopped with them behind).
    pub burst_missed: usize,
    /// Restart: objects never reconciled.
    pub restart_missed: usize,
    /// Burst: each replica's first reconcile after the heal.
    pub burst_first: Vec<f64>,
    /// Burst: CPU used from the heal until the phase ended (this process: the API server and every
    /// replica; and the rest of the machine).
    pub burst_cpu: Option<crate::cpu::CpuUse>,
    /// Burst: reconciles run from the heal until the phase ended.
    pub burst_reconciles: u64,
    /// Burst: each replica's relist (its LISTs delivered at least half its share) after the heal.
    pub burst_list: Vec<f64>,
    /// Reconciles after the no-change outage.
    pub no_change_reconciles: Option<u64>,
    /// Self-fences of kube-shard members during the no-change phase: each re-enqueues that member's
    /// owned shards when it renews again (by design), so reconciles then are not relist work.
    pub no_change_self_fences: u64,
    /// Restart until every object was reconciled.
    pub restart: Option<f64>,
    /// Restart: each replica's first reconcile after the restart.
    pub restart_first: Vec<f64>,
    /// Restart (kube-shard): seconds until a member was coordinator, until half the shards were owned
    /// again, until all were.
    pub restart_timeline: Option<[Option<f64>; 3]>,
    /// Restart under the same names until every object was reconciled.
    pub restart_same_names: Option<f64>,
    /// The limit the same-name restart did not finish within.
    pub same_names_limit: Option<f64>,
    /// The members' status at the end of the same-name restart.
    pub same_names_status: String,
    /// Objects whose status was behind on the server at the end (must be 0).
    pub unreconciled: usize,
    /// Reconciles in total.
    pub reconciles: u64,
    /// Status writes committed in total.
    pub writes: u64,
}

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

/// Run one configuration on a fresh server.
pub async fn measure(
    side: Side,
    objects: usize,
    work: Workload,
    timings: Timings,
    predicate: bool,
    phases: Phases,
) -> Result<Outcome, BenchError> {
    let ledger = Arc::new(Ledger::default());
    let how = deploy::How {
        work,
        timings,
        predicate,
    };
    let server = cluster::setup(objects, &ledger).await?;
    let limit = Duration::from_secs(60).max(Duration::from_millis(objects as u64 * 20));
    let mut out = Outcome::default();
    let mut replicas = deploy::start(side, &server, &ledger, how, 0, true).await?;
    out.cold = secs(cluster::until_reconciled(&ledger, limit).await);
    if out.cold.is_none() {
        return Err(BenchError::Cluster(format!(
            "{}: {} objects still unreconciled {limit:?} after the cold start",
            side.label(),
            ledger.pending()
        )));
    }
    // let the group settle (coordinator passes, reports) before the outages
    cluster::until_quiet(&ledger, Duration::from_secs(1), limit).await;
    let outage = Duration::from_secs(1);
    // no progress for this long (after progress began) ends a timed phase: longer than any wait of the
    // group (a takeover wave waits a lease period)
    let stall = timings.lease * 2;
    let per_replica = |n: usize| (objects as u64 / (2 * n as u64)).max(1);
    if phases.burst {
        let ids = deploy::identities(&replicas);
        let base = cluster::list_items(&server, &ids);
        cluster::outage(
            &server,
            &ids,
            outage,
            cluster::bump_all(&server, objects, 1, &ledger),
        )
        .await?;
        let healed = Instant::now();
        crate::cpu::perf_control("enable");
        let cpu = crate::cpu::CpuClock::now();
        let reconciles = ledger.reconciles();
        deploy::reset_clocks(&replicas, healed);
        let relisted =
            cluster::until_relisted(&server, &ids, &base, per_replica(ids.len()), healed, limit);
        let (done, relisted) = tokio::join!(
            cluster::until_reconciled_or_stalled(&ledger, stall, limit),
            relisted
        );
        out.burst = Some(done.secs);
        out.burst_cpu = Some(cpu.since());
        crate::cpu::perf_control("disable");
        out.burst_reconciles = ledger.reconciles() - reconciles;
        out.burst_missed = done.missed;
        out.burst_first = deploy::firsts(&replicas);
        out.burst_list = relisted
            .into_iter()
            .map(|x| x.unwrap_or(f64::NAN))
            .collect();
        cluster::until_quiet(&ledger, Duration::from_secs(1), limit).await;
    }
    if phases.no_change {
        let before = ledger.reconciles();
        let fences_before = deploy::self_fences(&replicas);
        let ids = deploy::identities(&replicas);
        let base = cluster::list_items(&server, &ids);
        cluster::outage(&server, &ids, outage, async { Ok(()) }).await?;
        // wait for every replica's relist (its watch's backoff may hold it back for seconds), then quiet
        let healed = Instant::now();
        let relisted =
            cluster::until_relisted(&server, &ids, &base, per_replica(ids.len()), healed, limit)
                .await;
        if relisted.iter().any(Option::is_none) {
            return Err(BenchError::Cluster(format!(
                "{}: not every replica relisted within {limit:?} after the no-change outage",
                side.label()
            )));
        }
        cluster::until_quiet(&ledger, Duration::from_secs(2), limit).await;
        out.no_change_reconciles = Some(ledger.reconciles() - before);
        out.no_change_self_fences = deploy::self_fences(&replicas) - fences_before;
    }
    if phases.restart_same_names {
        deploy::kill(&server, replicas).await;
        cluster::bump_all(&server, objects, 3, &ledger).await?;
        let restarted = Instant::now();
        replicas = deploy::start(side, &server, &ledger, how, 2, true).await?;
        deploy::reset_clocks(&replicas, restarted);
        let same_limit = (timings.lease + timings.grace) * 3 + Duration::from_secs(10);
        out.restart_same_names = cluster::until_reconciled(&ledger, same_limit)
            .await
            .map(|_| restarted.elapsed().as_secs_f64());
        out.same_names_status = deploy::describe(&replicas);
        if out.restart_same_names.is_none() {
            out.same_names_limit = Some(same_limit.as_secs_f64());
            // nothing else can be measured on this server: its members never rejoined
            out.unreconciled = 0;
            deploy::kill(&server, replicas).await;
            return Ok(out);
        }
    }
    if phases.restart {
        deploy::kill(&server, replicas).await;
        cluster::bump_all(&server, objects, 2, &ledger).await?;
        let restarted = Instant::now();
        if matches!(side, Side::Leader { .. }) {
            // a Lease-elected standby waits for the killed holder's lease to expire
            tokio::time::sleep(timings.lease).await;
        }
        replicas = deploy::start(side, &server, &ledger, how, 1, false).await?;
        deploy::reset_clocks(&replicas, restarted);
        let waiting = restarted.elapsed().as_secs_f64();
        let (done, timeline) = tokio::join!(
            cluster::until_reconciled_or_stalled(&ledger, stall, limit),
            restart_timeline(&replicas, restarted, limit)
        );
        out.restart_timeline = timeline;
        out.restart = Some(waiting + done.secs);
        out.restart_missed = done.missed;
        out.restart_first = deploy::firsts(&replicas);
    }
    cluster::until_quiet(&ledger, Duration::from_millis(500), limit).await;
    out.unreconciled = cluster::unreconciled_on_server(&server);
    out.reconciles = ledger.reconciles();
    out.writes = ledger.writes.load(std::sync::atomic::Ordering::Relaxed);
    deploy::kill(&server, replicas).await;
    Ok(out)
}

/// Sample the members' status every 50 ms: when one became coordinator, when half and all of the
/// shards were owned again (seconds from `since`); `None` for a leader.
async fn restart_timeline(
    replicas: &[deploy::Replica],
    since: Instant,
    limit: Duration,
) -> Option<[Option<f64>; 3]> {
    let s = kube_shard::ShardCount::DEFAULT.get() as usize;
    let mut marks = [None; 3];
    loop {
        let (coordinator, owned) = deploy::group_progress(replicas)?;
        let t = since.elapsed().as_secs_f64();
        for (i, reached) in [coordinator, owned * 2 >= s, owned >= s]
            .into_iter()
            .enumerate()
        {
            if reached && marks[i].is_none() {
                marks[i] = Some(t);
            }
        }
        if marks[2].is_some() || since.elapsed() > limit {
            return Some(marks);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn opt(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), f2)
}

fn list(v: &[f64]) -> String {
    v.iter().map(|x| f2(*x)).collect::<Vec<_>>().join(" ")
}

struct Row {
    side: Side,
    predicate: bool,
    work: Workload,
    out: Outcome,
}

/// The scenario.
pub fn run(opts: &Options) -> Result<Report, BenchError> {
    let rt = crate::runtime()?;
    rt.block_on(run_async(opts))
}

async fn run_async(opts: &Options) -> Result<Report, BenchError> {
    let objects = opts
        .objects
        .unwrap_or(if opts.quick { 2_000 } else { 10_000 });
    if objects == 0 {
        return Err(BenchError::BadOption("--objects must be at least 1".into()));
    }
    let ns: Vec<usize> = match opts.replicas {
        Some(0) => {
            return Err(BenchError::BadOption(
                "--replicas must be at least 1".into(),
            ))
        }
        Some(n) => vec![n],
        // --quick: N = 4 only (the headline), to stay within minutes
        None if opts.quick => vec![4],
        None => vec![2, 4],
    };
    let nmax = *ns.iter().max().unwrap_or(&4);
    let timings = Timings::bench();
    let io = Workload {
        io: Duration::from_millis(5),
        cpu: Duration::ZERO,
    };
    let cpu = Workload {
        io: Duration::ZERO,
        cpu: Duration::from_millis(2),
    };
    let all = Phases {
        burst: true,
        no_change: true,
        restart: true,
        restart_same_names: false,
    };
    let timed = Phases {
        no_change: false,
        ..all
    };
    let burst_only = Phases {
        burst: true,
        no_change: false,
        restart: false,
        restart_same_names: false,
    };
    let no_change_only = Phases {
        no_change: true,
        burst: false,
        ..burst_only
    };
    let same_names = Phases {
        restart_same_names: true,
        burst: false,
        ..burst_only
    };
    let mut plan: Vec<(Side, bool, Workload, Phases)> =
        vec![(Side::Leader { concurrency: 4 }, true, io, all)];
    for &n in &ns {
        plan.push((
            Side::Leader {
                concurrency: 4 * n as u16,
            },
            true,
            io,
            timed,
        ));
        plan.push((Side::Sharded { replicas: n }, true, io, all));
    }
    // the leader's burst again, right after kube-shard's largest group: a configuration costs more CPU
    // later in one process, so CPU per reconcile is compared with both of the leader's, around it
    plan.push((Side::Leader { concurrency: 4 }, true, io, burst_only));
    // a StatefulSet-style restart: every member killed, back under the same names
    plan.push((Side::Sharded { replicas: nmax }, true, io, same_names));
    // the relist difference without the generation predicate (a plain `Controller::new` user)
    plan.push((Side::Leader { concurrency: 4 }, false, io, no_change_only));
    plan.push((Side::Sharded { replicas: nmax }, false, io, no_change_only));
    // CPU-bound: capped by the machine's cores on every side
    plan.push((Side::Leader { concurrency: 4 }, true, cpu, burst_only));
    plan.push((
        Side::Leader {
            concurrency: 4 * nmax as u16,
        },
        true,
        cpu,
        burst_only,
    ));
    plan.push((Side::Sharded { replicas: nmax }, true, cpu, burst_only));
    // profiling (see `cpu::perf_control`): one side's burst alone, `leader` (concurrency 4) or `sharded`;
    // `alternate`: leader, sharded, sharded, leader in one process (does a configuration's CPU depend on
    // what ran before it in the process?)
    let leader = (Side::Leader { concurrency: 4 }, true, io, burst_only);
    let sharded = (Side::Sharded { replicas: nmax }, true, io, burst_only);
    match std::env::var("KSHARD_BENCH_BURST_ONLY").as_deref() {
        Ok("leader") => plan = vec![leader],
        Ok("sharded") => plan = vec![sharded],
        Ok("alternate") => plan = vec![leader, sharded, sharded, leader],
        Ok(other) => {
            return Err(BenchError::BadOption(format!(
                "KSHARD_BENCH_BURST_ONLY={other}: expected leader, sharded or alternate"
            )))
        }
        Err(_) => {}
    }
    let mut rows = Vec::new();
    for (side, predicate, work, phases) in plan {
        eprintln!(
            "recovery: {} ({}, {}) ...",
            side.label(),
            if predicate {
                "predicate"
            } else {
                "no predicate"
            },
            workload_label(work)
        );
        let out = measure(side, objects, work, timings, predicate, phases).await?;
        rows.push(Row {
            side,
            predicate,
            work,
            out,
        });
    }
    Ok(report(objects, &ns, timings, &rows))
}

fn workload_label(w: Workload) -> String {
    if w.cpu.is_zero() {
        format!("{} ms I/O", w.io.as_millis())
    } else {
        format!("{} ms CPU", w.cpu.as_millis())
    }
}

fn find(rows: &[Row], side: Side, predicate: bool, io: bool) -> Option<&Outcome> {
    rows.iter()
        .find(|r| r.side == side && r.predicate == predicate && r.work.cpu.is_zero() == io)
        .map(|r| &r.out)
}

fn report(objects: usize, ns: &[usize], t: Timings, rows: &[Row]) -> Report {
    let config = format!(
        "{objects} objects, 5 ms I/O per reconcile, predicate_filter(generation); lease {:?}, renew {:?}, retry {:?}, grace {:?}; in-process on a 2-thread runtime; {} build",
        t.lease, t.renew, t.retry, t.grace, build_profile()
    );
    let mut times = Table::new(
        format!("recovery: seconds until every object is reconciled — {config}"),
        &[
            "configuration",
            "cold start",
            "burst",
            "burst: missed",
            "burst: relist per replica",
            "burst: first reconcile per replica",
            "restart",
            "restart: missed",
            "restart: first reconcile per replica",
            "unreconciled at end",
        ],
    );
    for r in rows.iter().filter(|r| {
        r.predicate && r.work.cpu.is_zero() && (r.out.burst.is_some() || r.out.restart.is_some())
    }) {
        times.row(vec![
            r.side.label(),
            opt(r.out.cold),
            opt(r.out.burst),
            r.out.burst_missed.to_string(),
            list(&r.out.burst_list),
            list(&r.out.burst_first),
            opt(r.out.restart),
            r.out.restart_missed.to_string(),
            list(&r.out.restart_first),
            r.out.unreconciled.to_string(),
        ]);
    }
    let mut speed = Table::new(
        "recovery: speedup of kube-shard (leader's time ÷ kube-shard's), same run",
        &[
            "phase",
            "N",
            "vs leader c4",
            "÷ N",
            "target ÷N ≥ 0.9",
            "vs leader c4·N",
            "target > 1",
        ],
    );
    let leader4 = find(rows, Side::Leader { concurrency: 4 }, true, true);
    let mut json_speed = Vec::new();
    let mut met_all = true;
    for &n in ns {
        let ks = find(rows, Side::Sharded { replicas: n }, true, true);
        let big = find(
            rows,
            Side::Leader {
                concurrency: 4 * n as u16,
            },
            true,
            true,
        );
        for (phase, get) in [
            (
                "burst",
                (|o: &Outcome| o.burst) as fn(&Outcome) -> Option<f64>,
            ),
            ("restart", |o: &Outcome| o.restart),
        ] {
            let k = ks.and_then(get).unwrap_or(f64::NAN);
            let s4 = ratio(leader4.and_then(get).unwrap_or(f64::NAN), k);
            let sn = ratio(big.and_then(get).unwrap_or(f64::NAN), k);
            let per_n = s4 / n as f64;
            let met4 = per_n >= 0.9;
            let metn = sn > 1.0;
            if phase == "burst" && n == 4 {
                met_all &= met4 && metn;
            }
            speed.row(vec![
                phase.into(),
                n.to_string(),
                f2(s4),
                f2(per_n),
                verdict(met4).into(),
                f2(sn),
                verdict(metn).into(),
            ]);
            json_speed.push(json!({"phase": phase, "replicas": n, "vs_leader_c4": s4, "per_n": per_n, "vs_leader_c4n": sn}));
        }
    }
    let mut cpu_table = Table::new(
        format!("recovery: CPU over the burst — this process (API server and every replica) and the rest of the machine, {objects} objects"),
        &["configuration", "work", "burst s", "bench CPU s", "bench cores (CPU ÷ burst s)", "other processes' cores", "reconciles", "bench CPU ms per reconcile"],
    );
    for r in rows
        .iter()
        .filter(|r| r.predicate && r.out.burst_cpu.is_some())
    {
        let c = r.out.burst_cpu.unwrap_or_default();
        let burst = r.out.burst.unwrap_or(f64::NAN);
        cpu_table.row(vec![
            r.side.label(),
            workload_label(r.work),
            f2(burst),
            f2(c.own),
            f2(ratio(c.own, burst)),
            f2(c.other_cores()),
            r.out.burst_reconciles.to_string(),
            f2(ratio(c.own * 1000.0, r.out.burst_reconciles as f64)),
        ]);
    }
    let mut timeline = Table::new(
        format!(
            "recovery: restart timeline of kube-shard (seconds from the restart; lease {:?}, grace {:?}, dead members whose Pods were deleted are gone at once; others are taken over at most max(1, ⌈members/2⌉ − 1) per lease period)",
            t.lease, t.grace
        ),
        &["configuration", "a coordinator", "half the shards owned", "every shard owned", "first reconcile per replica", "every object reconciled"],
    );
    for r in rows.iter().filter(|r| r.out.restart_timeline.is_some()) {
        let [c, h, a] = r.out.restart_timeline.unwrap_or_default();
        timeline.row(vec![
            r.side.label(),
            opt(c),
            opt(h),
            opt(a),
            list(&r.out.restart_first),
            opt(r.out.restart),
        ]);
    }
    let mut avoided = Table::new(
        format!("recovery: reconciles after an outage with compaction and NO change ({objects} objects; work avoided, not a speedup)"),
        &["configuration", "predicate_filter(generation)", "reconciles after the relist", "÷ objects"],
    );
    for r in rows.iter().filter(|r| r.out.no_change_reconciles.is_some()) {
        let n = r.out.no_change_reconciles.unwrap_or(0);
        avoided.row(vec![
            r.side.label(),
            if r.predicate { "yes" } else { "no" }.into(),
            n.to_string(),
            f2(n as f64 / objects as f64),
        ]);
    }
    let mut cpu = Table::new(
        format!("recovery, CPU-bound: 0 ms I/O, 2 ms busy CPU per reconcile, {objects} objects, burst (seconds); on 2 cores every configuration is capped near 2×"),
        &["configuration", "burst", "speedup vs leader c4"],
    );
    let cpu4 = rows
        .iter()
        .find(|r| r.side == Side::Leader { concurrency: 4 } && !r.work.cpu.is_zero())
        .and_then(|r| r.out.burst);
    for r in rows.iter().filter(|r| !r.work.cpu.is_zero()) {
        cpu.row(vec![
            r.side.label(),
            opt(r.out.burst),
            f2(ratio(
                cpu4.unwrap_or(f64::NAN),
                r.out.burst.unwrap_or(f64::NAN),
            )),
        ]);
    }
    let mut same = Table::new(
        format!("recovery: every member killed and restarted under the SAME names (a StatefulSet), {objects} objects"),
        &["configuration", "restart (s)", "members at the end"],
    );
    for r in rows
        .iter()
        .filter(|r| r.out.restart_same_names.is_some() || r.out.same_names_limit.is_some())
    {
        same.row(vec![
            r.side.label(),
            match (r.out.restart_same_names, r.out.same_names_limit) {
                (Some(t), _) => f2(t),
                (None, Some(l)) => format!("not done after {l:.0} s"),
                _ => "-".into(),
            },
            r.out.same_names_status.clone(),
        ]);
    }
    let unreconciled: usize = rows
        .iter()
        .filter(|r| matches!(r.side, Side::Sharded { .. }))
        .map(|r| r.out.unreconciled)
        .sum();
    let leader_missed: usize = rows
        .iter()
        .filter(|r| matches!(r.side, Side::Leader { .. }))
        .map(|r| r.out.burst_missed + r.out.restart_missed)
        .sum();
    let nmax = ns.iter().copied().max().unwrap_or(1);
    let per_reconcile = |o: &Outcome| {
        o.burst_cpu
            .map_or(f64::NAN, |c| ratio(c.own, o.burst_reconciles as f64))
    };
    // the leader at concurrency 4 runs first and again right after kube-shard N = nmax: the mean of both
    let leader_cpu: Vec<f64> = rows
        .iter()
        .filter(|r| {
            r.side == Side::Leader { concurrency: 4 } && r.predicate && r.work.cpu.is_zero()
        })
        .map(|r| per_reconcile(&r.out))
        .filter(|x| !x.is_nan())
        .collect();
    let leader_cpu_mean = ratio(leader_cpu.iter().sum(), leader_cpu.len() as f64);
    let cpu_ratio = ratio(
        find(rows, Side::Sharded { replicas: nmax }, true, true).map_or(f64::NAN, per_reconcile),
        leader_cpu_mean,
    );
    let cpu_met = cpu_ratio <= 1.05;
    let notes = vec![
        format!(
            "burst, CPU per reconcile (this process: the API server and every replica): kube-shard N={nmax} ÷ the leader at concurrency 4 = {} (target ≤ 1.05): {}; the leader's is the mean of its {} burst(s) (first in the process, and again right after kube-shard N={nmax}: a configuration costs more CPU later in one process); {} build{}",
            f2(cpu_ratio),
            verdict(cpu_met),
            leader_cpu.len(),
            build_profile(),
            if cfg!(debug_assertions) {
                " — kube-shard's own code at opt-level 1 and kube-runtime's Controller at 2 lean this ratio the leader's way: compare on a release build (`cargo build --release -p kshard-dev`)"
            } else {
                ""
            }
        ),
        format!("burst at N=4: speedup ÷ N ≥ 0.9 vs the leader at concurrency 4 and > 1 vs the leader at concurrency 16: {}", verdict(met_all)),
        format!("kube-shard: objects left unreconciled on the server at the end of its configurations: {unreconciled} (must be 0); the stock leader missed {leader_missed} objects in total (see 'missed')"),
        "restart: kube-shard members come back under new names (a Deployment: the old Pods deleted, new ones created) and take the dead members' shards over once their Leases expired (lease_duration + grace): a member whose Pod is gone is gone at once, outside the takeover budget of max(1, ⌈members/2⌉ − 1) per lease period; the stock leader is modelled as waiting lease_duration for the killed holder's Lease".into(),
        "missed: objects still behind when progress stopped for 2 × lease_duration (the time is then until the last object that was reconciled); a stock Controller can miss objects after a relist: its reflector buffers the relist until InitDone, a reconcile triggered by an InitApply that starts before then reads the old object from the store, and predicate_filter(generation) lets no second trigger through".into(),
        "relist per replica: seconds from the heal until the LISTs that replica received delivered at least half its share of the objects (the server's per-identity accounting)".into(),
    ];
    let json_rows: Vec<_> = rows
        .iter()
        .map(|r| {
            json!({
                "configuration": r.side.label(), "predicate": r.predicate,
                "io_ms": r.work.io.as_millis() as u64, "cpu_ms": r.work.cpu.as_millis() as u64,
                "cold_s": r.out.cold, "burst_s": r.out.burst,
                "burst_cpu_s": r.out.burst_cpu.map(|c| c.own), "burst_other_cores": r.out.burst_cpu.map(|c| c.other_cores()), "burst_reconciles": r.out.burst_reconciles, "burst_missed": r.out.burst_missed, "restart_missed": r.out.restart_missed, "burst_first_reconcile_s": r.out.burst_first, "burst_relist_s": r.out.burst_list,
                "no_change_reconciles": r.out.no_change_reconciles, "restart_s": r.out.restart,
                "restart_first_reconcile_s": r.out.restart_first, "unreconciled": r.out.unreconciled,
                "restart_same_names_s": r.out.restart_same_names, "same_names_not_done_after_s": r.out.same_names_limit,
                "reconciles": r.out.reconciles, "writes": r.out.writes,
            })
        })
        .collect();
    Report {
        scenario: "recovery",
        tables: vec![times, speed, cpu_table, timeline, avoided, cpu, same],
        notes,
        json: json!({
            "scenario": "recovery", "objects": objects, "lease_s": t.lease.as_secs_f64(),
            "rows": json_rows, "speedups": json_speed, "targets_met": met_all,
            "build": build_profile(), "cpu_per_reconcile_vs_leader": cpu_ratio, "cpu_target_met": cpu_met,
            "unreconciled": unreconciled, "leader_missed": leader_missed,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io() -> Workload {
        Workload {
            io: Duration::from_millis(1),
            cpu: Duration::ZERO,
        }
    }

    /// A burst row that used `ms` of CPU per reconcile over 1 000 reconciles.
    fn burst_row(side: Side, ms: f64) -> Row {
        Row {
            side,
            predicate: true,
            work: io(),
            out: Outcome {
                burst: Some(1.0),
                burst_cpu: Some(crate::cpu::CpuUse {
                    wall: 1.0,
                    own: ms,
                    others: 0.0,
                }),
                burst_reconciles: 1000,
                ..Outcome::default()
            },
        }
    }

    #[test]
    fn cpu_per_reconcile_is_compared_with_the_mean_of_the_leaders_bursts_around_kube_shard() {
        let leader = Side::Leader { concurrency: 4 };
        let rows = [
            burst_row(leader, 0.20),
            burst_row(Side::Sharded { replicas: 4 }, 0.26),
            burst_row(leader, 0.30),
        ];
        let r = report(1000, &[4], deploy::Timings::bench(), &rows);
        let ratio = r.json["cpu_per_reconcile_vs_leader"].as_f64().unwrap();
        assert!((ratio - 1.04).abs() < 1e-9, "{ratio}");
        assert_eq!(r.json["cpu_target_met"], true);
        assert!(
            r.notes[0].contains("= 1.04 (target ≤ 1.05): ok"),
            "{}",
            r.notes[0]
        );
        // against the first leader burst alone it would be 1.30
        let r = report(1000, &[4], deploy::Timings::bench(), &rows[..2]);
        assert_eq!(r.json["cpu_target_met"], false);
        assert!(r.notes[0].contains("= 1.30"), "{}", r.notes[0]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_leader_reconciles_every_object_after_a_burst_and_again_after_a_plain_relist() {
        let all = Phases {
            burst: true,
            no_change: true,
            restart: false,
            restart_same_names: false,
        };
        let plain = measure(
            Side::Leader { concurrency: 4 },
            40,
            io(),
            Timings::bench(),
            false,
            all,
        )
        .await
        .unwrap();
        // (a stock Controller may miss a few objects after a relist: see the report's notes)
        assert!(
            plain.burst.is_some() && plain.burst_missed < 40,
            "{plain:?}"
        );
        // without the predicate, the relist after the compaction reconciles every object again
        assert!(plain.no_change_reconciles.unwrap() >= 40, "{plain:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn kube_shard_members_reconcile_every_object_after_a_burst_and_a_restart() {
        let phases = Phases {
            burst: true,
            no_change: true,
            restart: true,
            restart_same_names: false,
        };
        let out = measure(
            Side::Sharded { replicas: 2 },
            40,
            io(),
            Timings::bench(),
            false,
            phases,
        )
        .await
        .unwrap();
        assert!(out.burst.is_some() && out.restart.is_some(), "{out:?}");
        assert_eq!((out.burst_missed, out.restart_missed), (0, 0), "{out:?}");
        assert_eq!(out.unreconciled, 0, "{out:?}");
        assert_eq!(out.burst_first.len(), 2);
        // the index drops relisted objects at the same resourceVersion: no reconcile after a plain relist
        // (unless a member self-fenced on a loaded machine: un-fencing re-enqueues its shards by design)
        if out.no_change_self_fences == 0 {
            assert_eq!(out.no_change_reconciles, Some(0), "{out:?}");
        }
    }
}
