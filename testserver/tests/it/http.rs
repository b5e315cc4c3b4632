//! The same server over HTTPS (default) and plain HTTP: kubeconfig with the server's CA, bearer
//! tokens, curl-like raw requests, the stock watcher.

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
async fn kubeconfig_client_and_raw_requests_over_plain_http() {
    let server = TestServer::builder().shard_selector(true).build();
    let http = server.serve_plain_http().await.unwrap();
    assert!(http.url().starts_with("http://127.0.0.1:"));
    assert!(http.ca_pem().is_none());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    http.write_kubeconfig(&path, "alice").unwrap();
    let yaml = std::fs::read_to_string(&path).unwrap();
    assert!(yaml.contains("token: \"kube-shard-testserver:alice\""));
    assert!(!yaml.contains("certificate-authority-data"));

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_by_default_with_the_servers_ca_in_the_kubeconfig() {
    let server = TestServer::new();
    let http = server.serve_http().await.unwrap();
    assert!(http.url().starts_with("https://127.0.0.1:"));
    let yaml = http.kubeconfig_yaml("alice");
    let ca = http.ca_pem().unwrap();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let cluster = kc.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some(http.url().as_str()));
    let data = cluster.certificate_authority_data.as_deref().unwrap();
    use base64::Engine;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    assert_eq!(String::from_utf8(decoded).unwrap(), ca);

    let client = http.client("alice").await.unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    api.create(&PostParams::default(), &cm("over-https"))
        .await
        .unwrap();
    assert_eq!(server.accounting("alice").requests(Verb::Create), 1);

    // Plain HTTP to the TLS port gets no answer.
    let (code, _) = raw_get_lenient(http.addr()).await;
    assert_eq!(code, None);

    // Each server has its own CA: the server's CA verifies it, another server's CA does not.
    let other = TestServer::new().serve_http().await.unwrap();
    assert_ne!(other.ca_pem(), http.ca_pem());
    handshake(http.addr(), http.ca_pem().unwrap())
        .await
        .unwrap();
    let err = handshake(http.addr(), other.ca_pem().unwrap())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
}

/// A TLS handshake with `127.0.0.1` trusting only `ca_pem`.
async fn handshake(addr: std::net::SocketAddr, ca_pem: &str) -> std::io::Result<()> {
    use base64::Engine;
    let body: String = ca_pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.into()).unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await.map(drop)
}

async fn raw_get_lenient(addr: std::net::SocketAddr) -> (Option<u16>, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = "GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let _ = s.write_all(req.as_bytes()).await;
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.get(9..12).and_then(|c| c.parse().ok());
    (code, text)
}
