//! Three replicas of a controller share the ConfigMaps of an in-process API server: each reads only its
//! own shards (KEP-5866 `shardSelector`) and reconciles only what it owns.
//!
//! ```sh
//! cargo run --example sharded_watch
//! ```
//!
//! Ownership here is static (member i of 3, no membership): the simplest way to see the read path. A real
//! operator gets its `Ownership` from a shard group instead, and keeps the same watcher code.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::{controller::Action, watcher, Controller, WatchStreamExt};
use kube::Api;
use kube_shard::{Ownership, OwnershipConfig};
use kube_shard::{ShardCount, ShardKey, ShardedWatcher};
use kube_shard_testserver::TestServer;

const REPLICAS: u32 = 3;
const OBJECTS: usize = 300;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = TestServer::builder().shard_selector(true).build();
    let admin = server.client("admin");
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some("demo".into()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(admin, "demo");
    for i in 0..OBJECTS {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        cms.create(&PostParams::default(), &cm).await?;
    }

    let mut counters = Vec::new();
    for i in 0..REPLICAS {
        let config = OwnershipConfig::new(ShardCount::new(64)?, ShardKey::Uid);
        let ownership = Ownership::new_static(config, i, REPLICAS)?;
        let identity = format!("replica-{i}");
        let api: Api<ConfigMap> = Api::all(server.client(&identity));
        let sharded = ShardedWatcher::new(api, watcher::Config::default(), ownership.clone())
            .name(identity.clone())
            .build_reflector();
        let store = sharded.store.clone();
        let reconciled = Arc::new(AtomicUsize::new(0));
        counters.push((identity, reconciled.clone(), sharded.stats.clone()));
        let controller = Controller::for_stream(sharded.events.applied_objects(), store)
            .reconcile_on(sharded.reenqueue)
            .run(
                |cm: Arc<ConfigMap>, ctx: Arc<(Ownership, Arc<AtomicUsize>)>| async move {
                    // admission: only act on what this replica owns right now
                    let _permit = ctx.0.admit(cm.as_ref())?;
                    ctx.1.fetch_add(1, Ordering::Relaxed);
                    Ok::<_, kube_shard::ownership::AdmitError>(Action::await_change())
                },
                |_, _, _| Action::requeue(Duration::from_secs(1)),
                Arc::new((ownership, reconciled)),
            )
            .for_each(|_| async {});
        tokio::spawn(controller);
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut total = 0;
    for (identity, reconciled, stats) in &counters {
        let acct = server.accounting(identity);
        let n = reconciled.load(Ordering::Relaxed);
        total += n;
        println!(
            "{identity}: reconciled {n:>3} ConfigMaps, read {:>3} distinct objects, mode {}",
            acct.distinct_uids,
            stats.mode().as_str()
        );
    }
    println!("total reconciled: {total} of {OBJECTS}");
    Ok(())
}
