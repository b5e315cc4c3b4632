//! The `Document` operator of `document-operator-sharded.rs`, sharded with kube-shard: every replica
//! reconciles its own share of the Documents, handed over safely as replicas come, go and die. The diff
//! between the two files is the whole port (`docs/porting.md` walks through it line by line).
//!
//! ```sh
//! cargo run --example document-operator-sharded -- crd | kubectl apply -f -   # install the CRD
//! # outside a cluster, say which namespace the group's Leases live in (in a pod: its own namespace)
//! POD_NAMESPACE=default KUBECONFIG=~/.kube/config \
//!   cargo run --example document-operator-sharded -- run [--listen 0.0.0.0:8080]
//! ```
//!
//! Run it several times (each with its own `POD_NAME` and `--listen` port): the replicas split the
//! Documents; stop one with Ctrl-C and the others take its share at once; kill one and they take it over
//! after a lease. `cargo test --example document-operator-sharded` runs the same unit tests as the plain
//! version.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::Full;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, ResourceExt};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{self, finalizer, Event as Finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Client, CustomResource, CustomResourceExt, Resource};
use kube_shard::{Controller, Current, FencedApi, ShardGroup};
use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::RwLock;
use tokio::time::{Duration, Instant};
use tracing::{debug, error, info, instrument, warn};

/// The finalizer this operator puts on every Document, so that it sees them deleted.
pub const FINALIZER: &str = "documents.docs.example.com/cleanup";

/// The field manager of the status writes, and the reporting controller of the Events.
pub const MANAGER: &str = "document-operator";

/// How often a Document is reconciled when nothing changes.
const RESYNC: Duration = Duration::from_secs(5 * 60);

/// The condition the status reports: whether the Document is published (not hidden).
const PUBLISHED: &str = "Published";

/// Where the health, metrics and diagnostics endpoint listens unless `--listen` says otherwise.
const DEFAULT_LISTEN: &str = "0.0.0.0:8080";

// ---- the Document custom resource ----

/// A document the operator publishes or hides, and counts the words of.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, JsonSchema)]
#[kube(
    group = "docs.example.com",
    version = "v1",
    kind = "Document",
    namespaced,
    status = "DocumentStatus",
    shortname = "doc",
    printcolumn(name = "Title", type_ = "string", json_path = ".spec.title"),
    printcolumn(name = "Hidden", type_ = "boolean", json_path = ".status.hidden"),
    printcolumn(name = "Words", type_ = "integer", json_path = ".status.wordCount")
)]
#[serde(rename_all = "camelCase")]
pub struct DocumentSpec {
    /// The title; a Document without one is refused.
    pub title: String,
    /// The text of the document.
    #[serde(default)]
    pub content: String,
    /// Hide the document (it stays, unpublished).
    #[serde(default)]
    pub hide: bool,
}

/// What the operator last saw of a `Document`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DocumentStatus {
    /// Whether the document is hidden.
    pub hidden: bool,
    /// The number of words of its content.
    pub word_count: u64,
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The `Published` condition.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<DocumentCondition>,
}

/// A condition of a `Document`, as Kubernetes conditions are written.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DocumentCondition {
    /// The condition's type (`Published`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// A machine-readable reason for the condition's last transition.
    pub reason: String,
    /// A human-readable message about the transition.
    pub message: String,
    /// When the condition last changed its status.
    #[schemars(with = "String")]
    pub last_transition_time: Time,
}

impl Document {
    /// Whether the operator has already hidden this document.
    fn was_hidden(&self) -> bool {
        self.status.as_ref().map(|s| s.hidden).unwrap_or(false)
    }

    /// The spec must have a title.
    fn validate(&self) -> Result<(), Error> {
        if self.spec.title.trim().is_empty() {
            return Err(Error::IllegalDocument);
        }
        Ok(())
    }

    /// The `Published` condition as it is now: the previous transition time is kept while the status
    /// stays the same.
    fn published_condition(&self, now: Timestamp) -> DocumentCondition {
        let title = &self.spec.title;
        let (status, reason, message) = if self.spec.hide {
            ("False", "Hidden", format!("`{title}` is hidden"))
        } else {
            ("True", "Visible", format!("`{title}` is published"))
        };
        let previous = self
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == PUBLISHED));
        let last_transition_time = match previous {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => Time(now),
        };
        DocumentCondition {
            type_: PUBLISHED.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message,
            last_transition_time,
        }
    }

    /// The status this document should have.
    fn desired_status(&self, now: Timestamp) -> DocumentStatus {
        DocumentStatus {
            hidden: self.spec.hide,
            word_count: count_words(&self.spec.content),
            observed_generation: self.metadata.generation,
            conditions: vec![self.published_condition(now)],
        }
    }
}

/// The number of words of `text`: runs of non-space characters with at least one letter or digit (so
/// Markdown bullets and rules are not words).
pub fn count_words(text: &str) -> u64 {
    let words = text
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .count();
    words as u64
}

// ---- errors ----

#[derive(thiserror::Error, Debug)]
pub enum Error {
    #[error("SerializationError: {0}")]
    SerializationError(#[source] serde_json::Error),

    #[error("Kube Error: {0}")]
    KubeError(#[source] kube::Error),

    #[error("Finalizer Error: {0}")]
    // NB: awkward type because finalizer::Error embeds the reconciler error (which is this)
    // so boxing this error to break cycles
    FinalizerError(#[source] Box<finalizer::Error<Error>>),

    #[error("IllegalDocument")]
    IllegalDocument,

    #[error("FencedWriteError: {0}")]
    FencedWriteError(#[source] kube_shard::fenced_write::Error),
}

impl Error {
    /// The `error` label of the failure metric: the kind of the root cause.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::SerializationError(_) => "serialization",
            Error::KubeError(_) => "kube",
            Error::IllegalDocument => "illegal_document",
            Error::FencedWriteError(_) => "fenced_write",
            Error::FinalizerError(e) => match &**e {
                finalizer::Error::ApplyFailed(inner) | finalizer::Error::CleanupFailed(inner) => {
                    inner.metric_label()
                }
                finalizer::Error::AddFinalizer(_) | finalizer::Error::RemoveFinalizer(_) => "kube",
                _ => "finalizer",
            },
        }
    }
}

// ---- metrics ----

/// The labels of the failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: String,
}

/// The reconciler's Prometheus metrics.
#[derive(Clone)]
pub struct Metrics {
    pub reconciliations: Counter,
    pub failures: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciliations: Counter::default(),
            failures: Family::default(),
            // 10 ms to about 20 s
            reconcile_duration: Histogram::new(exponential_buckets(0.01, 2.0, 12)),
        }
    }
}

impl Metrics {
    /// Register the metrics in `registry` (under its prefix).
    pub fn register(self, registry: &mut Registry) -> Self {
        registry.register(
            "reconciliations",
            "Reconciliations started",
            self.reconciliations.clone(),
        );
        registry.register(
            "failures",
            "Reconciliations that failed, by error",
            self.failures.clone(),
        );
        registry.register(
            "duration_seconds",
            "The duration of reconciliations in seconds",
            self.reconcile_duration.clone(),
        );
        self
    }

    /// Count a failed reconciliation.
    pub fn reconcile_failure(&self, error: &Error) {
        self.failures
            .get_or_create(&ErrorLabels {
                error: error.metric_label().to_string(),
            })
            .inc();
    }

    /// Count a reconciliation and measure it until the returned guard is dropped.
    pub fn count_and_measure(&self) -> ReconcileMeasurer {
        self.reconciliations.inc();
        ReconcileMeasurer {
            start: Instant::now(),
            metric: self.reconcile_duration.clone(),
        }
    }
}

/// Observes the duration of a reconciliation when dropped.
pub struct ReconcileMeasurer {
    start: Instant,
    metric: Histogram,
}

impl Drop for ReconcileMeasurer {
    fn drop(&mut self) {
        self.metric.observe(self.start.elapsed().as_secs_f64());
    }
}

// ---- state shared by the controller and the web server ----

/// Diagnostics the web server shows at `/`.
#[derive(Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnostics {
    /// When a reconciliation last started.
    pub last_event: Timestamp,
    /// Who publishes the Events.
    #[serde(skip)]
    pub reporter: Reporter,
}

impl Default for Diagnostics {
    fn default() -> Self {
        Self {
            last_event: Timestamp::now(),
            reporter: Reporter {
                controller: MANAGER.into(),
                // set from the downward API in the Deployment
                instance: std::env::var("POD_NAME").ok(),
            },
        }
    }
}

impl Diagnostics {
    fn recorder(&self, client: Client) -> Recorder {
        Recorder::new(client, self.reporter.clone())
    }
}

/// State shared between the controller and the web server.
#[derive(Clone)]
pub struct State {
    /// Diagnostics populated by the reconciler.
    diagnostics: Arc<RwLock<Diagnostics>>,
    /// The metrics the reconciler updates.
    metrics: Arc<Metrics>,
    /// The registry `/metrics` encodes.
    registry: Arc<Registry>,
}

impl Default for State {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("document_operator_reconcile");
        let metrics = Metrics::default().register(&mut registry);
        Self {
            diagnostics: Arc::default(),
            metrics: Arc::new(metrics),
            registry: Arc::new(registry),
        }
    }
}

impl State {
    /// The metrics in the Prometheus text format.
    pub fn metrics(&self) -> String {
        let mut buffer = String::new();
        encode(&mut buffer, &self.registry).expect("writing to a String cannot fail");
        buffer
    }

    /// A copy of the diagnostics.
    pub async fn diagnostics(&self) -> Diagnostics {
        self.diagnostics.read().await.clone()
    }

    /// The context of the reconciler, which updates this state.
    pub async fn to_context(&self, client: Client) -> Arc<Context> {
        Arc::new(Context {
            client: client.clone(),
            recorder: self.diagnostics.read().await.recorder(client),
            metrics: self.metrics.clone(),
            diagnostics: self.diagnostics.clone(),
            failures: Mutex::default(),
        })
    }
}

/// What the reconciler and the error policy get.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Publishes Events (events.k8s.io/v1).
    pub recorder: Recorder,
    /// Diagnostics read by the web server.
    pub diagnostics: Arc<RwLock<Diagnostics>>,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Consecutive failures per Document, for the error policy's backoff; a success clears them.
    failures: Mutex<HashMap<ObjectRef<Document>, u32>>,
}

impl Context {
    /// Count one more failure of `doc`'s reconciliation; returns how many in a row.
    fn record_failure(&self, doc: &Document) -> u32 {
        let mut failures = self.failures.lock().unwrap();
        let count = failures.entry(ObjectRef::from_obj(doc)).or_insert(0);
        *count += 1;
        *count
    }

    /// Forget the failures of `doc` (it reconciled).
    fn clear_failures(&self, doc: &ObjectRef<Document>) {
        self.failures.lock().unwrap().remove(doc);
    }
}

/// The requeue delay after the `failures`th failure in a row: 5 s, doubling up to 5 minutes.
fn backoff(failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(6);
    Duration::from_secs(5 << exponent).min(RESYNC)
}

// ---- the reconciler ----

/// Reconcile one Document: add the finalizer, then either bring its status up to date or, when it is
/// being deleted, clean up and release it.
#[instrument(skip(ctx, doc), fields(name = %doc.name_any(), namespace = doc.metadata.namespace.as_deref()))]
async fn reconcile(doc: Arc<Document>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.metrics.count_and_measure();
    ctx.diagnostics.write().await.last_event = Timestamp::now();
    let ns = doc.namespace().unwrap(); // Document is namespaced
    let docs: Api<Document> = Api::namespaced(ctx.client.clone(), &ns);
    let key = ObjectRef::from_obj(&*doc);

    info!("Reconciling Document \"{}\" in {}", doc.name_any(), ns);
    let action = finalizer(&docs, FINALIZER, doc, |event| async {
        match event {
            Finalizer::Apply(doc) => doc.reconcile(ctx.clone()).await,
            Finalizer::Cleanup(doc) => doc.cleanup(ctx.clone()).await,
        }
    })
    .await
    .map_err(|e| Error::FinalizerError(Box::new(e)))?;
    ctx.clear_failures(&key);
    Ok(action)
}

/// Count the failure and retry the Document later, backing off while it keeps failing.
fn error_policy(doc: Arc<Document>, error: &Error, ctx: Arc<Context>) -> Action {
    warn!("reconcile failed: {error:?}");
    ctx.metrics.reconcile_failure(error);
    let failures = ctx.record_failure(&doc);
    Action::requeue(backoff(failures))
}

impl Document {
    /// Reconcile a live Document (the finalizer is in place).
    async fn reconcile(&self, ctx: Arc<Context>) -> Result<Action, Error> {
        let name = self.name_any();
        let ns = self.namespace().unwrap();
        let docs = FencedApi::new(Api::<Document>::namespaced(ctx.client.clone(), &ns));
        self.validate()?;

        let should_hide = self.spec.hide;
        if should_hide != self.was_hidden() {
            // one Event per change of visibility
            let (reason, action, note) = if should_hide {
                ("HideRequested", "Hiding", format!("Hiding `{name}`"))
            } else {
                ("ShowRequested", "Showing", format!("Showing `{name}`"))
            };
            ctx.recorder
                .publish(
                    &Event {
                        type_: EventType::Normal,
                        reason: reason.into(),
                        note: Some(note),
                        action: action.into(),
                        secondary: None,
                    },
                    &self.object_ref(&()),
                )
                .await
                .map_err(Error::KubeError)?;
        }

        let status = self.desired_status(Timestamp::now());
        if self.status.as_ref() == Some(&status) {
            debug!("status is up to date");
        } else {
            let status = serde_json::to_value(&status).map_err(Error::SerializationError)?;
            let patch = Patch::Apply(json!({
                "apiVersion": Document::api_version(&()),
                "kind": Document::kind(&()),
                "status": status,
            }));
            let params = PatchParams::apply(MANAGER).force();
            docs.patch_status(&Current, self, &params, &patch)
                .await
                .map_err(Error::FencedWriteError)?;
        }

        // If no events were received, check back every 5 minutes
        Ok(Action::requeue(RESYNC))
    }

    /// Clean up a deleted Document (the finalizer is removed afterwards).
    async fn cleanup(&self, ctx: Arc<Context>) -> Result<Action, Error> {
        // Document owns nothing outside itself, so we just publish an event
        ctx.recorder
            .publish(
                &Event {
                    type_: EventType::Normal,
                    reason: "DeleteRequested".into(),
                    note: Some(format!("Delete `{}`", self.name_any())),
                    action: "Deleting".into(),
                    secondary: None,
                },
                &self.object_ref(&()),
            )
            .await
            .map_err(Error::KubeError)?;
        Ok(Action::await_change())
    }
}

/// Run the controller over every Document until a signal (SIGTERM, Ctrl-C) stops it.
async fn run_controller(docs: Api<Document>, ctx: Arc<Context>, group: ShardGroup) {
    Controller::new(docs, watcher::Config::default().any_semantic(), group)
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .filter_map(|x| async move { std::result::Result::ok(x) })
        .for_each(|_| futures::future::ready(()))
        .await;
}

// ---- health, metrics and diagnostics over HTTP ----

type Body = Full<Bytes>;

fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// Answer one request: `/health`, `/metrics` or `/` (the diagnostics).
async fn handle<B>(req: Request<B>, state: State) -> Result<Response<Body>, Infallible> {
    let response = match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") => respond(StatusCode::OK, "text/plain", "healthy"),
        (&Method::GET, "/metrics") => respond(
            StatusCode::OK,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            state.metrics(),
        ),
        (&Method::GET, "/") => match serde_json::to_vec(&state.diagnostics().await) {
            Ok(json) => respond(StatusCode::OK, "application/json", json),
            Err(e) => respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                e.to_string(),
            ),
        },
        (_, "/health" | "/metrics" | "/") => respond(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "method not allowed",
        ),
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found"),
    };
    Ok(response)
}

/// Serve the endpoints on `listener`, one task per connection, until an accept fails.
async fn serve(listener: TcpListener, state: State) -> std::io::Result<()> {
    loop {
        let (stream, peer) = listener.accept().await?;
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, state.clone()));
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(%peer, "connection failed: {e}");
            }
        });
    }
}

// ---- start-up ----

/// Check that the CRD is installed, then run the controller and the web server until a signal.
async fn run(listen: SocketAddr) -> Result<(), Box<dyn std::error::Error>> {
    let group = ShardGroup::from_config(kube::Config::infer().await?, MANAGER).build()?;
    let client = group.client();
    let docs = Api::<Document>::all(client.clone());
    if let Err(e) = docs.list(&ListParams::default().limit(1)).await {
        error!("CRD is not queryable; {e:?}. Is the CRD installed?");
        info!(
            "Installation: cargo run --example document-operator-sharded -- crd | kubectl apply -f -"
        );
        std::process::exit(1);
    }

    let state = State::default();
    let ctx = state.to_context(client).await;
    let listener = TcpListener::bind(listen).await?;
    info!(
        "serving /health, /metrics and diagnostics on {}",
        listener.local_addr()?
    );

    tokio::select! {
        // biased: the controller first, so that once it has shut down on a signal the server stops with it
        biased;
        () = run_controller(docs, ctx, group) => info!("controller shut down"),
        served = serve(listener, state) => served?,
    }
    Ok(())
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).init();
}

const USAGE: &str = "usage: document-operator-sharded crd | run [--listen ADDR]";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("crd") => println!("{}", serde_json::to_string_pretty(&Document::crd())?),
        Some("run") => {
            let listen = match (args.next().as_deref(), args.next()) {
                (None, _) => DEFAULT_LISTEN.to_string(),
                (Some("--listen"), Some(addr)) => addr,
                _ => return Err(USAGE.into()),
            };
            init_tracing();
            run(listen.parse()?).await?;
        }
        _ => return Err(USAGE.into()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{DeleteParams, PostParams};
    use kube_shard_testserver::TestServer;

    const NS: &str = "default";

    /// An in-process API server with the CRD installed, a client of it and a reconciler context.
    async fn setup() -> (TestServer, Api<Document>, Arc<Context>, State) {
        let server = TestServer::new();
        kube_shard::testing::admit_all_on_this_thread();
        let client = server.client(MANAGER);
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        crds.create(&PostParams::default(), &Document::crd())
            .await
            .expect("create the CRD");
        let state = State::default();
        let ctx = state.to_context(client.clone()).await;
        (server, Api::namespaced(client, NS), ctx, state)
    }

    fn document(name: &str, title: &str, content: &str, hide: bool) -> Document {
        let mut doc = Document::new(
            name,
            DocumentSpec {
                title: title.into(),
                content: content.into(),
                hide,
            },
        );
        doc.metadata.namespace = Some(NS.into());
        doc
    }

    /// Create `doc` with the finalizer already in place (as if an earlier pass had added it).
    async fn create_finalized(docs: &Api<Document>, mut doc: Document) -> Document {
        doc.metadata.finalizers = Some(vec![FINALIZER.into()]);
        docs.create(&PostParams::default(), &doc).await.unwrap()
    }

    async fn events(ctx: &Context, name: &str, reason: &str) -> Vec<K8sEvent> {
        let events: Api<K8sEvent> = Api::namespaced(ctx.client.clone(), NS);
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .collect()
    }

    #[tokio::test]
    async fn new_document_gets_the_finalizer() {
        let (_server, docs, ctx, _) = setup().await;
        let created = docs
            .create(
                &PostParams::default(),
                &document("intro", "Intro", "hi", false),
            )
            .await
            .unwrap();
        assert!(created.finalizers().is_empty());

        let action = reconcile(Arc::new(created), ctx).await.unwrap();
        assert_eq!(action, Action::await_change());
        let stored = docs.get("intro").await.unwrap();
        assert_eq!(stored.finalizers(), [FINALIZER.to_string()]);
        assert!(
            stored.status.is_none(),
            "the status waits for the next reconcile"
        );
    }

    #[tokio::test]
    async fn finalized_document_gets_its_status_by_server_side_apply() {
        let (_server, docs, ctx, state) = setup().await;
        let doc = document(
            "guide",
            "Guide",
            "# Guide\n\n- read this\n- then that",
            false,
        );
        let doc = create_finalized(&docs, doc).await;

        let action = reconcile(Arc::new(doc), ctx.clone()).await.unwrap();
        assert_eq!(action, Action::requeue(RESYNC));

        let stored = docs.get_status("guide").await.unwrap();
        let status = stored.status.clone().expect("status written");
        assert!(!status.hidden);
        assert_eq!(status.word_count, 5);
        assert_eq!(status.observed_generation, stored.metadata.generation);
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(status.conditions[0].type_, PUBLISHED);
        assert_eq!(status.conditions[0].status, "True");

        // a second pass finds the status up to date and writes nothing
        let version = stored.resource_version();
        reconcile(Arc::new(stored), ctx).await.unwrap();
        assert_eq!(docs.get("guide").await.unwrap().resource_version(), version);
        assert!(state
            .metrics()
            .contains("document_operator_reconcile_reconciliations_total 2"));
    }

    #[tokio::test]
    async fn hidden_document_publishes_an_event() {
        let (_server, docs, ctx, _) = setup().await;
        let doc = create_finalized(&docs, document("secret", "Secret", "shh", true)).await;

        reconcile(Arc::new(doc), ctx.clone()).await.unwrap();
        let status = docs.get_status("secret").await.unwrap().status.unwrap();
        assert!(status.hidden);
        assert_eq!(status.conditions[0].status, "False");
        assert_eq!(status.conditions[0].reason, "Hidden");

        let hides = events(&ctx, "secret", "HideRequested").await;
        assert_eq!(hides.len(), 1, "{hides:?}");
        assert_eq!(hides[0].action.as_deref(), Some("Hiding"));
        assert_eq!(hides[0].reporting_controller.as_deref(), Some(MANAGER));
        assert_eq!(hides[0].type_.as_deref(), Some("Normal"));
    }

    #[tokio::test]
    async fn deleted_document_is_cleaned_up_and_released() {
        let (_server, docs, ctx, _) = setup().await;
        create_finalized(&docs, document("old", "Old", "gone soon", false)).await;

        docs.delete("old", &DeleteParams::default()).await.unwrap();
        let deleting = docs.get("old").await.expect("held by the finalizer");
        assert!(deleting.metadata.deletion_timestamp.is_some());

        let action = reconcile(Arc::new(deleting), ctx.clone()).await.unwrap();
        assert_eq!(action, Action::await_change());
        assert_eq!(events(&ctx, "old", "DeleteRequested").await.len(), 1);
        assert!(
            docs.get_opt("old").await.unwrap().is_none(),
            "finalizer removed, document gone"
        );
    }

    #[tokio::test]
    async fn illegal_document_fails_and_is_counted() {
        let (_server, docs, ctx, state) = setup().await;
        let doc = Arc::new(create_finalized(&docs, document("untitled", " ", "text", false)).await);

        let err = reconcile(doc.clone(), ctx.clone()).await.unwrap_err();
        assert_eq!(err.metric_label(), "illegal_document");
        assert!(err.to_string().contains("IllegalDocument"), "{err}");

        assert_eq!(
            error_policy(doc.clone(), &err, ctx.clone()),
            Action::requeue(Duration::from_secs(5))
        );
        assert_eq!(
            error_policy(doc, &err, ctx),
            Action::requeue(Duration::from_secs(10))
        );
        let metrics = state.metrics();
        assert!(
            metrics.contains(
                r#"document_operator_reconcile_failures_total{error="illegal_document"} 2"#
            ),
            "{metrics}"
        );
    }

    #[tokio::test]
    async fn endpoints_answer() {
        let state = State::default();
        let get = |path: &str| Request::get(path).body(()).unwrap();

        let health = handle(get("/health"), state.clone()).await.unwrap();
        assert_eq!(health.status(), StatusCode::OK);
        let body = http_body_util::BodyExt::collect(health.into_body())
            .await
            .unwrap();
        assert_eq!(body.to_bytes(), "healthy");

        let metrics = handle(get("/metrics"), state.clone()).await.unwrap();
        let body = http_body_util::BodyExt::collect(metrics.into_body())
            .await
            .unwrap();
        let text = String::from_utf8(body.to_bytes().to_vec()).unwrap();
        assert!(
            text.contains("# TYPE document_operator_reconcile_duration_seconds histogram"),
            "{text}"
        );

        let diagnostics = handle(get("/"), state.clone()).await.unwrap();
        let body = http_body_util::BodyExt::collect(diagnostics.into_body())
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body.to_bytes()).unwrap();
        assert!(json["lastEvent"].is_string(), "{json}");

        let missing = handle(get("/nope"), state).await.unwrap();
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn words_are_counted() {
        assert_eq!(count_words(""), 0);
        assert_eq!(count_words("  one\ttwo\n\nthree  "), 3);
        assert_eq!(count_words("# Title\n\n- item - other\n\n---"), 3);
        assert_eq!(count_words("naïve café, déjà vu"), 4);
    }

    #[test]
    fn backoff_doubles_up_to_the_resync() {
        let delays: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300]);
    }

    #[test]
    fn crd_is_namespaced_with_a_status() {
        let crd = Document::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("documents.docs.example.com")
        );
        assert_eq!(crd.spec.scope, "Namespaced");
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1");
        assert!(version.subresources.as_ref().unwrap().status.is_some());
    }
}
