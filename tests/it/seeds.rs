//! Seeded runs of paused-time scenarios: a scenario takes the testserver seed (uids and `generateName`
//! suffixes, hence shard placement), a failure names its seed, and `KUBE_SHARD_SEED=<n>` replays one.
//!
//! The seed fixes what the testserver draws. The library's incarnations, tokio's `select!` order and
//! backoff jitter stay random, so a replay is the same placement, not always the same interleaving.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The seeds to run: `KUBE_SHARD_SEED` when set, else `default`.
pub(crate) fn seeds(default: &[u64]) -> Vec<u64> {
    match std::env::var("KUBE_SHARD_SEED") {
        Ok(v) => vec![v
            .trim()
            .parse()
            .expect("KUBE_SHARD_SEED is an unsigned integer")],
        Err(_) => default.to_vec(),
    }
}

/// The seeds of a sweep: `KUBE_SHARD_SEEDS=<from>..<to>` (end excluded), else `default`.
pub(crate) fn sweep(default: std::ops::Range<u64>) -> std::ops::Range<u64> {
    let Ok(v) = std::env::var("KUBE_SHARD_SEEDS") else {
        return default;
    };
    let (from, to) = v
        .split_once("..")
        .expect("KUBE_SHARD_SEEDS is <from>..<to>");
    let parse = |t: &str| {
        t.trim()
            .parse()
            .expect("KUBE_SHARD_SEEDS bounds are integers")
    };
    parse(from)..parse(to)
}

/// Run `scenario(seed)` on a fresh paused-time runtime (what `#[tokio::test(start_paused = true)]` builds);
/// returns the panic message when it failed.
pub(crate) fn try_run<F, Fut>(seed: u64, scenario: F) -> Result<(), String>
where
    F: FnOnce(u64) -> Fut,
    Fut: Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    catch_unwind(AssertUnwindSafe(|| rt.block_on(scenario(seed)))).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic without a message".to_owned())
    })
}

/// Run `scenario` for every seed of [`seeds`]`(default)`; a failure names its seed and how to replay it.
pub(crate) fn run<F, Fut>(name: &str, default: &[u64], scenario: F)
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = ()>,
{
    for seed in seeds(default) {
        if let Err(msg) = try_run(seed, &scenario) {
            panic!("{name}: seed {seed} failed (replay with KUBE_SHARD_SEED={seed}): {msg}");
        }
    }
}
