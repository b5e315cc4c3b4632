//! `kube-shard-replica`: one replica of the example operator (the same start-up as `kshard operator`),
//! so the harness's tests can run replica processes without building the CLI.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use kube_shard_example_operator::run::{run, OperatorArgs, RunError};

#[derive(Debug, Parser)]
#[command(name = "kube-shard-replica")]
struct Cli {
    #[command(flatten)]
    args: OperatorArgs,
}

fn main() -> ExitCode {
    // logs on stderr (the harness sends them to the replica's log file), as `kshard operator`'s
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_shard=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    match run(Cli::parse().args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::Usage(m)) => {
            eprintln!("kube-shard-replica: {m}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("kube-shard-replica: {e}");
            ExitCode::FAILURE
        }
    }
}
