//! Replica processes of the example operator (`kshard operator`), run locally against the cluster, and
//! what the group publishes: the assignment ConfigMap and the member Leases.
//!
//! Every process is killed when [`Replicas`] is dropped, on a panic too. The work directory (one log per
//! replica, the shared fence log) is removed after a passing scenario and kept after a failing one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::ListParams;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use kube_shard::group::assignment::{Assignment, DATA_KEY};
use kube_shard::ownership::MemberId;
use kube_shard::testing::planner::{Member, PlanInput};
use kube_shard::{ShardCount, ShardKey};
pub use kube_shard_harness::group::GroupSnap;
use kube_shard_harness::operator::{OperatorFlags, ReplicaProgram, Timings};
use kube_shard_harness::process::{ProcessError, ProcessSignal, ReplicaProcess};
use tokio::time::Instant;

use super::fences::{fence_log, FenceLogCheck};
use super::workdir::WorkDir;
use super::{http_get, kshard_binary, sample, ReadPath, WidgetView};

/// Short leases: a member not seen renewing for `LEASE + GRACE` is taken over.
pub const LEASE: Duration = Timings::SHORT.lease;
/// A member that has not renewed for this long admits nothing.
pub const RENEW_DEADLINE: Duration = Timings::SHORT.renew_deadline;
pub const RETRY: Duration = Timings::SHORT.retry;
pub const GRACE: Duration = Timings::SHORT.takeover_grace;
/// The read path's activation barrier timeout (the library's default).
pub const BARRIER: Duration = Duration::from_secs(2);
/// How often the suite polls the group.
pub const POLL: Duration = Duration::from_millis(200);

/// docs/control-plane.md, "Takeover and the failover bound": crash to the victim's last shard admitted
/// elsewhere within `lease_duration + takeover_grace + k·retry_period + barrier`, k ≤ 3.
pub fn failover_bound() -> Duration {
    LEASE + GRACE + RETRY * 3 + BARRIER
}

/// What the suite can observe of that bound: members publish the shards they admit in their Lease at
/// each renewal (up to one retry period later), and the suite polls every [`POLL`].
pub fn observable_failover_bound() -> Duration {
    failover_bound() + RETRY + POLL
}

/// One replica process.
pub struct Replica {
    pub name: String,
    pub metrics: String,
    process: ReplicaProcess,
    pub running: bool,
    pub stopped: bool,
}

/// A shard group of replica processes.
pub struct Replicas {
    client: Client,
    kubeconfig: PathBuf,
    /// The namespace of the group's Leases and assignment.
    pub namespace: String,
    /// Widgets of this namespace only (else all namespaces).
    watch_namespace: Option<String>,
    pub group: String,
    pub key: ShardKey,
    pub shards: ShardCount,
    expected: u32,
    pub fence_log: PathBuf,
    pub members: Vec<Replica>,
    /// The assignment's versions since before the first replica started.
    pub assignments: AssignmentLog,
    /// Last: removed (after a passing run) once the processes are gone.
    pub work: WorkDir,
}

impl Replicas {
    /// A group `g` in `namespace` (Leases, assignment) over the Widgets of `watch_namespace` (all when
    /// `None`), S = 256, cold start planned once `expected` members are present.
    pub fn new(
        client: &Client,
        namespace: &str,
        watch_namespace: Option<&str>,
        key: ShardKey,
        expected: u32,
    ) -> Replicas {
        let kubeconfig = std::env::var_os("KUBECONFIG").expect("KUBECONFIG").into();
        let work = WorkDir::for_namespace(namespace);
        let shards = ShardCount::new(256).unwrap();
        let assignments = AssignmentLog::start(client, namespace, "g", shards, key);
        Replicas {
            client: client.clone(),
            kubeconfig,
            namespace: namespace.to_owned(),
            watch_namespace: watch_namespace.map(str::to_owned),
            group: "g".to_owned(),
            key,
            shards,
            expected,
            fence_log: work.join("fences.log"),
            members: Vec::new(),
            assignments,
            work,
        }
    }

    /// Start `replica-0` .. `replica-{n-1}` at once (so they join within the cold-start settle window),
    /// then wait for each one's metrics endpoint.
    pub async fn start(&mut self, n: u32) {
        let names: Vec<String> = (0..n).map(|i| format!("replica-{i}")).collect();
        let started = futures::future::join_all(names.iter().map(|name| self.launch(name))).await;
        for (name, p) in names.iter().zip(started) {
            self.started(name, p);
        }
    }

    /// Start one more replica process and wait for its metrics endpoint.
    pub async fn spawn(&mut self, name: &str) {
        let p = self.launch(name).await;
        self.started(name, p);
    }

    /// The example operator (`kshard operator`) with the suite's short timings and the shared fence log.
    async fn launch(&self, name: &str) -> Result<ReplicaProcess, ProcessError> {
        let mut flags =
            OperatorFlags::new(name, self.kubeconfig.clone(), &self.group, &self.namespace);
        flags.watch_namespace = self.watch_namespace.clone();
        flags.timings = Timings::SHORT;
        flags.expected = self.expected;
        flags.key = self.key;
        flags.shards = self.shards;
        flags.fence_log = Some(self.fence_log.clone());
        let launch = ReplicaProgram::new(kshard_binary(), &["operator"]).launch(&flags);
        let log = self.work.join(format!("{name}.log"));
        ReplicaProcess::start(name, &launch, &log, Duration::from_secs(30)).await
    }

    fn started(&mut self, name: &str, p: Result<ReplicaProcess, ProcessError>) {
        let p = p.unwrap_or_else(|e| panic!("{name} did not start: {e}"));
        self.members.push(Replica {
            name: name.to_owned(),
            metrics: p.metrics_addr().unwrap_or_default().to_owned(),
            process: p,
            running: true,
            stopped: false,
        });
    }

    pub fn replica(&self, name: &str) -> &Replica {
        self.members
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no replica {name}"))
    }

    fn replica_mut(&mut self, name: &str) -> &mut Replica {
        self.members
            .iter_mut()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no replica {name}"))
    }

    /// The names of the processes that run (stopped ones included: they are still members).
    pub fn live(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|r| r.running)
            .map(|r| r.name.clone())
            .collect()
    }

    fn signal(&self, name: &str, signal: ProcessSignal) {
        let r = self.replica(name);
        r.process.signal(signal).expect("signal a replica");
    }

    /// SIGKILL, and reap.
    pub async fn kill(&mut self, name: &str) {
        let r = self.replica_mut(name);
        r.process.kill().await;
        r.running = false;
    }

    /// SIGTERM (a graceful leave) and wait for the exit.
    pub async fn terminate(&mut self, name: &str, limit: Duration) -> ExitStatus {
        let r = self.replica_mut(name);
        let status = r
            .process
            .terminate(limit)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        r.running = false;
        status
    }

    pub fn stop(&mut self, name: &str) {
        self.signal(name, ProcessSignal::STOP);
        self.replica_mut(name).stopped = true;
    }

    pub fn resume(&mut self, name: &str) {
        self.signal(name, ProcessSignal::CONT);
        self.replica_mut(name).stopped = false;
    }

    /// A replica's `/metrics` (`None` when it does not answer).
    pub async fn metrics(&self, name: &str) -> Option<String> {
        let r = self.replica(name);
        match http_get(&r.metrics, "/metrics").await {
            Some((200, body)) => Some(body),
            _ => None,
        }
    }

    /// Every running replica's Widget read path.
    pub async fn read_paths(&self) -> BTreeMap<String, ReadPath> {
        let mut out = BTreeMap::new();
        for name in self.live() {
            let text = self.metrics(&name).await.unwrap_or_default();
            let path = ReadPath::parse(&text)
                .unwrap_or_else(|| panic!("{name}: no Widget read path metrics in\n{text}"));
            out.insert(name, path);
        }
        out
    }

    /// Whether every running replica reads Widgets in fallback mode (`Some(false)`: all in server mode;
    /// `None`: mixed).
    pub async fn fallback(&self) -> Option<bool> {
        let mut modes = BTreeSet::new();
        for name in self.live() {
            let text = self.metrics(&name).await.unwrap_or_default();
            let fallback = sample(&text, "kube_shard_read_fallback", "resource=\"widgets\"");
            modes.insert(fallback.map(|v| v != 0.0));
        }
        match modes.into_iter().collect::<Vec<_>>().as_slice() {
            [Some(fallback)] => Some(*fallback),
            _ => None,
        }
    }

    /// The assignment and the member Leases, as the cluster has them now (the library's reader,
    /// through the harness; empty before the group has an assignment).
    pub async fn snapshot(&self) -> GroupSnap {
        GroupSnap::read(
            self.client.clone(),
            &self.namespace,
            &self.group,
            self.shards,
        )
        .await
    }

    /// Poll until `cond` holds; panics with what was last seen after `limit`.
    pub async fn wait(
        &self,
        what: &str,
        limit: Duration,
        mut cond: impl FnMut(&GroupSnap) -> bool,
    ) -> GroupSnap {
        let start = Instant::now();
        loop {
            let g = self.snapshot().await;
            if cond(&g) {
                return g;
            }
            if start.elapsed() > limit {
                panic!(
                    "timed out after {limit:?} waiting for {what}; last seen: {}; logs in {}",
                    g.describe(),
                    self.work.path().display()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Until the group is settled over exactly the running replicas.
    pub async fn settled(&self, limit: Duration) -> GroupSnap {
        let live = self.live();
        self.wait(&format!("the group to settle over {live:?}"), limit, |g| {
            g.settled(&live)
        })
        .await
    }

    /// Until every Widget of `namespaces` (`expected` of them) is reconciled by the owner of its shard at
    /// the shard's epoch, on a settled group. Returns the Widgets and the group as last seen.
    pub async fn reconciled(
        &self,
        namespaces: &[String],
        expected: usize,
        limit: Duration,
    ) -> (Vec<WidgetView>, GroupSnap) {
        let start = Instant::now();
        let live = self.live();
        loop {
            let g = self.snapshot().await;
            let widgets = super::list_widgets(&self.client, namespaces).await;
            let problem = if g.settled(&live) {
                g.check_widgets(&widgets, expected, self.key)
            } else {
                Err(format!("not settled: {}", g.describe()))
            };
            match problem {
                Ok(()) => return (widgets, g),
                Err(e) if start.elapsed() > limit => panic!(
                    "after {limit:?} the Widgets are not all reconciled by their owners: {e}; logs in {}",
                    self.work.path().display()
                ),
                Err(_) => tokio::time::sleep(Duration::from_millis(300)).await,
            }
        }
    }

    /// The group's Events (events.k8s.io/v1) regarding a member's Lease with one of `reasons`, as
    /// `(reason, note)`.
    pub async fn lease_events(&self, member: &str, reasons: &[&str]) -> Vec<(String, String)> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), &self.namespace);
        let lease = format!("{}-{member}", self.group);
        let list = api.list(&ListParams::default()).await.expect("list Events");
        list.items
            .into_iter()
            .filter(|e| {
                let regarding = e.regarding.as_ref();
                regarding.and_then(|r| r.name.as_deref()) == Some(lease.as_str())
            })
            .filter_map(|e| Some((e.reason?, e.note.unwrap_or_default())))
            .filter(|(r, _)| reasons.contains(&r.as_str()))
            .collect()
    }

    /// Check the replicas' fence log, each write attributed to the owner the assignment gave its fence
    /// `(shard, epoch)` to. `stops`: members SIGSTOPped, with the wall-clock time of the stop.
    pub fn check_fence_log(&self, stops: &[(MemberId, u128)]) -> FenceLogCheck {
        fence_log(&self.fence_log, &self.assignments.fences(), stops)
    }

    /// The scenario passed: the work directory is removed on drop (after the processes, SIGKILLed as
    /// `members` drops).
    pub fn passed(&mut self) {
        self.work.passed();
    }
}

/// What the suite checks of a group beyond the harness's snapshot: where each Widget was reconciled.
pub trait WidgetPlacement {
    /// Every Widget (`expected` of them) reconciled, by the owner of its shard, at the shard's epoch.
    fn check_widgets(
        &self,
        widgets: &[WidgetView],
        expected: usize,
        key: ShardKey,
    ) -> Result<(), String>;
}

impl WidgetPlacement for GroupSnap {
    fn check_widgets(
        &self,
        widgets: &[WidgetView],
        expected: usize,
        key: ShardKey,
    ) -> Result<(), String> {
        if widgets.len() != expected {
            return Err(format!("{} Widgets, expected {expected}", widgets.len()));
        }
        let mut bad = Vec::new();
        for w in widgets {
            let shard = w.shard(key, self.shards);
            let owner = self.owner(shard).map(|m| m.name.to_string());
            if !w.reconciled() {
                bad.push(format!(
                    "{}/{} generation {} observed {:?}",
                    w.namespace, w.name, w.generation, w.observed
                ));
            } else if w.reconciled_by != owner || w.epoch != self.epoch(shard) {
                bad.push(format!(
                    "{}/{} (shard {shard}) reconciled by {:?} at {:?}, owner {owner:?} at {:?}",
                    w.namespace,
                    w.name,
                    w.reconciled_by,
                    w.epoch,
                    self.epoch(shard)
                ));
            }
        }
        match bad.len() {
            0 => Ok(()),
            n => Err(format!("{n} Widgets, e.g. {}", bad[0])),
        }
    }
}

/// The moves the planner itself makes from the owners `before` to the members `next` (by name, at their
/// incarnation in `after`); `leaving` members are still present, marked leaving.
pub fn planner_moves(
    before: &GroupSnap,
    after: &GroupSnap,
    next: &[String],
    leaving: &[String],
) -> usize {
    let a = before.assignment.as_ref().expect("an assignment");
    let mut input = PlanInput::new(before.shards).with_owners(a.owners());
    for name in next {
        let id = after
            .member_id(name)
            .or_else(|| before.member_id(name))
            .expect("a member id");
        input = input.with_member(Member::new(id));
    }
    for name in leaving {
        let id = before.member_id(name).expect("a member id");
        input = input.with_member(Member::new(id).with_leaving(true));
    }
    input.plan().expect("a plan").moves().len()
}

/// Every version of the assignment ConfigMap, as watched from before the replicas start: the moves
/// between two settled states are counted over all the versions in between (a shard moved away and back
/// counts twice), and every fence the coordinator handed out is known by `(shard, epoch)`.
pub struct AssignmentLog {
    inner: Arc<Mutex<Versions>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct Versions {
    /// (generation, owner per shard)
    versions: Vec<(u64, Vec<Option<MemberId>>)>,
    /// (shard, epoch) → the owner the assignment activated at that epoch
    fences: HashMap<(u32, u64), MemberId>,
}

impl AssignmentLog {
    fn start(client: &Client, namespace: &str, group: &str, s: ShardCount, key: ShardKey) -> Self {
        let inner = Arc::new(Mutex::new(Versions::default()));
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={group}-assignment"));
        let v = inner.clone();
        let task = tokio::spawn(async move {
            let stream = watcher::watcher(api, cfg).default_backoff();
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                let (Ok(watcher::Event::Apply(cm)) | Ok(watcher::Event::InitApply(cm))) = ev else {
                    continue;
                };
                let Some(a) = cm
                    .data
                    .as_ref()
                    .and_then(|d| d.get(DATA_KEY))
                    .and_then(|t| Assignment::decode(t, s, key).ok())
                else {
                    continue;
                };
                let mut owners = vec![None; s.get() as usize];
                let mut v = v.lock().unwrap();
                for (shard, sa) in &a.view.shards {
                    owners[*shard as usize] = Some(sa.owner.clone());
                    v.fences.insert((*shard, sa.epoch), sa.owner.clone());
                }
                if v.versions
                    .last()
                    .is_none_or(|(g, _)| *g < a.view.generation)
                {
                    v.versions.push((a.view.generation, owners));
                }
            }
        });
        AssignmentLog { inner, task }
    }

    /// The index of `generation` (waits up to 10 s for the watch to deliver it).
    pub async fn index_of(&self, generation: u64) -> usize {
        for _ in 0..100 {
            if let Some(i) = self
                .inner
                .lock()
                .unwrap()
                .versions
                .iter()
                .position(|(g, _)| *g == generation)
            {
                return i;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the assignment watch never saw generation {generation}");
    }

    /// (owner changes summed over consecutive versions, versions) from index `from` to `to`.
    pub fn moves(&self, from: usize, to: usize) -> (u64, usize) {
        let v = self.inner.lock().unwrap();
        let changes = v.versions[from..=to]
            .windows(2)
            .map(|w| w[0].1.iter().zip(&w[1].1).filter(|(a, b)| a != b).count() as u64)
            .sum();
        (changes, to - from)
    }

    /// Every fence handed out: (shard, epoch) → owner.
    pub fn fences(&self) -> HashMap<(u32, u64), MemberId> {
        self.inner.lock().unwrap().fences.clone()
    }
}

impl Drop for AssignmentLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}
