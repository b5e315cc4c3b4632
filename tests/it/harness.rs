//! The shard-group test harness: members on testserver in paused time, their fence log, the control
//! namespace, and the waits and counts the group, safety and HA tests share (the HA crate's tests include
//! this file by path).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use kube_shard::group::assignment::{Assignment, DATA_KEY};
use kube_shard::group::{GroupHandle, ShardGroup, ShardGroupBuilder};
use kube_shard::ownership::Ownership;
use kube_shard::testing::oracles::fences::FenceRecorder;
use kube_shard::{ShardCount, ShardKey};
use kube_shard_testserver::TestServer;
use tokio::time::Instant;

pub(crate) const GROUP: &str = "demo";
pub(crate) const CP_NS: &str = "control";
pub(crate) const LEASE: Duration = Duration::from_secs(3);
pub(crate) const RENEW: Duration = Duration::from_secs(2);
pub(crate) const RETRY: Duration = Duration::from_millis(500);
pub(crate) const GRACE: Duration = Duration::from_millis(500);
pub(crate) const MARGIN: Duration = Duration::from_millis(200);
/// `RENEW − MARGIN`: a fence issued while Owned, and a request sent with it, may last that long, so a drain
/// may not release a shard sooner (`build()` refuses a shorter drain).
pub(crate) const DRAIN: Duration = Duration::from_millis(1_800);

pub(crate) fn s() -> ShardCount {
    ShardCount::new(16).unwrap()
}

// === a member that can be frozen (a paused process) or killed ===

#[derive(Default)]
struct FreezeState {
    frozen: bool,
    wakers: Vec<Waker>,
}

#[derive(Clone, Default)]
pub(crate) struct Freeze(Arc<Mutex<FreezeState>>);

impl Freeze {
    pub(crate) fn set(&self, frozen: bool) {
        let mut s = self.0.lock().unwrap();
        s.frozen = frozen;
        if !frozen {
            for w in s.wakers.drain(..) {
                w.wake();
            }
        }
    }

    pub(crate) fn wrap<F: Future + Send + 'static>(
        &self,
        fut: F,
    ) -> impl Future<Output = F::Output> + Send + 'static {
        Frozen {
            inner: Box::pin(fut),
            freeze: self.clone(),
        }
    }
}

struct Frozen<F: Future> {
    inner: Pin<Box<F>>,
    freeze: Freeze,
}

impl<F: Future> Future for Frozen<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        {
            let mut s = self.freeze.0.lock().unwrap();
            if s.frozen {
                s.wakers.push(cx.waker().clone());
                return Poll::Pending;
            }
        }
        self.inner.as_mut().poll(cx)
    }
}

/// One fence the logger obtained: `[issued, last_valid]` is when it was seen valid; `valid_until` is the
/// bound it carried when issued. `member` is the name, `holder` the `name/incarnation` that held it.
#[derive(Clone, Debug)]
pub(crate) struct FenceRecord {
    pub(crate) member: String,
    pub(crate) holder: String,
    pub(crate) shard: u32,
    pub(crate) epoch: u64,
    pub(crate) issued: Instant,
    pub(crate) valid_until: Instant,
    pub(crate) last_valid: Instant,
}

/// What the members' fences did: the sampled log of the 50 ms logger, and the fence oracle's recorder,
/// installed on every member's ownership, which sees every fence (valid_until, drop) and fenced request.
#[derive(Clone)]
pub(crate) struct FenceLog {
    records: Arc<Mutex<Vec<FenceRecord>>>,
    pub(crate) oracle: Arc<FenceRecorder>,
}

impl Default for FenceLog {
    fn default() -> Self {
        FenceLog {
            records: Arc::default(),
            oracle: FenceRecorder::new(),
        }
    }
}

impl FenceLog {
    pub(crate) fn lock(
        &self,
    ) -> std::sync::LockResult<std::sync::MutexGuard<'_, Vec<FenceRecord>>> {
        self.records.lock()
    }

    /// Report this member's fences to the oracle (before its task runs).
    pub(crate) fn observe(&self, ownership: &Ownership) {
        assert!(kube_shard::testing::observe_fences(
            ownership,
            self.oracle.clone()
        ));
    }
}

pub(crate) struct Member {
    pub(crate) name: String,
    pub(crate) handle: GroupHandle,
    pub(crate) task: tokio::task::JoinHandle<()>,
    pub(crate) logger: tokio::task::JoinHandle<()>,
    pub(crate) freeze: Freeze,
}

impl Member {
    pub(crate) fn ownership(&self) -> Ownership {
        self.handle.ownership()
    }

    pub(crate) fn kill(&self) {
        self.task.abort();
        self.logger.abort();
    }
}

pub(crate) fn builder(server: &TestServer, name: &str) -> ShardGroupBuilder {
    ShardGroup::builder(server.client(name), GROUP, CP_NS)
        .member(name)
        .shards(s())
        .key(ShardKey::Uid)
        .timings(LEASE, RENEW, RETRY)
        .takeover_grace(GRACE)
        .drain_timeout(DRAIN)
        .fence_margin(MARGIN)
        .settle(Duration::from_secs(1), Duration::from_millis(500))
}

pub(crate) fn spawn(server: &TestServer, name: &str, log: &FenceLog) -> Member {
    spawn_with(builder(server, name), name, log)
}

pub(crate) fn spawn_with(b: ShardGroupBuilder, name: &str, log: &FenceLog) -> Member {
    let group = b.build().expect("valid config");
    let (handle, task) = group.start();
    log.observe(&handle.ownership());
    let freeze = Freeze::default();
    let task = tokio::spawn(freeze.wrap(async move {
        if let Err(e) = task.await {
            panic!("member task failed: {e}");
        }
    }));
    let logger = tokio::spawn(freeze.wrap(fence_logger(
        name.to_owned(),
        handle.ownership(),
        log.clone(),
    )));
    Member {
        name: name.to_owned(),
        handle,
        task,
        logger,
        freeze,
    }
}

/// Every 50 ms: take a fence for every admitted shard, and re-check the fences held.
pub(crate) async fn fence_logger(member: String, ownership: Ownership, log: FenceLog) {
    let mut held: BTreeMap<u32, (usize, kube_shard::Fence)> = BTreeMap::new();
    loop {
        let now = Instant::now();
        // re-check what we hold
        held.retain(|_, (idx, fence)| match fence.check() {
            Ok(_) => {
                log.lock().unwrap()[*idx].last_valid = now;
                true
            }
            Err(_) => false,
        });
        for shard in 0..s().get() {
            if held.contains_key(&shard) {
                continue;
            }
            if let Ok(permit) = ownership.admit_shard(shard) {
                if let Ok(fence) = permit.fence() {
                    if let Ok(remaining) = fence.check() {
                        let mut l = log.lock().unwrap();
                        l.push(FenceRecord {
                            member: member.clone(),
                            holder: kube_shard::testing::member_state(&ownership)
                                .me()
                                .to_string(),
                            shard,
                            epoch: fence.epoch(),
                            issued: now,
                            valid_until: now + remaining,
                            last_valid: now,
                        });
                        held.insert(shard, (l.len() - 1, fence));
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The safety contract on the log: for one shard, fences of different members (`name/incarnation`) are
/// never valid at the same time, and epochs only increase with issue time — on the sampled log, and on the
/// oracle's record of every fence and fenced request (windows up to `valid_until` or the drop of the fence,
/// extended by requests in flight; per shard and per uid).
pub(crate) fn check_fences(log: &FenceLog) {
    log.oracle.assert_exclusive();
    let log = log.lock().unwrap();
    let mut by_shard: BTreeMap<u32, Vec<&FenceRecord>> = BTreeMap::new();
    for r in log.iter() {
        by_shard.entry(r.shard).or_default().push(r);
    }
    for (shard, mut recs) in by_shard {
        recs.sort_by_key(|r| r.issued);
        for w in recs.windows(2) {
            assert!(
                w[0].epoch <= w[1].epoch,
                "shard {shard}: epoch went back: {:?} then {:?}",
                w[0],
                w[1]
            );
        }
        for (i, a) in recs.iter().enumerate() {
            for b in &recs[i + 1..] {
                if a.holder != b.holder {
                    assert!(
                        a.last_valid < b.issued || b.last_valid < a.issued,
                        "shard {shard}: overlapping fences {a:?} and {b:?}"
                    );
                }
            }
        }
    }
}

pub(crate) async fn setup(server: &TestServer) {
    let ns: Api<Namespace> = Api::all(server.client("admin"));
    ns.create(
        &PostParams::default(),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(CP_NS.into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        },
    )
    .await
    .unwrap();
}

pub(crate) async fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

/// Shard → members that own it (admitted or self-fenced), from the members' own states.
pub(crate) fn owners(members: &[&Member]) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for m in members {
        for s in m.handle.status().owned.iter() {
            out.entry(s).or_default().push(m.name.clone());
        }
        // the status is published at renewals; the ownership snapshot is live
        for (s, st) in m.ownership().shard_states() {
            if matches!(st, kube_shard::ownership::ShardState::Owned { .. }) {
                let v = out.entry(s).or_default();
                if !v.contains(&m.name) {
                    v.push(m.name.clone());
                }
            }
        }
    }
    out
}

/// Shards someone serves (Owned or Outgoing).
pub(crate) fn served(members: &[&Member]) -> BTreeSet<u32> {
    members
        .iter()
        .flat_map(|m| {
            m.ownership()
                .shard_states()
                .into_iter()
                .filter(|(_, st)| {
                    matches!(
                        st,
                        kube_shard::ownership::ShardState::Owned { .. }
                            | kube_shard::ownership::ShardState::Outgoing { .. }
                    )
                })
                .map(|(s, _)| s)
                .collect::<Vec<_>>()
        })
        .collect()
}

pub(crate) fn owned_count(m: &Member) -> usize {
    m.ownership()
        .shard_states()
        .into_iter()
        .filter(|(_, st)| matches!(st, kube_shard::ownership::ShardState::Owned { .. }))
        .count()
}

pub(crate) fn each_shard_owned_once(members: &[&Member]) -> bool {
    let o = owners(members);
    o.len() == s().get() as usize && o.values().all(|v| v.len() == 1)
}

pub(crate) async fn assignment(server: &TestServer) -> Option<Assignment> {
    let cms: Api<ConfigMap> = Api::namespaced(server.client("admin"), CP_NS);
    let cm = cms.get_opt(&format!("{GROUP}-assignment")).await.unwrap()?;
    let text = cm.data?.get(DATA_KEY)?.clone();
    Assignment::decode(&text, s(), ShardKey::Uid).ok()
}

/// Spawn `names` and wait (at most 30 s of virtual time) until every shard is owned exactly once.
pub(crate) async fn settled(server: &TestServer, names: &[&str], log: &FenceLog) -> Vec<Member> {
    let ms: Vec<Member> = names.iter().map(|n| spawn(server, n, log)).collect();
    {
        let refs: Vec<&Member> = ms.iter().collect();
        until(Duration::from_secs(30), "settled", || {
            each_shard_owned_once(&refs)
        })
        .await;
    }
    ms
}

/// A testserver that honours shard selectors, with the control namespace created, and an empty fence
/// log: the start of every group test.
pub(crate) async fn group_server() -> (TestServer, FenceLog) {
    let server = TestServer::builder().shard_selector(true).build();
    setup(&server).await;
    (server, FenceLog::default())
}

/// A Lease in the control namespace renewed by the test every second until `stop`.
pub(crate) fn renew_lease_forever(
    server: &TestServer,
    who: &str,
    lease: Lease,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let leases: Api<Lease> = Api::namespaced(server.client(who), CP_NS);
    tokio::spawn(async move {
        let name = lease.metadata.name.clone().unwrap();
        leases.create(&PostParams::default(), &lease).await.unwrap();
        let mut n = 0i64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let mut l = leases.get(&name).await.unwrap();
            let t = k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + n).unwrap();
            l.spec.as_mut().unwrap().renew_time = Some(MicroTime(t));
            leases
                .replace(&name, &PostParams::default(), &l)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

/// POST every policy and binding of `set` to testserver.
pub(crate) async fn post_policies(server: &TestServer, set: &kube_shard::fence_policy::PolicySet) {
    let client = server.client("admin");
    let docs = set
        .policies
        .iter()
        .map(|p| {
            (
                "validatingadmissionpolicies",
                serde_json::to_vec(p).unwrap(),
            )
        })
        .chain(set.bindings.iter().map(|b| {
            (
                "validatingadmissionpolicybindings",
                serde_json::to_vec(b).unwrap(),
            )
        }));
    for (plural, body) in docs {
        let req = http::Request::post(format!("/apis/admissionregistration.k8s.io/v1/{plural}"))
            .header("content-type", "application/json")
            .body(body)
            .unwrap();
        client.request_text(req).await.unwrap();
    }
}
