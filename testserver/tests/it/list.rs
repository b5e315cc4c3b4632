//! List semantics: consistent pages, resourceVersion matching, expiry.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube_shard_testserver::TestServer;

use crate::common::{cm, code, create_cms, get_json, item_names};

const CMS: &str = "/api/v1/namespaces/default/configmaps";

#[tokio::test]
async fn pages_are_a_consistent_snapshot() {
    let server = TestServer::new();
    let client = server.client("a");
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    create_cms(&api, "cm", 10).await;
    let p1 = api.list(&ListParams::default().limit(4)).await.unwrap();
    assert_eq!(p1.items.len(), 4);
    assert_eq!(p1.metadata.remaining_item_count, Some(6));
    let rv = p1.metadata.resource_version.clone().unwrap();
    // Writes between pages do not show.
    api.create(&PostParams::default(), &cm("cm-99"))
        .await
        .unwrap();
    api.delete("cm-9", &DeleteParams::default()).await.unwrap();
    let mut names: Vec<String> = p1
        .items
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    let mut token = p1.metadata.continue_.clone();
    while let Some(t) = token.filter(|t| !t.is_empty()) {
        let page = api
            .list(&ListParams::default().limit(4).continue_token(&t))
            .await
            .unwrap();
        assert_eq!(page.metadata.resource_version.as_deref(), Some(rv.as_str()));
        names.extend(page.items.iter().map(|c| c.metadata.name.clone().unwrap()));
        token = page.metadata.continue_;
    }
    assert_eq!(names.len(), 10);
    assert!(names.contains(&"cm-9".to_string()) && !names.contains(&"cm-99".to_string()));

    // Exact reads at an old resourceVersion, and 410 once compacted.
    let exact = get_json(
        &client,
        &format!("{CMS}?resourceVersion={rv}&resourceVersionMatch=Exact"),
    )
    .await
    .unwrap();
    assert_eq!(item_names(&exact).len(), 10);
    let p1 = api.list(&ListParams::default().limit(4)).await.unwrap();
    api.create(&PostParams::default(), &cm("later"))
        .await
        .unwrap();
    server.faults().compact();
    let t = p1.metadata.continue_.unwrap();
    let err = api
        .list(&ListParams::default().limit(4).continue_token(&t))
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(410));
    let err = get_json(
        &client,
        &format!("{CMS}?resourceVersion={rv}&resourceVersionMatch=Exact"),
    )
    .await
    .unwrap_err();
    assert_eq!(code(&err), Some(410));
}

#[tokio::test(start_paused = true)]
async fn future_resource_versions_wait_then_504() {
    let server = TestServer::new();
    let client = server.client("a");
    let future = server.resource_version() + 5;
    let err = get_json(&client, &format!("{CMS}?resourceVersion={future}"))
        .await
        .unwrap_err();
    let kube::Error::Api(s) = err else { panic!() };
    assert_eq!((s.code, s.reason.as_str()), (504, "Timeout"));
    assert!(s.message.starts_with("Too large resource version"));
    // A write that reaches it in time satisfies the wait.
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let next = server.resource_version() + 1;
    let waiter = tokio::spawn({
        let client = client.clone();
        async move { get_json(&client, &format!("{CMS}?resourceVersion={next}")).await }
    });
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    api.create(&PostParams::default(), &cm("x")).await.unwrap();
    assert_eq!(item_names(&waiter.await.unwrap().unwrap()), ["x"]);
}

#[tokio::test]
async fn watch_parameter_validation() {
    let server = TestServer::new();
    let client = server.client("a");
    for q in [
        "watch=true&sendInitialEvents=true",
        "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
        "watch=true&resourceVersionMatch=NotOlderThan",
    ] {
        let err = get_json(&client, &format!("{CMS}?{q}")).await.unwrap_err();
        assert_eq!(code(&err), Some(422), "{q}");
    }
}

#[tokio::test(start_paused = true)]
async fn watch_from_a_future_resource_version_is_an_in_stream_error() {
    use futures::StreamExt;
    let server = TestServer::new();
    let client = server.client("a");
    let future = server.resource_version() + 5;
    let req = http::Request::get(format!("{CMS}?watch=true&resourceVersion={future}"))
        .body(Vec::new())
        .unwrap();
    let mut events = client
        .request_events::<ConfigMap>(req)
        .await
        .unwrap()
        .boxed();
    match events.next().await.unwrap().unwrap() {
        kube::api::WatchEvent::Error(e) => assert_eq!(e.code, 504),
        other => panic!("{other:?}"),
    }
    assert!(events.next().await.is_none());
}
