//! Protobuf request bodies, as kubectl's imperative commands send built-in kinds: stored as their JSON
//! would be; refused where kube-apiserver refuses them. The bodies are the fuzz target's seeds
//! (`fuzz/corpus/protobuf_body/`, written by testserver's `write_fuzz_seeds`): one kind byte, then the body.

use http_body_util::BodyExt;
use kube_shard_testserver::TestServer;
use tower::ServiceExt;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

fn seed(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../fuzz/corpus/protobuf_body/seed-{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    data[1..].to_vec()
}

async fn send(
    server: &TestServer,
    method: &str,
    uri: &str,
    ct: &str,
    body: Vec<u8>,
) -> (u16, serde_json::Value) {
    let req = http::Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", ct)
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let resp = server.service("kubectl").oneshot(req).await.unwrap();
    let code = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (code, serde_json::from_slice(&body).unwrap_or_default())
}

#[tokio::test]
async fn a_protobuf_create_is_stored_as_its_json_would_be() {
    let server = TestServer::new();
    let (code, ns) = send(
        &server,
        "POST",
        "/api/v1/namespaces",
        PROTOBUF,
        seed("namespace"),
    )
    .await;
    assert_eq!(code, 201, "{ns}");
    assert_eq!(ns["metadata"]["name"], "tt");
    assert_eq!(ns["metadata"]["labels"]["a"], "b");
    assert!(ns["metadata"].get("generateName").is_none(), "Go omitempty");
    let (code, d) = send(
        &server,
        "POST",
        "/apis/apps/v1/namespaces/tt/deployments",
        PROTOBUF,
        seed("deployment"),
    )
    .await;
    assert_eq!(code, 201, "{d}");
    let stored = server
        .object("apps", "deployments", Some("tt"), "web")
        .unwrap();
    assert_eq!(stored["spec"]["replicas"], 2);
    assert_eq!(
        stored["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"],
        "500m"
    );
    let (code, s) = send(
        &server,
        "POST",
        "/api/v1/namespaces/tt/secrets",
        PROTOBUF,
        seed("secret"),
    )
    .await;
    assert_eq!((code, &s["data"]["k"]), (201, &serde_json::json!("dg==")));
}

#[tokio::test]
async fn protobuf_is_refused_where_the_real_server_refuses_it() {
    let server = TestServer::new();
    // a body for another endpoint's kind
    let (code, st) = send(
        &server,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        PROTOBUF,
        seed("secret"),
    )
    .await;
    assert_eq!(code, 400, "{st}");
    // not a protobuf message
    let (code, st) = send(
        &server,
        "POST",
        "/api/v1/namespaces",
        PROTOBUF,
        b"hello".to_vec(),
    )
    .await;
    assert_eq!(code, 400, "{st}");
    assert_eq!(st["kind"], "Status");
    // a patch has no protobuf form
    let (code, _) = send(
        &server,
        "PATCH",
        "/api/v1/namespaces/default",
        PROTOBUF,
        seed("namespace"),
    )
    .await;
    assert_eq!(code, 415);
}

#[tokio::test]
async fn answers_are_json_and_a_binary_only_accept_gets_406() {
    let server = TestServer::new();
    let get = |accept: &'static str| {
        let server = server.clone();
        async move {
            let req = http::Request::get("/api/v1/namespaces/default")
                .header("accept", accept)
                .body(String::new())
                .unwrap();
            let resp = server.service("kubectl").oneshot(req).await.unwrap();
            let ct = resp.headers()["content-type"].to_str().unwrap().to_owned();
            (resp.status().as_u16(), ct)
        }
    };
    let json = (200, "application/json".to_owned());
    assert_eq!(
        get("application/vnd.kubernetes.protobuf,application/json").await,
        json
    );
    assert_eq!(get("application/json").await, json);
    assert_eq!(get("*/*").await, json);
    assert_eq!(get("application/vnd.kubernetes.protobuf").await.0, 406);
    assert_eq!(get("application/cbor").await.0, 406);
}
