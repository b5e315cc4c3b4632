//! `kshard-dev bench`: parses flags, runs `kube_shard_bench` and prints its tables (or one JSON object per
//! scenario, one per line). The engine lives in the `kube-shard-bench` crate.

use std::io::Write;

use clap::Args;
use kube_shard_bench::{Options, Scenario};

use crate::DevError;

#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// The scenario: all, movement, scale, read, recovery, failover, handoff, coordination or mirror.
    #[arg(default_value = "all")]
    scenario: String,
    /// Print one JSON object per scenario (one per line) instead of tables.
    #[arg(long)]
    json: bool,
    /// Objects (recovery: default 10000, 2000 with --quick; mirror: default 10000, 1000 with --quick).
    #[arg(long)]
    objects: Option<usize>,
    /// kube-shard replicas (recovery; default: N = 2 and 4).
    #[arg(long)]
    replicas: Option<usize>,
    /// Fewer objects and repetitions, time-scaled timings (all scenarios in under 10 minutes).
    #[arg(long)]
    quick: bool,
    /// Seed of the pure scenarios' random orders and weights.
    #[arg(long, default_value = "18")]
    seed: u64,
}

pub(crate) fn run(args: &BenchArgs, out: &mut impl Write) -> Result<(), DevError> {
    let scenario: Scenario = args
        .scenario
        .parse()
        .map_err(|e: kube_shard_bench::BenchError| DevError::Usage(e.to_string()))?;
    let mut opts = Options::default();
    opts.objects = args.objects;
    opts.replicas = args.replicas;
    opts.quick = args.quick;
    opts.seed = args.seed;
    opts.replica = replica_command();
    let mut failed = None;
    let result = kube_shard_bench::run_each(scenario, &opts, |report| {
        let written = if args.json {
            serde_json::to_writer(&mut *out, &report.json)
                .map_err(DevError::from)
                .and_then(|()| writeln!(out).map_err(DevError::from))
        } else {
            write!(out, "{}", report.render())
                .and_then(|()| writeln!(out))
                .map_err(DevError::from)
        };
        let _ = out.flush();
        if let Err(e) = written {
            failed.get_or_insert(e);
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    result?;
    Ok(())
}

/// `kshard-bench-replica` beside this binary (both are built by `cargo build -p kshard-dev`), if it is there.
fn replica_command() -> Option<kube_shard_bench::memory::ReplicaCommand> {
    let exe = std::env::current_exe().ok()?;
    let path = exe.with_file_name(format!(
        "kshard-bench-replica{}",
        std::env::consts::EXE_SUFFIX
    ));
    path.is_file()
        .then(|| kube_shard_bench::memory::ReplicaCommand::new(path))
}
