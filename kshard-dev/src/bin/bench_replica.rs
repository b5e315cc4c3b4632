//! `kshard-bench-replica SPEC_JSON`: one replica process of `kshard-dev bench read`'s memory table (see
//! `kube_shard_bench::replica`). Not for use on its own: `kshard-dev bench` starts it, with the spec as one
//! JSON argument, and reads its status lines (JSON, one every 250 ms) until it kills it.
//!
//! Its global allocator is jemalloc with its background purge thread (what we recommend for an operator
//! binary: RSS follows the live bytes down after the cold start's peak, where glibc keeps the peak), and
//! each status line carries jemalloc's live bytes (`stats.allocated`); the runtime has 2 worker threads,
//! as every replica of the table, sharded or not.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use kube_shard_bench::replica::{serve, ReplicaSpec};
use tikv_jemalloc_ctl::{background_thread, epoch, stats};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The bytes the program holds (jemalloc's `stats.allocated`, refreshed).
fn live_bytes() -> u64 {
    let _ = epoch::advance();
    stats::allocated::read().map_or(0, |b| b as u64)
}

fn main() -> ExitCode {
    let Some(arg) = std::env::args().nth(1) else {
        eprintln!("usage: kshard-bench-replica SPEC_JSON (started by `kshard-dev bench read`)");
        return ExitCode::from(2);
    };
    let spec: ReplicaSpec = match serde_json::from_str(&arg) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kshard-bench-replica: bad spec: {e}");
            return ExitCode::from(2);
        }
    };
    // purge freed pages in the background (jemalloc's decay, 10 s by default), also while the process
    // is idle: what the cold start's peak leaves free goes back to the system
    if let Err(e) = background_thread::write(true) {
        eprintln!("kshard-bench-replica: jemalloc background thread: {e}");
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("kshard-bench-replica: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(spec, live_bytes, std::io::stdout())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kshard-bench-replica: {e}");
            ExitCode::FAILURE
        }
    }
}
