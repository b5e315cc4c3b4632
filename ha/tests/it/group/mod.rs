//! HA in a shard group (HA.md "HA in a shard group") on two testservers, paused time: each cluster's
//! operator is a shard group built with `ShardGroupBuilder::ha`; a worker per member admits every owned
//! shard through the group (`Ownership::admit_shard`), takes a fence, and keeps a request in flight up to
//! 300 ms but never past the fence's validity. The cross-cluster overlap checker
//! (`kube_shard_ha::overlap`) records each request under (cluster, the permit's failover epoch).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use kube_shard::group::ShardGroupBuilder;
use kube_shard::ownership::{AdmitError, Ownership, Permit};
use kube_shard_ha::faults::Faults;
use kube_shard_ha::overlap::HaOverlap;
use kube_shard_ha::{Attach, GroupHa, HaClients, HaConfig, HaMode};
use kube_shard_testserver::{Scope, TestServer};
use tokio::time::Instant;

use crate::harness::{builder, spawn_with, until, FenceLog, Member, CP_NS};

/// The HA renew deadline (the default timings: 15 s lease, 10 s renew deadline, 2 s retry).
const HA_RENEW: Duration = Duration::from_secs(10);

pub(crate) struct Side {
    pub(crate) member: Member,
    pub(crate) ha: GroupHa,
    pub(crate) worker: tokio::task::JoinHandle<()>,
    pub(crate) admitted: Arc<AtomicU64>,
}

impl Side {
    pub(crate) fn kill(&self) {
        self.member.kill();
        self.worker.abort();
    }

    pub(crate) fn ownership(&self) -> Ownership {
        self.member.ownership()
    }
}

pub(crate) fn ha_config(cluster: &str, rank: u64, mode: HaMode) -> HaConfig {
    HaConfig::builder("widgets")
        .mode(mode)
        .cluster(cluster, rank)
        .namespace(CP_NS)
        .kubeconfigs(None, Some("/peer".into()), None)
        .build()
        .unwrap()
}

/// Member `name` of cluster `cluster` (rank, mode) on `own`, its HA peer `peer`. The group uses the
/// identity `name`, the HA elector `name-ha` (so a test can cut either alone).
pub(crate) fn ha_builder(
    name: &str,
    cluster: &str,
    rank: u64,
    mode: HaMode,
    own: &TestServer,
    peer: &TestServer,
) -> HaBuilder {
    let who = format!("{name}-ha");
    HaBuilder {
        group: builder(own, name),
        ha: Attach::new(
            ha_config(cluster, rank, mode),
            HaClients::new(own.client(&who), peer.client(&who), None),
        ),
    }
}

/// A member's group builder and its HA, attached when the member is spawned ([`side`]).
pub(crate) struct HaBuilder {
    pub(crate) group: ShardGroupBuilder,
    pub(crate) ha: Attach,
}

impl HaBuilder {
    /// The member's elector with deliberately broken rules.
    pub(crate) fn ha_faults(mut self, faults: Faults) -> Self {
        self.ha = self.ha.faults(faults);
        self
    }

    pub(crate) fn legacy_leader_lease(mut self, name: &str) -> Self {
        self.group = self.group.legacy_leader_lease(name);
        self
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Worker {
    /// Re-checks its fence before every request and never runs a request past the fence's validity.
    Honest,
    /// PLANTED BUG: keeps its first permit and fence and never re-checks them.
    IgnoresFences,
}

pub(crate) fn side(b: HaBuilder, name: &str, cluster: &str, o: &HaOverlap, kind: Worker) -> Side {
    let (group, ha) = b.ha.to(b.group);
    let member = spawn_with(group, name, &FenceLog::default());
    let ha = ha.expect("an HA mode attaches");
    let admitted = Arc::new(AtomicU64::new(0));
    let worker = tokio::spawn(work(
        member.ownership(),
        cluster.to_string(),
        o.clone(),
        admitted.clone(),
        kind,
    ));
    Side {
        member,
        ha,
        worker,
        admitted,
    }
}

pub(crate) async fn work(
    own: Ownership,
    cluster: String,
    o: HaOverlap,
    n: Arc<AtomicU64>,
    kind: Worker,
) {
    let shards = own.config().shards.get();
    let mut kept: Vec<(Permit, kube_shard::Fence)> = Vec::new();
    loop {
        if kind == Worker::Honest || kept.is_empty() {
            kept.clear();
            for s in 0..shards {
                let Ok(p) = own.admit_shard(s) else { continue };
                if let Ok(f) = p.fence() {
                    kept.push((p, f));
                }
            }
        }
        let Some((p, _)) = kept.first() else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let epoch = p
            .failover_epoch()
            .expect("a permit in an HA group records its epoch");
        let left = match kind {
            Worker::Honest => kept
                .iter()
                .filter_map(|(_, f)| f.check().ok())
                .min()
                .unwrap_or(Duration::ZERO),
            Worker::IgnoresFences => Duration::from_millis(300),
        };
        if left.is_zero() {
            kept.clear();
            continue;
        }
        let w = o.admit(&cluster, epoch.wire());
        n.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(left.min(Duration::from_millis(300))).await;
        drop(w);
    }
}

pub(crate) async fn two_servers() -> (TestServer, TestServer) {
    let (sa, _) = crate::harness::group_server().await;
    let (sb, _) = crate::harness::group_server().await;
    (sa, sb)
}

/// Servers for clusters a and b, an HA Active member `a1` (its worker `kind`) and a Standby `b1`, once
/// `a1` admits.
async fn active_and_standby(kind: Worker) -> (TestServer, TestServer, HaOverlap, Side, Side) {
    let (sa, sb) = two_servers().await;
    let o = HaOverlap::default();
    let a = side(
        ha_builder("a1", "a", 1, HaMode::Active, &sa, &sb),
        "a1",
        "a",
        &o,
        kind,
    );
    let b = side(
        ha_builder("b1", "b", 2, HaMode::Standby, &sb, &sa),
        "b1",
        "b",
        &o,
        Worker::Honest,
    );
    until(Duration::from_secs(40), "A admitting", || {
        is_admitting(&a.ownership())
    })
    .await;
    (sa, sb, o, a, b)
}

pub(crate) fn is_admitting(o: &Ownership) -> bool {
    let shards = o.config().shards.get();
    (0..shards).any(|s| o.admit_shard(s).is_ok())
}

/// Cluster A's group of two honest members (`a1`, `a2`, Active) and cluster B's one (`b1`, Standby),
/// once both A members admit.
pub(crate) async fn two_active_members_and_a_standby(
    sa: &TestServer,
    sb: &TestServer,
    o: &HaOverlap,
) -> (Vec<Side>, Side) {
    let a: Vec<Side> = ["a1", "a2"]
        .iter()
        .map(|n| {
            let b = ha_builder(n, "a", 1, HaMode::Active, sa, sb);
            side(b, n, "a", o, Worker::Honest)
        })
        .collect();
    let b = side(
        ha_builder("b1", "b", 2, HaMode::Standby, sb, sa),
        "b1",
        "b",
        o,
        Worker::Honest,
    );
    until(Duration::from_secs(40), "both A members admitting", || {
        a.iter().all(|s| is_admitting(&s.ownership()))
    })
    .await;
    (a, b)
}

#[tokio::test(start_paused = true)]
async fn ha_group_a_standby_never_admits_while_the_active_renews() {
    let (sa, sb) = two_servers().await;
    let o = HaOverlap::default();
    let (a, b) = two_active_members_and_a_standby(&sa, &sb, &o).await;
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0);
    assert_eq!(
        b.ownership().admission_hold(),
        Some("this cluster is not the active HA cluster")
    );
    assert!(matches!(
        b.ownership().admit_shard(0),
        Err(AdmitError::Held { .. })
    ));
    for s in &a {
        assert!(s.admitted.load(Ordering::SeqCst) > 50);
        assert_eq!(s.ownership().admission_hold(), None);
        assert_eq!(s.ha.handle.active_epoch().unwrap().wire(), 1001);
    }
    assert_eq!(o.violations(), vec![], "{:?}", o.intervals());
    for s in a.iter().chain([&b]) {
        s.kill();
    }
}

#[tokio::test(start_paused = true)]
async fn ha_group_an_active_cut_from_its_apiserver_stops_admitting_within_renew_deadline() {
    let (sa, _sb, o, a, b) = active_and_standby(Worker::Honest).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // a fence taken now must end with the term, though the group itself keeps renewing
    let p = a
        .ownership()
        .admit_shard(owned_shard(&a.ownership()))
        .unwrap();
    let f = p.fence().unwrap();
    // the fence token a fenced write stamps names the term's failover epoch (HA.md "Fenced by the server")
    assert_eq!(f.failover_epoch().map(|e| e.wire()), Some(1001));
    assert!(f.token().to_string().starts_with("1001:"), "{}", f.token());
    // the HA elector loses its own apiserver; the group's identity still reaches it
    sa.faults().partition(Scope::identity("a1-ha"), true);
    let cut = Instant::now();
    let took = until(Duration::from_secs(12), "A stops admitting", || {
        !is_admitting(&a.ownership())
    })
    .await;
    eprintln!("[ha-group] A cut from its apiserver → admission closed after {took:?}");
    assert!(took <= HA_RENEW, "{took:?}");
    assert!(matches!(
        f.check(),
        Err(kube_shard::ownership::FenceError::TermEnded { .. })
    ));
    until(Duration::from_secs(2), "the HA hold bit set", || {
        a.ownership().admission_hold() == Some("this cluster is not the active HA cluster")
    })
    .await;
    let n = a.admitted.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        a.admitted.load(Ordering::SeqCst),
        n,
        "re-admitted while cut off"
    );
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0, "no witness, no human");
    let last = o.intervals()[&("a".to_string(), 1001)].end;
    assert!(last.duration_since(cut) <= HA_RENEW);
    assert_eq!(o.violations(), vec![]);
    drop((p, f));
    a.kill();
    b.kill();
}

pub(crate) fn owned_shard(o: &Ownership) -> u32 {
    let shards = o.config().shards.get();
    (0..shards)
        .find(|&s| o.admit_shard(s).is_ok())
        .expect("an admitted shard")
}

/// Promote B by force once it is armed: the time the command was accepted.
pub(crate) async fn force_promote(b: &Side) -> Instant {
    let control = &b.ha.control;
    for _ in 0..60 {
        if control.force_promote().await.is_ok() {
            return Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("B never armed");
}

#[tokio::test(start_paused = true)]
async fn ha_group_forced_promotion_then_the_returning_old_active_steps_down_without_admitting() {
    let (sa, sb, o, a, b) = active_and_standby(Worker::Honest).await;
    until(Duration::from_secs(40), "B's group settled (held)", || {
        b.ownership().admission_hold().is_some() && owned(&b.ownership()) == 16
    })
    .await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let mut reenqueue = b.ownership().transitions();
    // the old Active stops; its last renewal is the own Lease's age before the kill
    let st = a.ha.control.status().await.unwrap();
    let own_age = Duration::from_millis(st.leases[0].age_ms.unwrap());
    a.kill();
    let last_renewal = Instant::now() - own_age;
    let accepted = force_promote(&b).await;
    until(Duration::from_secs(40), "B's worker admitting", || {
        o.intervals().contains_key(&("b".to_string(), 2002))
    })
    .await;
    let first = o.intervals()[&("b".to_string(), 2002)].start;
    eprintln!(
        "[ha-group] forced: A's last renewal → B admitting {:?} (command accepted after {:?}, then the Lease takeover wait)",
        first.duration_since(last_renewal),
        accepted.duration_since(last_renewal)
    );
    // promotion re-enqueued every owned shard (the hold lifting, through the unbounded stream)
    let mut n = 0;
    while let Some(t) = reenqueue.try_next_transition() {
        if t.is_reenqueue() {
            n += 1;
        }
    }
    assert!(n >= 16, "re-enqueued {n} of 16 shards at promotion");
    // the old Active restarts with --ha-mode=active: it reads the Leases and stands by
    tokio::time::sleep(Duration::from_secs(20)).await;
    let a2 = side(
        ha_builder("a1", "a", 1, HaMode::Active, &sa, &sb),
        "a1",
        "a",
        &o,
        Worker::Honest,
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        a2.admitted.load(Ordering::SeqCst),
        0,
        "the old Active admitted"
    );
    let st = a2.ha.control.status().await.unwrap();
    assert_eq!(st.role, "standby");
    assert!(is_admitting(&b.ownership()));
    assert_eq!(o.violations(), vec![], "{:?}", o.intervals());
    a2.kill();
    b.kill();
}

fn owned(o: &Ownership) -> usize {
    o.shard_states()
        .values()
        .filter(|s| matches!(s, kube_shard::ownership::ShardState::Owned { .. }))
        .count()
}

/// The old Active is alive but cut from both apiservers' HA Leases (its own and the peer's); a human
/// promotes B. Honest workers: A's last request ends before B's first admission (the renew deadline is
/// below the takeover wait). The same run with a worker that ignores its fences is an overlap, and the
/// checker finds it.
async fn cut_off_active_then_forced(kind: Worker) -> HaOverlap {
    let (sa, sb, o, a, b) = active_and_standby(kind).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    sa.faults().partition(Scope::identity("a1-ha"), true);
    sb.faults().partition(Scope::identity("a1-ha"), true);
    force_promote(&b).await;
    until(Duration::from_secs(40), "B admitting", || {
        is_admitting(&b.ownership())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.kill();
    b.kill();
    o
}

#[tokio::test(start_paused = true)]
async fn ha_group_forced_promotion_over_a_cut_off_active_never_overlaps() {
    let o = cut_off_active_then_forced(Worker::Honest).await;
    assert_eq!(o.violations(), vec![], "{:?}", o.intervals());
    assert!(o.intervals().contains_key(&("b".to_string(), 2002)));
}

#[tokio::test(start_paused = true)]
async fn ha_group_the_overlap_checker_finds_a_worker_that_ignores_its_fences() {
    let o = cut_off_active_then_forced(Worker::IgnoresFences).await;
    assert!(
        o.violations()
            .iter()
            .any(|v| matches!(v, kube_shard_ha::overlap::Violation::Overlap { .. })),
        "the planted overlap was not found: {:?}",
        o.intervals()
    );
}

/// The legacy gate together with HA: the Standby's group also migrates from a leader-elected
/// deployment. When the legacy leader goes away the legacy gate lifts its own hold bit only: the Standby
/// still admits nothing (a single-value hold would have been cleared here).
#[tokio::test(start_paused = true)]
async fn ha_group_the_legacy_gate_lifting_does_not_open_a_standby() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;
    let (sa, sb) = two_servers().await;
    let o = HaOverlap::default();
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some("old-leader".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("old-0".into()),
            lease_duration_seconds: Some(3),
            renew_time: Some(MicroTime(
                k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
            )),
            ..LeaseSpec::default()
        }),
    };
    let started = Instant::now();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let renewer = crate::harness::renew_lease_forever(&sb, "old", lease, stop.clone());
    let leases: kube::Api<Lease> = kube::Api::namespaced(sb.client("old"), CP_NS);
    while leases.get_opt("old-leader").await.unwrap().is_none() {
        tokio::task::yield_now().await; // the legacy Lease exists before the Standby starts
    }
    let a = side(
        ha_builder("a1", "a", 1, HaMode::Active, &sa, &sb),
        "a1",
        "a",
        &o,
        Worker::Honest,
    );
    let b = side(
        ha_builder("b1", "b", 2, HaMode::Standby, &sb, &sa).legacy_leader_lease("old-leader"),
        "b1",
        "b",
        &o,
        Worker::Honest,
    );
    until(Duration::from_secs(40), "A admitting", || {
        is_admitting(&a.ownership())
    })
    .await;
    // the legacy leader renews for 39 s, then stops
    tokio::time::sleep_until(started + Duration::from_secs(39)).await;
    stop.store(true, Ordering::Relaxed);
    renewer.await.unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        b.ownership().admission_hold(),
        Some("this cluster is not the active HA cluster")
    );
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0);
    assert!(!is_admitting(&b.ownership()));
    assert_eq!(o.violations(), vec![]);
    a.kill();
    b.kill();
}

/// An elector attached to a builder that is dropped unstarted (a configuration error before `start`)
/// stops with it: no elector keeps renewing the HA Leases for a member that never ran.
#[tokio::test(start_paused = true)]
async fn ha_an_attached_builder_dropped_unstarted_stops_its_elector() {
    let (sa, sb) = two_servers().await;
    let b = ha_builder("a1", "a", 1, HaMode::Active, &sa, &sb);
    let (group, ha) = b.ha.to(b.group);
    let control = ha.expect("an HA mode attaches").control;
    assert!(
        control.status().await.is_ok(),
        "the elector runs once attached"
    );
    drop(group);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        control.status().await.is_err(),
        "the elector of a dropped, unstarted builder still runs"
    );
}

mod permit;
mod stepdown;
