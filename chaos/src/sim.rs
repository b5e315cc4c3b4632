//! One seed: a world, its schedule of faults, the writer, the settle bound and the oracle.

use std::sync::OnceLock;
use std::time::Duration;

use kube_shard_chaos_entropy as entropy;

use serde::Serialize;

use crate::check::{self, Finding};
use crate::fault::Fault;
use crate::fault::{self, Shape, Timed};
use crate::inject;
use crate::rng::Rng;
use crate::world::{World, LEASE, MARGIN, RENEW, RETRY};

/// How a run is shaped.
#[derive(Clone, Debug)]
pub struct Options {
    /// Members at the start (3–6 in the issue).
    pub members: usize,
    /// Widgets created at the start (the writer adds and removes some; at most `max_objects`).
    pub objects: usize,
    /// The writer never grows the Widgets beyond this.
    pub max_objects: usize,
    /// How long faults are injected (≤ 10 simulated minutes).
    pub window: Duration,
    /// At most this many faults per schedule.
    pub max_faults: usize,
    /// After the faults: the bound within which the group must settle.
    pub settle: Duration,
    /// The fault point to plant (`kube_shard::testing::faults`).
    pub plant: Option<String>,
    /// Draw only these fault kinds (`fault::KINDS`); empty: every kind.
    pub kinds: &'static [&'static str],
    /// Mixed into the stream a seed's thread draws its std hash keys from (0, the default: the seed's
    /// own); tokio's runtime seed stays the seed's. The same seed with another salt orders kube-runtime's
    /// held reconciles differently: the determinism test's control.
    pub hash_salt: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            members: 3,
            objects: 40,
            max_objects: 300,
            window: Duration::from_secs(120),
            max_faults: 8,
            settle: Duration::from_secs(60),
            plant: None,
            kinds: &[],
            hash_salt: 0,
        }
    }
}

impl Options {
    /// The fault schedule's shape.
    #[must_use]
    pub fn shape(&self) -> Shape {
        Shape {
            window: self.window,
            max_faults: self.max_faults,
            lease: LEASE,
            renew_deadline: RENEW,
            retry: RETRY,
            fence_margin: MARGIN,
            kinds: self.kinds,
        }
    }
}

/// What one seed did.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// The faults injected.
    pub faults: Vec<Timed>,
    /// What the oracle found.
    pub findings: Vec<Finding>,
    /// Simulated time, ms.
    pub simulated_ms: u64,
    /// Oracle checks run.
    pub checks: usize,
    /// FNV-1a 64 of the trace ([`digest`]): two runs with the same digest did the same thing in the
    /// same order. Empty when the seed did not run.
    pub trace_digest: String,
    /// The trace, in order: every API request as it arrives (`>`: identity, verb, path and query, body
    /// digest) and its answer (`<`: status), every fault, member start, kill, reconcile and assignment
    /// version, then the count of entropy draws (what `CHAOS_FENCES` / `CHAOS_LEASES` add comes after it and
    /// is not digested: fence ids come from a process-wide counter). Lease and assignment writes are its `PUT`s.
    #[serde(skip)]
    pub log: Vec<String>,
}

/// Whether a seed's run repeats exactly (see [`replay`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Every hash key and random draw of a seed's thread follows the seed: the same seed gives the same
    /// trace, in any process, alone or in a batch.
    Exact,
    /// No override on this platform (not Linux with glibc): the simulator runs, but std's hash keys are
    /// the OS's, so kube-runtime's pick among held reconciles differs from run to run.
    Unsupported,
    /// Something exact replay needs is missing (it says what): seeds refuse to run rather than pretend
    /// to replay.
    Broken(&'static str),
}

impl Replay {
    /// What to tell the user.
    #[must_use]
    pub fn message(self) -> &'static str {
        match self {
            Replay::Exact => {
                "exact replay: every seed's hash keys and random draws follow the seed"
            }
            Replay::Unsupported => {
                "no exact replay on this platform (it needs Linux with glibc): a seed's faults and \
                 writes repeat, the order of kube-runtime's held reconciles does not"
            }
            Replay::Broken(why) => why,
        }
    }
}

/// This process's replay status. The first call fixes the process-wide keys (ahash's, drawn once per
/// process, and the testserver's tables) from a constant stream on a thread of their own, before any seed
/// runs, so they are the same in every process whichever seed comes first.
pub fn replay() -> Replay {
    static STATUS: OnceLock<Replay> = OnceLock::new();
    *STATUS.get_or_init(|| {
        struct Fixed;
        impl ahash::random_state::RandomSource for Fixed {
            fn gen_hasher_seed(&self) -> usize {
                0x5eed
            }
        }
        // every ahash map (kube's reflector store) hashes with the fixed keys and this per-map seed; it
        // fails only when a map was built before, with keys from elsewhere
        let ahash_fresh = ahash::random_state::set_random_source(Fixed).is_ok();
        let prepared = std::thread::spawn(|| {
            let _ = entropy::seed_thread(PROCESS_KEYS);
            let _ = ahash::RandomState::new();
            kube_shard_testserver::init_process_tables();
            // the CEL parser's process-wide caches: a fence-key-skew seed posts these policies, and the
            // first parse of an expression in a process creates hash maps on the parsing thread (moving its
            // hash keys on) that later parses do not — so a seed that parsed them first in its process
            // would order held reconciles differently from the same seed run after it
            let policies: Vec<serde_json::Value> = crate::world::fence_policy_set()
                .policies
                .iter()
                .filter_map(|p| serde_json::to_value(p).ok())
                .collect();
            kube_shard_testserver::warm_admission(&policies);
        })
        .join()
        .is_ok();
        if !prepared {
            Replay::Broken("chaos: building the process-wide tables panicked; refusing to run")
        } else if !cfg!(tokio_unstable) {
            Replay::Broken(
                "chaos: built without `--cfg tokio_unstable` (the workspace's .cargo/config.toml sets it; \
                 a RUSTFLAGS variable replaces it): tokio's runtime seed cannot be fixed, so no seed \
                 would replay; refusing to run",
            )
        } else if !ahash_fresh {
            Replay::Broken(
                "chaos: this process built an ahash map before the simulator fixed ahash's keys \
                 (call kube_shard_chaos::replay() first): stores would iterate differently in each \
                 process; refusing to run",
            )
        } else if entropy::interposed() {
            Replay::Exact
        } else if cfg!(all(target_os = "linux", target_env = "gnu")) {
            Replay::Broken(
                "chaos: the getrandom override (kube-shard-chaos-entropy) is not reached in this \
                 process: std's hash keys come from the kernel, so no seed would replay; refusing to run",
            )
        } else {
            Replay::Unsupported
        }
    })
}

/// The stream the process-wide keys are drawn from.
const PROCESS_KEYS: u64 = 0x0005_EED0_0000_0001;

/// The stream a seed's thread draws its keys from: the seed's own, or another one for the same seed
/// (`Options::hash_salt`, the determinism test's control).
fn thread_keys(seed: u64, salt: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.rotate_left(17) ^ salt
}

/// Run seed `seed` (with its own schedule, or `faults` when given: replay and shrinking) on a **fresh OS
/// thread** with a current-thread runtime in paused time. Before anything on that thread builds a map, its
/// hash keys are drawn from the seed, and every thread-local source (the library's draws, kube's backoff
/// jitter, planted-bug switches) is seeded there: the same seed gives the same trace in any process, alone
/// or in a batch (on Linux with glibc; see [`replay`]).
#[must_use]
pub fn run_seed(seed: u64, opts: &Options, faults: Option<Vec<Timed>>) -> Outcome {
    if let Replay::Broken(why) = replay() {
        return refused(seed, faults, "no-exact-replay", why);
    }
    let keys = thread_keys(seed, opts.hash_salt);
    let fallback = faults.clone();
    std::thread::scope(|s| {
        s.spawn(|| {
            match entropy::seed_thread(keys) {
                Ok(()) | Err(entropy::SeedError::Unsupported) => {}
                Err(e) => return refused(seed, faults, "no-exact-replay", &format!("chaos: {e}")),
            }
            run_on_this_thread(seed, opts, faults)
        })
        .join()
    })
    .unwrap_or_else(|p| refused(seed, fallback, "panic", &panic_text(p.as_ref())))
}

/// A seed that did not run to its end: `kind` says why (a panic, or no exact replay).
fn refused(seed: u64, faults: Option<Vec<Timed>>, kind: &str, why: &str) -> Outcome {
    Outcome {
        seed,
        faults: faults.unwrap_or_default(),
        findings: vec![Finding {
            kind: kind.into(),
            detail: why.to_owned(),
        }],
        simulated_ms: 0,
        checks: 0,
        trace_digest: String::new(),
        log: Vec::new(),
    }
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

fn run_on_this_thread(seed: u64, opts: &Options, faults: Option<Vec<Timed>>) -> Outcome {
    let mut rng = Rng::new(seed);
    let faults = faults.unwrap_or_else(|| fault::schedule(&mut rng, &opts.shape()));
    // the library's randomness (incarnations, Event names, jitter) and kube's backoff jitter
    kube_shard::rt::seed_thread(seed);
    fastrand::seed(seed);
    let planted = crate::plant::switch_on(opts.plant.as_deref());
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // the order a `watch` change wakes its waiters in, and any unbiased `select!`, follow the seed (not the
    // hash salt: the control varies std's keys alone)
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(
        &thread_keys(seed, 0).to_le_bytes(),
    ));
    let rt = builder.build().expect("a current-thread runtime");
    let run = {
        let (opts, faults) = (opts.clone(), faults.clone());
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(simulate(seed, &opts, &faults, rng))
        }))
    };
    drop(rt);
    crate::plant::switch_off(planted);
    kube_shard::rt::unseed_thread();
    match run {
        Ok((findings, simulated_ms, checks, mut log, traced)) => {
            let traced = traced.min(log.len());
            log.insert(traced, format!("entropy draws {}", entropy::draws()));
            Outcome {
                seed,
                faults,
                findings,
                simulated_ms,
                checks,
                trace_digest: digest(&log[..=traced]),
                log,
            }
        }
        Err(p) => refused(seed, Some(faults), "panic", &panic_text(p.as_ref())),
    }
}

/// FNV-1a 64 of the trace's lines, each ended by a newline, in order: 16 hex digits.
#[must_use]
pub fn digest(trace: &[String]) -> String {
    use kube_shard::hash::{FNV_OFFSET_BASIS, FNV_PRIME};
    // streamed: the trace runs to megabytes, and `fnv1a64` takes one slice
    let mut h = FNV_OFFSET_BASIS;
    for line in trace {
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h = (h ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
    }
    format!("{h:016x}")
}

async fn simulate(
    seed: u64,
    opts: &Options,
    faults: &[Timed],
    mut rng: Rng,
) -> (Vec<Finding>, u64, usize, Vec<String>, usize) {
    let mut w = World::new(seed).await;
    check::record(&w.server);
    // only the seeds that skew a fence-parameter key run with the per-shard fence level: it refuses the
    // late writes the fence oracle is there to see
    if faults
        .iter()
        .any(|t| matches!(t.fault, Fault::FenceKeySkew { .. }))
    {
        w.fence_policy_on().await;
    }
    inject::seed_widgets(&w, opts.objects).await;
    for _ in 0..opts.members {
        let n = w.fresh_name();
        w.spawn(&n);
    }
    let window_ms = u64::try_from(opts.window.as_millis()).unwrap_or(u64::MAX);
    let mut next = faults.iter().peekable();
    let mut writer_at = 2_000;
    loop {
        let fault_at = next.peek().map(|t| t.at_ms);
        let writer = (writer_at < window_ms).then_some(writer_at);
        let at = match (fault_at, writer) {
            (None, None) => break,
            (Some(f), Some(x)) => f.min(x),
            (Some(f), None) => f,
            (None, Some(x)) => x,
        };
        tokio::time::sleep(Duration::from_millis(at.saturating_sub(w.now_ms()))).await;
        if Some(at) == fault_at {
            let t = next.next().expect("peeked");
            inject::apply(&mut w, &t.fault).await;
        } else {
            inject::write_step(&w, &mut rng, opts.max_objects).await;
            writer_at = w.now_ms() + rng.range(300, 3_000);
        }
    }
    tokio::time::sleep(Duration::from_millis(window_ms.saturating_sub(w.now_ms()))).await;
    // faults stop: heal, bring the group back to its size, then the settle bound
    tokio::time::sleep(Duration::from_secs(2)).await;
    inject::heal(&w).await;
    while w.live().len() < opts.members {
        let n = w.fresh_name();
        w.spawn(&n);
    }
    let mut findings = std::mem::take(&mut w.findings);
    findings.extend(settle(&w, opts.settle).await);
    let (safety, checks) = check::safety(&w);
    findings.extend(safety);
    log_assignments(&w);
    // what CHAOS_FENCES / CHAOS_LEASES add is for reading, not the trace: fence ids come from a
    // process-wide counter
    let traced = w.log.lock().unwrap_or_else(|e| e.into_inner()).len();
    log_debug(&w);
    for m in &w.members {
        m.switch.kill();
    }
    let log = std::mem::take(&mut *w.log.lock().unwrap_or_else(|e| e.into_inner()));
    (findings, w.now_ms(), checks + 2, log, traced)
}

/// Wait up to `bound` for the settle checks to pass; what is still wrong at the bound.
async fn settle(w: &World, bound: Duration) -> Vec<Finding> {
    let start = tokio::time::Instant::now();
    loop {
        match check::settled(w) {
            Ok(_) => {
                w.note(format!("settled after {} ms", start.elapsed().as_millis()));
                return Vec::new();
            }
            Err(f) if start.elapsed() >= bound => return f,
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn log_assignments(w: &World) {
    let h = check::ownership_history(&w.server);
    for a in h.assignments {
        let owners: Vec<String> = a
            .shards
            .iter()
            .map(|(s, o)| match o.move_id {
                Some(m) => format!("{s}:{}~{m}", o.owner.name),
                None => format!("{s}:{}", o.owner.name),
            })
            .collect();
        w.note(format!("assignment rv={} {}", a.rv, owners.join(",")));
    }
}

/// `CHAOS_FENCES=1`: every fence and fenced request; `CHAOS_LEASES=1`: Lease versions and member states.
fn log_debug(w: &World) {
    if std::env::var_os("CHAOS_FENCES").is_some() {
        let fh = w.fences.history();
        for f in &fh.fences {
            w.note(format!(
                "fence #{} {} shard {} epoch {} issued {}us valid_until {}us dropped {}us",
                f.id, f.member, f.shard, f.epoch, f.issued, f.valid_until, f.dropped
            ));
        }
        for r in &fh.requests {
            w.note(format!(
                "request #{} fence #{} uid {:?} sent {}us ended {}us",
                r.id, r.fence, r.uid, r.sent, r.ended
            ));
        }
    }
    if std::env::var_os("CHAOS_LEASES").is_some() {
        for m in w.live().into_iter().map(|i| &w.members[i]) {
            let st = m.handle.status();
            w.note(format!(
                "member {} gc_passes={} gc_collected={} term={} reconciles={} errors={} fence_refused={} self_fenced={} generation={}",
                m.name,
                m.gc.passes.get(),
                m.gc.collected.get(),
                m.gc.term.get(),
                m.metrics.reconciles.get(),
                m.metrics.errors.get(),
                m.metrics.fence_refused.get(),
                st.self_fenced,
                st.generation
            ));
        }
        for m in w.live().into_iter().map(|i| &w.members[i]) {
            w.note(format!("status {} {:?}", m.name, m.handle.status()));
        }
        for c in w
            .server
            .history()
            .of(&kube_shard_testserver::ResourceFilter::resource("leases")
                .namespace(crate::world::CP_NS)
                .name(format!("{}-coordinator", crate::world::GROUP)))
        {
            w.note(format!(
                "coordinator lease rv={} by {} {:?} {}",
                c.resource_version,
                c.identity,
                c.change,
                c.object.pointer("/spec").cloned().unwrap_or_default()
            ));
        }
        // every committed assignment version in full: who wrote it (the restorer's too), its generation, and
        // per shard the owner's incarnation, epoch and handoff
        for c in
            w.server.history().of(
                &kube_shard_testserver::ResourceFilter::resource("configmaps")
                    .namespace(crate::world::CP_NS)
                    .name(format!("{}-assignment", crate::world::GROUP)),
            )
        {
            let text = c
                .object
                .pointer(&format!(
                    "/data/{}",
                    kube_shard::group::assignment::DATA_KEY
                ))
                .and_then(|v| v.as_str())
                .map(str::to_owned);
            let decoded = text.as_deref().map(|t| {
                kube_shard::group::assignment::Assignment::decode(
                    t,
                    crate::world::shards(),
                    kube_shard::ShardKey::Uid,
                )
            });
            let body = match decoded {
                None => "(no text)".to_owned(),
                Some(Err(e)) => format!("(undecodable: {e})"),
                Some(Ok(a)) => {
                    let shards: Vec<String> = a
                        .view
                        .shards
                        .iter()
                        .map(|(s, e)| {
                            let h = match &e.handoff {
                                kube_shard::group::assignment::Handoff::Stable => String::new(),
                                kube_shard::group::assignment::Handoff::Moving { id, to } => {
                                    format!(" moving#{id}->{to}")
                                }
                                kube_shard::group::assignment::Handoff::Draining { id, to } => {
                                    format!(" draining#{id}->{to}")
                                }
                                other => format!(" {other:?}"),
                            };
                            format!("{s}:{}@{}{h}", e.owner, e.epoch)
                        })
                        .collect();
                    format!("gen={} {}", a.view.generation, shards.join(","))
                }
            };
            w.note(format!(
                "assignment version rv={} by {} {:?} {}",
                c.resource_version,
                c.identity,
                c.change,
                if c.deleted() {
                    "(deleted)".to_owned()
                } else {
                    body
                }
            ));
        }
        // every member Lease version's report: what each member said it applied, saw and held
        for c in w
            .server
            .history()
            .of(&kube_shard_testserver::ResourceFilter::resource("leases")
                .namespace(crate::world::CP_NS))
        {
            let ann = c.object.pointer("/metadata/annotations");
            let text = |k: &str| ann.and_then(|a| a.get(k)).and_then(|v| v.as_str());
            let Some(report) = text(kube_shard::group::report::REPORT).and_then(|t| {
                kube_shard::group::report::MemberReport::decode(t, crate::world::shards()).ok()
            }) else {
                continue;
            };
            w.note(format!(
                "report rv={} {}/{} applied={} seen={} admitted={} serving={} kept={} stale={} leaving={}",
                c.resource_version,
                c.name,
                text(kube_shard::group::report::INCARNATION).unwrap_or_default(),
                report.applied_generation,
                report.seen_generation,
                report.admitted,
                report.serving,
                report.kept,
                report.stale,
                report.leaving
            ));
        }
        for l in check::ownership_history(&w.server).leases {
            w.note(format!(
                "lease rv={} {}/{} released={:?} taken_over={:?}",
                l.rv,
                l.name,
                l.incarnation.unwrap_or_default(),
                l.released,
                l.taken_over
            ));
        }
    }
}
