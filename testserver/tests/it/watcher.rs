//! The stock `kube_runtime::watcher` and `reflector` against the in-memory service, in paused time.

use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Api, DeleteParams, Patch, PatchParams, PostParams},
    runtime::{
        reflector,
        watcher::{self, Event},
        WatchStreamExt,
    },
};
use kube_shard_testserver::{Scope, TestServer, Verb};
use serde_json::json;

use crate::common::{cm, create_cms};

type Ev = Event<ConfigMap>;

async fn next<S: Stream<Item = watcher::Result<Ev>> + Unpin>(s: &mut S) -> Ev {
    tokio::time::timeout(Duration::from_secs(600), s.next())
        .await
        .expect("an event within 600 s (paused time)")
        .expect("stream never ends")
        .expect("no watcher error")
}

/// Read events up to and including `InitDone`, returning the names applied in between.
async fn initial<S: Stream<Item = watcher::Result<Ev>> + Unpin>(s: &mut S) -> Vec<String> {
    assert!(matches!(next(s).await, Event::Init));
    let mut names = Vec::new();
    loop {
        match next(s).await {
            Event::InitApply(o) => names.push(o.metadata.name.unwrap()),
            Event::InitDone => return names,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Let the watcher start its watch (it does so only when polled after `InitDone`).
async fn settle<S: Stream<Item = watcher::Result<Ev>> + Unpin>(s: &mut S) {
    assert!(tokio::time::timeout(Duration::from_secs(1), s.next())
        .await
        .is_err());
}

fn name_of(e: &Ev) -> (&'static str, String) {
    match e {
        Event::Apply(o) => ("apply", o.metadata.name.clone().unwrap()),
        Event::Delete(o) => ("delete", o.metadata.name.clone().unwrap()),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn paged_initial_list_then_live_events() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("setup"), "default");
    create_cms(&api, "cm", 25).await;
    let watched: Api<ConfigMap> = Api::namespaced(server.client("w"), "default");
    let mut s = watcher(watched, watcher::Config::default().page_size(10)).boxed();
    let names = initial(&mut s).await;
    assert_eq!(names.len(), 25);
    assert_eq!(
        server.accounting("w").requests(Verb::List),
        3,
        "25 items in pages of 10"
    );

    api.create(&PostParams::default(), &cm("new"))
        .await
        .unwrap();
    assert_eq!(name_of(&next(&mut s).await), ("apply", "new".into()));
    api.patch(
        "new",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"a": "b"}})),
    )
    .await
    .unwrap();
    assert_eq!(name_of(&next(&mut s).await), ("apply", "new".into()));
    api.delete("new", &DeleteParams::default()).await.unwrap();
    assert_eq!(name_of(&next(&mut s).await), ("delete", "new".into()));
    let acc = server.accounting("w");
    assert_eq!(acc.list_items, 25);
    assert_eq!(acc.watch_events, 3);
    assert_eq!(acc.distinct_uids, 26);
}

use kube::runtime::watcher::watcher;

#[tokio::test(start_paused = true)]
async fn bookmarks_every_minute_and_watch_timeouts_rewatch() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("w"), "default");
    let mut s = watcher(api.clone(), watcher::Config::default().timeout(290)).boxed();
    initial(&mut s).await;
    // Nothing happens for 10 minutes: bookmarks every 60 s, the 290 s watch timeout ends the watch
    // twice and the watcher re-watches from its resourceVersion without relisting.
    let pending = tokio::time::timeout(Duration::from_secs(600), s.next()).await;
    assert!(pending.is_err(), "bookmarks and re-watches are silent");
    let acc = server.accounting("w");
    assert_eq!(acc.requests(Verb::List), 1);
    assert_eq!(acc.requests(Verb::Watch), 3, "{acc:?}");
    // 60, 120, 180, 240 and 288 s (2 s before the timeout) in each of the two 290 s watches; the
    // third starts at 580 s.
    assert_eq!(acc.bookmarks, 10, "{acc:?}");
}

#[tokio::test(start_paused = true)]
async fn custom_bookmark_interval() {
    let server = TestServer::builder()
        .bookmark_interval(Duration::from_secs(5))
        .build();
    let api: Api<ConfigMap> = Api::namespaced(server.client("w"), "default");
    let mut s = watcher(api, watcher::Config::default()).boxed();
    initial(&mut s).await;
    let _ = tokio::time::timeout(Duration::from_secs(21), s.next()).await;
    assert_eq!(server.accounting("w").bookmarks, 4);
}

#[tokio::test(start_paused = true)]
async fn closed_watches_resume_from_their_resource_version() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("setup"), "default");
    create_cms(&api, "cm", 3).await;
    let watched: Api<ConfigMap> = Api::namespaced(server.client("w"), "default");
    let mut s = watcher(watched, watcher::Config::default())
        .default_backoff()
        .boxed();
    assert_eq!(initial(&mut s).await.len(), 3);
    settle(&mut s).await;
    server.faults().close_watches(Scope::identity("w"));
    api.create(&PostParams::default(), &cm("during"))
        .await
        .unwrap();
    // The watcher re-watches from its RV: the change made while it was closed arrives, no relist.
    assert_eq!(name_of(&next(&mut s).await), ("apply", "during".into()));
    let acc = server.accounting("w");
    assert_eq!(acc.requests(Verb::List), 1);
    assert_eq!(acc.requests(Verb::Watch), 2);
}

#[tokio::test(start_paused = true)]
async fn compaction_forces_a_relist() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("setup"), "default");
    create_cms(&api, "cm", 3).await;
    let watched: Api<ConfigMap> = Api::namespaced(server.client("w"), "default");
    let mut s = watcher(watched, watcher::Config::default())
        .default_backoff()
        .boxed();
    assert_eq!(initial(&mut s).await.len(), 3);
    settle(&mut s).await;
    server.faults().freeze_watches(Scope::identity("w"), true);
    api.create(&PostParams::default(), &cm("after"))
        .await
        .unwrap();
    server.faults().compact();
    server.faults().close_watches(Scope::identity("w"));
    server.faults().freeze_watches(Scope::identity("w"), false);
    // The re-watch from the old RV gets an in-stream 410 → the watcher relists.
    let mut saw_410 = false;
    loop {
        match tokio::time::timeout(Duration::from_secs(600), s.next())
            .await
            .unwrap()
            .unwrap()
        {
            Err(watcher::Error::WatchError(status)) => {
                assert_eq!(status.code, 410);
                assert_eq!(status.reason, "Expired");
                saw_410 = true;
            }
            Err(e) => panic!("unexpected {e}"),
            Ok(Event::Init) => break,
            Ok(other) => panic!("unexpected {other:?}"),
        }
    }
    assert!(saw_410);
    let mut names = Vec::new();
    loop {
        match next(&mut s).await {
            Event::InitApply(o) => names.push(o.metadata.name.unwrap()),
            Event::InitDone => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(names.len(), 4);
    assert_eq!(server.accounting("w").requests(Verb::List), 2);
}

#[tokio::test(start_paused = true)]
async fn history_overflow_is_a_410_too() {
    let server = TestServer::builder().history(5).build();
    let api: Api<ConfigMap> = Api::namespaced(server.client("setup"), "default");
    let watched: Api<ConfigMap> = Api::namespaced(server.client("w"), "default");
    let mut s = watcher(watched, watcher::Config::default())
        .default_backoff()
        .boxed();
    initial(&mut s).await;
    settle(&mut s).await;
    server.faults().partition(Scope::identity("w"), true);
    create_cms(&api, "burst", 10).await;
    server.faults().close_watches(Scope::identity("w"));
    server.faults().partition(Scope::identity("w"), false);
    let mut relisted = false;
    for _ in 0..40 {
        match tokio::time::timeout(Duration::from_secs(600), s.next())
            .await
            .unwrap()
            .unwrap()
        {
            Ok(Event::InitDone) => {
                relisted = true;
                break;
            }
            _ => continue,
        }
    }
    assert!(relisted);
}

#[tokio::test(start_paused = true)]
async fn streaming_list_initial_events() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("setup"), "default");
    create_cms(&api, "cm", 7).await;
    let watched: Api<ConfigMap> = Api::namespaced(server.client("w"), "default");
    let mut s = watcher(watched, watcher::Config::default().streaming_lists()).boxed();
    assert_eq!(initial(&mut s).await.len(), 7);
    let acc = server.accounting("w");
    assert_eq!(acc.requests(Verb::List), 0);
    assert_eq!(acc.requests(Verb::Watch), 1);
    assert_eq!(acc.bookmarks, 1, "the initial-events-end bookmark");
    api.create(&PostParams::default(), &cm("live"))
        .await
        .unwrap();
    assert_eq!(name_of(&next(&mut s).await), ("apply", "live".into()));
}

#[tokio::test(start_paused = true)]
async fn reflector_follows_the_server() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("setup"), "default");
    create_cms(&api, "cm", 12).await;
    let (reader, writer) = reflector::store();
    let watched: Api<ConfigMap> = Api::namespaced(server.client("r"), "default");
    let stream = reflector::reflector(
        writer,
        watcher(watched, watcher::Config::default().page_size(5)),
    )
    .default_backoff()
    .applied_objects();
    let task = tokio::spawn(stream.for_each(|_| async {}));
    reader.wait_until_ready().await.unwrap();
    assert_eq!(reader.state().len(), 12);
    api.delete("cm-0", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("x")).await.unwrap();
    server.faults().close_watches(Scope::All);
    api.create(&PostParams::default(), &cm("y")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut names: Vec<String> = reader
        .state()
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 13);
    assert!(names.contains(&"x".to_string()) && names.contains(&"y".to_string()));
    assert!(!names.contains(&"cm-0".to_string()));
    task.abort();
}

#[tokio::test(start_paused = true)]
async fn label_selected_watch_sees_objects_enter_and_leave() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("setup"), "default");
    api.create(&PostParams::default(), &cm("a")).await.unwrap();
    let watched: Api<ConfigMap> = Api::namespaced(server.client("w"), "default");
    let mut s = watcher(watched, watcher::Config::default().labels("app=x")).boxed();
    assert!(initial(&mut s).await.is_empty());
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "x"}}})),
    )
    .await
    .unwrap();
    assert_eq!(name_of(&next(&mut s).await), ("apply", "a".into()));
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "y"}}})),
    )
    .await
    .unwrap();
    assert_eq!(name_of(&next(&mut s).await), ("delete", "a".into()));
}

#[tokio::test(start_paused = true)]
async fn metadata_lists_gets_and_watches() {
    use kube::core::PartialObjectMeta;
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("m"), "default");
    create_cms(&api, "cm", 3).await;
    let list = api
        .list_metadata(&kube::api::ListParams::default())
        .await
        .unwrap();
    assert_eq!(list.items.len(), 3);
    assert!(list.items.iter().all(|i| i.metadata.uid.is_some()));
    let one = api.get_metadata("cm-0").await.unwrap();
    assert_eq!(one.types.unwrap().kind, "PartialObjectMetadata");
    let meta: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(server.client("m"), "default");
    let mut s = watcher(meta, watcher::Config::default()).boxed();
    let mut n = 0;
    loop {
        match s.next().await.unwrap().unwrap() {
            Event::Init => {}
            Event::InitApply(_) => n += 1,
            Event::InitDone => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(n, 3);
    api.create(&PostParams::default(), &cm("live"))
        .await
        .unwrap();
    match s.next().await.unwrap().unwrap() {
        Event::Apply(o) => assert_eq!(o.metadata.name.as_deref(), Some("live")),
        other => panic!("{other:?}"),
    }
}
