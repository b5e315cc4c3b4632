//! One seed: a world, its schedule of faults, the writer, the settle bound and the oracle.

use std::time::Duration;

use serde::Serialize;

use crate::check::{self, Finding};
use crate::fault::{self, Shape, Timed};
use crate::inject;
use crate::rng::Rng;
use crate::world::{World, LEASE, RENEW};

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
    /// The planted bug to switch on (feature `planted-bugs`).
    pub plant: Option<String>,
    /// Draw only these fault kinds (`fault::KINDS`); empty: every kind.
    pub kinds: &'static [&'static str],
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
    /// The event log (faults, starts, reconciles, assignment versions).
    #[serde(skip)]
    pub log: Vec<String>,
}

/// Run seed `seed` (with its own schedule, or `faults` when given: replay and shrinking) on a fresh
/// current-thread runtime in paused time, on the calling thread.
#[must_use]
pub fn run_seed(seed: u64, opts: &Options, faults: Option<Vec<Timed>>) -> Outcome {
    fixed_hashers();
    let mut rng = Rng::new(seed);
    let faults = faults.unwrap_or_else(|| fault::schedule(&mut rng, &opts.shape()));
    // the library's randomness (incarnations, Event names, jitter) and kube's backoff jitter
    kube_shard::ownership::random::seed_thread(seed);
    fastrand::seed(seed);
    let planted = crate::plant::switch_on(opts.plant.as_deref());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    let run = {
        let (opts, faults) = (opts.clone(), faults.clone());
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(simulate(seed, &opts, &faults, rng))
        }))
    };
    drop(rt);
    crate::plant::switch_off(planted);
    kube_shard::ownership::random::unseed_thread();
    match run {
        Ok((findings, simulated_ms, checks, log)) => Outcome {
            seed,
            faults,
            findings,
            simulated_ms,
            checks,
            log,
        },
        Err(p) => Outcome {
            seed,
            faults,
            findings: vec![Finding {
                kind: "panic".into(),
                detail: p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default(),
            }],
            simulated_ms: 0,
            checks: 0,
            log: Vec::new(),
        },
    }
}

/// A constant random source for ahash (kube's reflector store), set once per process before any map is
/// built: every ahash `RandomState` of the process then hashes alike, so a store's iteration order
/// repeats from one run of a seed to the next in the same process. (Its fixed keys still come from the OS
/// once per process, and the process may have built a map before: then this does nothing.)
fn fixed_hashers() {
    struct Fixed;
    impl ahash::random_state::RandomSource for Fixed {
        fn gen_hasher_seed(&self) -> usize {
            0x5eed
        }
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = ahash::random_state::set_random_source(Fixed);
    });
}

async fn simulate(
    seed: u64,
    opts: &Options,
    faults: &[Timed],
    mut rng: Rng,
) -> (Vec<Finding>, u64, usize, Vec<String>) {
    let mut w = World::new(seed).await;
    check::record(&w.server);
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
    let mut findings = settle(&w, opts.settle).await;
    let (safety, checks) = check::safety(&w);
    findings.extend(safety);
    log_assignments(&w);
    for m in &w.members {
        m.switch.kill();
    }
    let log = std::mem::take(&mut *w.log.lock().unwrap_or_else(|e| e.into_inner()));
    (findings, w.now_ms(), checks + 2, log)
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
        for l in h.leases {
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
