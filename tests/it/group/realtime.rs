//! Real time, over HTTP: members on their dedicated threads with their own clients (built from a
//! kubeconfig), time-scaled settings. Few and serial: the rest of the suite runs in paused time.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_shard::group::ShardGroup;
use kube_shard::{ShardCount, ShardKey};
use kube_shard_testserver::{Scope, TestServer};

use crate::group::{setup, CP_NS, GROUP};

async fn kube_config(yaml: &str) -> kube::Config {
    let kc = Kubeconfig::from_yaml(yaml).unwrap();
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn realtime_partitioned_member_is_taken_over_over_http() {
    let server = TestServer::builder().shard_selector(true).build();
    let http = server.serve_plain_http().await.unwrap();
    setup(&server).await;
    let lease = Duration::from_millis(1200);
    let mut handles = Vec::new();
    for name in ["a", "b", "c"] {
        let config = kube_config(&http.kubeconfig_yaml(name)).await;
        let client = kube::Client::try_from(config.clone()).unwrap();
        let group = ShardGroup::builder(client, GROUP, CP_NS)
            .member(name)
            .shards(ShardCount::new(16).unwrap())
            .key(ShardKey::Uid)
            .timings(
                lease,
                Duration::from_millis(800),
                Duration::from_millis(150),
            )
            .takeover_grace(Duration::from_millis(150))
            .fence_margin(Duration::from_millis(100))
            // renew deadline − margin: a drain may not release while a fence issued before it lasts
            .drain_timeout(Duration::from_millis(700))
            .settle(Duration::from_millis(300), Duration::from_millis(150))
            .dedicated_thread(config)
            .build()
            .unwrap();
        let (handle, task) = group.start();
        let h = tokio::spawn(task);
        handles.push((name, handle, h));
    }
    let owned = |handles: &[(
        &str,
        kube_shard::group::GroupHandle,
        tokio::task::JoinHandle<_>,
    )],
                 skip: Option<&str>| {
        let mut by_shard = std::collections::BTreeMap::<u32, usize>::new();
        for (n, h, _) in handles {
            if Some(*n) == skip {
                continue;
            }
            for s in 0..16 {
                if h.ownership().admit_shard(s).is_ok() {
                    *by_shard.entry(s).or_default() += 1;
                }
            }
        }
        by_shard
    };
    let start = std::time::Instant::now();
    loop {
        let o = owned(&handles, None);
        if o.len() == 16 && o.values().all(|c| *c == 1) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "did not settle: {o:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let settle = start.elapsed();
    // sample fences while b is cut off from the API server
    let victim: BTreeSet<u32> = (0..16)
        .filter(|s| handles[1].1.ownership().admit_shard(*s).is_ok())
        .collect();
    let cut = std::time::Instant::now();
    server.faults().partition(Scope::identity("b"), true);
    let mut b_fenced_at = None;
    let mut taken_at = None;
    while taken_at.is_none() {
        assert!(cut.elapsed() < Duration::from_secs(20), "no takeover");
        let b_admits = victim
            .iter()
            .any(|s| handles[1].1.ownership().admit_shard(*s).is_ok());
        if !b_admits && b_fenced_at.is_none() {
            b_fenced_at = Some(cut.elapsed());
        }
        let o = owned(&handles, Some("b"));
        if victim.iter().all(|s| o.get(s) == Some(&1)) {
            taken_at = Some(cut.elapsed());
            // never two admitting members for one shard
            assert!(!b_admits, "b still admits while others own its shards");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (fenced, taken) = (b_fenced_at.unwrap(), taken_at.unwrap());
    eprintln!(
        "real time over HTTP: settled in {settle:?}; partitioned member self-fenced after {fenced:?}, shards taken over after {taken:?} ({:.2} x lease)",
        taken.as_secs_f64() / lease.as_secs_f64()
    );
    assert!(
        fenced < taken,
        "the victim self-fences before anyone takes over"
    );
    server.faults().partition(Scope::identity("b"), false);
    for (_, h, _) in &handles {
        h.leave();
    }
}
