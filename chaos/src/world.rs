//! The simulated cluster: testserver, the members (each the example operator on a `ShardGroup`), what
//! they did (fences, reconciles), and the event log.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use futures::FutureExt;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use kube_shard::fence_policy::FencePolicyConfig;
use kube_shard::group::{GroupHandle, ShardGroup};
use kube_shard::rt::Clock;
use kube_shard::testing::oracles::fences::FenceRecorder;
use kube_shard::testing::oracles::quiescence::Reconcile;
use kube_shard::watcher::ReadPathMetrics;
use kube_shard::{ShardCount, ShardKey};
use kube_shard_example_operator as example;
use kube_shard_testserver::TestServer;
use tokio::time::Instant;

use crate::check::Finding;
use crate::rng::Rng;
use crate::switch::Switch;

/// The group's name.
pub const GROUP: &str = "chaos";
/// The namespace of the group's Leases and assignment.
pub const CP_NS: &str = "control";
/// The namespace of the Widgets.
pub const NS: &str = "widgets";
/// The test suite's timings: lease 3 s, renew deadline 2 s, retry 0.5 s, grace 0.5 s, margin 0.2 s,
/// drain 1.8 s.
pub const LEASE: Duration = Duration::from_secs(3);
/// See [`LEASE`].
pub const RENEW: Duration = Duration::from_secs(2);
/// See [`LEASE`].
pub const RETRY: Duration = Duration::from_millis(500);
const GRACE: Duration = Duration::from_millis(500);
/// See [`LEASE`].
pub const MARGIN: Duration = Duration::from_millis(200);
/// See [`LEASE`].
pub const DRAIN: Duration = Duration::from_millis(1_800);
/// The per-shard fence parameter ConfigMap (in [`CP_NS`]) of a seed that runs with the fence policy.
pub const FENCE_PARAMS: &str = "chaos-fence";
/// Simulated time 0 on every member's wall clock (2026-01-01T00:00:00Z), so stamps do not depend on the
/// host's clock.
const EPOCH_SECS: u64 = 1_767_225_600;

thread_local! {
    /// Simulated time 0 of the seed running on this thread (each seed runs on a fresh thread), for
    /// [`sim_ms`].
    static SIM_START: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) };
}

/// Simulated ms since the start of the seed running on this thread (`None` off a seed's thread): the
/// stamp `chaos` puts on the library's tracing lines, so they read beside the event log.
#[must_use]
pub fn sim_ms() -> Option<u64> {
    SIM_START
        .with(std::cell::Cell::get)
        .map(|s| u64::try_from(s.elapsed().as_millis()).unwrap_or(u64::MAX))
}

/// The number of shards.
#[must_use]
pub fn shards() -> ShardCount {
    ShardCount::new(16).expect("16 is a valid shard count")
}

/// One member process.
pub struct Member {
    /// Its name.
    pub name: String,
    /// Pause or kill it.
    pub switch: Switch,
    /// Its group handle.
    pub handle: GroupHandle,
    /// Its wall clock's offset from simulated time (ms).
    pub wall_offset: Arc<AtomicI64>,
    /// It was asked to leave.
    pub leaving: bool,
    /// It runs with another shard count (a misconfigured rollout): it must refuse the group's
    /// assignment, admit nothing and write nothing; never counted among the group's members.
    pub foreign: bool,
    /// Its operator's metrics (reconciles, errors, refused fences).
    pub metrics: example::OperatorMetrics,
    /// Its singleton's metrics (orphan collection).
    pub gc: kube_shard_example_operator::gc::GcMetrics,
}

impl Member {
    /// Alive: not killed, and its group task has not ended.
    #[must_use]
    pub fn alive(&self) -> bool {
        !self.switch.is_dead()
    }
}

/// Everything one seed's run touches.
pub struct World {
    /// The API server.
    pub server: TestServer,
    /// Every member ever started (dead ones stay, `alive()` false).
    pub members: Vec<Member>,
    /// The fence oracle's recorder, on every member.
    pub fences: Arc<FenceRecorder>,
    /// Every successful reconcile (member name, `namespace/name/uid`, generation).
    pub reconciles: Arc<Mutex<Vec<Reconcile>>>,
    /// The trace: events and API requests in order (the determinism test compares two runs of it).
    pub log: Arc<Mutex<Vec<String>>>,
    /// Simulated time 0.
    pub start: Instant,
    /// The reconcile hook's randomness (slow and failing reconciles): the seed, and per object key how
    /// many reconciles it has had. Each draw depends on (seed, key, count) only, not on the order in
    /// which the members' reconciles of one instant run.
    pub hook_rng: Arc<Mutex<(u64, std::collections::BTreeMap<String, u64>)>>,
    /// What the faults that judge liveness while they last found (merged into the seed's findings).
    pub findings: Vec<Finding>,
    /// An assignment no member decodes was written (nothing moves until the heal deletes it): the faults
    /// that judge liveness while they last do not judge.
    pub undecodable: bool,
    /// Fence-parameter keys an admin set far ahead and has not corrected yet: (shard, value set, value
    /// before). The heal puts each back if it still holds the value set.
    pub skewed_keys: Vec<(u32, u64, u64)>,
    /// The members keep the per-shard fence parameters ([`FENCE_PARAMS`]) and the policy refuses writes
    /// below them ([`World::fence_policy_on`]).
    pub fence_params: bool,
    next_name: usize,
}

impl World {
    /// A fresh world on a seeded testserver, with the control and Widget namespaces and the CRD.
    pub async fn new(seed: u64) -> World {
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        let started: Arc<OnceLock<Instant>> = Arc::default();
        let server = TestServer::builder()
            .shard_selector(true)
            .seed(seed)
            .wall_clock_start(SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
            .request_tap(tap(log.clone(), started.clone()))
            .build();
        let admin = server.client("admin");
        for ns in [CP_NS, NS] {
            let _ = Api::<Namespace>::all(admin.clone())
                .create(
                    &PostParams::default(),
                    &Namespace {
                        metadata: ObjectMeta {
                            name: Some(ns.into()),
                            ..ObjectMeta::default()
                        },
                        ..Namespace::default()
                    },
                )
                .await;
        }
        let _ = example::widget::install_crd(admin, Duration::from_secs(5)).await;
        let start = Instant::now();
        let _ = started.set(start);
        SIM_START.with(|c| c.set(Some(start)));
        World {
            server,
            members: Vec::new(),
            fences: FenceRecorder::new(),
            reconciles: Arc::default(),
            log,
            start,
            hook_rng: Arc::new(Mutex::new((seed ^ 0xA5A5, Default::default()))),
            findings: Vec::new(),
            undecodable: false,
            skewed_keys: Vec::new(),
            fence_params: false,
            next_name: 0,
        }
    }

    /// Simulated ms since the start.
    #[must_use]
    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The admin's clocks: a member's without an offset (its wall clock reads [`wall_ms`](Self::wall_ms)).
    #[must_use]
    pub fn admin_clock(&self) -> Clock {
        member_clock(self.start, Arc::new(AtomicI64::new(0)))
    }

    /// The admin's wall clock now (ms since the Unix epoch): the fixed epoch + simulated time.
    #[must_use]
    pub fn wall_ms(&self) -> u64 {
        EPOCH_SECS * 1_000 + self.now_ms()
    }

    /// Run with the per-shard fence level (before any member starts): the parameter ConfigMap
    /// [`FENCE_PARAMS`] created empty, both fence policies for ConfigMaps (the children) posted, and
    /// every member started from now on publishing each shard's epoch there before it activates.
    pub async fn fence_policy_on(&mut self) {
        let set = fence_policy_set();
        let admin = self.server.client("admin");
        if let Some(cm) = &set.params {
            // the per-shard binding refuses every covered write while its parameters are missing
            let _ = Api::<ConfigMap>::namespaced(admin.clone(), CP_NS)
                .create(&PostParams::default(), cm)
                .await;
        }
        for p in &set.policies {
            let _ = Api::<ValidatingAdmissionPolicy>::all(admin.clone())
                .create(&PostParams::default(), p)
                .await;
        }
        for b in &set.bindings {
            let _ = Api::<ValidatingAdmissionPolicyBinding>::all(admin.clone())
                .create(&PostParams::default(), b)
                .await;
        }
        self.fence_params = true;
        self.note("fence parameters and policy on");
    }

    /// Append to the event log.
    pub fn note(&self, what: impl AsRef<str>) {
        let line = format!("{:>9} {}", self.now_ms(), what.as_ref());
        self.log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    /// A name never used before.
    pub fn fresh_name(&mut self) -> String {
        let n = format!("m{}", self.next_name);
        self.next_name += 1;
        n
    }

    /// Indexes of the live members that were not asked to leave.
    #[must_use]
    pub fn live(&self) -> Vec<usize> {
        (0..self.members.len())
            .filter(|&i| {
                let m = &self.members[i];
                m.alive() && !m.leaving && !m.foreign
            })
            .collect()
    }

    /// Start a member process named `name` (a same-name restart when the name was used before).
    pub fn spawn(&mut self, name: &str) {
        self.spawn_with(name, shards());
    }

    /// Start a member process named `name` configured with `s` shards (another `S` than the group's:
    /// a member that must refuse loudly and admit nothing).
    pub fn spawn_with(&mut self, name: &str, s: ShardCount) {
        let switch = Switch::default();
        let wall_offset = Arc::new(AtomicI64::new(0));
        let clock = member_clock(self.start, wall_offset.clone());
        let client = self.server.client(name);
        let mut builder = ShardGroup::builder(client.clone(), GROUP, CP_NS);
        if self.fence_params {
            builder = builder.fence_params(FENCE_PARAMS);
        }
        let group = builder
            .member(name)
            .shards(s)
            .key(ShardKey::Uid)
            .timings(LEASE, RENEW, RETRY)
            .takeover_grace(GRACE)
            .drain_timeout(DRAIN)
            .fence_margin(MARGIN)
            .settle(Duration::from_secs(1), Duration::from_millis(500))
            .clock(clock)
            .spawner(switch.spawner())
            .build()
            .expect("the simulator's group config is valid");
        let (handle, task) = group.start();
        let ownership = handle.ownership();
        kube_shard::testing::observe_fences(&ownership, self.fences.clone());
        let config = example::Config::new(name)
            .watch_namespace(Some(NS.to_owned()))
            .concurrency(1)
            .gc_interval(Duration::from_secs(10))
            .spawner(switch.spawner())
            .before_write(self.before_write())
            .on_reconciled(self.on_reconciled());
        let workload = example::build(
            example::Clients::one(client),
            ownership,
            handle.leadership(),
            config,
            &ReadPathMetrics::new(),
            futures::future::pending(),
        )
        .expect("the example operator builds");
        let metrics = workload.metrics.clone();
        let gc = workload.gc_metrics.clone();
        let sw = switch.clone();
        tokio::spawn(switch.wrap(task.map(move |r| {
            // the group task ended (a graceful leave, or it gave up): the process exits
            let _ = r;
            sw.kill();
        })));
        tokio::spawn(switch.wrap(workload.controller));
        tokio::spawn(switch.wrap(workload.singleton));
        self.note(format!("start {name}"));
        self.members.push(Member {
            name: name.to_owned(),
            switch,
            handle,
            wall_offset,
            leaving: false,
            foreign: s != shards(),
            metrics,
            gc,
        });
    }

    fn before_write(&self) -> example::BeforeWrite {
        let rng = self.hook_rng.clone();
        Arc::new(move |key: &str| {
            let (fail, slow) = {
                let mut g = rng.lock().unwrap_or_else(|e| e.into_inner());
                let seed = g.0;
                let n = g.1.entry(key.to_owned()).or_default();
                *n += 1;
                let mut r = Rng::new(
                    seed ^ kube_shard::hash::fnv1a64(key.as_bytes()) ^ n.wrapping_mul(0x9E37_79B9),
                );
                (
                    r.chance(1, 25),
                    r.chance(1, 30).then(|| r.range(500, 4_000)),
                )
            };
            async move {
                if let Some(ms) = slow {
                    // past the drain timeout sometimes: the drain must wait for it (or its fence expires)
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                if fail {
                    example::Injected::Fail
                } else {
                    example::Injected::Proceed
                }
            }
            .boxed()
        })
    }

    fn on_reconciled(&self) -> example::OnReconciled {
        let (recs, log, start) = (self.reconciles.clone(), self.log.clone(), self.start);
        Arc::new(move |r: &example::Reconciled| {
            let key = format!("{}/{}", r.key, r.uid);
            let generation = u64::try_from(r.generation).unwrap_or(0);
            log.lock().unwrap_or_else(|e| e.into_inner()).push(format!(
                "{:>9} reconciled {} {key} {generation}",
                start.elapsed().as_millis(),
                r.member
            ));
            recs.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(Reconcile {
                    member: r.member.clone(),
                    key,
                    generation,
                });
        })
    }
}

/// The trace's request lines: `>` when a request arrives (identity, verb, path and query, body digest),
/// `<` when it is answered (status); stamped with simulated ms (0 while the world is being set up).
fn tap(
    log: Arc<Mutex<Vec<String>>>,
    started: Arc<OnceLock<Instant>>,
) -> impl Fn(&kube_shard_testserver::Tapped) + Send + Sync + 'static {
    move |t| {
        let ms = started.get().map_or(0, |s| s.elapsed().as_millis());
        let line = match (event_publication(&t.uri), t.status) {
            (Some(events), None) => format!("{ms:>9} > {} EVENT {events}", t.identity),
            (Some(events), Some(_)) => format!("{ms:>9} < {} EVENT {events}", t.identity),
            (None, None) => format!(
                "{ms:>9} > {} {} {} {:016x}",
                t.identity, t.method, t.uri, t.body_digest
            ),
            (None, Some(code)) => format!("{ms:>9} < {} {} {} {code}", t.identity, t.method, t.uri),
        };
        log.lock().unwrap_or_else(|e| e.into_inner()).push(line);
    }
}

/// The Events collection a request publishes to (events.k8s.io), if it is one. The members publish Events
/// through kube's `Recorder`, which stamps their names and `eventTime` with the real wall clock (not the
/// simulated one) and picks create or patch by a real-time cache: the trace keeps that an Event was
/// published and where, not its method, name, body or status, so a seed's trace still repeats exactly.
fn event_publication(uri: &str) -> Option<&str> {
    let start = uri.find("/apis/events.k8s.io/")?;
    let end = uri[start..]
        .find("/events")
        .map(|i| start + i + "/events".len())?;
    Some(&uri[..end])
}

/// Whether a trace line is a request line (`tap`), which `--log` leaves out.
#[must_use]
pub fn is_request_line(line: &str) -> bool {
    matches!(line.split_whitespace().nth(1), Some(">" | "<"))
}

/// The fence policies (and parameter ConfigMap and bindings) a seed that skews a fence key runs with: both
/// fence policies for ConfigMaps (the children), with the per-shard parameters in [`FENCE_PARAMS`].
#[must_use]
pub fn fence_policy_set() -> kube_shard::fence_policy::PolicySet {
    let params = format!("{CP_NS}/{FENCE_PARAMS}")
        .parse()
        .expect("a valid parameter reference");
    FencePolicyConfig::new(vec!["configmaps".parse().expect("a resource")])
        .params(params)
        .generate()
        .expect("a valid fence policy")
}

/// A member's clocks: the boot clock is simulated time (it keeps counting while the member is paused, like
/// a suspend), the wall clock is the fixed epoch + simulated time + the member's offset.
fn member_clock(start: Instant, offset: Arc<AtomicI64>) -> Clock {
    Clock::with_boot(move || start.elapsed()).with_wall(move || {
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(EPOCH_SECS) + start.elapsed();
        let off = offset.load(Ordering::SeqCst);
        if off >= 0 {
            base + Duration::from_millis(off.unsigned_abs())
        } else {
            base - Duration::from_millis(off.unsigned_abs())
        }
    })
}
