//! `late_commit` and `drop_answer`: writes that commit although the client saw no answer.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use kube_shard_testserver::{Scope, TestServer, Verb};
use tokio::time::{timeout, Instant};

use crate::common::cm;

fn stored(server: &TestServer, name: &str) -> Option<serde_json::Value> {
    server.object("", "configmaps", Some("default"), name)
}

#[tokio::test(start_paused = true)]
async fn late_commit_commits_after_the_client_timed_out() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("m0"), "default");
    let late = Scope::identity("m0").verb(Verb::Create);
    server
        .faults()
        .late_commit(late.clone(), Duration::from_secs(5));
    let sent = Instant::now();
    let answer = timeout(
        Duration::from_secs(1),
        api.create(&PostParams::default(), &cm("late")),
    )
    .await;
    assert!(answer.is_err(), "the client must see no answer: {answer:?}");
    assert!(stored(&server, "late").is_none(), "not yet committed");
    tokio::time::sleep_until(sent + Duration::from_millis(4_900)).await;
    assert!(
        stored(&server, "late").is_none(),
        "commits 5 s after arrival"
    );
    tokio::time::sleep_until(sent + Duration::from_millis(5_100)).await;
    assert!(
        stored(&server, "late").is_some(),
        "committed after the timeout"
    );

    // Reads and other identities are answered; `answer_normally` heals.
    assert!(api.get("late").await.is_ok());
    let other: Api<ConfigMap> = Api::namespaced(server.client("m1"), "default");
    other
        .create(&PostParams::default(), &cm("m1"))
        .await
        .unwrap();
    server.faults().answer_normally(late);
    api.create(&PostParams::default(), &cm("prompt"))
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn drop_answer_commits_at_once_and_never_answers() {
    let server = TestServer::new();
    let api: Api<ConfigMap> = Api::namespaced(server.client("m0"), "default");
    let created = api
        .create(&PostParams::default(), &cm("lost"))
        .await
        .unwrap();
    server
        .faults()
        .drop_answer(Scope::identity("m0").verb(Verb::Update).name("lost"));
    let mut next = created.clone();
    next.data = Some([("k".to_string(), "new".to_string())].into());
    // The client gives up at once: the write still commits.
    let answer = timeout(
        Duration::from_millis(1),
        api.replace("lost", &PostParams::default(), &next),
    )
    .await;
    assert!(answer.is_err());
    tokio::task::yield_now().await;
    let now = stored(&server, "lost").unwrap();
    assert_eq!(now["data"]["k"], "new");
    assert_ne!(
        now["metadata"]["resourceVersion"].as_str(),
        created.metadata.resource_version.as_deref()
    );
    // Waiting longer does not bring an answer either.
    let answer = timeout(
        Duration::from_secs(600),
        api.replace("lost", &PostParams::default(), &next),
    )
    .await;
    assert!(answer.is_err(), "a dropped answer never comes");
    assert!(api.get("lost").await.is_ok(), "GETs are answered");
}

#[tokio::test]
async fn late_commit_and_drop_answer_over_http() {
    let server = TestServer::new();
    let http = server.serve_http().await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(http.client("m0").await.unwrap(), "default");
    let faults = server.faults();
    // A create names its object in the body, not the path: narrow to the verb.
    let creates = Scope::identity("m0").verb(Verb::Create);
    faults.late_commit(creates.clone(), Duration::from_secs(2));
    let sent = Instant::now();
    let answer = timeout(
        Duration::from_millis(200),
        api.create(&PostParams::default(), &cm("late")),
    )
    .await;
    assert!(answer.is_err(), "timed out: {answer:?}");
    assert!(stored(&server, "late").is_none());
    while stored(&server, "late").is_none() {
        assert!(sent.elapsed() < Duration::from_secs(30), "never committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sent.elapsed() >= Duration::from_secs(2));

    faults.answer_normally(creates.clone());
    faults.drop_answer(creates);
    let answer = timeout(
        Duration::from_millis(500),
        api.create(&PostParams::default(), &cm("lost")),
    )
    .await;
    assert!(answer.is_err());
    assert!(stored(&server, "lost").is_some(), "committed, answer lost");
    // The connection is not poisoned for others: a new client is answered.
    let fresh: Api<ConfigMap> = Api::namespaced(http.client("m1").await.unwrap(), "default");
    assert!(fresh.get("late").await.is_ok());
}
