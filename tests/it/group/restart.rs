//! Takeovers after a restart of every replica: members that publish their Pod and whose Pods are gone are
//! gone by that evidence, so new members get every dead member's shards in one pass; without that
//! evidence (no Pod published, or the Pods still exist: a brownout, not a restart) dead members are taken
//! over at the takeover budget's pace, `max(1, ⌈members/2⌉ − 1)` per lease period.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use kube_shard::group::PodRef;
use kube_shard_testserver::TestServer;
use tokio::time::Instant;

use crate::group::{builder, owners, spawn_with, until, FenceLog, Member, CP_NS, LEASE};

/// Create the Pod `name` and give its reference (with the uid the server gave it).
async fn pod(s: &TestServer, name: &str) -> PodRef {
    let p: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": CP_NS},
        "spec": {"containers": [{"name": "operator", "image": "example/operator:1"}]},
    }))
    .unwrap();
    let made = Api::<Pod>::namespaced(s.client("admin"), CP_NS)
        .create(&PostParams::default(), &p)
        .await
        .unwrap();
    PodRef::new(CP_NS, name, made.metadata.uid.unwrap())
}

/// Members `names`, publishing a Pod each when `pods`.
async fn members(s: &TestServer, names: &[&str], pods: bool, log: &FenceLog) -> Vec<Member> {
    let mut out = Vec::new();
    for n in names {
        let p = if pods { Some(pod(s, n).await) } else { None };
        out.push(spawn_with(builder(s, n).pod(p), n, log));
    }
    out
}

/// Kill `old` (all of a group), delete their Pods when `delete_pods`, start `new` members, and return
/// when each shard first got a new owner, from the kill.
async fn restart(pods: bool, delete_pods: bool) -> BTreeMap<u32, Duration> {
    let (server, log) = crate::group::group_server().await;
    let old_names = ["old-0", "old-1", "old-2", "old-3"];
    let old = members(&server, &old_names, pods, &log).await;
    {
        let refs: Vec<&Member> = old.iter().collect();
        until(Duration::from_secs(30), "the old members settled", || {
            crate::group::each_shard_owned_once(&refs)
        })
        .await;
    }
    for m in &old {
        m.kill();
    }
    if delete_pods {
        for n in old_names {
            Api::<Pod>::namespaced(server.client("admin"), CP_NS)
                .delete(n, &DeleteParams::default())
                .await
                .unwrap();
        }
    }
    let t0 = Instant::now();
    let new = members(&server, &["new-0", "new-1", "new-2", "new-3"], pods, &log).await;
    let refs: Vec<&Member> = new.iter().collect();
    let mut first: BTreeMap<u32, Duration> = BTreeMap::new();
    let s = crate::harness::s().get();
    while first.len() < s as usize && t0.elapsed() < Duration::from_secs(60) {
        for shard in owners(&refs).keys() {
            first.entry(*shard).or_insert_with(|| t0.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for m in &new {
        m.kill();
    }
    assert_eq!(first.len(), s as usize, "every shard owned again");
    first
}

/// The time between the first and the last shard a new member got.
fn spread(first: &BTreeMap<u32, Duration>) -> Duration {
    let v: BTreeSet<Duration> = first.values().copied().collect();
    *v.last().unwrap() - *v.first().unwrap()
}

/// A restart of every replica under new Pod names: the dead members' Pods are gone, so every dead member
/// is gone in one pass and the new members get all their shards together. The same restart without the
/// Pods published waits for the takeover budget (3 of the 8 members observed per lease period), a lease
/// period apart.
#[tokio::test(start_paused = true)]
async fn a_restart_under_new_pod_names_takes_every_dead_member_over_in_one_pass() {
    let with = restart(true, true).await;
    let without = restart(false, false).await;
    eprintln!(
        "[restart] with Pod evidence: all owned at {:?} (spread {:?}); without: {:?} (spread {:?})",
        with.values().max(),
        spread(&with),
        without.values().max(),
        spread(&without)
    );
    assert!(spread(&with) < LEASE / 2, "{:?}", spread(&with));
    assert!(spread(&without) >= LEASE / 2, "{:?}", spread(&without));
    assert!(with.values().max() < without.values().max());
}

/// Members whose Pods still exist (renewals stalled by a brownout, not a restart) get no evidence: the
/// takeover budget paces them as before.
#[tokio::test(start_paused = true)]
async fn dead_members_whose_pods_still_exist_are_taken_over_at_the_budgets_pace() {
    let alive = restart(true, false).await;
    assert!(spread(&alive) >= LEASE / 2, "{:?}", spread(&alive));
}
