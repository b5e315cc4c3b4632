//! The demo (`kshard-dev demo`): the sharded example operator, end to end.
//!
//! By default it starts kube-shard's embedded API server (testserver) over HTTP on 127.0.0.1, installs the
//! Widget CRD, creates `objects` Widgets and starts `replicas` replica processes (the options' replica
//! program: `kshard-dev operator`, `kube-shard-replica`; each with its own kubeconfig identity). Then:
//!
//! 1. waits until every Widget is reconciled (`status.observedGeneration == metadata.generation`);
//! 2. starts a writer that keeps changing Widget specs until the end;
//! 3. in a settled window in which the writer touches every Widget, measures each replica's read
//!    amplification: distinct Widgets delivered to its Widget read path ÷ Widgets it owns — on the embedded
//!    server from its per-identity accounting (distinct uids), against a cluster (`--kubeconfig`) from the
//!    replica's own metrics (`kube_shard_read_indexed_objects{resource="widgets"}`, the Widgets its read
//!    index holds; the demo deletes none: the distinct-uid analog). The e2e suite also checks the event-based
//!    figure `received ÷ (received − unwanted)` from `kube_shard_read_objects_{received,unwanted}`;
//! 4. scales to replicas+1 and counts the shards moved against the optimum;
//! 5. SIGKILLs one replica (not the coordinator) and measures the failover (until its last shard is
//!    admitted elsewhere);
//! 6. stops the writer, waits for the group and the Widgets to settle, checks the fences (testserver's
//!    fence audit, the per-shard commit order, and the replicas' fence log), and stops everything.
//!
//! On the embedded server the replicas run with `--install-fence-policy`: the apiserver itself refuses
//! stale fenced writes (both levels, and Widget `/status` through its status fence field). The demo counts
//! the writes it refused (`refusals`): of members that had lost the shard, and of current owners — an
//! invariant: none.
//!
//! [`run`] returns the report ([`DemoReport`]); a violated invariant is in it, not an error.

mod error;
pub mod ha;
mod refusals;
mod view;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_shard::group::assignment::{Assignment, DATA_KEY};
use kube_shard::{fnv1a64, ShardCount, ShardKey};
use kube_shard_example_operator::widget::{self, Widget, WidgetSpec};
use kube_shard_testserver::{HttpServer, ResourceFilter, TestServer};
use serde::Serialize;
use tokio::time::Instant;

pub use self::error::DemoError;
pub use self::refusals::Counts as RefusalCounts;
use crate::operator::{OperatorFlags, ReplicaProgram, Timings};
use crate::process::ReplicaProcess;
use crate::{checks, group};

/// Demo timings (lease 5 s, renew deadline 3.5 s, retry 0.5 s, takeover grace 0.5 s).
const TIMINGS: Timings = Timings::DEMO;
const LEASE: Duration = TIMINGS.lease;
const GRACE: Duration = TIMINGS.takeover_grace;
const RETRY: Duration = TIMINGS.retry;

/// What the demo runs (`kshard-dev demo`'s flags; [`new`](Self::new) gives the CLI's defaults with the
/// replica program the caller names).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DemoOptions {
    /// Widgets to create.
    pub objects: usize,
    /// Replica processes to start (then scaled to one more, then one is killed).
    pub replicas: u32,
    /// The number of logical shards S.
    pub shards: ShardCount,
    /// The shard key.
    pub hash_key: ShardKey,
    /// The embedded server's ShardedListAndWatch gate (KEP-5866 shardSelector).
    pub shard_selector: bool,
    /// The fence ValidatingAdmissionPolicies on the embedded server, and the count of the writes they
    /// refused.
    pub fence_policy: bool,
    /// A real cluster instead of the embedded server (replicas run locally with it).
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the Widgets and of the group's Leases and assignment.
    pub namespace: String,
    /// The shard group.
    pub group: String,
    /// Widget spec changes per second made by the writer.
    pub write_rate: u32,
    /// Draw the live view on stdout (a terminal); else progress lines on stderr.
    pub view: bool,
    /// Keep the work directory (kubeconfigs, replica logs, fence log).
    pub keep: bool,
    /// The program that runs a replica (`kshard operator`, `kube-shard-replica`).
    pub replica: ReplicaProgram,
}

impl DemoOptions {
    /// The CLI's defaults, with replicas run by `replica`.
    pub fn new(replica: ReplicaProgram) -> Self {
        DemoOptions {
            objects: 2000,
            replicas: 3,
            shards: ShardCount::DEFAULT,
            hash_key: ShardKey::Uid,
            shard_selector: true,
            fence_policy: true,
            kubeconfig: None,
            namespace: "kshard-demo".to_owned(),
            group: "widgets".to_owned(),
            write_rate: 400,
            view: false,
            keep: false,
            replica,
        }
    }
}

/// The demo's result (`kshard-dev demo --json` prints it).
#[derive(Clone, Debug, Default, Serialize)]
#[non_exhaustive]
pub struct DemoReport {
    pub replicas: u32,
    pub objects: usize,
    pub shards: u32,
    pub hash_key: String,
    /// `on`/`off` on the embedded server, `cluster` against one.
    pub shard_selector: String,
    /// The Widget read path: `server` (shard selectors) or `fallback` (local filter).
    pub mode: String,
    pub owned_fraction: Vec<f64>,
    pub read_amplification: Vec<Option<f64>>,
    pub fence_violations: u64,
    pub fence_audit_violations: u64,
    pub fence_order_violations: u64,
    pub fence_log_violations: u64,
    pub fenced_writes: u64,
    /// Writes the embedded server's fence policies refused (`null` against a cluster, where the demo
    /// installs none).
    pub server_refused: Option<RefusalCounts>,
    pub unowned_shards_after_settle: u64,
    pub unreconciled_objects: u64,
    pub scale_moved_shards: u64,
    pub scale_optimal_moved_shards: u64,
    pub failover_seconds: f64,
    pub lease_duration_seconds: f64,
    pub reconciles: BTreeMap<String, u64>,
    pub duration_seconds: f64,
    pub invariants_held: bool,
    pub failures: Vec<String>,
}

/// One replica process.
struct Replica {
    name: String,
    process: ReplicaProcess,
    alive: bool,
}

/// What the embedded server (if any) gives.
struct Embedded {
    server: TestServer,
    http: HttpServer,
}

/// The scenario's state.
pub(crate) struct Demo<'a> {
    args: &'a DemoOptions,
    dir: PathBuf,
    embedded: Option<Embedded>,
    admin: Client,
    replicas: Vec<Replica>,
    /// Per Widget index: its shard.
    widget_shards: Vec<u32>,
    /// Widgets per shard.
    per_shard: Vec<u64>,
    phase: String,
    tty: bool,
    last_draw: Option<Instant>,
    started: Instant,
    fence_log: PathBuf,
    writer_touched: Arc<AtomicU64>,
    writer_stop: Arc<AtomicBool>,
    /// The writes the fence policies refused, once counted (the last frame shows them).
    refused: Option<refusals::Counts>,
}

/// A poll of the group (through the library's reader) and of the replicas' reconcile counters.
#[derive(Clone)]
pub(crate) struct GroupSnap {
    pub(crate) group: group::GroupSnap,
    /// name → reconciles (scraped)
    pub(crate) reconciles: BTreeMap<String, u64>,
}

impl std::ops::Deref for GroupSnap {
    type Target = group::GroupSnap;
    fn deref(&self) -> &group::GroupSnap {
        &self.group
    }
}

/// Run the demo to its verdict: `Ok` with the report whether or not the invariants held (see
/// [`DemoReport::invariants_held`]); `Err` only when it could not run.
pub async fn run(args: &DemoOptions) -> Result<DemoReport, DemoError> {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("kshard-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (embedded, admin) = match &args.kubeconfig {
        None => {
            let server = TestServer::builder()
                .shard_selector(args.shard_selector)
                .build();
            // the assignment's every version: where each refused write stood (`refusals`)
            server.history().record(
                ResourceFilter::resource("configmaps")
                    .namespace(args.namespace.clone())
                    .name(format!("{}-assignment", args.group)),
            );
            let http = server.serve_http().await?;
            let admin = server.client("demo-admin");
            (Some(Embedded { server, http }), admin)
        }
        Some(p) => (
            None,
            kube_shard_example_operator::run::client_from(Some(p)).await?,
        ),
    };
    let mut d = Demo {
        args,
        fence_log: dir.join("fences.log"),
        dir,
        embedded,
        admin,
        replicas: Vec::new(),
        widget_shards: Vec::new(),
        per_shard: vec![0; args.shards.get() as usize],
        phase: String::new(),
        tty: args.view,
        last_draw: None,
        started,
        writer_touched: Arc::new(AtomicU64::new(0)),
        writer_stop: Arc::new(AtomicBool::new(false)),
        refused: None,
    };
    let mut report = DemoReport {
        replicas: args.replicas,
        objects: args.objects,
        shards: args.shards.get(),
        hash_key: args.hash_key.to_string(),
        shard_selector: if args.kubeconfig.is_some() {
            "cluster".to_owned()
        } else if args.shard_selector {
            "on".to_owned()
        } else {
            "off".to_owned()
        },
        lease_duration_seconds: LEASE.as_secs_f64(),
        ..DemoReport::default()
    };
    if let Err(e) = d.scenario(&mut report).await {
        report.invariants_held = false;
        report.failures.push(e.to_string());
        report.duration_seconds = round2(d.started.elapsed().as_secs_f64());
        d.diagnose().await;
    }
    d.stop_all().await;
    if let Some(e) = &d.embedded {
        // keep the server until the replicas are gone
        let _ = e.http.addr();
    }
    if args.keep || !report.invariants_held {
        d.say(&format!("work directory kept: {}", d.dir.display()));
    } else {
        let _ = std::fs::remove_dir_all(&d.dir);
    }
    Ok(report)
}

impl Demo<'_> {
    fn say(&mut self, msg: &str) {
        if self.tty {
            // the view redraws below the messages
            self.last_draw = None;
            println!("\x1b[2K{msg}");
        } else {
            eprintln!("kshard-dev demo: {msg}");
        }
    }

    fn set_phase(&mut self, phase: &str) {
        self.phase = phase.to_owned();
        let secs = self.started.elapsed().as_secs_f64();
        self.say(&format!("[{secs:6.1}s] {phase}"));
    }

    fn s(&self) -> ShardCount {
        self.args.shards
    }

    fn kubeconfig_for(&self, identity: &str) -> Result<PathBuf, DemoError> {
        match (&self.embedded, &self.args.kubeconfig) {
            (Some(e), _) => {
                let p = self.dir.join(format!("{identity}.kubeconfig"));
                e.http.write_kubeconfig(&p, identity)?;
                Ok(p)
            }
            (None, Some(p)) => Ok(p.clone()),
            (None, None) => unreachable!("either embedded or a kubeconfig"),
        }
    }

    fn live(&self) -> Vec<String> {
        self.replicas
            .iter()
            .filter(|r| r.alive)
            .map(|r| r.name.clone())
            .collect()
    }

    async fn scenario(&mut self, report: &mut DemoReport) -> Result<(), DemoError> {
        let args = self.args;
        let s = self.s();
        self.set_phase("installing the Widget CRD and creating Widgets");
        widget::install_crd(self.admin.clone(), Duration::from_secs(30))
            .await
            .map_err(|e| DemoError::failed(format!("installing the CRD: {e}")))?;
        self.create_namespace().await?;
        self.create_widgets().await?;

        self.set_phase(&format!("starting {} replicas", args.replicas));
        for i in 0..args.replicas {
            self.spawn_replica(i).await?;
        }
        let live = self.live();
        self.wait("the group settles", Duration::from_secs(60), |_, g| {
            g.settled(&live)
        })
        .await?;
        self.set_phase("waiting until every Widget is reconciled");
        self.wait_reconciled(Duration::from_secs(90)).await?;

        // the writer: keeps changing specs until the end
        let writer = self.start_writer()?;

        self.set_phase("measuring read amplification (the writer touches every Widget)");
        let (fractions, amps, mode) = self.measure_amplification().await?;
        report.owned_fraction = fractions;
        report.read_amplification = amps;
        report.mode = mode;

        // scale up
        let before = self.snapshot().await;
        let n = args.replicas;
        self.set_phase(&format!("scaling to {} replicas", n + 1));
        self.spawn_replica(n).await?;
        let live = self.live();
        self.wait(
            "the group settles after scaling",
            Duration::from_secs(90),
            |_, g| g.settled(&live),
        )
        .await?;
        let after = self.snapshot().await;
        let (moved, optimal) = (
            before.moved(&after),
            before.optimal_moves(&self.live()).unwrap_or(u64::MAX),
        );
        report.scale_moved_shards = moved;
        report.scale_optimal_moved_shards = optimal;

        // kill one (not the coordinator)
        let coordinator = after.coordinator.clone();
        let victim_idx = self
            .replicas
            .iter()
            .position(|r| r.alive && Some(&r.name) != coordinator.as_ref())
            .unwrap_or(0);
        let victim = self.replicas[victim_idx].name.clone();
        let victim_shards: Vec<u32> = after.owned_by(&victim).into_iter().collect();
        self.set_phase(&format!(
            "SIGKILL {victim} ({} shards) under load",
            victim_shards.len()
        ));
        let killed_at = Instant::now();
        self.replicas[victim_idx].process.kill().await;
        self.replicas[victim_idx].alive = false;
        let others = self.live();
        self.wait(
            "takeover of the killed replica's shards",
            Duration::from_secs(60),
            |_, g| {
                let admitted = g.admitted_by(&others);
                victim_shards.iter().all(|s| admitted.contains(s))
            },
        )
        .await?;
        report.failover_seconds = round2(killed_at.elapsed().as_secs_f64());
        self.say(&format!(
            "failover: {:.2} s (lease duration {:.1} s)",
            report.failover_seconds,
            LEASE.as_secs_f64()
        ));

        let live = self.live();
        self.wait(
            "the group settles after the kill",
            Duration::from_secs(90),
            |_, g| g.settled(&live),
        )
        .await?;

        self.set_phase("stopping the writer; waiting for every Widget to be reconciled");
        self.writer_stop.store(true, Ordering::Relaxed);
        let _ = writer.await;
        let snap = self.snapshot().await;
        let live = self.live();
        report.unowned_shards_after_settle = if snap.settled(&live) {
            let admitted = snap.admitted_by(&live);
            (0..s.get()).filter(|x| !admitted.contains(x)).count() as u64
        } else {
            let admitted = snap.admitted_by(&live);
            (0..s.get())
                .filter(|x| !admitted.contains(x))
                .count()
                .max(1) as u64
        };
        let _ = self.wait_reconciled(Duration::from_secs(60)).await;
        report.unreconciled_objects = self.unreconciled().await? as u64;
        report.reconciles = snap.reconciles.clone();

        self.set_phase("checking fences");
        self.check_fences(report);

        report.duration_seconds = round2(self.started.elapsed().as_secs_f64());
        let mut failures = Vec::new();
        if report.fence_violations != 0 {
            failures.push(format!("{} fence violations", report.fence_violations));
        }
        if let Some(r) = report.server_refused.filter(|r| r.current_owner != 0) {
            failures.push(format!(
                "the fence policies refused {} writes of current owners",
                r.current_owner
            ));
        }
        if report.unowned_shards_after_settle != 0 {
            failures.push(format!(
                "{} unowned shards after settle",
                report.unowned_shards_after_settle
            ));
        }
        if report.unreconciled_objects != 0 {
            failures.push(format!(
                "{} unreconciled Widgets",
                report.unreconciled_objects
            ));
        }
        if report.scale_moved_shards != report.scale_optimal_moved_shards {
            failures.push(format!(
                "scaling moved {} shards, the optimum is {}",
                report.scale_moved_shards, report.scale_optimal_moved_shards
            ));
        }
        if report.mode == "server" {
            for (i, a) in report.read_amplification.iter().enumerate() {
                if let Some(a) = a {
                    if !(0.95..=1.05).contains(a) {
                        failures.push(format!(
                            "replica-{i}: read amplification {a} in server mode"
                        ));
                    }
                }
            }
        }
        let bound = LEASE + GRACE + RETRY * 8 + Duration::from_secs(5);
        if report.failover_seconds > bound.as_secs_f64() {
            failures.push(format!(
                "failover {} s above the bound {:?}",
                report.failover_seconds, bound
            ));
        }
        report.invariants_held = failures.is_empty();
        report.failures = failures;
        if self.tty {
            // leave the last frame on screen
            let text = view::render(self, &snap);
            println!("{text}");
            self.last_draw = None;
        }
        self.set_phase(if report.invariants_held {
            "done: every invariant held"
        } else {
            "done: invariants VIOLATED"
        });
        Ok(())
    }

    /// After a failure: the group as the demo last saw it (stderr) and each replica's metrics (files).
    async fn diagnose(&mut self) {
        let g = self.snapshot().await;
        let mut lines = vec![format!(
            "diagnosis: coordinator {:?}, generation {:?}, moves in flight {:?}, shards assigned {:?}",
            g.coordinator,
            g.assignment.as_ref().map(|a| a.view.generation),
            g.assignment.as_ref().map(Assignment::moves_in_flight),
            g.assignment.as_ref().map(|a| a.view.shards.len()),
        )];
        for (name, (inc, rep)) in &g.members {
            let owned = g.owned_by(name).len();
            match rep {
                Some(r) => lines.push(format!(
                    "  {name}/{inc}: owns {owned}, ready {}, leaving {}, applied {}, admitted {}, serving {}",
                    r.ready,
                    r.leaving,
                    r.applied_generation,
                    r.admitted.len(),
                    r.serving.len()
                )),
                None => lines.push(format!("  {name}/{inc}: owns {owned}, no report")),
            }
        }
        for r in &self.replicas {
            lines.push(format!("  process {}: alive {}", r.name, r.alive));
            if let (true, Some(addr)) = (r.alive, r.process.metrics_addr()) {
                if let Ok(text) =
                    kube_shard_example_operator::run::http::get(addr, "/metrics").await
                {
                    let _ = std::fs::write(self.dir.join(format!("{}.metrics", r.name)), text);
                }
            }
        }
        for l in lines {
            self.say(&l);
        }
    }

    async fn create_namespace(&self) -> Result<(), DemoError> {
        let api: Api<Namespace> = Api::all(self.admin.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(self.args.namespace.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(DemoError::failed(format!("creating the namespace: {e}"))),
        }
    }

    async fn create_widgets(&mut self) -> Result<(), DemoError> {
        let api: Api<Widget> = Api::namespaced(self.admin.clone(), &self.args.namespace);
        let colors = ["red", "green", "blue", "amber", "violet"];
        let ns = self.args.namespace.clone();
        let created: Vec<Result<Widget, kube::Error>> = futures::stream::iter(0..self.args.objects)
            .map(|i| {
                let api = api.clone();
                let w = Widget::new(
                    &widget_name(i),
                    &ns,
                    WidgetSpec {
                        size: Some(i as i64),
                        color: Some(colors[i % colors.len()].to_owned()),
                        message: (i % 3 == 0).then(|| format!("widget number {i}")),
                    },
                );
                async move {
                    match api.create(&PostParams::default(), &w).await {
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            api.get(w.metadata.name.as_deref().unwrap_or_default())
                                .await
                        }
                        r => r,
                    }
                }
            })
            .buffered(16)
            .collect()
            .await;
        let s = self.s();
        for w in created {
            let w = w.map_err(|e| DemoError::failed(format!("creating Widgets: {e}")))?;
            let h = match self.args.hash_key {
                ShardKey::Namespace => fnv1a64(ns.as_bytes()),
                _ => fnv1a64(w.metadata.uid.as_deref().unwrap_or_default().as_bytes()),
            };
            let shard = s.shard_of(h);
            self.widget_shards.push(shard);
            self.per_shard[shard as usize] += 1;
        }
        Ok(())
    }

    async fn spawn_replica(&mut self, i: u32) -> Result<(), DemoError> {
        let name = format!("replica-{i}");
        let mut flags = OperatorFlags::new(
            &name,
            self.kubeconfig_for(&name)?,
            &self.args.group,
            &self.args.namespace,
        );
        flags.widget_kubeconfig = Some(self.kubeconfig_for(&format!("{name}-widgets"))?);
        flags.watch_namespace = Some(self.args.namespace.clone());
        flags.timings = TIMINGS;
        flags.expected = self.args.replicas;
        flags.key = self.args.hash_key;
        flags.shards = self.s();
        // the apiserver's own fences, on the embedded server (never installed into a real cluster)
        flags.install_fence_policy = self.embedded.is_some() && self.args.fence_policy;
        flags.fence_log = Some(self.fence_log.clone());
        let launch = self.args.replica.launch(&flags);
        let log = self.dir.join(format!("{name}.log"));
        let process = ReplicaProcess::start(&name, &launch, &log, Duration::from_secs(30)).await?;
        self.replicas.push(Replica {
            name,
            process,
            alive: true,
        });
        Ok(())
    }

    async fn stop_all(&mut self) {
        self.writer_stop.store(true, Ordering::Relaxed);
        for r in self.replicas.iter().filter(|r| r.alive) {
            let _ = r.process.signal(crate::process::ProcessSignal::TERM);
        }
        // a graceful leave needs somewhere to move the shards: whoever is last is stopped after a short wait
        let deadline = Instant::now() + Duration::from_secs(3);
        for r in self.replicas.iter_mut().filter(|r| r.alive) {
            let left = deadline.saturating_duration_since(Instant::now());
            if r.process.wait(left).await.is_err() {
                r.process.kill().await;
            }
            r.alive = false;
        }
    }

    /// Poll the group (assignment, leases, coordinator, replica metrics).
    pub(crate) async fn snapshot(&self) -> GroupSnap {
        let group = group::GroupSnap::read(
            self.admin.clone(),
            &self.args.namespace,
            &self.args.group,
            self.s(),
        )
        .await;
        let mut g = GroupSnap {
            group,
            reconciles: BTreeMap::new(),
        };
        for r in self.replicas.iter().filter(|r| r.alive) {
            if let Some(addr) = r.process.metrics_addr() {
                if let Ok(text) =
                    kube_shard_example_operator::run::http::get(addr, "/metrics").await
                {
                    if let Some(v) = metric(&text, "kshard_widget_reconciles_total") {
                        g.reconciles.insert(r.name.clone(), v as u64);
                    }
                }
            }
        }
        g
    }

    /// Wait until `cond` holds on a fresh snapshot, redrawing the view.
    async fn wait(
        &mut self,
        what: &str,
        limit: Duration,
        mut cond: impl FnMut(&Self, &GroupSnap) -> bool,
    ) -> Result<GroupSnap, DemoError> {
        let start = Instant::now();
        loop {
            let g = self.snapshot().await;
            self.draw(&g);
            if cond(self, &g) {
                return Ok(g);
            }
            if start.elapsed() > limit {
                return Err(DemoError::failed(format!(
                    "timed out after {limit:?} waiting for {what} (logs in {})",
                    self.dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn draw(&mut self, g: &GroupSnap) {
        if !self.tty {
            return;
        }
        if self
            .last_draw
            .is_some_and(|t| t.elapsed() < Duration::from_millis(400))
        {
            return;
        }
        let text = view::render(self, g);
        let lines = text.lines().count();
        print!("{text}\x1b[{lines}A");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        self.last_draw = Some(Instant::now());
    }

    /// `(name, generation, observedGeneration)` of every Widget.
    async fn widget_generations(&self) -> Result<Vec<(i64, Option<i64>)>, DemoError> {
        if let Some(e) = &self.embedded {
            return Ok(e
                .server
                .objects(widget::GROUP, widget::PLURAL)
                .iter()
                .map(|w| {
                    (
                        w["metadata"]["generation"].as_i64().unwrap_or(0),
                        w["status"]["observedGeneration"].as_i64(),
                    )
                })
                .collect());
        }
        let api: Api<Widget> = Api::namespaced(self.admin.clone(), &self.args.namespace);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| DemoError::failed(format!("listing Widgets: {e}")))?;
        Ok(list
            .items
            .iter()
            .map(|w| {
                (
                    w.metadata.generation.unwrap_or(0),
                    w.status.as_ref().and_then(|s| s.observed_generation),
                )
            })
            .collect())
    }

    async fn unreconciled(&self) -> Result<usize, DemoError> {
        let gens = self.widget_generations().await?;
        let missing = self.args.objects.saturating_sub(gens.len());
        Ok(missing + gens.iter().filter(|(g, o)| Some(*g) != *o).count())
    }

    async fn wait_reconciled(&mut self, limit: Duration) -> Result<(), DemoError> {
        let start = Instant::now();
        loop {
            let left = self.unreconciled().await?;
            let g = self.snapshot().await;
            self.draw(&g);
            if left == 0 {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(DemoError::failed(format!(
                    "timed out after {limit:?}: {left} Widgets not reconciled (logs in {})",
                    self.dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn start_writer(&self) -> Result<tokio::task::JoinHandle<()>, DemoError> {
        let client = match &self.embedded {
            Some(e) => e.server.client("demo-writer"),
            None => self.admin.clone(),
        };
        let api: Api<Widget> = Api::namespaced(client, &self.args.namespace);
        let touched = self.writer_touched.clone();
        let stop = self.writer_stop.clone();
        let n = self.args.objects;
        let rate = self.args.write_rate.max(10) as usize;
        Ok(tokio::spawn(async move {
            // every 20 ms a batch of rate/50 spec changes, round robin over the Widgets
            let per_tick = (rate / 50).max(1);
            let mut tick = tokio::time::interval(Duration::from_millis(20));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut next = 0usize;
            let mut counter: i64 = 1_000_000;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let batch: Vec<_> = (0..per_tick)
                    .map(|_| {
                        let i = next % n;
                        next += 1;
                        counter += 1;
                        let api = api.clone();
                        let size = counter;
                        async move {
                            let patch = serde_json::json!({"spec": {"size": size}});
                            api.patch(
                                &widget_name(i),
                                &PatchParams::default(),
                                &Patch::Merge(&patch),
                            )
                            .await
                            .is_ok()
                        }
                    })
                    .collect();
                let ok = futures::future::join_all(batch).await;
                touched.fetch_add(ok.iter().filter(|o| **o).count() as u64, Ordering::Relaxed);
            }
        }))
    }

    /// In a settled window: reset the accounting (read each replica's read counters), let the writer
    /// touch every Widget, then read the distinct Widget uids delivered to each replica's Widget read path
    /// (against a cluster: its read counters again).
    async fn measure_amplification(
        &mut self,
    ) -> Result<(Vec<f64>, Vec<Option<f64>>, String), DemoError> {
        let live = self.live();
        let g0 = self
            .wait("a settled window", Duration::from_secs(60), |_, g| {
                g.settled(&live)
            })
            .await?;
        let gen0 = g0.assignment.as_ref().map(|a| a.view.generation);
        if let Some(e) = &self.embedded {
            e.server.reset_accounting();
        }
        let start = self.writer_touched.load(Ordering::Relaxed);
        let n = self.args.objects as u64;
        let t0 = Instant::now();
        while self.writer_touched.load(Ordering::Relaxed) < start + n + 1 {
            let g = self.snapshot().await;
            self.draw(&g);
            if t0.elapsed() > Duration::from_secs(60) {
                return Err(DemoError::failed("the writer is too slow"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // let the last events reach the replicas
        tokio::time::sleep(Duration::from_secs(1)).await;
        let accounts: Vec<Option<u64>> = self
            .replicas
            .iter()
            .map(|r| {
                self.embedded.as_ref().map(|e| {
                    e.server
                        .accounting(&format!("{}-widgets", r.name))
                        .distinct_uids
                })
            })
            .collect();
        // against a cluster: the Widgets each replica's read index holds
        let held = self.indexed_widgets().await;
        let g1 = self.snapshot().await;
        if g1.assignment.as_ref().map(|a| a.view.generation) != gen0 {
            self.say("warning: the assignment changed during the amplification window");
        }
        let s = self.s();
        let mut fractions = Vec::new();
        let mut amps = Vec::new();
        let mut modes = BTreeSet::new();
        for (i, (r, acc)) in self.replicas.iter().zip(&accounts).enumerate() {
            let owned: u64 = g1
                .owned_by(&r.name)
                .into_iter()
                .map(|sh| self.per_shard[sh as usize])
                .sum();
            fractions.push(round4(owned as f64 / n.max(1) as f64));
            // distinct Widgets delivered (the embedded server's accounting, else the replica's index)
            let delivered = acc.or(held[i]);
            amps.push(delivered.map(|d| per_owned(d, owned)));
            if let Some(addr) = r.process.metrics_addr() {
                if let Ok(text) =
                    kube_shard_example_operator::run::http::get(addr, "/metrics").await
                {
                    let fb = metric_labeled(
                        &text,
                        "kube_shard_read_fallback",
                        kube_shard_example_operator::WIDGET_STREAM,
                    );
                    modes.insert(if fb == Some(0.0) {
                        "server"
                    } else {
                        "fallback"
                    });
                }
            }
        }
        let _ = s;
        let mode = if modes.contains("fallback") || modes.is_empty() {
            "fallback"
        } else {
            "server"
        };
        self.say(&format!(
            "read amplification {amps:?}, owned fractions {fractions:?}, mode {mode}"
        ));
        Ok((fractions, amps, mode.to_owned()))
    }

    /// Per replica (`None` when it does not answer): the Widgets its read index holds.
    async fn indexed_widgets(&self) -> Vec<Option<u64>> {
        let mut out = Vec::new();
        for r in &self.replicas {
            let text = match (r.process.metrics_addr(), r.alive) {
                (Some(addr), true) => kube_shard_example_operator::run::http::get(addr, "/metrics")
                    .await
                    .ok(),
                _ => None,
            };
            out.push(text.as_deref().and_then(indexed_widgets));
        }
        out
    }

    fn check_fences(&mut self, report: &mut DemoReport) {
        if let Some(e) = &self.embedded {
            let audit = e.server.fence_audit();
            report.fence_audit_violations = audit.violation_count() as u64;
            report.fenced_writes = audit.commits.len() as u64;
            report.fence_order_violations =
                checks::commit_order_violations(audit.commits.iter().filter_map(|c| {
                    // the demo runs no HA mirror: every token names a shard
                    Some((
                        c.token.shard()?,
                        c.token.shard_epoch()?,
                        c.identity.as_str(),
                        c.resource_version,
                    ))
                }));
        }
        if let Some(e) = self.embedded.as_ref().filter(|_| self.args.fence_policy) {
            let counts = self.refused_writes(&e.server);
            self.refused = Some(counts);
            report.server_refused = Some(counts);
        }
        let text = std::fs::read_to_string(&self.fence_log).unwrap_or_default();
        let records = checks::parse_fence_log(&text);
        if self.embedded.is_none() {
            report.fenced_writes = records.len() as u64;
        }
        report.fence_log_violations = checks::fence_log_violations(&records).len() as u64;
        report.fence_violations = report.fence_audit_violations
            + report.fence_order_violations
            + report.fence_log_violations;
    }
}

impl Demo<'_> {
    /// The writes the fence policies refused, classified against the assignment's history.
    fn refused_writes(&self, server: &TestServer) -> refusals::Counts {
        let filter = ResourceFilter::resource("configmaps")
            .namespace(self.args.namespace.clone())
            .name(format!("{}-assignment", self.args.group));
        let versions: Vec<refusals::Version> = server
            .history()
            .of(&filter)
            .iter()
            .filter_map(|c| {
                let text = c.object["data"][DATA_KEY].as_str()?;
                let a = Assignment::decode(text, self.s(), self.args.hash_key).ok()?;
                Some(refusals::Version {
                    resource_version: c.resource_version,
                    epochs: a.view.shards.iter().map(|(s, e)| (*s, e.epoch)).collect(),
                })
            })
            .collect();
        let refused: Vec<refusals::Refused> = server
            .admission_refusals()
            .iter()
            .filter(|r| !r.dry_run)
            .map(|r| refusals::Refused {
                resource_version: r.resource_version,
                fence: r.fence,
            })
            .collect();
        refusals::classify(&refused, &versions)
    }
}

fn widget_name(i: usize) -> String {
    format!("w-{i:05}")
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round4(x: f64) -> f64 {
    (x * 10000.0).round() / 10000.0
}

/// A metric's value (the first sample line starting with `name`).
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        (k == name || k.starts_with(&format!("{name}{{"))).then(|| v.parse().ok())?
    })
}

fn metric_labeled(text: &str, name: &str, resource: &str) -> Option<f64> {
    let key = format!("{name}{{resource=\"{resource}\"}}");
    text.lines().find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        (k == key).then(|| v.parse().ok())?
    })
}

/// The Widgets a replica's read index holds (`kube_shard_read_indexed_objects` of its Widget stream).
fn indexed_widgets(text: &str) -> Option<u64> {
    let v = metric_labeled(
        text,
        "kube_shard_read_indexed_objects",
        kube_shard_example_operator::WIDGET_STREAM,
    )?;
    (v >= 0.0).then_some(v as u64)
}

/// Read amplification: distinct Widgets delivered ÷ Widgets owned (1 when both are 0).
fn per_owned(delivered: u64, owned: u64) -> f64 {
    match (delivered, owned) {
        (0, 0) => 1.0,
        (_, 0) => f64::INFINITY,
        (d, o) => round4(d as f64 / o as f64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amplification_from_the_read_index() {
        let text = "kube_shard_read_indexed_objects{resource=\"widget-children\"} 7\n\
                    kube_shard_read_indexed_objects{resource=\"widgets\"} 300\n";
        assert_eq!(indexed_widgets(text), Some(300));
        assert_eq!(indexed_widgets("# nothing\n"), None);
        // server mode: holds what it owns; fallback with 3 replicas: everything
        assert_eq!(per_owned(100, 100), 1.0);
        assert_eq!(per_owned(300, 100), 3.0);
        assert_eq!(per_owned(0, 0), 1.0);
        assert_eq!(per_owned(5, 0), f64::INFINITY);
    }

    #[test]
    fn metrics_parse() {
        let text = "# HELP x\nkshard_widget_reconciles_total 42\nkube_shard_read_fallback{resource=\"widgets\"} 0\n";
        assert_eq!(metric(text, "kshard_widget_reconciles_total"), Some(42.0));
        assert_eq!(
            metric_labeled(text, "kube_shard_read_fallback", "widgets"),
            Some(0.0)
        );
    }
}
