//! `chaos`: run seeded fault schedules against a simulated kube-shard group and report violations.

use std::time::{Duration, Instant};

use clap::Parser;
use kube_shard_chaos::fault::Timed;
use kube_shard_chaos::{
    replay, replay_command, run_many, run_seed, shrink, world, Options, Outcome, Replay,
};

#[derive(Debug, Parser)]
#[command(name = "chaos", about = "Deterministic fault simulator for kube-shard")]
struct Args {
    /// How many seeds.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    seed_start: u64,
    /// Members at the start (3–6).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=6))]
    members: u64,
    /// OS threads running seeds.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Print the summary (and failing seeds) as JSON.
    #[arg(long)]
    json: bool,
    /// Simulated seconds of faults per seed (≤ 600).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(15..=600))]
    window: u64,
    /// Widgets at the start of each seed (≤ 300).
    #[arg(long, default_value_t = 40, value_parser = clap::value_parser!(u64).range(1..=300))]
    objects: u64,
    /// Replay this fault list (JSON, as printed for a failing seed) instead of the seed's own.
    #[arg(long)]
    faults: Option<String>,
    /// Plant one of the library's fault points (`kube_shard::testing::faults`).
    #[arg(long)]
    plant: Option<String>,
    /// Re-runs allowed to shrink each failing seed's fault list (0: no shrinking).
    #[arg(long, default_value_t = 24)]
    shrink: usize,
    /// Print each seed's event log (faults, starts, reconciles, assignment versions).
    #[arg(long)]
    log: bool,
    /// Print each seed's whole trace: the event log and every API request and answer, in order.
    #[arg(long)]
    trace: bool,
    /// At most this many faults per seed.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=64))]
    max_faults: u64,
    /// Draw only these fault kinds (comma-separated, as the summary names them).
    #[arg(long, value_delimiter = ',')]
    kinds: Vec<String>,
    /// Run each seed this many times in this one process, one after the other, and print where a run's
    /// trace first differs from the seed's first run (exact replay inside one process).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    repeat: u64,
}

fn main() {
    let args = Args::parse();
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_timer(SimTime)
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    match replay() {
        Replay::Exact => {}
        Replay::Unsupported => eprintln!("chaos: {}", Replay::Unsupported.message()),
        Replay::Broken(why) => {
            eprintln!("{why}");
            std::process::exit(2);
        }
    }
    if let Some(p) = &args.plant {
        let names = kube_shard_chaos::plant::names();
        if !names.contains(&p.as_str()) {
            eprintln!("chaos: no fault point {p:?} (available: {names:?})");
            std::process::exit(2);
        }
    }
    let mut kinds: Vec<&'static str> = Vec::new();
    for k in &args.kinds {
        match kube_shard_chaos::fault::KINDS.iter().find(|n| *n == k) {
            Some(n) => kinds.push(n),
            None => {
                eprintln!(
                    "chaos: no fault kind {k:?} (kinds: {:?})",
                    kube_shard_chaos::fault::KINDS
                );
                std::process::exit(2);
            }
        }
    }
    if kinds.is_empty() {
        kinds = kube_shard_chaos::fault::default_kinds().to_vec();
    }
    let opts = Options {
        kinds: Vec::leak(kinds),
        max_faults: args.max_faults as usize,
        members: args.members as usize,
        objects: args.objects as usize,
        window: Duration::from_secs(args.window),
        plant: args.plant.clone(),
        ..Options::default()
    };
    let started = Instant::now();
    if args.repeat > 1 {
        let mut differ = false;
        for seed in args.seed_start..args.seed_start + args.seeds {
            let first = run_seed(seed, &opts, None);
            for n in 2..=args.repeat {
                let again = run_seed(seed, &opts, None);
                match first_difference(&first.log, &again.log) {
                    None => println!(
                        "seed {seed}: run {n} traces as run 1 ({})",
                        again.trace_digest
                    ),
                    Some(d) => {
                        differ = true;
                        println!(
                            "seed {seed}: run {n} ({}) differs from run 1 ({}): {d}",
                            again.trace_digest, first.trace_digest
                        );
                    }
                }
            }
        }
        std::process::exit(i32::from(differ));
    }
    if let Some(text) = &args.faults {
        let faults: Vec<Timed> = match serde_json::from_str(text) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("chaos: --faults is not a fault list: {e}");
                std::process::exit(2);
            }
        };
        let o = run_seed(args.seed_start, &opts, Some(faults));
        print_log(&o, &args);
        if args.json {
            let v = serde_json::json!({ "seeds": [seed_json(&o)], "failing": o.findings });
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        } else {
            print_outcome(&o, &opts, &args);
        }
        std::process::exit(i32::from(!o.findings.is_empty()));
    }
    let failed = std::sync::Mutex::new(Vec::<Outcome>::new());
    let seeds = std::sync::Mutex::new(Vec::<serde_json::Value>::new());
    let summary = run_many(args.seed_start, args.seeds, args.jobs, &opts, |o| {
        print_log(o, &args);
        seeds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(seed_json(o));
        if !o.findings.is_empty() {
            failed
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(o.clone());
        }
    });
    let mut failed = failed.into_inner().unwrap_or_else(|e| e.into_inner());
    failed.sort_by_key(|o| o.seed);
    let mut shrunk = Vec::new();
    for o in &failed {
        let s = if args.shrink > 0 && o.faults.len() > 1 {
            shrink(&opts, o, args.shrink)
        } else {
            o.clone()
        };
        if !args.json {
            print_outcome(o, &opts, &args);
            if s.faults.len() < o.faults.len() {
                println!(
                    "  shrunk to {} fault(s): {}",
                    s.faults.len(),
                    replay_command(&s, &opts, true)
                );
            }
        }
        shrunk.push(s);
    }
    let wall = started.elapsed();
    if args.json {
        let mut seeds = seeds.into_inner().unwrap_or_else(|e| e.into_inner());
        seeds.sort_by_key(|s| s["seed"].as_u64());
        let v = serde_json::json!({
            "seeds": seeds,
            "summary": summary,
            "wall_seconds": wall.as_secs_f64(),
            "failing": failed.iter().zip(&shrunk).map(|(o, s)| serde_json::json!({
                "seed": o.seed,
                "findings": o.findings,
                "replay": replay_command(o, &opts, false),
                "shrunk_faults": s.faults,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!(
            "chaos: {} schedules, {:.2} simulated hours, {} checks, {} violation(s) {:?}, in {:.1} s",
            summary.schedules,
            summary.simulated_hours,
            summary.checks,
            summary.violations.values().sum::<u64>(),
            summary.violations,
            wall.as_secs_f64()
        );
        println!("faults by kind: {:?}", summary.faults);
    }
    std::process::exit(i32::from(!failed.is_empty()));
}

/// Tracing lines stamped with the seed's simulated ms (as the event log is), not the host's clock.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match world::sim_ms() {
            Some(ms) => write!(w, "{ms:>9}"),
            None => write!(w, "{:>9}", "-"),
        }
    }
}

fn print_outcome(o: &Outcome, opts: &Options, args: &Args) {
    if o.findings.is_empty() {
        println!(
            "seed {} ok ({} faults, trace {})",
            o.seed,
            o.faults.len(),
            o.trace_digest
        );
        return;
    }
    let kinds: Vec<&str> = o.findings.iter().map(|f| f.kind.as_str()).collect();
    println!(
        "seed {} FAILED {kinds:?}: {} — replay: {} (trace {})",
        o.seed,
        o.findings[0].detail,
        replay_command(o, opts, args.faults.is_some()),
        o.trace_digest
    );
}

/// `--log`: the events; `--trace`: everything, requests included. On standard error, one seed at a time.
fn print_log(o: &Outcome, args: &Args) {
    if !(args.log || args.trace) {
        return;
    }
    let mut out = String::new();
    for l in &o.log {
        if args.trace || !world::is_request_line(l) {
            out.push_str(&format!("seed {} {l}\n", o.seed));
        }
    }
    eprint!("{out}");
}

/// Where two traces first differ (`None`: equal).
fn first_difference(a: &[String], b: &[String]) -> Option<String> {
    if a == b {
        return None;
    }
    let i = a
        .iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len()));
    Some(format!(
        "line {i} of {}/{}:\n  {:?}\n  {:?}",
        a.len(),
        b.len(),
        a.get(i),
        b.get(i)
    ))
}

fn seed_json(o: &Outcome) -> serde_json::Value {
    serde_json::json!({
        "seed": o.seed,
        "trace_digest": o.trace_digest,
        "ok": o.findings.is_empty(),
    })
}
