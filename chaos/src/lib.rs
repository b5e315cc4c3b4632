//! A deterministic fault simulator for kube-shard.
//!
//! Each seed builds a world — testserver (seeded uids) and 3–6 members, each the example operator
//! (`kube-shard-example-operator`) on a `ShardGroup`, every task of a member under one pause/kill switch,
//! its clocks driven by simulated time — runs a writer and a seeded schedule of faults on a current-thread
//! runtime in paused time, heals, and judges the run with the safety oracles (`kube_shard::testing::oracles`) and the
//! settle checks. [`run_many`] spreads seeds over OS threads; [`shrink`] cuts a failing fault list down.
//!
//! Exact replay (`docs/testing.md`, "Determinism"): each seed runs on a fresh OS thread whose std hash keys
//! (kube-runtime's scheduler and `FutureHashMap`), tokio seed and thread-local draws follow the seed
//! (`kube-shard-chaos-entropy`, Linux with glibc), every `select!` on its path is `biased;`, and
//! testserver's wall clock starts at a fixed epoch: a seed's trace and its digest repeat in any process,
//! alone or in a batch. Not frozen by a pause: kube's client buffer task and the Controller's scheduler
//! (only what the member's spawner started and the futures the simulator holds are).
#![forbid(unsafe_code)]

pub mod check;
pub mod fault;
pub mod inject;
pub mod plant;
pub mod rng;
pub mod sim;
pub mod switch;
pub mod world;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

pub use sim::{digest, replay, run_seed, Options, Outcome, Replay};

/// What a batch of seeds did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// Schedules run.
    pub schedules: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Simulated time, hours.
    pub simulated_hours: f64,
    /// Oracle checks run.
    pub checks: u64,
    /// Violations, by kind.
    pub violations: BTreeMap<String, u64>,
    /// The seeds that failed, in order.
    pub failing: Vec<u64>,
}

impl Summary {
    /// Count one seed's outcome in.
    pub fn add(&mut self, o: &Outcome) {
        self.schedules += 1;
        for t in &o.faults {
            *self.faults.entry(t.fault.kind().to_owned()).or_default() += 1;
        }
        self.simulated_hours += o.simulated_ms as f64 / 3_600_000.0;
        self.checks += o.checks as u64;
        for f in &o.findings {
            *self.violations.entry(f.kind.clone()).or_default() += 1;
        }
        if !o.findings.is_empty() {
            self.failing.push(o.seed);
            self.failing.sort_unstable();
        }
    }
}

/// Run seeds `start .. start + n` on `jobs` OS threads (each seed on its own current-thread runtime);
/// `each` sees every outcome as it ends (in completion order). Returns the summary.
pub fn run_many(
    start: u64,
    n: u64,
    jobs: usize,
    opts: &Options,
    each: impl Fn(&Outcome) + Send + Sync,
) -> Summary {
    let next = AtomicU64::new(start);
    let summary = Mutex::new(Summary::default());
    let each = Arc::new(each);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::SeqCst);
                if seed >= start + n {
                    return;
                }
                let o = run_seed(seed, opts, None);
                each(&o);
                summary.lock().unwrap_or_else(|e| e.into_inner()).add(&o);
            });
        }
    });
    summary.into_inner().unwrap_or_else(|e| e.into_inner())
}

/// A shorter fault list for failing `seed` that still fails with a violation of the same kind as the
/// first one of `failing`: drop halves, then single faults, while the failure stays (at most `budget`
/// re-runs). Returns the list and the outcome of its last failing run.
#[must_use]
pub fn shrink(opts: &Options, failing: &Outcome, budget: usize) -> Outcome {
    let Some(kind) = failing.findings.first().map(|f| f.kind.clone()) else {
        return failing.clone();
    };
    let mut best = failing.clone();
    let mut runs = 0;
    let mut chunk = best.faults.len().div_ceil(2).max(1);
    while chunk >= 1 && runs < budget {
        let mut i = 0;
        let mut progressed = false;
        while i < best.faults.len() && runs < budget {
            let mut trial = best.faults.clone();
            let end = (i + chunk).min(trial.len());
            trial.drain(i..end);
            runs += 1;
            let o = run_seed(failing.seed, opts, Some(trial));
            if o.findings.iter().any(|f| f.kind == kind) {
                best = o;
                progressed = true;
            } else {
                i += chunk;
            }
        }
        if !progressed {
            if chunk == 1 {
                break;
            }
            chunk = chunk.div_ceil(2);
        }
    }
    best
}

/// The command that replays `o` (with its fault list when `faults` is given).
#[must_use]
pub fn replay_command(o: &Outcome, opts: &Options, faults: bool) -> String {
    let mut cmd = format!(
        "cargo run -p kube-shard-chaos --release -- --seeds 1 --seed-start {} --members {}",
        o.seed, opts.members
    );
    if let Some(p) = &opts.plant {
        cmd.push_str(&format!(" --plant {p}"));
    }
    let d = Options::default();
    if opts.window != d.window {
        cmd.push_str(&format!(" --window {}", opts.window.as_secs()));
    }
    if opts.objects != d.objects {
        cmd.push_str(&format!(" --objects {}", opts.objects));
    }
    if opts.max_faults != d.max_faults {
        cmd.push_str(&format!(" --max-faults {}", opts.max_faults));
    }
    if !opts.kinds.is_empty() {
        cmd.push_str(&format!(" --kinds {}", opts.kinds.join(",")));
    }
    if faults {
        let json = serde_json::to_string(&o.faults).unwrap_or_default();
        cmd.push_str(&format!(" --faults '{json}'"));
    }
    cmd
}
