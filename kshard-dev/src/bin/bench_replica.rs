//! `kshard-bench-replica SPEC_JSON`: one replica process of `kshard-dev bench read`'s memory table (see
//! `kube_shard_bench::replica`). Not for use on its own: `kshard-dev bench` starts it, with the spec as one
//! JSON argument, and reads its status lines (JSON, one every 250 ms) until it kills it.
//!
//! Its global allocator counts bytes (`stats_alloc`), so each status line carries the allocator's live
//! bytes; the runtime has 2 worker threads, as every replica of the table.
#![forbid(unsafe_code)]

use std::alloc::System;
use std::process::ExitCode;

use kube_shard_bench::replica::{serve, ReplicaSpec};
use stats_alloc::{StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn live_bytes() -> u64 {
    let s = GLOBAL.stats();
    s.bytes_allocated.saturating_sub(s.bytes_deallocated) as u64
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
