//! The two clusters: embedded API servers (in-process, resourceVersion counters far apart), the Widget
//! CRD and namespace on both, and per cluster its HA participants as tasks: the elector
//! (`kube_shard::ha::spawn`) and a tiny operator that admits through the [`HaHandle`] and reconciles
//! Widget status.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_shard::ha::handle::tokio_clock;
use kube_shard::ha::{
    Epoch, HaClients, HaConfig, HaControl, HaHandle, HaMetrics, HaMode, LocalClock, Timings,
};
use kube_shard_testserver::TestServer;
use tracing::Instrument;

use super::measure::Recorder;
use crate::cli::CliError;
use crate::operator::widget::{self, Widget};

/// The HA name (the Lease `widgets-ha`, the freeze `widgets-ha-freeze`, the checkpoint `widgets-ha-mirror`).
pub(crate) const HA_NAME: &str = "widgets";
/// Identities that write while a cluster is frozen: the mirrors and the demo's failback pairing.
pub(crate) const EXEMPT: [&str; 3] = ["a-mirror", "b-mirror", "demo-repair"];

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
pub(crate) fn ha_config(id: &str, rank: u64, mode: HaMode, ns: &str) -> Result<HaConfig, CliError> {
    HaConfig::builder(HA_NAME)
        .mode(mode)
        .cluster(id, rank)
        .namespace(ns)
        .kubeconfigs(None, Some("in-process-peer".into()), None)
        .timings(timings())
        .build()
        .map_err(|e| CliError::failed(format!("HA configuration of {id}: {e}")))
}

/// One cluster: its server and its running HA participants.
pub(crate) struct Cluster {
    pub(crate) id: &'static str,
    pub(crate) rank: u64,
    pub(crate) server: TestServer,
    pub(crate) handle: HaHandle,
    pub(crate) control: HaControl,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    pub(crate) fn client(&self, identity: &str) -> Client {
        self.server.client(identity)
    }

    pub(crate) fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// A server with its resourceVersions starting at `rv_start`, the CRD and the namespace.
pub(crate) async fn server(rv_start: u64, ns: &str) -> Result<TestServer, CliError> {
    let s = TestServer::builder()
        .resource_version_start(rv_start)
        // the garbage collector: the mirror deletes copies with `propagationPolicy: Orphan`
        .controllers(true)
        .build();
    let admin = s.client("demo-admin");
    widget::install_crd(admin.clone(), Duration::from_secs(30))
        .await
        .map_err(|e| CliError::failed(format!("installing the Widget CRD: {e}")))?;
    let nsapi: Api<Namespace> = Api::all(admin);
    let n = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    match nsapi.create(&PostParams::default(), &n).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(CliError::failed(format!("creating namespace {ns}: {e}"))),
    }
    Ok(s)
}

/// Start cluster `id`'s elector (identity `<id>-ha`, reaching `peer` too) and its operator
/// (`<id>-op`).
pub(crate) fn start(
    (id, rank, mode): (&'static str, u64, HaMode),
    server: TestServer,
    peer: &TestServer,
    ns: &str,
    clock: LocalClock,
    rec: &Recorder,
) -> Result<Cluster, CliError> {
    let cfg = ha_config(id, rank, mode, ns)?;
    let who = format!("{id}-ha");
    let clients = HaClients::new(server.client(&who), peer.client(&who), None);
    let (handle, control, task) = kube_shard::ha::spawn(&cfg, clients, clock, HaMetrics::default());
    let op = tokio::spawn(
        operator(
            id,
            handle.clone(),
            Api::namespaced(server.client(&format!("{id}-op")), ns),
            rec.clone(),
        )
        .instrument(tracing::info_span!("demo_ha_operator", cluster = id)),
    );
    let mut tasks = vec![op];
    tasks.extend(task);
    Ok(Cluster {
        id,
        rank,
        server,
        handle,
        control,
        tasks,
    })
}

/// The shared clock of both clusters' electors.
pub(crate) fn clock() -> LocalClock {
    tokio_clock()
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

async fn round(cluster: &str, ha: &HaHandle, admitted: Epoch, api: &Api<Widget>, rec: &Recorder) {
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
