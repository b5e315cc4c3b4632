//! Cross-cluster HA on real apiservers: the elector of each cluster runs in this process, its
//! requests to each cluster through its own [`Link`] (so one direction of one path can be cut), a worker per
//! cluster admits through the guard, and the cross-cluster overlap checker (`kube_shard_ha::overlap`) judges.
//! Late commits are real: the Active cluster's etcd is stopped with SIGSTOP and resumed.
//!
//! Needs `KUBECONFIG` (cluster A), `KSHARD_E2E_PEER_KUBECONFIG` (cluster B) and, for the witness scenario,
//! `KSHARD_E2E_WITNESS_KUBECONFIG`; the etcd scenario needs cluster A's etcd on this machine (its pid file beside the kubeconfig, as a
//! local apiserver started by a script writes it). A scenario whose clusters are not given is skipped, by name.
//! Timings are scaled: lease 6 s, renew deadline 3 s, retry 1 s, request timeout 1 s, grace 1 s (a taker
//! waits 7 s).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use kube::Api;
use kube_shard_ha::overlap::HaOverlap;
use kube_shard_ha::{HaClients, HaConfig, HaControl, HaHandle, HaMetrics, HaMode, Timings};
use tokio::time::Instant;

use crate::support::links::{freeze, skip, Cluster, Link};
use crate::support::{rand_u32, report};

const RENEW_DEADLINE: Duration = Duration::from_secs(3);

fn timings() -> Timings {
    let s = Duration::from_secs;
    Timings::new(s(6), s(3), s(1), s(1), s(1))
}

/// The clusters of a scenario and one namespace of the same name in each.
struct World {
    clusters: Vec<Cluster>,
    ns: String,
    overlap: HaOverlap,
}

impl World {
    /// The scenario's world, or `None` (the scenario skipped, by name) when its clusters are not given.
    async fn new(scenario: &str, witness: bool) -> Option<World> {
        let clusters = Cluster::for_scenario(scenario, witness)?;
        let ns = format!("e2e-ha-{:08x}", rand_u32());
        for c in &clusters {
            let api: Api<Namespace> = Api::all(c.client().await);
            let meta = ObjectMeta {
                name: Some(ns.clone()),
                ..ObjectMeta::default()
            };
            api.create(
                &PostParams::default(),
                &Namespace {
                    metadata: meta,
                    ..Namespace::default()
                },
            )
            .await
            .expect("create the namespace");
        }
        Some(World {
            clusters,
            ns,
            overlap: HaOverlap::default(),
        })
    }

    /// Start cluster `me`'s operator (0 = A, 1 = B), with a link to every cluster.
    async fn start(&self, me: usize, mode: HaMode) -> Op {
        let id = ["a", "b"][me];
        let mut links = Vec::new();
        for c in &self.clusters {
            links.push(Link::start(c.server).await);
        }
        let peer = 1 - me;
        let own_client = self.clusters[me].client_via(links[me].addr()).await;
        let peer_client = self.clusters[peer].client_via(links[peer].addr()).await;
        let witness_client = match self.clusters.get(2) {
            Some(w) => Some(w.client_via(links[2].addr()).await),
            None => None,
        };
        let b = HaConfig::builder("widgets")
            .mode(mode)
            .cluster(id, me as u64 + 1)
            .namespace(&self.ns)
            .witness_namespace(&self.ns)
            .timings(timings())
            .kubeconfigs(
                None,
                Some(self.clusters[peer].kubeconfig.clone()),
                self.clusters.get(2).map(|w| w.kubeconfig.clone()),
            );
        // no mirror runs here: the witness promotes without the lag gate, by name
        let cfg = match self.clusters.get(2) {
            Some(_) => b.auto_promote_without_lag_bound(),
            None => b,
        }
        .build()
        .expect("a valid HA config");
        let clients = HaClients::new(own_client, peer_client, witness_client);
        let (handle, control, task) = kube_shard_ha::spawn(
            &cfg,
            clients,
            kube_shard::rt::Clock::system(),
            HaMetrics::default(),
        );
        let admitted = Arc::new(AtomicU64::new(0));
        let worker = tokio::spawn(work(
            handle.clone(),
            self.overlap.clone(),
            admitted.clone(),
            id,
        ));
        Op {
            handle,
            control,
            task: task.expect("not standalone"),
            worker,
            admitted,
            links,
        }
    }

    /// A Active, B Standby, once A admits.
    async fn active_and_standby(&self) -> (Op, Op) {
        let a = self.start(0, HaMode::Active).await;
        let b = self.start(1, HaMode::Standby).await;
        until(Duration::from_secs(40), "A active", || a.handle.is_active()).await;
        (a, b)
    }

    /// The end of a scenario: no overlap, the figures reported, the operators stopped, the namespaces
    /// dropped.
    async fn finish(self, ops: (Op, Op), figures: serde_json::Value) {
        self.no_overlap();
        report(figures);
        drop(ops);
        self.drop_namespaces().await;
    }

    fn no_overlap(&self) {
        assert_eq!(
            self.overlap.violations(),
            vec![],
            "intervals: {:?}",
            self.overlap.intervals()
        );
    }

    async fn drop_namespaces(&self) {
        for c in &self.clusters {
            let api: Api<Namespace> = Api::all(c.client().await);
            let _ = api.delete(&self.ns, &DeleteParams::default()).await;
        }
    }
}

/// Admit through the guard and keep each request in flight 300 ms (below the request timeout).
async fn work(h: HaHandle, o: HaOverlap, n: Arc<AtomicU64>, id: &'static str) {
    loop {
        match h.admit() {
            Ok(e) => {
                let w = o.admit(id, e.wire());
                n.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                drop(w);
            }
            Err(_) => {
                let _ = tokio::time::timeout(Duration::from_millis(200), h.await_change()).await;
            }
        }
    }
}

/// One cluster's operator: its elector, its worker, and its links (index = cluster).
struct Op {
    handle: HaHandle,
    control: HaControl,
    task: tokio::task::JoinHandle<()>,
    worker: tokio::task::JoinHandle<()>,
    admitted: Arc<AtomicU64>,
    links: Vec<Link>,
}

impl Drop for Op {
    fn drop(&mut self) {
        self.task.abort();
        self.worker.abort();
    }
}

async fn until(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    t.elapsed()
}

async fn force_until_armed(op: &Op) -> kube_shard_ha::FailoverEpoch {
    for _ in 0..60 {
        if let Ok(e) = op.control.force_promote().await {
            return e;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("never armed within 60 s");
}

/// Resumes a stopped etcd however the scenario ends.
struct Frozen(i32);

impl Drop for Frozen {
    fn drop(&mut self) {
        freeze(self.0, false);
    }
}

/// A Standby never admits while the Active renews; the Active cut from its own apiserver stops within the
/// renew deadline; the Standby is promoted by force; the old Active, healed, steps down by itself.
#[tokio::test]
#[ignore = "needs two real clusters: KUBECONFIG and KSHARD_E2E_PEER_KUBECONFIG"]
async fn ha_real_cut_active_forced_promotion_and_the_old_active_steps_down() {
    let scenario = "ha_real_cut_active_forced_promotion_and_the_old_active_steps_down";
    let Some(w) = World::new(scenario, false).await else {
        return;
    };
    let (a, b) = w.active_and_standby().await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        b.admitted.load(Ordering::SeqCst),
        0,
        "B admitted while A renewed"
    );
    assert!(a.handle.is_active());

    a.links[0].set_cut(true); // A loses its own apiserver
    let stopped = until(Duration::from_secs(10), "A inactive", || {
        !a.handle.is_active()
    })
    .await;
    assert!(
        stopped <= RENEW_DEADLINE + Duration::from_millis(200),
        "{stopped:?}"
    );
    let cut_at = Instant::now() - stopped;
    let epoch = force_until_armed(&b).await;
    assert_eq!(epoch.n(), 2);
    until(Duration::from_secs(20), "B admitting", || {
        b.handle.is_active()
    })
    .await;
    let admitting = cut_at.elapsed();

    a.links[0].set_cut(false);
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(!a.handle.is_active() && b.handle.is_active());
    let st = a.control.status().await.unwrap();
    assert_eq!(st.role, "standby", "{st:?}");
    w.finish(
        (a, b),
        serde_json::json!({
            "scenario": "ha_real_cut_active",
            "active_stopped_after_cut_s": stopped.as_secs_f64(),
            "cut_to_standby_admitting_s": admitting.as_secs_f64(),
            "overlaps": 0,
        }),
    )
    .await;
}

/// The Active cluster's etcd stops (SIGSTOP): A's renewals hang and it stops within the renew deadline; B,
/// unable to read A's Lease for the full wait, is armed and promoted by force. etcd resumes and whatever A
/// sent meanwhile commits late; A then sees the higher epoch and stands by, never admitting again.
#[tokio::test]
#[ignore = "needs two local apiservers whose etcd it can pause: KUBECONFIG and KSHARD_E2E_PEER_KUBECONFIG"]
async fn ha_real_a_stopped_etcd_commits_late_without_two_actives() {
    let scenario = "ha_real_a_stopped_etcd_commits_late_without_two_actives";
    let Some(w) = World::new(scenario, false).await else {
        return;
    };
    let Some(pid) = w.clusters[0].etcd_pid() else {
        skip(
            scenario,
            "needs cluster A's etcd on this machine, to pause it (its pid in etcd.pid beside the kubeconfig)",
        );
        w.drop_namespaces().await;
        return;
    };
    let (a, b) = w.active_and_standby().await;
    tokio::time::sleep(Duration::from_secs(5)).await;

    freeze(pid, true);
    let guard = Frozen(pid);
    let stopped = until(Duration::from_secs(10), "A inactive", || {
        !a.handle.is_active()
    })
    .await;
    assert!(
        stopped <= RENEW_DEADLINE + Duration::from_millis(200),
        "{stopped:?}"
    );
    assert_eq!(force_until_armed(&b).await.n(), 2);
    until(Duration::from_secs(20), "B admitting", || {
        b.handle.is_active()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let a_before = a.admitted.load(Ordering::SeqCst);
    drop(guard); // etcd resumes: A's and B's stalled writes to A's Lease commit now, late

    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        a.admitted.load(Ordering::SeqCst),
        a_before,
        "A admitted after etcd resumed"
    );
    assert!(
        !a.handle.is_active() && b.handle.is_active(),
        "A: {:?}\nB: {:?}",
        a.control.status().await,
        b.control.status().await
    );
    w.finish(
        (a, b),
        serde_json::json!({
            "scenario": "ha_real_stopped_etcd",
            "active_stopped_after_freeze_s": stopped.as_secs_f64(),
            "overlaps": 0,
        }),
    )
    .await;
}

/// With a witness: A's site loses its links to B and to the witness but keeps its own apiserver. A stops at
/// its renew deadline, B promotes itself through the witness, and A, healed, stays down.
#[tokio::test]
#[ignore = "needs three real clusters: KUBECONFIG, KSHARD_E2E_PEER_KUBECONFIG, KSHARD_E2E_WITNESS_KUBECONFIG"]
async fn ha_real_witness_a_site_partition_moves_the_term_without_overlap() {
    let scenario = "ha_real_witness_a_site_partition_moves_the_term_without_overlap";
    let Some(w) = World::new(scenario, true).await else {
        return;
    };
    let (a, b) = w.active_and_standby().await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0);

    a.links[1].set_cut(true);
    a.links[2].set_cut(true);
    let stopped = until(Duration::from_secs(10), "A inactive", || {
        !a.handle.is_active()
    })
    .await;
    let cut_at = Instant::now() - stopped;
    until(Duration::from_secs(40), "B active", || b.handle.is_active()).await;
    let promoted = cut_at.elapsed();
    a.links[1].set_cut(false);
    a.links[2].set_cut(false);
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(b.handle.is_active() && !a.handle.is_active());
    w.finish(
        (a, b),
        serde_json::json!({
            "scenario": "ha_real_witness_site_partition",
            "active_stopped_after_cut_s": stopped.as_secs_f64(),
            "cut_to_standby_admitting_s": promoted.as_secs_f64(),
            "overlaps": 0,
        }),
    )
    .await;
}
