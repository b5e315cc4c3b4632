//! The sharded example operator, `examples/document-operator-sharded.rs`, run as a user runs it: three
//! replica processes (`run --listen ADDR`, `POD_NAME`, `POD_NAMESPACE`) against a real kube-apiserver.
//! The scenario shows that
//!
//! 1. every Document is reconciled (its status written: `hidden`, `wordCount`, `observedGeneration` and
//!    the `Published` condition) and the three replicas split the work: each Document was last reconciled
//!    by the owner of its shard, and each replica reconciled some;
//! 2. after a replica (not the coordinator) is SIGKILLed, every Document it reconciled last is reconciled
//!    again by a surviving replica, the new owner of its shard, although no Document changed: the test
//!    writes nothing once they are settled, and their resourceVersions stay as they were (an up-to-date
//!    status is not written again), so the takeover alone brought them back;
//! 3. the fence log the library writes (`KUBE_SHARD_FENCE_LOG`, the example being built with the
//!    `test-util` feature) has no violation and holds at least one line per status change a watch on the
//!    Documents saw: every status write went through a fence.
//!
//! Reconciles are read from the replicas' stdout: the example logs `Reconciling Document "NAME" in NS`
//! at info for each one. The group is the example's (`document-operator`, its `MANAGER`), with its
//! Leases in the test's namespace; the replicas watch Documents in every namespace, so run one such
//! scenario per cluster at a time. The CRD is cluster-scoped: created when absent, and kept.
//!
//! `KUBECONFIG=$(../shared/realkube/realkube start NAME --fresh) cargo test -p kube-shard-e2e --test e2e
//! document_operator -- --ignored --nocapture`. The example binary is `KSHARD_DOCUMENT_OPERATOR_BIN`, or
//! built into `target/e2e`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_shard::{fnv1a64, ShardCount};
use kube_shard_harness::checks::{fence_log_violations, parse_fence_log};
use kube_shard_harness::group::GroupSnap;
use kube_shard_harness::process::{Launch, ReplicaProcess};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::support::workdir::WorkDir;
use crate::support::{client, drop_namespace, namespace, report};

/// The Documents the scenario creates.
const DOCUMENTS: usize = 30;
/// The replica processes (their `POD_NAME`, the member names).
const REPLICAS: [&str; 3] = ["docop-0", "docop-1", "docop-2"];
/// The example's group: its `MANAGER`.
const GROUP: &str = "document-operator";
const CRD: &str = "documents.docs.example.com";
/// The split counts as settled once no replica has reconciled a Document of the test for this long.
const QUIET: Duration = Duration::from_secs(3);
/// Time for three replicas to form the group (cold start settle, join debounce) and reconcile.
const START_LIMIT: Duration = Duration::from_secs(120);
/// A takeover after a SIGKILL: the default 15 s lease plus the 2 s grace, and margin.
const TAKEOVER_LIMIT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(250);

// ---- the example binary and its CRD ----

/// The example operator as a private hard link: `KSHARD_DOCUMENT_OPERATOR_BIN`, or built by this test.
fn operator_binary() -> PathBuf {
    crate::support::private_binary(
        "KSHARD_DOCUMENT_OPERATOR_BIN",
        &["-p", "kube-shard", "--example", "document-operator-sharded"],
        "examples/document-operator-sharded",
    )
}

fn document_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("docs.example.com", "v1", "Document"),
        "documents",
    )
}

fn documents(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &document_resource())
}

/// Create the CRD from the binary's `crd` subcommand unless it exists (it is shared between runs), and
/// wait until it is Established.
async fn install_crd(client: &Client, bin: &Path) {
    let out = std::process::Command::new(bin)
        .arg("crd")
        .output()
        .expect("run the example's crd subcommand");
    assert!(out.status.success(), "`crd` failed: {out:?}");
    let crd: CustomResourceDefinition =
        serde_json::from_slice(&out.stdout).expect("`crd` prints the CRD as JSON");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    match crds.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create the Document CRD: {e}"),
    }
    let established = |c: &CustomResourceDefinition| {
        c.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            })
    };
    let start = Instant::now();
    while !crds.get(CRD).await.is_ok_and(|c| established(&c)) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the Document CRD is not Established after 60 s"
        );
        tokio::time::sleep(POLL).await;
    }
}

// ---- the Documents ----

/// The spec of Document `i` and the word count the operator must report for it: a Markdown heading
/// (`#` is not a word), `i` bullets (`-` is not a word) and a rule (nor is `---`).
fn spec(i: usize) -> (Value, u64) {
    let bullets = "- item\n".repeat(i);
    let content = format!("# Part {i}\n\n{bullets}\n---\n");
    let spec =
        json!({"title": format!("Document {i}"), "content": content, "hide": i.is_multiple_of(3)});
    (spec, 2 + i as u64)
}

/// Create `doc-0` .. and return each one's expected word count by name.
async fn create_documents(api: &Api<DynamicObject>) -> BTreeMap<String, u64> {
    let mut expected = BTreeMap::new();
    for i in 0..DOCUMENTS {
        let name = format!("doc-{i}");
        let (spec, words) = spec(i);
        let mut doc = DynamicObject::new(&name, &document_resource());
        doc.data = json!({ "spec": spec });
        api.create(&PostParams::default(), &doc)
            .await
            .expect("create a Document");
        expected.insert(name, words);
    }
    expected
}

/// What is wrong with the status of `doc` (`words` expected), if anything.
fn status_problem(doc: &DynamicObject, words: u64) -> Option<String> {
    let status = &doc.data["status"];
    let hide = doc.data["spec"]["hide"].as_bool().unwrap_or(false);
    let (published, reason) = if hide {
        ("False", "Hidden")
    } else {
        ("True", "Visible")
    };
    let condition = status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Published"));
    let ok = status["hidden"].as_bool() == Some(hide)
        && status["wordCount"].as_u64() == Some(words)
        && status["observedGeneration"].as_i64() == doc.metadata.generation
        && condition.is_some_and(|c| c["status"] == published && c["reason"] == reason);
    (!ok).then(|| {
        format!(
            "{}: status {status}, expected {words} words, hidden {hide}",
            doc.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

/// Until every Document has the status it should; returns them.
async fn wait_statuses(
    api: &Api<DynamicObject>,
    expected: &BTreeMap<String, u64>,
    limit: Duration,
) -> Vec<DynamicObject> {
    let start = Instant::now();
    loop {
        let docs = api.list(&ListParams::default()).await.expect("list").items;
        let problems: Vec<String> = docs
            .iter()
            .filter_map(|d| {
                let name = d.metadata.name.clone().unwrap_or_default();
                status_problem(d, *expected.get(&name)?)
            })
            .collect();
        if docs.len() == expected.len() && problems.is_empty() {
            return docs;
        }
        assert!(
            start.elapsed() < limit,
            "after {limit:?}, {} Documents of {} have a wrong status, e.g. {:?}",
            problems.len(),
            docs.len(),
            problems.first()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// Each Document's (resourceVersion, generation).
async fn versions(api: &Api<DynamicObject>) -> BTreeMap<String, (String, i64)> {
    let docs = api.list(&ListParams::default()).await.expect("list").items;
    docs.into_iter()
        .map(|d| {
            let m = d.metadata;
            let version = (
                m.resource_version.unwrap_or_default(),
                m.generation.unwrap_or(0),
            );
            (m.name.unwrap_or_default(), version)
        })
        .collect()
}

/// Delete the Documents while the replicas still run, so that their owners run the cleanup and remove
/// the finalizer; returns how many they released within 30 s (the rest are released by the test, so
/// that no Document is left for a later run's replicas, which watch every namespace).
async fn delete_documents(api: &Api<DynamicObject>) -> usize {
    let all = ListParams::default();
    let before = api.list(&all).await.map(|l| l.items.len()).unwrap_or(0);
    let _ = api.delete_collection(&DeleteParams::default(), &all).await;
    let start = Instant::now();
    let mut left = before;
    while left > 0 && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(POLL).await;
        left = api.list(&all).await.map(|l| l.items.len()).unwrap_or(left);
    }
    let unfinalize = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    for d in api.list(&all).await.map(|l| l.items).unwrap_or_default() {
        let name = d.metadata.name.unwrap_or_default();
        let _ = api.patch(&name, &PatchParams::default(), &unfinalize).await;
    }
    before - left
}

// ---- status changes, as a watch sees them ----

/// Counts the status-changing commits a watch on the Documents sees: a change of `.status` between
/// consecutive events of one object (from none at its first event).
struct StatusChanges {
    count: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl StatusChanges {
    fn start(api: Api<DynamicObject>) -> Self {
        let count = Arc::new(AtomicU64::new(0));
        let c = count.clone();
        let task = tokio::spawn(async move {
            let mut last: HashMap<String, Value> = HashMap::new();
            let mut stream = std::pin::pin!(watcher::watcher(api, watcher::Config::default()));
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        let name = o.metadata.name.clone().unwrap_or_default();
                        let status = o.data.get("status").cloned().unwrap_or(Value::Null);
                        if last.insert(name, status.clone()).unwrap_or(Value::Null) != status {
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(watcher::Event::Delete(o)) => {
                        last.remove(o.metadata.name.as_deref().unwrap_or_default());
                    }
                    _ => {}
                }
            }
        });
        StatusChanges { count, task }
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

impl Drop for StatusChanges {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---- the replica processes and their logs ----

/// One stdout line of a replica, when it arrived.
struct Line {
    replica: String,
    text: String,
    at: Instant,
}

/// A reconcile a replica logged.
#[derive(Clone, Debug)]
struct Reconcile {
    replica: String,
    name: String,
    at: Instant,
}

/// The Document a log line says is being reconciled, when it is one of namespace `ns`.
fn reconciled_document<'a>(text: &'a str, ns: &str) -> Option<&'a str> {
    let rest = text.split_once("Reconciling Document \"")?.1;
    let (name, rest) = rest.split_once('"')?;
    let in_ns = rest.strip_prefix(" in ")?.split_whitespace().next()?;
    (in_ns == ns).then_some(name)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("its address").port()
}

/// The replica processes (killed when dropped), their stdout lines in arrival order, and a work
/// directory with each one's log and the shared fence log (removed after a passing run).
struct Operator {
    namespace: String,
    fence_log: PathBuf,
    replicas: Vec<ReplicaProcess>,
    killed: BTreeSet<String>,
    lines: Arc<Mutex<Vec<Line>>>,
    /// Last: removed (after a passing run) once the processes, killed as `replicas` drops, are gone.
    work: WorkDir,
}

impl Operator {
    /// Start the replicas at once, each with the environment a Deployment would give it.
    fn start(bin: &Path, ns: &str) -> Operator {
        let work = WorkDir::for_namespace(ns);
        let fence_log = work.join("fences.log");
        let kubeconfig = std::env::var_os("KUBECONFIG").expect("KUBECONFIG");
        let lines: Arc<Mutex<Vec<Line>>> = Arc::default();
        let replicas = REPLICAS
            .iter()
            .map(|name| {
                let launch = Launch::new(bin)
                    .args(["run", "--listen", &format!("127.0.0.1:{}", free_port())])
                    .env("KUBECONFIG", &kubeconfig)
                    .env("POD_NAME", name)
                    .env("POD_NAMESPACE", ns)
                    .env("RUST_LOG", "info")
                    .env(kube_shard::testing::fence_log::ENV, &fence_log);
                let stderr = work.join(format!("{name}.stderr.log"));
                let stdout = std::fs::File::create(work.join(format!("{name}.log")))
                    .expect("create a replica's log");
                let on_line = collect(name, &lines, stdout);
                ReplicaProcess::start_with_lines(name, &launch, &stderr, on_line)
                    .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect();
        Operator {
            namespace: ns.to_owned(),
            fence_log,
            replicas,
            killed: BTreeSet::new(),
            lines,
            work,
        }
    }

    /// The replicas that run.
    fn live(&self) -> Vec<String> {
        REPLICAS
            .iter()
            .filter(|r| !self.killed.contains(**r))
            .map(|r| r.to_string())
            .collect()
    }

    /// SIGKILL, and reap.
    async fn kill(&mut self, name: &str) {
        let p = self.replicas.iter_mut().find(|p| p.name() == name);
        p.unwrap_or_else(|| panic!("no replica {name}"))
            .kill()
            .await;
        self.killed.insert(name.to_owned());
    }

    /// How many lines the replicas have logged so far.
    fn mark(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// The reconciles of the test's Documents logged from line `from` on, in arrival order.
    fn reconciles(&self, from: usize) -> Vec<Reconcile> {
        let lines = self.lines.lock().unwrap();
        lines[from.min(lines.len())..]
            .iter()
            .filter_map(|l| {
                Some(Reconcile {
                    name: reconciled_document(&l.text, &self.namespace)?.to_owned(),
                    replica: l.replica.clone(),
                    at: l.at,
                })
            })
            .collect()
    }
}

/// Keeps a replica's stdout lines: in `lines`, and in its log file.
fn collect(
    replica: &str,
    lines: &Arc<Mutex<Vec<Line>>>,
    mut file: std::fs::File,
) -> impl FnMut(&str) + Send + 'static {
    let (replica, lines) = (replica.to_owned(), lines.clone());
    move |text| {
        let _ = writeln!(file, "{text}");
        lines.lock().unwrap().push(Line {
            replica: replica.clone(),
            text: text.to_owned(),
            at: Instant::now(),
        });
    }
}

// ---- who reconciled what ----

/// What the test knows of a Document: its uid, for its shard.
type Uids = BTreeMap<String, String>;

fn shard_owner(snap: &GroupSnap, uid: &str) -> Option<String> {
    let shard = snap.shards.shard_of(fnv1a64(uid.as_bytes()));
    snap.owner(shard).map(|m| m.name.to_string())
}

/// The last of `reconciles` of each Document of `names`, when each was by the owner of its shard; else
/// what is wrong.
fn last_by_owners(
    reconciles: &[Reconcile],
    snap: &GroupSnap,
    uids: &Uids,
    names: &BTreeSet<String>,
) -> Result<BTreeMap<String, Reconcile>, String> {
    let mut last = BTreeMap::new();
    for r in reconciles.iter().filter(|r| names.contains(&r.name)) {
        last.insert(r.name.clone(), r.clone());
    }
    let mut wrong = Vec::new();
    for name in names {
        let owner = shard_owner(snap, &uids[name]);
        match last.get(name) {
            None => wrong.push(format!("{name}: not reconciled")),
            Some(r) if Some(&r.replica) != owner.as_ref() => wrong.push(format!(
                "{name}: last reconciled by {}, its shard's owner is {owner:?}",
                r.replica
            )),
            Some(_) => {}
        }
    }
    match wrong.len() {
        0 => Ok(last),
        n => Err(format!("{n} Documents, e.g. {}", wrong[0])),
    }
}

/// Until the group is settled over the running replicas and every Document of `names` has been
/// reconciled since line `from`, last by the owner of its shard (and, with `quiet`, no Document of the
/// test for that long). Returns the group and each Document's last reconcile.
async fn wait_reconciled_by_owners(
    op: &Operator,
    client: &Client,
    uids: &Uids,
    names: &BTreeSet<String>,
    from: usize,
    quiet: Option<Duration>,
    limit: Duration,
) -> (GroupSnap, BTreeMap<String, Reconcile>) {
    let start = Instant::now();
    let live = op.live();
    loop {
        let snap = GroupSnap::read(client.clone(), &op.namespace, GROUP, ShardCount::DEFAULT).await;
        let reconciles = op.reconciles(from);
        let quiet_enough = match (quiet, reconciles.last()) {
            (Some(q), Some(r)) => r.at.elapsed() >= q,
            _ => true,
        };
        let problem = if !snap.settled(&live) {
            Err(format!("not settled over {live:?}: {}", snap.describe()))
        } else if !quiet_enough {
            Err("the replicas are still reconciling".to_owned())
        } else {
            last_by_owners(&reconciles, &snap, uids, names)
        };
        match problem {
            Ok(last) => return (snap, last),
            Err(e) if start.elapsed() > limit => {
                panic!("after {limit:?}: {e}; logs in {}", op.work.path().display())
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// How many of `last` each replica has.
fn per_replica(last: &BTreeMap<String, Reconcile>) -> BTreeMap<String, usize> {
    let mut n = BTreeMap::new();
    for r in last.values() {
        *n.entry(r.replica.clone()).or_default() += 1;
    }
    n
}

/// The replica to kill: of those that are not the coordinator, the one that reconciled the most
/// Documents last.
fn victim(snap: &GroupSnap, last: &BTreeMap<String, Reconcile>) -> String {
    let counts = per_replica(last);
    REPLICAS
        .iter()
        .filter(|r| snap.coordinator.as_deref() != Some(**r))
        .max_by_key(|r| counts.get(**r).copied().unwrap_or(0))
        .expect("a replica that is not the coordinator")
        .to_string()
}

/// Per replica, the reconciles it logged and the Documents they were of.
fn after_kill_per_survivor(reconciles: &[Reconcile]) -> BTreeMap<String, Value> {
    let mut by: BTreeMap<String, (usize, BTreeSet<&str>)> = BTreeMap::new();
    for r in reconciles {
        let (n, docs) = by.entry(r.replica.clone()).or_default();
        *n += 1;
        docs.insert(&r.name);
    }
    by.into_iter()
        .map(|(r, (n, docs))| (r, json!({"reconciles": n, "documents": docs.len()})))
        .collect()
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

// ---- the fence log ----

/// The fence log's lines, after checking it has no violation, names only the scenario's replicas and
/// holds at least `status_writes` lines.
///
/// What the operator writes without a fence, and so is not in the log:
/// - the finalizer, added and removed by kube's `finalizer` helper through the plain `Api` (JSON patches
///   whose `test` operation checks the finalizer list at the index it edits; it is removed only after the
///   cleanup returned `Ok`, a cleanup that only publishes an Event is idempotent, and the fence policy
///   does not refuse these patches since they leave the fence annotation as it is);
/// - Events, through kube's `Recorder` (`HideRequested` for hidden Documents, `DeleteRequested` at
///   cleanup): informational, a deposed owner may publish one more.
///
/// Neither changes `.status`, so every status change the watch counted is a fenced write.
fn check_fence_log(path: &Path, status_writes: u64) -> usize {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let records = parse_fence_log(&text);
    let violations = fence_log_violations(&records);
    assert!(
        violations.is_empty(),
        "{} fence log violations, e.g. {}",
        violations.len(),
        violations[0]
    );
    let strangers: BTreeSet<&str> = records
        .iter()
        .map(|r| r.member.split('/').next().unwrap_or_default())
        .filter(|m| !REPLICAS.contains(m))
        .collect();
    assert!(strangers.is_empty(), "fence log lines of {strangers:?}");
    assert!(
        records.len() as u64 >= status_writes,
        "{} fenced writes in the fence log, {status_writes} status changes watched: a status write \
         went unfenced",
        records.len()
    );
    records.len()
}

// ---- the scenario ----

/// Three replicas of the sharded example operator split thirty Documents; one is SIGKILLed and the
/// survivors reconcile its Documents again without them changing; every status write was fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: KUBECONFIG=... cargo test -p kube-shard-e2e --test e2e document_operator -- --ignored"]
async fn sharded_example_splits_documents_and_takes_over_a_killed_replica() {
    let began = Instant::now();
    let client = client().await;
    let bin = operator_binary();
    let built = began.elapsed();
    install_crd(&client, &bin).await;
    let ns = namespace(&client, "kshard-e2e-docop").await;
    let api = documents(&client, &ns);
    let statuses = StatusChanges::start(api.clone());
    let expected = create_documents(&api).await;
    let mut op = Operator::start(&bin, &ns);
    let started = Instant::now();

    // 1. all reconciled, split over the three replicas
    let docs = wait_statuses(&api, &expected, START_LIMIT).await;
    let uids: Uids = docs
        .iter()
        .map(|d| {
            (
                d.metadata.name.clone().unwrap(),
                d.metadata.uid.clone().unwrap(),
            )
        })
        .collect();
    let all: BTreeSet<String> = expected.keys().cloned().collect();
    let (snap, last) =
        wait_reconciled_by_owners(&op, &client, &uids, &all, 0, Some(QUIET), START_LIMIT).await;
    let split = per_replica(&last);
    for r in REPLICAS {
        assert!(
            split.get(r).is_some_and(|n| *n > 0),
            "{r} reconciled no Document last: {split:?}"
        );
    }
    let settled_after = started.elapsed();

    // 2. SIGKILL a replica: its Documents are reconciled again by their new owners, unchanged
    let before = versions(&api).await;
    let status_writes_at_kill = statuses.count();
    let victim = victim(&snap, &last);
    let moving: BTreeSet<String> = last
        .values()
        .filter(|r| r.replica == victim)
        .map(|r| r.name.clone())
        .collect();
    assert!(!moving.is_empty(), "{victim} reconciled no Document last");
    let mark = op.mark();
    let killed = Instant::now();
    op.kill(&victim).await;
    let (_, again) =
        wait_reconciled_by_owners(&op, &client, &uids, &moving, mark, None, TAKEOVER_LIMIT).await;
    let since_kill: Vec<Duration> = again.values().map(|r| r.at - killed).collect();
    let after_kill = op.reconciles(mark);
    let survivors = after_kill_per_survivor(&after_kill);
    let after = versions(&api).await;
    assert_eq!(
        before, after,
        "the Documents changed after they settled (resourceVersion, generation)"
    );

    // 3. the fence log
    let status_writes = statuses.count();
    let fence_lines = check_fence_log(&op.fence_log, status_writes);

    let released = delete_documents(&api).await;
    report(json!({
        "scenario": "document_operator", "documents": DOCUMENTS, "replicas": REPLICAS.len(),
        "last_reconciled_per_replica": split, "coordinator": snap.coordinator, "killed": victim,
        "documents_of_the_killed": moving.len(),
        "reconciles_after_kill": after_kill.len(),
        "documents_reconciled_after_kill_per_survivor": survivors,
        "first_re_reconcile_seconds": since_kill.iter().min().copied().map(secs),
        "last_re_reconcile_seconds": since_kill.iter().max().copied().map(secs),
        "status_writes_watched": status_writes, "status_writes_after_kill": status_writes - status_writes_at_kill,
        "fence_log_lines": fence_lines,
        "released_by_the_operator_on_delete": released,
        "build_seconds": secs(built), "settled_seconds": secs(settled_after),
        "total_seconds": secs(began.elapsed()),
    }));
    op.work.passed();
    drop(op);
    let _ = std::fs::remove_file(&bin);
    drop_namespace(&client, &ns).await;
}

/// The example's reconcile line as it logs it, with kube's and its own spans.
#[test]
fn a_reconcile_line_names_its_document_in_its_namespace() {
    let line = "2026-12-06T02:12:55.421638Z  INFO reconciling object{object.ref=Document.v1.docs.example.com/d1.ns \
                object.reason=object updated}:reconcile{name=d1 namespace=\"ns\"}: document_operator_sharded: \
                Reconciling Document \"d1\" in ns";
    assert_eq!(reconciled_document(line, "ns"), Some("d1"));
    assert_eq!(reconciled_document(line, "other"), None);
    assert_eq!(
        reconciled_document("INFO document_operator_sharded: controller shut down", "ns"),
        None
    );
}
