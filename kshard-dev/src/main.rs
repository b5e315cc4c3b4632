//! `kshard-dev`: kube-shard's developer tool (not published; `kshard` is what users install).
//!
//! Output contract (other tools parse it):
//! - `kshard-dev demo [--json] ...` runs the sharded example operator end to end; with `--json` it prints
//!   exactly one JSON object on stdout at the end (progress on stderr); exit 0 only when every invariant
//!   held. `kshard-dev demo ha` does the same for cross-cluster Active/Standby.
//! - `kshard-dev testserver [--listen ADDR] [--kubeconfig-out PATH] [--shard-selector on|off]` prints
//!   `serving URL` once it listens (the kubeconfig is written before), then serves until SIGINT/SIGTERM.
//! - `kshard-dev bench [SCENARIO|all] [--json] [--objects N] [--replicas N] [--quick]` prints a table per
//!   scenario, or with `--json` one JSON object per scenario, one per line; exit 2 for an unknown
//!   scenario. `read` runs `kshard-bench-replica` (a second binary of this package, found beside
//!   `kshard-dev`) as its replica processes for the memory table; without it that table is left out.
//! - `kshard-dev operator ...` runs the example operator (the demo's replicas); with `--metrics-addr` its
//!   first stdout line is `metrics http://ADDR`.
//!
//! `kshard demo|testserver|bench` run this binary when it sits beside `kshard`.
//!
//! Its global allocator is jemalloc, as for the bench's replica processes (`kshard-bench-replica`): the
//! in-process benchmarks allocate and free a whole server's objects per configuration, and with glibc's
//! allocator a configuration's CPU depended on the ones run before it in the same process (the same
//! configuration ran ≈ 15 % slower in a second position); both sides of every comparison use it alike.
#![forbid(unsafe_code)]

mod bench;
mod demo;
mod testserver;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kube_shard_example_operator::run::{OperatorArgs, RunError};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// kube-shard's developer tool: the demo, the benchmarks, the embedded API server.
#[derive(Debug, Parser)]
#[command(name = "kshard-dev", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The whole thing in one command: a sharded operator on an embedded API server, scaled and killed
    /// under load, with the invariants checked.
    Demo(demo::DemoArgs),
    /// Measure kube-shard side by side with one leader, static ranges, `hash % N` and a ring (ratios,
    /// one run); see docs/performance.md.
    Bench(bench::BenchArgs),
    /// Run the in-process test API server over HTTP (KEP-5866 gate switchable) until interrupted.
    Testserver(testserver::TestserverArgs),
    /// Run the sharded example operator (Widgets): the demo starts its replicas with it.
    Operator(Box<OperatorArgs>),
}

/// A failure of a subcommand, with its exit code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DevError {
    #[error("cannot write output: {0}")]
    Io(#[from] std::io::Error),
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Demo(#[from] kube_shard_harness::DemoError),
    #[error("invariants violated: {0}")]
    InvariantsViolated(String),
    #[error("{0}")]
    Bench(#[from] kube_shard_bench::BenchError),
    #[error("{0}")]
    Operator(#[from] RunError),
    #[error("{0}")]
    Usage(String),
}

impl DevError {
    fn exit_code(&self) -> u8 {
        match self {
            DevError::Usage(_)
            | DevError::Demo(kube_shard_harness::DemoError::Options(_))
            | DevError::Operator(RunError::Usage(_)) => 2,
            _ => 1,
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // logs on stderr, filtered by RUST_LOG (default: warnings, and kube-shard's own info lines — but
    // only warnings for `bench`, whose in-process members would print every shard transition)
    let default = match cli.command {
        Command::Bench(_) => "warn",
        _ => "warn,kube_shard=info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kshard-dev: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}

fn run(cli: Cli) -> Result<(), DevError> {
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Bench(args) => bench::run(&args, &mut std::io::stdout().lock()),
        Command::Testserver(args) => testserver::run(&args, &mut std::io::stdout().lock()),
        Command::Operator(args) => Ok(kube_shard_example_operator::run::run(*args)?),
    }
}
