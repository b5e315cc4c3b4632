//! The embedded API server, the `Item` custom resource, the writer and the ledger that says when every
//! object is reconciled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::Client;
use kube_shard_testserver::{Scope, TestServer};
use serde_json::json;

use crate::BenchError;

/// The namespace of the objects and the group.
pub(crate) const NS: &str = "default";
/// The writer's identity (never partitioned).
pub(crate) const WRITER: &str = "writer";

/// `items.bench.kube-shard.io/v1`, namespaced, with a status subresource.
pub(crate) fn item_resource() -> ApiResource {
    ApiResource {
        group: "bench.kube-shard.io".into(),
        version: "v1".into(),
        api_version: "bench.kube-shard.io/v1".into(),
        kind: "Item".into(),
        plural: "items".into(),
    }
}

fn crd() -> Result<CustomResourceDefinition, BenchError> {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "items.bench.kube-shard.io"},
        "spec": {
            "group": "bench.kube-shard.io",
            "scope": "Namespaced",
            "names": {"kind": "Item", "listKind": "ItemList", "plural": "items", "singular": "item"},
            "versions": [{
                "name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .map_err(|e| BenchError::Library(format!("the Item CRD: {e}")))
}

fn cluster(e: impl std::fmt::Display) -> BenchError {
    BenchError::Cluster(e.to_string())
}

/// The items API for an identity.
pub(crate) fn items(client: Client) -> Api<DynamicObject> {
    Api::namespaced_with(client, NS, &item_resource())
}

/// Which generation every object must reach, and which it reached (written by a reconcile).
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    state: Mutex<LedgerState>,
    /// Reconciles run (the user's reconcile body, admitted).
    pub(crate) reconciles: AtomicU64,
    /// Status writes committed.
    pub(crate) writes: AtomicU64,
}

#[derive(Debug, Default)]
struct LedgerState {
    target: HashMap<String, i64>,
    written: HashMap<String, i64>,
    pending: usize,
}

impl Ledger {
    /// Object `name` must reach generation `g`.
    pub(crate) fn expect(&self, name: &str, g: i64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let was = Self::is_pending(&s, name);
        s.target.insert(name.to_owned(), g);
        let now = Self::is_pending(&s, name);
        Self::adjust(&mut s, was, now);
    }

    /// A reconcile committed `observedGeneration = g` for `name`.
    pub(crate) fn written(&self, name: &str, g: i64) {
        self.writes.fetch_add(1, Ordering::Relaxed);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let was = Self::is_pending(&s, name);
        let w = s.written.entry(name.to_owned()).or_insert(0);
        *w = (*w).max(g);
        let now = Self::is_pending(&s, name);
        Self::adjust(&mut s, was, now);
    }

    fn is_pending(s: &LedgerState, name: &str) -> bool {
        let t = s.target.get(name).copied().unwrap_or(0);
        s.written.get(name).copied().unwrap_or(0) < t
    }

    fn adjust(s: &mut LedgerState, was: bool, now: bool) {
        match (was, now) {
            (false, true) => s.pending += 1,
            (true, false) => s.pending -= 1,
            _ => {}
        }
    }

    /// Objects not reconciled to their target generation yet.
    pub(crate) fn pending(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).pending
    }

    /// Reconciles so far.
    pub(crate) fn reconciles(&self) -> u64 {
        self.reconciles.load(Ordering::Relaxed)
    }
}

/// The server with the CRD and `objects` Items, each expected at generation 1.
pub(crate) async fn setup(objects: usize, ledger: &Ledger) -> Result<TestServer, BenchError> {
    setup_with(objects, ledger, true).await
}

/// [`setup`], with the `ShardedListAndWatch` gate on or off (off: readers fall back to filtering locally).
pub(crate) async fn setup_with(
    objects: usize,
    ledger: &Ledger,
    gate: bool,
) -> Result<TestServer, BenchError> {
    // history: larger than any burst, so only the explicit compaction forces the relists
    let server = TestServer::builder()
        .shard_selector(gate)
        .history(4 * objects + 10_000)
        .build();
    let client = server.client(WRITER);
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd()?)
        .await
        .map_err(cluster)?;
    let api = items(client);
    let results: Vec<Result<(), BenchError>> = stream::iter(0..objects)
        .map(|i| {
            let api = api.clone();
            async move {
                let mut obj = DynamicObject::new(&name(i), &item_resource()).within(NS);
                obj.data = json!({"spec": {"round": 0}});
                api.create(&PostParams::default(), &obj)
                    .await
                    .map(|_| ())
                    .map_err(cluster)
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    for i in 0..objects {
        ledger.expect(&name(i), 1);
    }
    Ok(server)
}

/// The name of object `i`.
pub(crate) fn name(i: usize) -> String {
    format!("item-{i:05}")
}

/// Change every object's spec (a new generation each) as the writer; the ledger expects the new ones.
pub(crate) async fn bump_all(
    server: &TestServer,
    objects: usize,
    round: u64,
    ledger: &Ledger,
) -> Result<(), BenchError> {
    let api = items(server.client(WRITER));
    let results: Vec<Result<(String, i64), BenchError>> = stream::iter(0..objects)
        .map(|i| {
            let api = api.clone();
            async move {
                let n = name(i);
                let patch = Patch::Merge(json!({"spec": {"round": round}}));
                let obj = api
                    .patch(&n, &PatchParams::default(), &patch)
                    .await
                    .map_err(cluster)?;
                Ok((n, obj.metadata.generation.unwrap_or(0)))
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    for r in results {
        let (n, g) = r?;
        ledger.expect(&n, g);
    }
    Ok(())
}

/// An outage as the replicas see it: partitioned (requests fail, watches freeze) while `during` runs;
/// then the history is compacted and every watch ended, so each replica's next watch gets a 410 and
/// relists; then the partition heals. Returns when the partition healed.
pub(crate) async fn outage<F: std::future::Future<Output = Result<(), BenchError>>>(
    server: &TestServer,
    identities: &[String],
    min: Duration,
    during: F,
) -> Result<(), BenchError> {
    let faults = server.faults();
    for id in identities {
        faults.partition(Scope::identity(id.clone()), true);
    }
    let started = tokio::time::Instant::now();
    during.await?;
    // the rest of the cluster goes on: the resourceVersion moves past what the replicas saw, so the
    // compaction leaves every replica's next watch behind it (a 410, then a relist)
    tick(server).await?;
    tokio::time::sleep_until(started + min).await;
    faults.compact();
    faults.close_watches(Scope::All);
    for id in identities {
        faults.partition(Scope::identity(id.clone()), false);
    }
    Ok(())
}

/// One write elsewhere in the cluster (a ConfigMap the writer owns).
pub(crate) async fn tick(server: &TestServer) -> Result<(), BenchError> {
    let cms: Api<ConfigMap> = Api::namespaced(server.client(WRITER), NS);
    let patch = Patch::Apply(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "bench-clock"},
        "data": {"rv": server.resource_version().to_string()}
    }));
    cms.patch("bench-clock", &PatchParams::apply("bench").force(), &patch)
        .await
        .map_err(cluster)?;
    Ok(())
}

/// Check on the server itself that every Item has `status.observedGeneration == metadata.generation`:
/// returns the number that do not.
pub(crate) fn unreconciled_on_server(server: &TestServer) -> usize {
    server
        .objects("bench.kube-shard.io", "items")
        .iter()
        .filter(|o| {
            let g = o["metadata"]["generation"].as_i64().unwrap_or(0);
            o["status"]["observedGeneration"].as_i64() != Some(g)
        })
        .count()
}

/// Wait until the ledger has nothing pending (or `limit` passes): the time it took, or `None`.
pub(crate) async fn until_reconciled(ledger: &Ledger, limit: Duration) -> Option<Duration> {
    let start = tokio::time::Instant::now();
    loop {
        if ledger.pending() == 0 {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// LIST items delivered so far to each identity.
pub(crate) fn list_items(server: &TestServer, ids: &[String]) -> Vec<u64> {
    ids.iter()
        .map(|i| server.accounting(i).list_items)
        .collect()
}

/// Per identity, the seconds from `since` until the items delivered to it by LISTs grew by at least
/// `min_items` over `base` — its relist — polled every 20 ms until `limit`; `None` for those that did not.
pub(crate) async fn until_relisted(
    server: &TestServer,
    ids: &[String],
    base: &[u64],
    min_items: u64,
    since: tokio::time::Instant,
    limit: Duration,
) -> Vec<Option<f64>> {
    let mut at: Vec<Option<f64>> = vec![None; ids.len()];
    while since.elapsed() < limit && at.iter().any(Option::is_none) {
        for (i, now) in list_items(server, ids).into_iter().enumerate() {
            if at[i].is_none() && now >= base[i] + min_items {
                at[i] = Some(since.elapsed().as_secs_f64());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    at
}

/// How a timed phase ended.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Done {
    /// Seconds until the last object that was reconciled was (all of them when `missed` is 0).
    pub(crate) secs: f64,
    /// Objects still behind when progress stopped for `stall` (or at the limit).
    pub(crate) missed: usize,
}

/// Wait until every object is reconciled, or until progress (after it began) stopped for `stall`, or
/// `limit` passed.
pub(crate) async fn until_reconciled_or_stalled(
    ledger: &Ledger,
    stall: Duration,
    limit: Duration,
) -> Done {
    let start = tokio::time::Instant::now();
    let first = ledger.pending();
    let mut last = first;
    let mut last_progress = start;
    loop {
        let now = ledger.pending();
        if now == 0 {
            return Done {
                secs: start.elapsed().as_secs_f64(),
                missed: 0,
            };
        }
        if now != last {
            last = now;
            last_progress = tokio::time::Instant::now();
        }
        let stalled = now < first && last_progress.elapsed() >= stall;
        if stalled || start.elapsed() > limit {
            return Done {
                secs: (last_progress - start).as_secs_f64(),
                missed: now,
            };
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until no reconcile ran for `quiet` (or `limit` passes).
pub(crate) async fn until_quiet(ledger: &Ledger, quiet: Duration, limit: Duration) {
    let start = tokio::time::Instant::now();
    let mut last = ledger.reconciles();
    let mut since = tokio::time::Instant::now();
    while start.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = ledger.reconciles();
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= quiet {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ledger is the completion oracle: a write of an older generation, or none, keeps an object
    /// pending; only the target generation (or a newer one) clears it.
    #[test]
    fn an_object_is_pending_until_its_target_generation_is_written() {
        let l = Ledger::default();
        l.expect("a", 1);
        l.expect("b", 1);
        assert_eq!(l.pending(), 2);
        l.written("a", 1);
        assert_eq!(l.pending(), 1);
        l.expect("a", 2); // changed again
        l.written("a", 1); // a stale reconcile wrote the old generation
        assert_eq!(l.pending(), 2);
        l.written("a", 3);
        l.written("b", 1);
        assert_eq!(l.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_phase_reports_what_was_missed() {
        let l = Ledger::default();
        for n in ["a", "b", "c"] {
            l.expect(n, 1);
        }
        l.written("a", 1);
        let done =
            until_reconciled_or_stalled(&l, Duration::from_secs(5), Duration::from_secs(60)).await;
        assert_eq!(done.missed, 2);
        assert!(done.secs < 1.0, "{done:?}");
    }
}
