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
//! Over HTTP (for `kubectl`, other processes, or a `kube::Client` built from a kubeconfig), with the
//! same behaviour: [`TestServer::serve_http`] binds `127.0.0.1:0`; [`HttpServer::write_kubeconfig`]
//! writes an ordinary kubeconfig with a `token:` user (`kube-shard-testserver:<identity>`); the server
//! stops when the handle is dropped. `kshard testserver --listen ADDR --kubeconfig-out PATH
//! [--shard-selector on|off]` runs it standalone.
//!
//! ```
//! # use kube_shard_testserver::TestServer;
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = TestServer::new();
//! let http = server.serve_http().await?;
//! let client = http.client("kubectl").await?; // loaded from the kubeconfig it writes
//! let version = client.apiserver_version().await?;
//! assert_eq!(version.minor, "36");
//! # Ok(()) }
//! ```
//!
//! ## What it serves
//!
//! - core/v1 `namespaces` (with `/status` and `/finalize`), `configmaps`, `secrets`, `events`;
//!   `coordination.k8s.io/v1` `leases`; `apiextensions.k8s.io/v1` `customresourcedefinitions`. Creating a
//!   CRD serves its resource at once (namespaced or cluster-scoped, every served version, a `/status`
//!   subresource when declared) and sets its `NamesAccepted`/`Established` conditions.
//! - Discovery (`/api`, `/apis`, `/api/v1`, `/apis/GROUP[/VERSION]`), `/version`, `/healthz`.
//! - `default`, `kube-system`, `kube-public` and `kube-node-lease` exist from the start.
//!
//! ## Semantics (as kube-apiserver)
//!
//! - Objects: random UUID v4 `uid`; one global `resourceVersion` counter; `creationTimestamp`;
//!   `generation` on custom resources and CRDs, bumped on changes outside `metadata` (and `status` when
//!   the status subresource exists); create answers 201, 409 `AlreadyExists`, `generateName`; namespaced
//!   creates need the namespace (404) and refuse a terminating one (403); replace answers 409 on a stale
//!   `resourceVersion` or a different `uid`; a no-op update keeps the `resourceVersion`; merge and JSON
//!   patches (a `resourceVersion` in the patch is a precondition); delete with `uid`/`resourceVersion`
//!   preconditions; finalizers set `deletionTimestamp` and keep the object until the last is removed;
//!   `deletecollection`; a `/status` write changes only `.status`.
//! - Lists: `labelSelector` (equality and set-based), `fieldSelector` (`metadata.name`,
//!   `metadata.namespace`), `limit`/`continue` over a consistent snapshot (pages are read at the first
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
//! `kube-shard.io/fence` annotation in the request body — as `<shard>/<epoch>`, keeps the highest epoch
//! committed **per object uid**, and flags every later commit of that object with a lower epoch,
//! whatever shard its token names ([`FenceAudit::violations`], [`TestServer::fence_violations`]).
//! Epochs are generations of one assignment: they only grow, across shards and across a change of the
//! shard count, so a lower epoch committed later was written under an older assignment — by a second
//! owner (a member at `S = 16` writing `7/9` after one at `S = 32` wrote `3/10` is flagged). An equal
//! epoch is not flagged. A malformed token is an audit error, never a failed write. Writes refused (409,
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
//! Tests prove only what the server reproduces. What it does **not**:
//!
//! - **No authentication or authorization**: any token `kube-shard-testserver:<identity>` is accepted
//!   (a missing or other token is a 401); no RBAC, no admission (webhooks, quota, LimitRange,
//!   ValidatingAdmissionPolicy), no API priority and fairness (429s only when injected).
//! - **Server-side apply is approximated as a JSON merge patch**: no `managedFields` (never kept), no
//!   field ownership or conflicts, `force` ignored, fields dropped from an applied configuration are not
//!   removed. A strategic merge patch is also applied as a JSON merge patch (lists are replaced, not
//!   merged by key). An apply to a missing object creates it.
//! - **Validation is minimal**: object names, metadata JSON types, label syntax, configmap/secret data
//!   types, CRD names and storage versions. Everything else is stored as sent: no OpenAPI schema
//!   validation, pruning, defaulting or CEL rules for custom resources, no version conversion (all served
//!   versions of a CRD share one storage; only `apiVersion` is rewritten), no type checks of other
//!   built-in fields.
//! - Field selectors only on `metadata.name` and `metadata.namespace` (the real server has more per
//!   resource, such as `type` for secrets and `involvedObject.*` for events).
//! - One global history of changes (default 10 000, [`Builder::history`]) stands in for the per-resource
//!   watch caches and etcd's 5-minute compaction: a watch or continue token older than it gets a 410.
//!   `resourceVersion=0` lists honour `limit` (as a cacher serving snapshots does).
//! - Bookmarks come exactly every interval (and 2 s before a watch's timeout, as the cacher sends
//!   them), without the cacher's jitter; a watch without `timeoutSeconds` lasts 1800 s (the real server picks at random between
//!   `--min-request-timeout` and twice it). A frozen watch ignores its timeout until thawed.
//! - KEP-5866 selectors are parsed by kube-shard's strict parser: CEL forms the real server accepts but
//!   kube-shard never sends (comments, escape sequences, double, triple or raw quotes, parentheses) are
//!   answered with the invalid-selector 500 here. `remainingItemCount` on sharded pages counts the
//!   unfiltered remainder (as 1.36 gets it wrong). `shardInfo` is not put on `Table` answers.
//! - Deletion: no graceful deletion period (nothing here has one); `propagationPolicy` `Orphan` and
//!   `Foreground` add the `orphan`/`foregroundDeletion` finalizers as the real server does, and only the
//!   opt-in controllers mode ([`Builder::controllers`]) processes them. Deleting a built-in object
//!   answers a `Status`, a custom resource the object.
//! - Deleting a CRD removes its instances and stops serving it synchronously (the real finalizer
//!   controller takes a moment); CRD names are not checked for conflicts with other resources.
//! - Controllers mode runs garbage collection and namespace finalisation synchronously inside the write
//!   that triggers them; the real controllers are asynchronous and eventually consistent. In the default
//!   bare mode a deleted namespace stays `Terminating` until its `spec.finalizers` are cleared through
//!   `/finalize`, and owned objects are never collected.
//! - Discovery is served in the legacy format only (no aggregated discovery; clients fall back), and
//!   there is no OpenAPI (`/openapi/v2`, `/openapi/v3` are 404: `kubectl apply` needs
//!   `--validate=false`, `kubectl explain` does not work). JSON only (no protobuf or CBOR), HTTP/1.1
//!   without TLS or compression; `Table` has Name/(Data)/Age columns only and watches do not serve
//!   `Table`. No `/scale`, `/proxy`, `/log`, `/exec`, no `selfLink`, no events TTL.
//! - Timestamps have second precision and come from the wall clock (not tokio time). The
//!   resourceVersion counter starts low and grows by one per write (treat it as opaque, as always).
//! - Faults model failures as seen from a client: a partition answers nothing and freezes that
//!   identity's watches; an outage ends every watch and refuses every request until it is over.
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod accounting;
mod audit;
mod builtins;
mod controllers;
mod discovery;
mod faults;
mod history;
mod http;
mod kinds;
mod kubeconfig;
mod labels;
mod list;
mod openapi;
mod query;
mod render;
mod resources;
mod rest;
mod router;
mod scale;
mod server;
mod service;
mod status;
mod store;
mod tls;
mod watch;

pub use accounting::{Accounting, Verb};
pub use audit::{FenceAudit, FenceAuditError, FenceSource, FenceViolation, FencedCommit};
pub use faults::{FailRule, Faults, GateSkew, RequestMatch, Scope, Target};
pub use history::{Commit, CommitKind, History, ResourceFilter};
pub use http::{ClientError, HttpServer, Transport};
pub use server::{Builder, Config, TestServer};
pub use service::{ApiService, Refused, ResponseBody};
pub use tls::TlsError;
