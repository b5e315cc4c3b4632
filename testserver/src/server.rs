//! The server: shared state, the builder and the handles users get.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use tokio::sync::watch;

use crate::{
    accounting::{Accounting, Ledger},
    audit::{Auditor, FenceAudit},
    determinism::{Entropy, WallClock},
    faults::{FaultState, Faults},
    history::{History, Recorder},
    http::{HttpServer, Transport},
    kubeconfig,
    service::ApiService,
    store::Store,
};

/// Server configuration (see [`Builder`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The `ShardedListAndWatch` feature gate at start (default off, as in 1.36 and 1.37).
    pub shard_selector: bool,
    /// Interval between watch bookmarks (default 60 s, like the cacher: eager bookmarks would hide
    /// latency).
    pub bookmark_interval: Duration,
    /// Changes kept for watches and continue tokens (default 10 000); older ones answer 410.
    pub history: usize,
    /// Run the garbage collector and namespace finalisation (default off: a bare kube-apiserver).
    pub controllers: bool,
    /// Watch duration when the request has no `timeoutSeconds` (default 1800 s, kube-apiserver's
    /// `--min-request-timeout`; the real server randomises it up to twice that).
    pub default_watch_timeout: Duration,
    /// How long a request for a future resourceVersion waits before "Too large resource version"
    /// (default 3 s, like the cacher).
    pub future_rv_wait: Duration,
    /// Seed of the random source of uids and `generateName` suffixes (`None`, the default: a random
    /// seed). One seed gives the same uids and names for the same sequence of creates.
    pub seed: Option<u64>,
    /// The resourceVersion counter's start (default 1, at least 1): two servers started far apart
    /// never hand out the same resourceVersion.
    pub resource_version_start: u64,
    /// Added to the wall clock the server stamps timestamps with (default zero).
    pub clock_offset: jiff::SignedDuration,
    /// How fast the server's wall clock runs per second of tokio time (default 1.0; a negative or
    /// non-finite rate stops it).
    pub clock_rate: f64,
    /// The server's wall clock at build, before the offset (default: the host's clock then).
    pub wall_clock_start: Option<std::time::SystemTime>,
    pub(crate) request_tap: Option<crate::tap::RequestTap>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            shard_selector: false,
            bookmark_interval: Duration::from_secs(60),
            history: 10_000,
            controllers: false,
            default_watch_timeout: Duration::from_secs(1800),
            future_rv_wait: Duration::from_secs(3),
            seed: None,
            resource_version_start: 1,
            clock_offset: jiff::SignedDuration::ZERO,
            clock_rate: 1.0,
            wall_clock_start: None,
            request_tap: None,
        }
    }
}

/// Builds a [`TestServer`].
#[derive(Debug, Default)]
#[must_use = "call build() to get a TestServer"]
pub struct Builder {
    config: Config,
}

impl Builder {
    /// The `ShardedListAndWatch` gate at start (switch it later with [`TestServer::set_shard_selector`]).
    pub fn shard_selector(mut self, on: bool) -> Self {
        self.config.shard_selector = on;
        self
    }

    /// Interval between watch bookmarks (default 60 s).
    pub fn bookmark_interval(mut self, every: Duration) -> Self {
        self.config.bookmark_interval = every;
        self
    }

    /// Changes kept in the history (default 10 000, at least 1).
    pub fn history(mut self, changes: usize) -> Self {
        self.config.history = changes.max(1);
        self
    }

    /// Run garbage collection (ownerReferences) and namespace finalisation.
    pub fn controllers(mut self, on: bool) -> Self {
        self.config.controllers = on;
        self
    }

    /// Watch duration when a watch has no `timeoutSeconds` (default 1800 s).
    pub fn default_watch_timeout(mut self, timeout: Duration) -> Self {
        self.config.default_watch_timeout = timeout;
        self
    }

    /// Draw uids and `generateName` suffixes from a random source seeded with `seed`: the same seed and
    /// the same sequence of creates give the same uids and names (uids decide shard placement). By
    /// default the seed is random.
    ///
    /// ```
    /// # use kube_shard_testserver::TestServer;
    /// let uid = |s: &TestServer| s.object("", "namespaces", None, "default").unwrap()["metadata"]["uid"].clone();
    /// let (a, b) = (TestServer::builder().seed(7).build(), TestServer::builder().seed(7).build());
    /// assert_eq!(uid(&a), uid(&b));
    /// ```
    pub fn seed(mut self, seed: u64) -> Self {
        self.config.seed = Some(seed);
        self
    }

    /// Start the resourceVersion counter at `rv` (default 1; 0 counts as 1). Give two servers counters
    /// far apart (one at 10^9) so that comparing resourceVersions across servers is caught, not passed
    /// by luck.
    pub fn resource_version_start(mut self, rv: u64) -> Self {
        self.config.resource_version_start = rv.max(1);
        self
    }

    /// Shift the server's wall clock (creationTimestamp, deletionTimestamp, condition times, Table
    /// ages) by `offset`, forward or back.
    pub fn clock_offset(mut self, offset: jiff::SignedDuration) -> Self {
        self.config.clock_offset = offset;
        self
    }

    /// Run the server's wall clock at `rate` seconds per second of tokio time (default 1.0): the wall
    /// clock is `wall time at build + offset + rate × tokio time elapsed since build`, so paused tokio
    /// time drives it and two servers can drift apart.
    pub fn clock_rate(mut self, rate: f64) -> Self {
        self.config.clock_rate = rate;
        self
    }

    /// Start the server's wall clock at `at` instead of the host's clock: with paused tokio time every
    /// `creationTimestamp`, `managedFields` time and Table age then repeats from one run to the next.
    pub fn wall_clock_start(mut self, at: std::time::SystemTime) -> Self {
        self.config.wall_clock_start = Some(at);
        self
    }

    /// Call `tap` with every request the server receives, in the order it receives them (identity,
    /// method, path and query, a digest of the body), and again with the status of its answer. It runs on
    /// the task handling the request: keep it short.
    pub fn request_tap(mut self, tap: impl Fn(&crate::Tapped) + Send + Sync + 'static) -> Self {
        self.config.request_tap = Some(crate::tap::RequestTap(Arc::new(tap)));
        self
    }

    /// Start the server (no socket; see [`TestServer::serve_http`]). Needs no runtime until used.
    pub fn build(self) -> TestServer {
        TestServer::from_config(self.config)
    }
}

fn loopback() -> std::net::SocketAddr {
    std::net::SocketAddr::from(([127, 0, 0, 1], 0))
}

/// State shared by every handle, service and watch.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) config: Config,
    store: Mutex<Store>,
    pub(crate) gate: AtomicBool,
    pub(crate) faults: FaultState,
    pub(crate) ledger: Ledger,
    pub(crate) auditor: Auditor,
    pub(crate) recorder: Recorder,
    /// Writes refused by admission.
    pub(crate) refusals: crate::refusals::RefusalLog,
    conns: AtomicU64,
    /// The current resourceVersion, for requests waiting for a future one.
    pub(crate) rv_tx: watch::Sender<u64>,
    pub(crate) address: Mutex<Option<String>>,
    pub(crate) entropy: Entropy,
    pub(crate) clock: WallClock,
}

impl Inner {
    pub(crate) fn lock_store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn next_conn(&self) -> u64 {
        self.conns.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn gate(&self) -> bool {
        self.gate.load(Ordering::Relaxed)
    }
}

/// An in-process Kubernetes API server. Cheap to clone (a handle).
///
/// See the [crate docs](crate) for what it serves and how it differs from kube-apiserver.
#[derive(Clone, Debug)]
pub struct TestServer {
    pub(crate) inner: Arc<Inner>,
}

impl Default for TestServer {
    fn default() -> Self {
        Self::builder().build()
    }
}

impl TestServer {
    /// A builder with the defaults of a bare kube-apiserver with the gate off.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// A server with the defaults.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    fn from_config(config: Config) -> Self {
        let store = Store::new(config.history, config.resource_version_start);
        let rv_start = store.rv;
        let inner = Arc::new(Inner {
            gate: AtomicBool::new(config.shard_selector),
            store: Mutex::new(store),
            faults: FaultState::default(),
            ledger: Ledger::default(),
            auditor: Auditor::default(),
            recorder: Recorder::default(),
            refusals: Default::default(),
            conns: AtomicU64::new(0),
            rv_tx: watch::channel(rv_start).0,
            address: Mutex::new(None),
            entropy: Entropy::new(config.seed),
            clock: WallClock::new(
                config.wall_clock_start,
                config.clock_offset,
                config.clock_rate,
            ),
            config,
        });
        crate::rest::bootstrap(&inner);
        TestServer { inner }
    }

    /// A `kube::Client` over the in-memory service, as `identity`: every request is attributed to it.
    /// Each call is a new "connection" (for [`GateSkew::PerConnection`](crate::GateSkew)). Needs a tokio
    /// runtime (kube's client spawns a buffer task); works under paused time.
    #[must_use]
    pub fn client(&self, identity: &str) -> kube::Client {
        kube::Client::new(self.service(identity), "default")
    }

    /// The in-memory `tower::Service` for `identity`, for a client stack of your own.
    #[must_use]
    pub fn service(&self, identity: &str) -> ApiService {
        ApiService::new(self.inner.clone(), identity)
    }

    /// The bearer token of `identity` over HTTP (any identity is accepted; there is no RBAC).
    #[must_use]
    pub fn token(identity: &str) -> String {
        format!("{}{identity}", crate::http::TOKEN_PREFIX)
    }

    /// Serve HTTPS on `127.0.0.1` at an ephemeral port, with a CA generated for this server (see
    /// [`HttpServer::kubeconfig_yaml`]). The server stops when the handle is dropped.
    pub async fn serve_http(&self) -> std::io::Result<HttpServer> {
        self.serve_http_on(loopback()).await
    }

    /// Serve HTTPS on `addr`.
    pub async fn serve_http_on(&self, addr: std::net::SocketAddr) -> std::io::Result<HttpServer> {
        self.serve_http_with(addr, Transport::Https).await
    }

    /// Serve plain HTTP on `127.0.0.1` at an ephemeral port (kubectl sends no token over plain HTTP:
    /// use [`TestServer::serve_http`] for it).
    pub async fn serve_plain_http(&self) -> std::io::Result<HttpServer> {
        self.serve_http_with(loopback(), Transport::PlainHttp).await
    }

    /// Serve on `addr` over `transport`.
    pub async fn serve_http_with(
        &self,
        addr: std::net::SocketAddr,
        transport: Transport,
    ) -> std::io::Result<HttpServer> {
        HttpServer::start(self.inner.clone(), addr, transport).await
    }

    /// A kubeconfig (YAML) for `url` with `identity`'s token and no CA (for a plain HTTP server;
    /// [`HttpServer::kubeconfig_yaml`] adds the CA of an HTTPS one).
    #[must_use]
    pub fn kubeconfig_yaml(url: &str, identity: &str) -> String {
        kubeconfig::render(url, identity, &Self::token(identity), None)
    }

    /// Write a kubeconfig for `url` with `identity`'s token and no CA.
    pub fn write_kubeconfig(
        path: impl AsRef<Path>,
        url: &str,
        identity: &str,
    ) -> std::io::Result<()> {
        std::fs::write(path, Self::kubeconfig_yaml(url, identity))
    }

    /// The fault switchboard.
    #[must_use]
    pub fn faults(&self) -> Faults {
        Faults {
            inner: self.inner.clone(),
        }
    }

    /// What `identity` asked for and was sent so far.
    #[must_use]
    pub fn accounting(&self, identity: &str) -> Accounting {
        self.inner.ledger.get(identity)
    }

    /// Every identity seen so far.
    #[must_use]
    pub fn identities(&self) -> Vec<String> {
        self.inner.ledger.identities()
    }

    /// Forget all accounting.
    pub fn reset_accounting(&self) {
        self.inner.ledger.reset();
    }

    /// A snapshot of the fence audit.
    #[must_use]
    pub fn fence_audit(&self) -> FenceAudit {
        self.inner.auditor.snapshot()
    }

    /// The number of lower-epoch fenced commits so far.
    #[must_use]
    pub fn fence_violations(&self) -> usize {
        self.inner.auditor.violation_count()
    }

    /// Forget the fence audit.
    pub fn reset_fence_audit(&self) {
        self.inner.auditor.reset();
    }

    /// The recorder of committed history: opt in per resource or object with [`History::record`],
    /// then read an object's every committed version with [`History::of`].
    #[must_use]
    pub fn history(&self) -> History {
        History {
            inner: self.inner.clone(),
        }
    }

    /// Every write a ValidatingAdmissionPolicy refused so far, in order: who, what, the fence it carried
    /// (header), the message, and the resourceVersion the store was at (to place it among the commits
    /// [`TestServer::history`] recorded).
    #[must_use]
    pub fn admission_refusals(&self) -> Vec<crate::AdmissionRefusal> {
        self.inner.refusals.all()
    }

    /// Switch the `ShardedListAndWatch` gate at run time (open watches keep the mode they started with).
    pub fn set_shard_selector(&self, on: bool) {
        self.inner.gate.store(on, Ordering::Relaxed);
    }

    /// The gate as configured (without skew faults).
    #[must_use]
    pub fn shard_selector(&self) -> bool {
        self.inner.gate()
    }

    /// The server's wall clock now: what it stamps `creationTimestamp`, `deletionTimestamp` and
    /// condition times with (see [`Builder::clock_offset`], [`Builder::clock_rate`]).
    #[must_use]
    pub fn wall_clock(&self) -> jiff::Timestamp {
        self.inner.clock.now()
    }

    /// The current resourceVersion.
    #[must_use]
    pub fn resource_version(&self) -> u64 {
        self.inner.lock_store().rv
    }

    /// One stored object as JSON, read without a client (nothing is accounted). `group` is `""` for
    /// the core group; `namespace` is `None` for cluster-scoped resources.
    #[must_use]
    pub fn object(
        &self,
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
    ) -> Option<serde_json::Value> {
        let key = crate::store::obj_key(namespace, name);
        self.inner
            .lock_store()
            .get(&format!("{group}/{plural}"), &key)
            .map(|o| o.value.clone())
    }

    /// Every stored object of a resource (all namespaces), in storage order, read without a client.
    #[must_use]
    pub fn objects(&self, group: &str, plural: &str) -> Vec<serde_json::Value> {
        self.inner
            .lock_store()
            .current(&format!("{group}/{plural}"), None)
            .iter()
            .map(|o| o.value.clone())
            .collect()
    }

    /// Watches currently open.
    #[must_use]
    pub fn open_watches(&self) -> usize {
        self.inner.lock_store().open_watches()
    }
}
