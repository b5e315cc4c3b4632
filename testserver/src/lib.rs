//! # kube-shard-testserver
//!
//! An in-process Kubernetes API server for tests: real `kube::Client`s and the stock
//! `kube_runtime::watcher`/`reflector` talk to it as to a **bare kube-apiserver** (no
//! controller-manager), with KEP-5866 `shardSelector` semantics, switchable faults, per-identity
//! accounting, an audit of fenced writes and an opt-in recorder of committed history. No cluster, no
//! container, no socket unless you ask for one.
//!
//! ## Use it in your tests
//!
//! ```toml
//! [dev-dependencies]
//! kube-shard-testserver = "0.1"
//! k8s-openapi = { version = "0.29", features = ["latest"] }   # your version feature
//! tokio = { version = "1", features = ["macros", "rt", "test-util"] }
//! ```
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, ListParams, PostParams};
//! use kube_shard_testserver::{FailRule, Scope, TestServer, Verb};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kube::Error> {
//! // In your tests: #[tokio::test(start_paused = true)] works too (no real time, no socket).
//! let server = TestServer::builder().shard_selector(true).build();
//! let api: Api<ConfigMap> = Api::namespaced(server.client("replica-0"), "default");
//!
//! let cm: ConfigMap = serde_json::from_value(serde_json::json!({"metadata": {"name": "a"}})).unwrap();
//! let created = api.create(&PostParams::default(), &cm).await?;
//! assert_eq!(created.metadata.uid.as_ref().map(String::len), Some(36));
//!
//! // Faults are switched at run time, for everyone or for one identity.
//! server.faults().fail_next(Scope::identity("replica-0"), FailRule::status(503));
//! assert!(api.list(&ListParams::default()).await.is_err());
//! assert_eq!(api.list(&ListParams::default()).await?.items.len(), 1);
//!
//! // Every request is attributed to an identity.
//! let acc = server.accounting("replica-0");
//! assert_eq!(acc.requests(Verb::List), 2);
//! assert_eq!(acc.errors, 1);
//! assert_eq!(server.fence_violations(), 0);
//! # Ok(()) }
//! ```
//!
//! Over HTTPS (for `kubectl`, other processes, or a `kube::Client` built from a kubeconfig), with the
//! same behaviour: [`TestServer::serve_http`] binds `127.0.0.1:0` with a CA generated for this server;
//! [`HttpServer::write_kubeconfig`] writes an ordinary kubeconfig with that CA as
//! `certificate-authority-data` and a `token:` user (`kube-shard-testserver:<identity>`);
//! [`HttpServer::client`] brings its own rustls connector (ring), so your crate needs no TLS feature of
//! `kube`. Plain HTTP is [`TestServer::serve_plain_http`] ([`Transport::PlainHttp`]; kubectl sends no
//! token over it). The server stops when the handle is dropped. `kshard-dev testserver --listen ADDR
//! --kubeconfig-out PATH [--shard-selector on|off] [--plain-http]` runs it standalone.
//!
//! ```
//! # use kube_shard_testserver::TestServer;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = TestServer::new();
//! let http = server.serve_http().await?;
//! assert!(http.url().starts_with("https://127.0.0.1:"));
//! let client = http.client("kubectl").await?; // TLS verified with the server's own CA
//! let version = client.apiserver_version().await?;
//! assert_eq!(version.minor, "36");
//! # Ok(()) }
//! ```
//!
//! ## What it serves
//!
//! - Every built-in resource of kube-apiserver v1.36.2 (68 in 21 groups), stored generically and
//!   discovered as the real server lists them; the table is generated from discovery captured from the
//!   real server (`testserver/kinds/`). `/status` where the real server has it, `/scale` on
//!   Deployments, ReplicaSets, StatefulSets and ReplicationControllers, `namespaces/{name}/finalize`.
//!   Defaults of Deployments, pod templates and Services, Service `clusterIP` allocation, Secret
//!   `stringData`, immutable Secrets and ConfigMaps, `generation` on the kinds that keep it, the field
//!   selectors of the real server (`involvedObject.*` on events, ...), review resources that allow
//!   everything.
//! - `apiextensions.k8s.io/v1` `customresourcedefinitions`: creating a CRD serves its resource at once
//!   (namespaced or cluster-scoped, every served version, a `/status` subresource when declared) and
//!   sets its `NamesAccepted`/`Established` conditions.
//! - `/openapi/v2` and `/openapi/v3` captured from the real server (`kubectl explain`, client-side
//!   apply); server-side apply with `managedFields`, conflicts and `force`, and strategic merge patch,
//!   both following the captured schema (merge keys, list types). Discovery (`/api`, `/apis`, `/api/v1`,
//!   `/apis/GROUP[/VERSION]`), a minimal OpenAPI v3 for custom resources (enough for
//!   kubectl's server-side field validation), `/version`, `/healthz`.
//! - `default`, `kube-system`, `kube-public`, `kube-node-lease` and the `kubernetes` Service exist from
//!   the start.
//!
//! ## Semantics (as kube-apiserver)
//!
//! - Objects: UUID v4 `uid` (random, or from [`Builder::seed`]); one global `resourceVersion` counter
//!   (from [`Builder::resource_version_start`]); `creationTimestamp` from the server's wall clock
//!   ([`Builder::clock_offset`], [`Builder::clock_rate`]);
//!   `generation` on custom resources, CRDs and the built-in kinds that keep it, bumped on changes
//!   outside `metadata` (and `status` when the status subresource exists); create answers 201, 409 `AlreadyExists`, `generateName`; namespaced
//!   creates need the namespace (404) and refuse a terminating one (403); replace answers 409 on a stale
//!   `resourceVersion` or a different `uid`; a no-op update keeps the `resourceVersion`; merge and JSON
//!   patches (a `resourceVersion` in the patch is a precondition); delete with `uid`/`resourceVersion`
//!   preconditions; finalizers set `deletionTimestamp` and keep the object until the last is removed;
//!   `deletecollection`; a `/status` write changes only `.status`.
//! - Lists: `labelSelector` (equality and set-based), `fieldSelector` (`metadata.name`,
//!   `metadata.namespace` and the real server's per-resource fields), `limit`/`continue` over a consistent snapshot (pages are read at the first
//!   page's resourceVersion even while writes go on), `resourceVersion` with `resourceVersionMatch`
//!   (`NotOlderThan`, `Exact`; a future one waits 3 s, then 504 "Too large resource version"),
//!   metadata-only (`Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`) and
//!   `Table` (kubectl) representations. Built-in list items carry no `kind`/`apiVersion`, CRD list items do.
//! - Watches: from a `resourceVersion` within the history (older → `200` then an in-stream `ERROR`
//!   with a `Status` of code 410, reason `Expired`, "too old resource version"), "get state and start"
//!   for an unset or `0` `resourceVersion`, `sendInitialEvents=true` ending with the bookmark annotated
//!   `k8s.io/initial-events-end: "true"`; a future `resourceVersion` waits 3 s, then ends in an
//!   in-stream `ERROR` 504 "Too large resource version" (as the cacher answers); bookmarks every
//!   [`Config::bookmark_interval`] (60 s by default, like the cacher: eager bookmarks would hide
//!   latency) and 2 s before the timeout; `timeoutSeconds`; label and field selectors (an update
//!   entering the selection is an `ADDED`, one leaving it a `DELETED`); metadata-only. Watch bodies are
//!   streams polled by the client: everything runs on tokio time.
//! - **KEP-5866** (`ShardedListAndWatch`, off by default, [`TestServer::set_shard_selector`] at run time):
//!   with the gate on, `shardSelector` is parsed with the server's rules (invalid → HTTP 500, empty
//!   `reason`, message `invalid shard selector: ...`; only the empty string means "no sharding"; the
//!   first value wins) and filters LIST, WATCH, watch-list and DELETECOLLECTION, AND-ed with the other
//!   selectors; `metadata.shardInfo.selector` (canonical form) is echoed on LISTs of built-in resources
//!   only — never on CRD lists, metadata-only lists or watch events. With the gate off the parameter is
//!   ignored entirely, even when invalid.
//!
//! ## Faults ([`TestServer::faults`], per identity or global, switchable while clients run)
//!
//! [`Faults::fail_next`] (403, 429 with `Retry-After`, 500, 503, 504, …), [`Faults::latency`], [`Faults::slow_answers`],
//! [`Faults::late_commit`] and [`Faults::drop_answer`] (handled on a detached task, never answered: a
//! write commits although the client timed out),
//! [`Faults::close_watches`], [`Faults::freeze_watches`] (connection open, nothing sent),
//! [`Faults::partition`] (no answer at all: the in-memory call fails with [`Refused`], HTTP closes the
//! connection; open watches freeze), [`Faults::outage`] (everyone, for a duration; every watch ends),
//! [`Faults::compact`] (forces 410s), [`Faults::lagging_lists`] (`resourceVersion=0` lists from a stale
//! snapshot), [`Faults::gate_skew`] (the gate flips per request or per connection, as in an HA control
//! plane mid-upgrade) and [`Faults::unfiltered_watch`] (per resource, LIST filtered but WATCH not:
//! kubernetes/kubernetes#140510).
//!
//! `fail_next`, `latency`, `close_watches` and `freeze_watches` take a [`Target`]: a [`Scope`] (every
//! identity or one) narrowed, if you like, to a verb, a resource, a namespace and one object
//! ([`RequestMatch`]; a [`FailRule`] narrows the same way). The namespace and name are those of the
//! request's path, or for a LIST or WATCH of a collection the equalities of its `fieldSelector`
//! (`metadata.name=NAME`, how `watch_object` reads one object):
//!
//! ```
//! use k8s_openapi::api::coordination::v1::Lease;
//! use kube::api::Api;
//! use kube_shard_testserver::{FailRule, Scope, TestServer, Verb};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kube::Error> {
//! let server = TestServer::new();
//! let leases: Api<Lease> = Api::namespaced(server.client("m0"), "default");
//! for name in ["old", "new"] {
//!     let l: Lease = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
//!     leases.create(&Default::default(), &l).await?;
//! }
//! // Forbidden to read one Lease, and only that one.
//! server.faults().fail_next(
//!     Scope::identity("m0"),
//!     FailRule::status(403)
//!         .times(u32::MAX)
//!         .verb(Verb::Get)
//!         .resource("leases")
//!         .namespace("default")
//!         .name("old"),
//! );
//! assert!(leases.get("old").await.is_err());
//! assert!(leases.get("new").await.is_ok());
//! // The Lease watches of m0 go quiet; its other watches and every request still work.
//! server.faults().freeze_watches(Scope::identity("m0").resource("leases"), true);
//! # Ok(()) }
//! ```
//!
//! ## Accounting and fence audit
//!
//! [`TestServer::accounting`] gives per identity the requests by [`Verb`], refusals, errors, list items
//! and watch events delivered, bookmarks, distinct object uids delivered and bytes written.
//! [`TestServer::fence_audit`] records every committed write that carries a fence — the
//! `x-kube-shard-fence` header ([`kube_shard::token::FENCE_HEADER`]) or, on main-resource writes, the
//! `kube-shard.io/fence` annotation in the request body — as `<failover-epoch>:<shard>/<epoch>` (or
//! `<failover-epoch>:mirror`; a legacy `<shard>/<epoch>` is failover epoch 0), keeps the highest token
//! committed **per object uid**, and flags every later commit of that object behind it, whatever shard its
//! token names ([`FenceAudit::violations`], [`TestServer::fence_violations`]): a lower failover epoch (a
//! deposed Active's write), or an equal one with a lower shard epoch. Shard epochs are generations of one
//! assignment: they only grow, across shards and across a change of the shard count, so a lower one
//! committed later was written under an older assignment — by a second owner (a member at `S = 16`
//! writing `0:7/9` after one at `S = 32` wrote `0:3/10` is flagged). An equal token is not flagged, nor is a
//! mirror token at the highest failover epoch. A malformed token is an audit error, never a failed write. Writes refused (409,
//! 404, …) are not commits.
//!
//! ## Committed history
//!
//! [`TestServer::history`] records, for the objects a test asks for ([`History::record`] with a
//! [`ResourceFilter`]: a resource, a namespace, a name, a uid), every committed version in commit order
//! ([`History::of`]): its resourceVersion, the object as committed, the verb, who wrote it, the fence it
//! carried and whether it was a create, an update or a delete ([`Commit`], [`CommitKind`]). It is
//! opt-in: nothing is kept for objects no filter covers. Refused writes and no-op updates are not
//! commits; a DELETE held by finalizers is an update, and the write that removes the last finalizer is
//! the delete. Use it to replay how an object got where it is, for example every owner change of an
//! assignment ConfigMap:
//!
//! ```
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kube::api::{Api, Patch, PatchParams, PostParams};
//! use kube_shard_testserver::{CommitKind, ResourceFilter, TestServer, Verb};
//! use serde_json::json;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kube::Error> {
//! let server = TestServer::new();
//! let assignment = ResourceFilter::resource("configmaps").namespace("default").name("shards");
//! server.history().record(assignment.clone());
//!
//! let api: Api<ConfigMap> = Api::namespaced(server.client("coordinator-a"), "default");
//! let cm = json!({"metadata": {"name": "shards"}, "data": {"0": "m0"}});
//! let cm: ConfigMap = serde_json::from_value(cm).unwrap();
//! api.create(&PostParams::default(), &cm).await?;
//! let moved = Patch::Merge(json!({"data": {"0": "m1"}}));
//! Api::<ConfigMap>::namespaced(server.client("coordinator-b"), "default")
//!     .patch("shards", &PatchParams::default(), &moved)
//!     .await?;
//!
//! let commits = server.history().of(&assignment);
//! let owners: Vec<(String, String)> = commits
//!     .iter()
//!     .map(|c| {
//!         let cm: ConfigMap = c.object_as().unwrap();
//!         (c.identity.clone(), cm.data.unwrap()["0"].clone())
//!     })
//!     .collect();
//! let want = [("coordinator-a", "m0"), ("coordinator-b", "m1")].map(|(a, b)| (a.into(), b.into()));
//! assert_eq!(owners, want);
//! assert_eq!((commits[1].verb, commits[1].change), (Verb::Patch, CommitKind::Updated));
//! assert!(commits[0].resource_version < commits[1].resource_version);
//! # Ok(()) }
//! ```
//!
//! ## Known differences from kube-apiserver
//!
//! Tests prove only what the server reproduces. The full list is in the crate's `README.md`
//! (`testserver/README.md` in the repository), checked with kubectl against the real server in CI. In
//! short:
//!
//! - **No authentication or authorization**: any token `kube-shard-testserver:<identity>` is accepted
//!   (a missing or other token is a 401); no RBAC, no admission, no API priority and fairness.
//! - **Server-side apply and strategic merge** cover what the differential test exercises (see the
//!   README for what is left out: YAML apply bodies, unions, pruning, the `.` marker of `Update` entries
//!   on struct fields).
//! - **Validation and defaulting are minimal**: no schemas for built-in kinds or custom resources
//!   (`fieldValidation` is accepted, not enforced), only the defaults listed above, no CRD version
//!   conversion.
//! - Request bodies are JSON only: kubectl's `create <kind> NAME` generators send protobuf and get a
//!   415 (`kubectl create -f` works). Tables have the real columns for a few kinds only (Name and Age
//!   for the others). No `/log`, `/exec`,
//!   `/proxy`, `/eviction`; no OpenAPI schemas for custom resources.
//! - One global history (default 10 000 changes, [`Builder::history`]) stands in for the watch caches
//!   and etcd compaction; bookmarks come exactly every [`Config::bookmark_interval`].
//! - KEP-5866 selectors are parsed by kube-shard's strict parser (CEL forms kube-shard never sends are
//!   an invalid-selector 500).
//! - The opt-in controllers mode ([`Builder::controllers`]) runs garbage collection and namespace
//!   finalisation synchronously; the default bare mode runs neither, like a bare kube-apiserver.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod accounting;
mod admission;
mod audit;
mod builtins;
mod columns;
mod controllers;
mod determinism;
mod discovery;
mod faults;
mod fieldset;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod history;
mod http;
mod kinds;
mod kubeconfig;
mod labels;
mod list;
mod openapi;
mod protobuf;
mod query;
mod refusals;
mod render;
mod resources;
mod rest;
mod router;
mod scale;
mod schema;
mod server;
mod service;
mod smp;
mod ssa;
mod status;
mod store;
mod tap;
mod tls;
mod watch;

pub use accounting::{Accounting, Verb};
pub use audit::{FenceAudit, FenceAuditError, FenceSource, FenceViolation, FencedCommit};
pub use faults::{FailRule, Faults, GateSkew, RequestMatch, Scope, Target};
pub use history::{Commit, CommitKind, History, ResourceFilter};
pub use http::{ClientError, HttpServer, Transport};
pub use refusals::AdmissionRefusal;
pub use server::{Builder, Config, TestServer};
pub use service::{ApiService, Refused, ResponseBody};
pub use tap::Tapped;
pub use tls::TlsError;

/// Build the process-wide tables (the captured OpenAPI schemas) now, on this thread. They are otherwise
/// built by the first request that needs them, on whatever thread serves it; a caller that must know
/// exactly what each of its threads does (the fault simulator's exact replay) calls this once first.
pub fn init_process_tables() {
    let _ = schema::Schemas::builtin();
    let _ = protobuf::table();
}

/// Parse, now and on this thread, every CEL expression the admission policies `policies`
/// (ValidatingAdmissionPolicy objects as JSON) would evaluate. The CEL parser keeps process-wide caches
/// (its ANTLR DFA): the first parse of an expression in a process creates std hash maps on the parsing
/// thread — moving that thread's hash keys on — and later parses of the same text create none. So a thread
/// that evaluates a policy first in its process hashes differently afterwards from one that evaluates it
/// second; a caller that must know exactly what each of its threads does (the fault simulator's exact
/// replay) parses the policies it will post once first, like [`init_process_tables`].
pub fn warm_admission(policies: &[serde_json::Value]) {
    admission::warm(policies);
}
