//! The same server over HTTP: kubeconfig, bearer tokens, curl-like raw requests, the stock watcher.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Api, ListParams, PostParams},
    runtime::watcher::{self, watcher, Event},
};
use kube_shard_testserver::{Scope, TestServer, Verb};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::common::cm;

async fn raw_get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text[9..12].parse().unwrap();
    (code, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubeconfig_client_and_raw_requests() {
    let server = TestServer::builder().shard_selector(true).build();
    let http = server.serve_http().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    http.write_kubeconfig(&path, "alice").unwrap();
    let yaml = std::fs::read_to_string(&path).unwrap();
    assert!(yaml.contains("token: \"kube-shard-testserver:alice\""));

    let client = http.client("alice").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &cm("over-http"))
        .await
        .unwrap();
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    assert_eq!(server.accounting("alice").requests(Verb::Create), 1);

    let token = TestServer::token("bob");
    let (code, body) = raw_get(http.addr(), "/api/v1/configmaps", Some(&token)).await;
    assert_eq!(code, 200);
    assert!(body.contains("over-http"));
    let sel = "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')";
    let path = format!(
        "/api/v1/configmaps?shardSelector={}",
        crate::common::enc(sel)
    );
    let (code, body) = raw_get(http.addr(), &path, Some(&token)).await;
    assert_eq!(code, 200);
    assert!(body.contains("shardInfo"));
    let (code, body) = raw_get(http.addr(), "/api/v1/configmaps", None).await;
    assert_eq!(code, 401);
    assert!(body.contains("Unauthorized"));

    // Partitioned: the connection is closed without an answer.
    server.faults().partition(Scope::identity("bob"), true);
    let mut s = tokio::net::TcpStream::connect(http.addr()).await.unwrap();
    s.write_all(
        format!("GET /api HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    assert!(buf.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stock_watcher_over_http() {
    let server = TestServer::builder()
        .bookmark_interval(Duration::from_millis(200))
        .build();
    let http = server.serve_http().await.unwrap();
    let client = http.client("w").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let mut s = watcher(api.clone(), watcher::Config::default()).boxed();
    assert!(matches!(s.next().await.unwrap().unwrap(), Event::Init));
    assert!(matches!(s.next().await.unwrap().unwrap(), Event::InitDone));
    api.create(&PostParams::default(), &cm("live"))
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
    {
        Event::Apply(o) => assert_eq!(o.metadata.name.as_deref(), Some("live")),
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(server.accounting("w").bookmarks >= 1);
}
