//! The replica **process** of the `read` scenario's memory table (`kshard-bench-replica`, a thin binary
//! in the `kshard` package): one group member with one sharded read stream, or one stock unsharded
//! `kube_runtime` reflector, talking to the bench's embedded API server over plain HTTP. It prints one
//! [`Status`] line (JSON) on stdout every 250 ms until it is killed.
//!
//! The binary brings the allocator counter (the `live_bytes` of [`serve`]): the engine only reports it.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use kube::api::DynamicObject;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};

use crate::failover::Timings;
use crate::members::{start_on, Clients};
use crate::recovery::cluster::item_resource;
use crate::BenchError;

/// What the replica runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ReplicaMode {
    /// A kube-shard group member (server mode when the server has the gate on).
    Member {
        /// Its member name (and client identity).
        name: String,
        /// The group's name.
        group: String,
        /// `expected_replicas`.
        replicas: u32,
    },
    /// One stock `kube_runtime::watcher` reflector reading every object.
    Unsharded,
}

/// How to run one replica process (passed to the binary as one JSON argument).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ReplicaSpec {
    /// Kubeconfig of the group's client (Leases, the assignment).
    pub group_kubeconfig: PathBuf,
    /// Kubeconfig of the read stream's client.
    pub read_kubeconfig: PathBuf,
    /// Namespace of the `Item`s it reads (an empty one for the zero-object baseline).
    pub namespace: String,
    /// Member or unsharded.
    pub mode: ReplicaMode,
    /// Group timings.
    pub timings: Timings,
}

/// One status line of a replica process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Status {
    /// Objects in its store.
    pub held: u64,
    /// Its read stream has completed its initial list.
    pub initialized: bool,
    /// Shards it owns (members; 0 for the unsharded one).
    pub owned_shards: u32,
    /// Moves in flight in its view (members).
    pub moving: u32,
    /// The allocator's live bytes.
    pub live_bytes: u64,
    /// Objects in the member's index whose copy is still held there, not only in the store (reflector
    /// mode hands copies over to the store: 0 once it applied them).
    pub index_copies: u64,
}

async fn client(path: &PathBuf) -> Result<Client, BenchError> {
    let kc = Kubeconfig::read_from(path)
        .map_err(|e| BenchError::Cluster(format!("replica: kubeconfig {}: {e}", path.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| BenchError::Cluster(format!("replica: kubeconfig: {e}")))?;
    Client::try_from(config).map_err(|e| BenchError::Cluster(format!("replica: client: {e}")))
}

/// A stock reflector over every object of `api`, its events drained.
fn unsharded(api: Api<DynamicObject>) -> Store<DynamicObject> {
    let writer = reflector::store::Writer::new(item_resource());
    let reader = writer.as_reader();
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects();
    tokio::spawn(stream.for_each(|_| async {}));
    reader
}

/// Run one replica until the process is killed (or `out` is closed), printing a [`Status`] line every
/// 250 ms on `out`; `live_bytes` is the allocator's count of live bytes (0 if the binary does not count).
pub async fn serve(
    config: ReplicaSpec,
    live_bytes: fn() -> u64,
    mut out: impl Write,
) -> Result<(), BenchError> {
    let read = Api::namespaced_with(
        client(&config.read_kubeconfig).await?,
        &config.namespace,
        &item_resource(),
    );
    let t = config.timings;
    let mut status: Box<dyn FnMut() -> Status> = match &config.mode {
        ReplicaMode::Member {
            name,
            group,
            replicas,
        } => {
            let on = Clients {
                group: client(&config.group_kubeconfig).await?,
                group_name: group,
                read,
                reader: format!("{name}-read"),
            };
            let m = start_on(on, name, *replicas as usize, t, t.lease * 3)?;
            Box::new(move || {
                let st = m.group.status();
                Status {
                    held: m.store.state().len() as u64,
                    initialized: m.stats.initialized(),
                    owned_shards: st.owned.len() as u32,
                    moving: st.moves_in_flight as u32,
                    live_bytes: 0,
                    index_copies: m.stats.indexed().saturating_sub(m.stats.handed_over()),
                }
            })
        }
        ReplicaMode::Unsharded => {
            let store = unsharded(read);
            let mut synced = false;
            Box::new(move || {
                synced = synced || store.wait_until_ready().now_or_never().is_some();
                Status {
                    held: store.state().len() as u64,
                    initialized: synced,
                    ..Status::default()
                }
            })
        }
    };
    loop {
        let mut st = status();
        st.live_bytes = live_bytes();
        let line = serde_json::to_string(&st)
            .map_err(|e| BenchError::Cluster(format!("replica: status: {e}")))?;
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            // the parent went away
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
