//! The operator's singleton: collect orphaned child ConfigMaps (whose Widget is gone).
//!
//! On a real cluster the garbage collector deletes them through their ownerReference; a bare apiserver
//! (the embedded test server, or one without a controller manager) has none. This is work that must run
//! once per group, not per object: after its Widget is deleted no shard owner is asked about a child. It
//! runs on the coordinator through `Leadership::run_singleton`, re-checks its term before every delete,
//! and deletes with a uid precondition.
//!
//! Order matters: children are listed **before** Widgets. A child in the first list was created before the
//! Widget list was taken, and its Widget before the child, so a Widget missing from the second list was
//! really deleted (never "created after the list").
//!
//! Every request of a pass is time-limited ([`REQUEST_LIMIT`]): kube's client sets no read timeout, so a
//! request on a black-holed connection would hold the pass — and every pass after it in this term — until
//! TCP gives up. A pass that times out fails and the next one starts after the interval.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::core::PartialObjectMeta;
use kube::{Api, Client};
use kube_shard::group::SingletonGuard;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tracing::{info, warn};

use crate::widget::{Widget, CHILD_LABEL};

/// How long one request of a collection pass (a LIST page, a delete) may wait for its answer: the read
/// path's bound (`docs/read-path.md`, "Time limits"). A healthy apiserver answers in well under a second.
pub const REQUEST_LIMIT: Duration = Duration::from_secs(35);

/// Why a collection pass failed.
#[derive(Debug, thiserror::Error)]
enum PassError {
    /// The apiserver answered with an error.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// No answer within [`REQUEST_LIMIT`].
    #[error("{what} got no answer within {REQUEST_LIMIT:?}")]
    TimedOut { what: &'static str },
}

/// `request` within [`REQUEST_LIMIT`] (dropped on expiry).
async fn bounded<T>(
    what: &'static str,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, PassError> {
    match tokio::time::timeout(REQUEST_LIMIT, request).await {
        Ok(r) => r.map_err(PassError::from),
        Err(_) => Err(PassError::TimedOut { what }),
    }
}

/// Metrics of the singleton.
#[derive(Clone, Default)]
pub struct GcMetrics {
    /// The term this member runs the singleton in (0 when it does not).
    pub term: Gauge,
    /// Orphaned children deleted.
    pub collected: Counter,
    /// Collection passes completed.
    pub passes: Counter,
}

impl GcMetrics {
    /// Register every metric (names `kshard_singleton_*`, `kshard_orphans_collected`).
    pub fn register(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "kshard_singleton_term",
            "The term this member runs the singleton in (0 when it does not lead)",
            self.term.clone(),
        );
        r.register(
            "kshard_orphans_collected",
            "Child ConfigMaps whose Widget was gone, deleted by the singleton",
            self.collected.clone(),
        );
        r.register(
            "kshard_singleton_passes",
            "Orphan collection passes completed",
            self.passes.clone(),
        );
    }
}

/// Run collection passes every `interval` while `guard`'s term lasts.
pub async fn collect_orphans(
    client: Client,
    namespace: Option<String>,
    interval: Duration,
    guard: SingletonGuard,
    metrics: GcMetrics,
) {
    metrics
        .term
        .set(i64::try_from(guard.term()).unwrap_or(i64::MAX));
    let _reset = ResetOnDrop(metrics.term.clone());
    let (children, widgets): (Api<ConfigMap>, Api<Widget>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client, ns),
        ),
        None => (Api::all(client.clone()), Api::all(client)),
    };
    loop {
        match pass(&children, &widgets, &guard, &metrics).await {
            Ok(n) if n > 0 => info!(
                collected = n,
                term = guard.term(),
                "orphaned children deleted"
            ),
            Ok(_) => {}
            Err(e) => warn!(error = %e, "orphan collection failed; retrying next pass"),
        }
        metrics.passes.inc();
        tokio::time::sleep(interval).await;
    }
}

struct ResetOnDrop(Gauge);

impl Drop for ResetOnDrop {
    fn drop(&mut self) {
        self.0.set(0);
    }
}

async fn pass(
    children: &Api<ConfigMap>,
    widgets: &Api<Widget>,
    guard: &SingletonGuard,
    metrics: &GcMetrics,
) -> Result<usize, PassError> {
    let kids = bounded(
        "the child LIST",
        children.list_metadata(&ListParams::default().labels(CHILD_LABEL)),
    )
    .await?;
    let listed = bounded(
        "the Widget LIST",
        widgets.list_metadata(&ListParams::default()),
    )
    .await?;
    let live: BTreeSet<String> = listed
        .items
        .into_iter()
        .filter_map(|w| w.metadata.uid)
        .collect();
    let mut collected = 0;
    for kid in kids.items {
        let Some((ns, name, uid)) = orphan(&kid, &live) else {
            continue;
        };
        if guard.check().is_err() {
            break;
        }
        let api: Api<ConfigMap> = Api::namespaced(children.clone().into_client(), &ns);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match bounded("a child's delete", api.delete(&name, &dp)).await {
            Ok(_) => {
                collected += 1;
                metrics.collected.inc();
            }
            Err(PassError::Api(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(collected)
}

/// `(namespace, name, uid)` of a child whose controlling Widget is not in `live`.
fn orphan(
    kid: &PartialObjectMeta<ConfigMap>,
    live: &BTreeSet<String>,
) -> Option<(String, String, String)> {
    let m = &kid.metadata;
    let owner = m
        .owner_references
        .as_ref()?
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Widget")?;
    if live.contains(&owner.uid) {
        return None;
    }
    Some((m.namespace.clone()?, m.name.clone()?, m.uid.clone()?))
}
