//! `kshard`: the kube-shard command-line tool users install (it links neither the embedded API server nor
//! the benchmark engine: those are the developer tool's, `kshard-dev`).
//!
//! Output contract (other tools parse it):
//! - `kshard hash [--key uid|namespace] [--shards S] [--json] VALUE...` prints `VALUE<TAB>hash<TAB>shard`
//!   per value (16 lowercase hex digits, no `0x`), or a JSON array of `{"value","hash","shard"}`.
//! - `kshard selector [--key uid|namespace] [--shards S] --owned LIST` prints the canonical selector for
//!   the owned shards; owning nothing exits 2.
//! - `kshard selector --check EXPR` prints the canonical form of an accepted expression, or exits 2 with
//!   the reason on stderr.
//! - `kshard status|explain|pin|unpin|pause|resume [--kubeconfig PATH] [-n NS] [--group G] [--json]` operate
//!   a live shard group; with `--json` each prints one JSON object.
//! - `kshard fence-policy --resource PLURAL.GROUP [--resource ...] [--annotation KEY] [--name NAME]
//!   [--params NAMESPACE/NAME]` prints the fence ValidatingAdmissionPolicy and its binding as YAML (for
//!   `kubectl apply -f -`; with `--params` also the per-shard policy, its binding and the empty parameter
//!   ConfigMap); bad input exits 2.
//! - `kshard ha status --peer-kubeconfig P -n NS --name N --cluster-id ID --rank R [--json]` prints both
//!   clusters' HA Leases side by side (with `--json`, one object: `leases`, `active`, `limbo`, `alarm`);
//!   `kshard ha promote --force --old-active-stopped ...` prints `promoted: ...` once this cluster's HA Lease
//!   records the new epoch; refused or timed out → exit 1, bad flags → exit 2.
//! - `kshard operator ...` (hidden) runs the example operator; with `--metrics-addr` its first stdout line is
//!   `metrics http://ADDR`.
//! - `kshard demo|testserver|bench ...` (hidden) run the developer tool `kshard-dev` with the same
//!   arguments when it sits beside this binary, else exit 2 saying where the command went.
#![forbid(unsafe_code)]

mod cli;
mod dev;
mod ha_check;
mod ha_cmd;
mod operator;
mod ops;
mod status;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // logs on stderr, filtered by RUST_LOG (default: warnings, and kube-shard's own info lines)
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_shard=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        // a forwarded developer command has said why it failed
        Err(cli::CliError::Forwarded(dev::ForwardError::Exited { code, .. })) => {
            ExitCode::from(code)
        }
        Err(err) => {
            eprintln!("kshard: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}
