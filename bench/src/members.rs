//! Group members run in process for the timing scenarios (`failover`, `handoff`, `coordination`):
//! a `ShardGroup` with one sharded read stream whose events are drained, so activation waits for its
//! barrier as in an operator.

use std::time::Duration;

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube_shard::group::{GroupHandle, ShardGroup};
use kube_shard::watcher::WatcherStats;
use kube_shard::ShardedWatcher;
use kube_shard_testserver::{Scope, TestServer};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::failover::Timings;
use crate::recovery::cluster::{self, item_resource, items, NS};
use crate::BenchError;

/// One running member.
pub(crate) struct Member {
    /// The client identity of its group (Leases, the assignment, Events).
    pub(crate) identity: String,
    /// The client identity of its read stream (`<identity>-read`), so reads are counted apart.
    pub(crate) reader: String,
    pub(crate) group: GroupHandle,
    pub(crate) stats: WatcherStats,
    pub(crate) store: Store<DynamicObject>,
    tasks: Vec<JoinHandle<()>>,
}

pub(crate) fn start(
    server: &TestServer,
    name: &str,
    n: usize,
    t: Timings,
) -> Result<Member, BenchError> {
    start_settled(server, name, n, t, t.retry * 2)
}

/// [`start`] with this cold-start settle window (the group plans once `n` members are present or the
/// window has passed).
pub(crate) fn start_settled(
    server: &TestServer,
    name: &str,
    n: usize,
    t: Timings,
    settle: Duration,
) -> Result<Member, BenchError> {
    let reader = format!("{name}-read");
    let on = Clients {
        group: server.client(name),
        group_name: "bench",
        read: items(server.client(&reader)),
        reader,
    };
    start_on(on, name, n, t, settle)
}

/// Where a member runs: its group's client and group name, its read stream's API (and identity).
pub(crate) struct Clients<'a> {
    pub(crate) group: kube::Client,
    pub(crate) group_name: &'a str,
    pub(crate) read: kube::Api<DynamicObject>,
    pub(crate) reader: String,
}

/// A member on these clients (in process, or in a replica process over HTTP).
pub(crate) fn start_on(
    on: Clients<'_>,
    name: &str,
    n: usize,
    t: Timings,
    settle: Duration,
) -> Result<Member, BenchError> {
    let group = ShardGroup::builder(on.group, on.group_name, NS)
        .member(name.to_owned())
        .timings(t.lease, t.renew, t.retry)
        .takeover_grace(t.grace)
        .fence_margin(t.retry)
        .drain_timeout(t.renew)
        .settle(settle, t.retry * 2)
        .expected_replicas(n as u32)
        .build()
        .map_err(|e| BenchError::Library(format!("shard group: {e}")))?;
    let (handle, task) = group.start();
    let reader = on.reader;
    let sharded = ShardedWatcher::new_with(
        on.read,
        watcher::Config::default(),
        handle.ownership(),
        item_resource(),
    )
    .barrier_timeout(t.barrier)
    .build_reflector();
    let (stats, store) = (sharded.stats, sharded.store);
    let mut events = sharded.events;
    let mut reenqueue = sharded.reenqueue;
    let drain = tokio::spawn(async move {
        loop {
            tokio::select! {
                e = events.next() => if e.is_none() { break },
                r = reenqueue.next() => if r.is_none() { break },
            }
        }
    });
    let task = tokio::spawn(async move {
        let _ = task.await;
    });
    Ok(Member {
        identity: name.to_owned(),
        reader,
        group: handle,
        stats,
        store,
        tasks: vec![task, drain],
    })
}

pub(crate) fn kill(server: &TestServer, m: Member) {
    for t in m.tasks {
        t.abort();
    }
    for id in [m.identity, m.reader] {
        server.faults().partition(Scope::identity(id), true);
    }
}

/// Every shard admitted by exactly the members' share, nothing moving.
fn balanced(members: &[Member], s: u32) -> bool {
    let n = members.len() as u32;
    let mut total = 0;
    for m in members {
        let st = m.group.status();
        let owned = st.owned.len() as u32;
        if st.moves_in_flight > 0 || owned < s / n || owned > s.div_ceil(n) {
            return false;
        }
        total += owned;
    }
    total == s
}

pub(crate) async fn until_balanced(
    members: &[Member],
    s: u32,
    limit: Duration,
) -> Result<(), BenchError> {
    let start = Instant::now();
    while !balanced(members, s) {
        if start.elapsed() > limit {
            return Err(BenchError::Cluster(format!(
                "the group did not balance within {limit:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// A writer changing the objects' specs, about 200 changes per second, until aborted.
pub(crate) fn spawn_writer(server: &TestServer, objects: usize) -> JoinHandle<()> {
    let api = items(server.client(cluster::WRITER));
    tokio::spawn(async move {
        let mut i = 0usize;
        loop {
            let patch = kube::api::Patch::Merge(serde_json::json!({"spec": {"tick": i}}));
            let _ = api
                .patch(
                    &cluster::name(i % objects.max(1)),
                    &Default::default(),
                    &patch,
                )
                .await;
            i += 1;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
}

/// Write requests (create, update, patch, delete) made by these identities so far.
pub(crate) fn writes(server: &TestServer, identities: &[String]) -> u64 {
    identities
        .iter()
        .map(|id| {
            let acc = server.accounting(id);
            acc.requests
                .iter()
                .filter(|(verb, _)| verb.is_write())
                .map(|(_, n)| n)
                .sum::<u64>()
        })
        .sum()
}

/// Response bytes received by these identities so far.
pub(crate) fn bytes(server: &TestServer, identities: &[String]) -> u64 {
    identities
        .iter()
        .map(|id| server.accounting(id).bytes_written)
        .sum()
}
