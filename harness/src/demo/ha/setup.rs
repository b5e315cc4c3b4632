//! The two clusters: embedded API servers (in-process, resourceVersion counters far apart) or two real
//! clusters reached through the demo's own TCP proxies ([`super::proxy`]), the Widget CRD and namespace
//! on both, and per cluster its HA participants as tasks: the elector (`kube_shard_ha::spawn`) and a
//! tiny operator that admits through the [`HaHandle`] and reconciles Widget status.
//!
//! Identities: on testserver every participant has its own client identity (`a-ha`, `a-op`,
//! `b-mirror`, `writer`, ...). On a real cluster the one kubeconfig user impersonates the same names
//! (`Impersonate-User`, with the group `system:masters`), so the switchover's freeze, which matches on
//! the user name, exempts exactly the mirrors as on testserver. The kubeconfig user must be allowed to
//! impersonate users and groups (a cluster admin is).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_shard::rt::Clock;
use kube_shard_ha::{
    FailoverEpoch, HaClients, HaConfig, HaControl, HaHandle, HaMetrics, HaMode, Timings,
};
use kube_shard_testserver::TestServer;
use tracing::Instrument;

use super::measure::Recorder;
use super::proxy::Proxy;
use crate::demo::DemoError;
use kube_shard_example_operator::widget::{self, Widget};

/// The HA name (the Lease `widgets-ha`, the freeze `widgets-ha-freeze`, the checkpoint `widgets-ha-mirror`).
pub(crate) const HA_NAME: &str = "widgets";
/// Identities that write while a cluster is frozen: the mirrors, the demo's failback pairing, and (real
/// clusters) the demo's stand-in for the garbage collector ([`gc_stand_in`]).
pub(crate) const EXEMPT: [&str; 4] = ["a-mirror", "b-mirror", "demo-repair", "demo-gc"];

/// The demo's time-scaled HA timings: lease 4 s, renew deadline 2 s, retry 0.5 s, request timeout 1 s,
/// grace 0.5 s.
pub(crate) fn timings() -> Timings {
    Timings::new(
        Duration::from_secs(4),
        Duration::from_secs(2),
        Duration::from_millis(500),
        Duration::from_secs(1),
        Duration::from_millis(500),
    )
}

/// The HA configuration of cluster `id` (rank) in `ns`. The peer is reached by an in-process client;
/// the peer kubeconfig path is only a placeholder the configuration requires.
pub(crate) fn ha_config(
    id: &str,
    rank: u64,
    mode: HaMode,
    ns: &str,
) -> Result<HaConfig, DemoError> {
    HaConfig::builder(HA_NAME)
        .mode(mode)
        .cluster(id, rank)
        .namespace(ns)
        .kubeconfigs(None, Some("in-process-peer".into()), None)
        .timings(timings())
        .build()
        .map_err(|e| DemoError::failed(format!("HA configuration of {id}: {e}")))
}

/// Where a cluster's API is: an embedded server, or a real cluster behind the demo's proxies.
#[derive(Clone)]
pub(crate) enum Backend {
    Embedded(TestServer),
    Real(Arc<RealCluster>),
}

impl Backend {
    /// A client acting as `identity`.
    pub(crate) fn client(&self, identity: &str) -> Client {
        match self {
            Backend::Embedded(s) => s.client(identity),
            Backend::Real(r) => r.client(identity),
        }
    }
}

/// The group every impersonated participant gets on a real cluster.
const IMPERSONATED_GROUP: &str = "system:masters";

/// A real cluster (cluster `id` of the pair) behind two proxies: `main` carries its own site's
/// participants (its elector and operator, the writer, the demo's oracle), `from_peer` those of the
/// other site (`<peer>-*` identities: the peer's elector, mirror and commands). Cutting both and the
/// peer's `from_peer` partitions this cluster's whole site, as testserver's `partition` does.
pub(crate) struct RealCluster {
    peer_id: &'static str,
    main: Proxy,
    from_peer: Proxy,
    main_cfg: kube::Config,
    peer_cfg: kube::Config,
    clients: Mutex<HashMap<String, Client>>,
    fallback: Client,
}

impl RealCluster {
    /// Connect to the cluster of the kubeconfig at `path` through two new proxies.
    pub(crate) async fn connect(
        path: &Path,
        peer_id: &'static str,
    ) -> Result<Arc<Self>, DemoError> {
        let cfg = kube_shard_example_operator::run::config_from(Some(path)).await?;
        let uri = cfg.cluster_url.clone();
        let bad = |why: &str| {
            DemoError::failed(format!(
                "kubeconfig {}: server {uri}: {why}",
                path.display()
            ))
        };
        let scheme = uri.scheme_str().unwrap_or("https").to_owned();
        let host = uri.host().ok_or_else(|| bad("no host"))?.to_owned();
        let port = uri
            .port_u16()
            .unwrap_or(if scheme == "http" { 80 } else { 443 });
        let upstream = format!("{host}:{port}");
        let start = |what| {
            let upstream = upstream.clone();
            async move {
                Proxy::start(upstream)
                    .await
                    .map_err(|e| DemoError::failed(format!("starting the {what} proxy: {e}")))
            }
        };
        let main = start("cluster").await?;
        let from_peer = start("peer").await?;
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let at = |p: &Proxy| -> Result<kube::Config, DemoError> {
            let mut c = cfg.clone();
            let path = uri.path().trim_end_matches('/');
            c.cluster_url = format!("{scheme}://{}{path}", p.addr())
                .parse()
                .map_err(|e| bad(&format!("rewriting to the proxy: {e}")))?;
            // TLS passes through: the server's certificate is checked against its own name
            if c.tls_server_name.is_none() && bare != "127.0.0.1" {
                c.tls_server_name = Some(bare.clone());
            }
            Ok(c)
        };
        let main_cfg = at(&main)?;
        let peer_cfg = at(&from_peer)?;
        let fallback = impersonating(&main_cfg, "demo-admin")?;
        Ok(Arc::new(RealCluster {
            peer_id,
            main,
            from_peer,
            main_cfg,
            peer_cfg,
            clients: Mutex::default(),
            fallback,
        }))
    }

    fn client(&self, identity: &str) -> Client {
        let mut m = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = m.get(identity) {
            return c.clone();
        }
        let from_peer = identity
            .strip_prefix(self.peer_id)
            .is_some_and(|r| r.starts_with('-'));
        let cfg = if from_peer {
            &self.peer_cfg
        } else {
            &self.main_cfg
        };
        // the configuration built the fallback already: this cannot fail on bad input
        let c = impersonating(cfg, identity).unwrap_or_else(|e| {
            tracing::error!("a client for {identity}: {e}; using demo-admin");
            self.fallback.clone()
        });
        m.insert(identity.to_owned(), c.clone());
        c
    }

    /// Partition (`true`) or heal this cluster's proxies; `peer_too`: also the way this site reaches
    /// the peer (the peer's `from_peer` proxy).
    pub(crate) fn cut(&self, on: bool, peer: &RealCluster) {
        self.main.cut(on);
        self.from_peer.cut(on);
        peer.from_peer.cut(on);
    }

    pub(crate) fn stop(&self) {
        self.main.stop();
        self.from_peer.stop();
    }
}

fn impersonating(cfg: &kube::Config, identity: &str) -> Result<Client, DemoError> {
    let mut c = cfg.clone();
    c.auth_info.impersonate = Some(identity.to_owned());
    c.auth_info.impersonate_groups = Some(vec![IMPERSONATED_GROUP.to_owned()]);
    Client::try_from(c).map_err(|e| DemoError::failed(format!("a client as {identity}: {e}")))
}

/// Prepare a real cluster pair for a run in `ns`: refuse the same cluster twice, a cluster with HA
/// Leases of the demo's name (in any namespace) or with its freeze policy in place; then the Widget CRD
/// and the namespace on both.
pub(crate) async fn prepare_real(
    a: &Backend,
    b: &Backend,
    ns: &str,
    probe: &HaConfig,
) -> Result<(), DemoError> {
    let mut uids = Vec::new();
    for (id, c) in [
        ("a (--active-kubeconfig)", a),
        ("b (--standby-kubeconfig)", b),
    ] {
        let admin = c.client("demo-admin");
        let at = |what: &str| {
            let id = id.to_owned();
            let what = what.to_owned();
            move |e: kube::Error| DemoError::failed(format!("cluster {id}: {what}: {e}"))
        };
        let ks: Api<Namespace> = Api::all(admin.clone());
        let uid = ks
            .get("kube-system")
            .await
            .map_err(at("reading namespace kube-system (is the kubeconfig user allowed to impersonate users and groups?)"))?
            .metadata
            .uid
            .unwrap_or_default();
        uids.push(uid);
        let lease = format!("{HA_NAME}-ha");
        let leases: Api<Lease> = Api::all(admin.clone());
        let held = leases
            .list(&ListParams::default().fields(&format!("metadata.name={lease}")))
            .await
            .map_err(at("listing HA Leases"))?;
        // only a demo run's own namespaces: another HA setup named like the demo's in a namespace of its
        // own does not meet this run (a fresh namespace; the freeze, cluster-wide, is checked below)
        let demo_ns = |l: &&Lease| {
            l.metadata
                .namespace
                .as_deref()
                .is_some_and(|n| n == ns || n.starts_with(DEMO_NS_PREFIX))
        };
        if let Some(l) = held.items.iter().find(demo_ns) {
            return Err(DemoError::failed(format!(
                "cluster {id} already has the HA Lease {}/{lease} (another `kshard-dev demo ha` run, or one that did not clean up): refusing to run; delete it first",
                l.metadata.namespace.as_deref().unwrap_or_default()
            )));
        }
        let freeze = kube_shard_ha::switchover::freeze_name(probe);
        let vap: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy> =
            Api::all(admin.clone());
        if vap
            .get_opt(&freeze)
            .await
            .map_err(at("reading the freeze policy"))?
            .is_some()
        {
            return Err(DemoError::failed(format!(
                "cluster {id} has the freeze policy {freeze} in place (another run, or one that did not clean up): refusing to run; delete the ValidatingAdmissionPolicy and its binding first"
            )));
        }
    }
    if uids[0] == uids[1] {
        return Err(DemoError::failed(
            "--active-kubeconfig and --standby-kubeconfig reach the same cluster (kube-system has the same uid): the demo needs two clusters",
        ));
    }
    for (id, c) in [("a", a), ("b", b)] {
        let admin = c.client("demo-admin");
        widget::install_crd(admin.clone(), Duration::from_secs(30))
            .await
            .map_err(|e| {
                DemoError::failed(format!("cluster {id}: installing the Widget CRD: {e}"))
            })?;
        create_namespace(admin, ns)
            .await
            .map_err(|e| DemoError::failed(format!("cluster {id}: {e}")))?;
    }
    same_widget_crd(a, b).await
}

/// The mirror refuses a kind the two clusters define differently (its schema check). A cluster may
/// already have a Widget CRD of its own (another tool's, an earlier version): give `b` exactly `a`'s
/// definition, so the demo runs against what `a` serves.
async fn same_widget_crd(a: &Backend, b: &Backend) -> Result<(), DemoError> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api = |c: &Backend| -> Api<CustomResourceDefinition> { Api::all(c.client("demo-admin")) };
    let fail =
        |what: &str, e: kube::Error| DemoError::failed(format!("{what} the Widget CRD: {e}"));
    let name = widget::crd().metadata.name.unwrap_or_default();
    let on_a = api(a)
        .get(&name)
        .await
        .map_err(|e| fail("cluster a: reading", e))?;
    let mut on_b = api(b)
        .get(&name)
        .await
        .map_err(|e| fail("cluster b: reading", e))?;
    if on_b.spec == on_a.spec {
        return Ok(());
    }
    on_b.spec = on_a.spec;
    on_b.status = None;
    api(b)
        .replace(&name, &PostParams::default(), &on_b)
        .await
        .map_err(|e| fail("cluster b: making it a's", e))?;
    tokio::time::sleep(Duration::from_secs(2)).await; // the changed definition served
    Ok(())
}

/// Undo a real run as far as a bare apiserver lets it: lift the freeze, delete the demo's Leases (the HA
/// Leases, the mirror checkpoints) and its namespace. Without a namespace controller the namespace
/// stays Terminating with its Widgets; nothing of it blocks another run.
pub(crate) async fn cleanup_real(c: &Backend, ns: &str, cfg: &HaConfig) -> Vec<String> {
    let admin = c.client("demo-admin");
    let mut failed = Vec::new();
    if let Err(e) = kube_shard_ha::switchover::unfreeze(&admin, cfg).await {
        failed.push(format!("lifting the freeze: {e}"));
    } else if !freeze_lifted(c, ns).await {
        failed.push("the freeze still refused writes 10 s after it was deleted".into());
    }
    let leases: Api<Lease> = Api::namespaced(admin.clone(), ns);
    if let Err(e) = leases
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
    {
        failed.push(format!("deleting the Leases in {ns}: {e}"));
    }
    let nsapi: Api<Namespace> = Api::all(admin);
    match nsapi.delete(ns, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => failed.push(format!("deleting namespace {ns}: {e}")),
    }
    failed
}

/// kube-apiserver enforces a deleted ValidatingAdmissionPolicy until its admission plugin's informer
/// sees the delete: probe (a dry-run create in the freeze's scope by the writer's identity) until the
/// freeze no longer refuses, so that whatever runs next on the cluster is not refused by a policy already
/// gone. At most 10 s.
async fn freeze_lifted(c: &Backend, ns: &str) -> bool {
    let api: Api<Widget> = Api::namespaced(c.client("writer"), ns);
    let pp = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let mut probe = Widget::new(
        "kshard-demo-ha-freeze-probe",
        ns,
        kube_shard_example_operator::widget::WidgetSpec::default(),
    );
    probe.metadata.labels = Some(super::cluster_objects::labels());
    for _ in 0..50 {
        match api.create(&pp, &probe).await {
            // accepted, or refused by something other than the freeze: the freeze is gone
            Ok(_) => return true,
            Err(kube::Error::Api(s))
                if !s.message.contains(kube_shard_ha::switchover::FREEZE_MARK) =>
            {
                return true
            }
            // still refused by the freeze, or no answer (which says nothing either way): ask again
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    false
}

/// The garbage collector's part the demo needs, on a cluster without one (a bare apiserver): the
/// mirror deletes copies with `propagationPolicy: Orphan`, which leaves them Terminating with the
/// `orphan` finalizer until the collector has orphaned their dependents. Widgets have none, so this task
/// (identity `demo-gc`) removes the `orphan` finalizer of Terminating Widgets in `ns` whose only
/// finalizer it is, as the collector would. On a cluster with a collector both may try; the loser's
/// write fails its resourceVersion precondition and is ignored.
pub(crate) fn gc_stand_in(c: &Backend, ns: &str) -> tokio::task::JoinHandle<()> {
    let api: Api<Widget> = Api::namespaced(c.client("demo-gc"), ns);
    tokio::spawn(async move {
        loop {
            if let Ok(l) = api.list(&ListParams::default()).await {
                for w in l.items {
                    let m = &w.metadata;
                    let only_orphan = m
                        .finalizers
                        .as_ref()
                        .is_some_and(|f| f.iter().all(|f| f == "orphan") && !f.is_empty());
                    if m.deletion_timestamp.is_none() || !only_orphan {
                        continue;
                    }
                    let patch = serde_json::json!({"metadata": {
                        "finalizers": null,
                        "resourceVersion": m.resource_version,
                    }});
                    let name = m.name.clone().unwrap_or_default();
                    let _ = api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
}

/// The prefix of the namespaces runs on real clusters make.
pub(crate) const DEMO_NS_PREFIX: &str = "kshard-demo-ha-";

/// A fresh namespace name for a run on real clusters: `kshard-demo-ha-<8 hex>`.
pub(crate) fn fresh_namespace() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded at random per process
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{DEMO_NS_PREFIX}{:08x}", h.finish() as u32)
}

async fn create_namespace(admin: Client, ns: &str) -> Result<(), String> {
    let nsapi: Api<Namespace> = Api::all(admin);
    let n = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match nsapi.create(&PostParams::default(), &n).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(format!("creating namespace {ns}: {e}")),
    }
}

/// One cluster: its API and its running HA participants.
pub(crate) struct Cluster {
    pub(crate) id: &'static str,
    pub(crate) rank: u64,
    pub(crate) backend: Backend,
    pub(crate) handle: HaHandle,
    pub(crate) control: HaControl,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    pub(crate) fn client(&self, identity: &str) -> Client {
        self.backend.client(identity)
    }

    pub(crate) fn real(&self) -> Option<&RealCluster> {
        match &self.backend {
            Backend::Real(r) => Some(r),
            Backend::Embedded(_) => None,
        }
    }

    pub(crate) fn add_task(&mut self, t: tokio::task::JoinHandle<()>) {
        self.tasks.push(t);
    }

    pub(crate) fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A server with its resourceVersions starting at `rv_start`, the CRD and the namespace.
pub(crate) async fn server(rv_start: u64, ns: &str) -> Result<TestServer, DemoError> {
    let s = TestServer::builder()
        .resource_version_start(rv_start)
        // the garbage collector: the mirror deletes copies with `propagationPolicy: Orphan`
        .controllers(true)
        .build();
    let admin = s.client("demo-admin");
    widget::install_crd(admin.clone(), Duration::from_secs(30))
        .await
        .map_err(|e| DemoError::failed(format!("installing the Widget CRD: {e}")))?;
    create_namespace(admin, ns)
        .await
        .map_err(DemoError::failed)?;
    Ok(s)
}

/// Start cluster `id`'s elector (identity `<id>-ha`, reaching `peer` too) and its operator
/// (`<id>-op`).
pub(crate) fn start(
    (id, rank, mode): (&'static str, u64, HaMode),
    backend: Backend,
    peer: &Backend,
    ns: &str,
    clock: Clock,
    rec: &Recorder,
) -> Result<Cluster, DemoError> {
    let cfg = ha_config(id, rank, mode, ns)?;
    let who = format!("{id}-ha");
    let clients = HaClients::new(backend.client(&who), peer.client(&who), None);
    let (handle, control, task) = kube_shard_ha::spawn(&cfg, clients, clock, HaMetrics::default());
    let op = tokio::spawn(
        operator(
            id,
            handle.clone(),
            Api::namespaced(backend.client(&format!("{id}-op")), ns),
            rec.clone(),
        )
        .instrument(tracing::info_span!("demo_ha_operator", cluster = id)),
    );
    let mut tasks = vec![op];
    tasks.extend(task);
    Ok(Cluster {
        id,
        rank,
        backend,
        handle,
        control,
        tasks,
    })
}

/// The shared clock of both clusters' electors.
pub(crate) fn clock() -> Clock {
    Clock::system()
}

/// The example operator reduced to what HA needs: while the handle admits, each round (at most one
/// request timeout long, never past the term, each write admitted again) writes `status` of up to 50 Widgets whose generation it
/// has not observed, under the admitted epoch. A Standby waits for a change of the HA state.
async fn operator(cluster: &'static str, ha: HaHandle, api: Api<Widget>, rec: Recorder) {
    let budget = timings().request_timeout;
    loop {
        let Ok(epoch) = ha.admit() else {
            tokio::select! {
                () = ha.await_change() => {}
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
            continue;
        };
        let left = ha.term_remaining();
        if left < budget / 2 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let work = rec.admit(cluster, epoch.wire());
        let _ =
            tokio::time::timeout(left.min(budget), round(cluster, &ha, epoch, &api, &rec)).await;
        drop(work);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn round(
    cluster: &str,
    ha: &HaHandle,
    admitted: FailoverEpoch,
    api: &Api<Widget>,
    rec: &Recorder,
) {
    let epoch = admitted.wire();
    let Ok(list) = api.list(&ListParams::default()).await else {
        return;
    };
    let todo = list.items.into_iter().filter(|w| {
        let gen = w.metadata.generation;
        w.status.as_ref().and_then(|s| s.observed_generation) != gen
    });
    for w in todo.take(50) {
        // every request is admitted again: a step-down ends the round at once, not at the term's end
        if ha.active_epoch() != Some(admitted) {
            return;
        }
        let name = w.metadata.name.clone().unwrap_or_default();
        let patch = serde_json::json!({"status": {
            "observedGeneration": w.metadata.generation,
            "reconciledBy": format!("{cluster}-operator"),
            "epoch": epoch,
        }});
        if api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .is_ok()
        {
            rec.wrote(cluster, epoch);
        }
    }
}
