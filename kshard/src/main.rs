//! `kshard`: the kube-shard command-line tool.
//!
//! Output contract (other tools parse it):
//! - `kshard hash [--key uid|namespace] [--shards S] [--json] VALUE...` prints `VALUE<TAB>hash<TAB>shard`
//!   per value (16 lowercase hex digits, no `0x`), or a JSON array of `{"value","hash","shard"}`.
//! - `kshard selector [--key uid|namespace] [--shards S] --owned LIST` prints the canonical selector for
//!   the owned shards; owning nothing exits 2.
//! - `kshard selector --check EXPR` prints the canonical form of an accepted expression, or exits 2 with
//!   the reason on stderr.
//! - `kshard testserver [--listen ADDR] [--kubeconfig-out PATH] [--shard-selector on|off]` prints
//!   `serving URL` once it listens (the kubeconfig is written before), then serves until SIGINT/SIGTERM.
//! - `kshard demo [--json] ...` runs the sharded example operator end to end; with `--json` it prints exactly
//!   one JSON object on stdout at the end (progress on stderr); exit 0 only when every invariant held.
//! - `kshard status|explain|pin|unpin|pause|resume [--kubeconfig PATH] [-n NS] [--group G] [--json]` operate
//!   a live shard group; with `--json` each prints one JSON object.
//! - `kshard bench [SCENARIO|all] [--json] [--objects N] [--replicas N] [--quick]` prints a table per
//!   scenario, or with `--json` one JSON object per scenario, one per line; exit 2 for an unknown scenario.
//!   `read` runs `kshard-bench-replica` (a second binary of this package, found beside `kshard`) as its
//!   replica processes for the memory table; without it that table is left out.
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
#![forbid(unsafe_code)]

mod bench_cmd;
mod cli;
mod demo;
mod ha_check;
mod ha_cmd;
mod operator;
mod ops;
mod testserver_cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // logs on stderr, filtered by RUST_LOG (default: warnings, and kube-shard's own info lines — but
    // only warnings for `bench`, whose in-process members would print every shard transition)
    let default = if args.is_bench() {
        "warn"
    } else {
        "warn,kube_shard=info"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
    match cli::run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kshard: {err}");
            ExitCode::from(err.exit_code())
        }
    }
}
