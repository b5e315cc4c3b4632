//! Helpers shared by the tests.
#![allow(dead_code)]

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{ObjectMeta, PostParams},
    Api,
};

pub fn cm(name: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some([("k".to_string(), "v".to_string())].into()),
        ..Default::default()
    }
}

pub fn cm_labeled(name: &str, key: &str, value: &str) -> ConfigMap {
    let mut c = cm(name);
    c.metadata.labels = Some([(key.to_string(), value.to_string())].into());
    c
}

pub async fn create_cms(api: &Api<ConfigMap>, prefix: &str, n: usize) -> Vec<ConfigMap> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(
            api.create(&PostParams::default(), &cm(&format!("{prefix}-{i}")))
                .await
                .expect("create"),
        );
    }
    out
}

/// The `kube::Error::Api` status code, if it is one.
pub fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// GET `uri` (path and query) as JSON through a client.
pub async fn get_json(client: &kube::Client, uri: &str) -> Result<serde_json::Value, kube::Error> {
    get_json_accept(client, uri, "application/json").await
}

pub async fn get_json_accept(
    client: &kube::Client,
    uri: &str,
    accept: &str,
) -> Result<serde_json::Value, kube::Error> {
    let req = http::Request::get(uri)
        .header("accept", accept)
        .body(Vec::new())
        .unwrap();
    let text = client.request_text(req).await?;
    Ok(serde_json::from_str(&text).unwrap())
}

pub fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// Names of the items of a list answer.
pub fn item_names(list: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}
