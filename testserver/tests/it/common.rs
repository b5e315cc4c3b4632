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
