//! Load: 100 000 configmaps with 50 concurrent watches, list and event throughput.
//! `cargo test --release -p kube-shard-testserver --test it load -- --ignored --nocapture`

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Instant,
};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Api, ListParams, PostParams},
    runtime::watcher::{self, watcher, Event},
};
use kube_shard_testserver::TestServer;

use crate::common::cm;

const OBJECTS: usize = 100_000;
const WATCHES: usize = 50;
const WRITERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "load test: run in release mode with --ignored --nocapture"]
async fn load_100k_configmaps_50_watches() {
    let objects: usize = std::env::var("TESTSERVER_LOAD_OBJECTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(OBJECTS);
    let server = TestServer::new();
    let seen = Arc::new(AtomicU64::new(0));
    let mut watchers = Vec::new();
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(WATCHES);
    for i in 0..WATCHES {
        let api: Api<ConfigMap> = Api::all(server.client(&format!("watch-{}", i % 5)));
        let seen = seen.clone();
        let ready = ready_tx.clone();
        watchers.push(tokio::spawn(async move {
            let mut s = watcher(api, watcher::Config::default()).boxed();
            let mut n = 0;
            while let Some(ev) = s.next().await {
                match ev.unwrap() {
                    Event::InitDone => ready.send(()).await.unwrap(),
                    Event::Apply(_) => {
                        n += 1;
                        seen.fetch_add(1, Ordering::Relaxed);
                        if n == objects {
                            return;
                        }
                    }
                    _ => {}
                }
            }
        }));
    }
    for _ in 0..WATCHES {
        ready_rx.recv().await.unwrap();
    }

    let t0 = Instant::now();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let api: Api<ConfigMap> = Api::namespaced(server.client("loader"), "default");
        writers.push(tokio::spawn(async move {
            for i in (w..objects).step_by(WRITERS) {
                api.create(&PostParams::default(), &cm(&format!("cm-{i:06}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let created = t0.elapsed();
    for w in watchers {
        w.await.unwrap();
    }
    let delivered = t0.elapsed();
    let events = seen.load(Ordering::Relaxed);
    assert_eq!(events, (objects * WATCHES) as u64);

    let api: Api<ConfigMap> = Api::all(server.client("lister"));
    let t1 = Instant::now();
    let all = api.list(&ListParams::default()).await.unwrap();
    let full = t1.elapsed();
    assert_eq!(all.items.len(), objects);
    let t2 = Instant::now();
    let mut paged = 0;
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await.unwrap();
        paged += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => break,
        }
    }
    let pages = t2.elapsed();
    assert_eq!(paged, objects);
    let per_sec = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64();
    println!("testserver load: {objects} configmaps, {WATCHES} concurrent stock watchers, {WRITERS} writers");
    println!(
        "  create: {:.2?} ({:.0} creates/s, every commit fanned out to {WATCHES} watches)",
        created,
        per_sec(objects, created)
    );
    println!(
        "  events: {events} delivered and decoded in {:.2?} ({:.0} events/s)",
        delivered,
        per_sec(events as usize, delivered)
    );
    println!(
        "  list (one page): {:.2?} ({:.0} items/s)",
        full,
        per_sec(objects, full)
    );
    println!(
        "  list (pages of 500): {:.2?} ({:.0} items/s)",
        pages,
        per_sec(objects, pages)
    );
}
