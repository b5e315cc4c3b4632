//! `kshard-dev testserver`: serves `kubectl get configmaps -A` (here: the same requests from a kube client
//! loaded from the written kubeconfig, and a raw bearer-token GET like curl's) and a sharded list by URL.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn raw_get(url: &str, path: &str, token: &str) -> String {
    let addr = url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testserver_serves_a_kubeconfig_client_and_sharded_lists() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kshard-dev"))
        .args([
            "testserver",
            "--plain-http",
            "--listen",
            "127.0.0.1:0",
            "--shard-selector",
            "on",
            "--kubeconfig-out",
        ])
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .spawn()
        .expect("run kshard-dev testserver");
    let stdout = child.stdout.take().unwrap();
    let running = Running(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let url = line
        .trim()
        .strip_prefix("serving ")
        .expect("serving URL")
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");

    let yaml = std::fs::read_to_string(&kubeconfig).unwrap();
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    assert_eq!(config.cluster_url.to_string().trim_end_matches('/'), url);
    let client = kube::Client::try_from(config).unwrap();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for i in 0..20 {
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": format!("cm-{i}")}}))
                .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    // kubectl get configmaps -A
    let all: Api<ConfigMap> = Api::all(client);
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        20
    );

    let token = yaml
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .unwrap()
        .trim_matches('"')
        .to_string();
    let body = raw_get(&url, "/api/v1/configmaps", &token).await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert_eq!(body.matches("\"name\":\"cm-").count(), 20);
    let sel = "shardRange(object.metadata.uid,%20'0x0000000000000000',%20'0x8000000000000000')";
    let body = raw_get(
        &url,
        &format!("/api/v1/configmaps?shardSelector={sel}"),
        &token,
    )
    .await;
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(body.contains("\"shardInfo\":{\"selector\":\"shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')\"}"), "{body}");
    assert!(body.matches("\"name\":\"cm-").count() < 20);
    drop(running);
}
