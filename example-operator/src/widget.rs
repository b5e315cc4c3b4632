//! The example custom resource `Widget` (`example.kube-shard.io/v1`, namespaced, with a status
//! subresource) and its CustomResourceDefinition. Every `spec` field is optional.

use std::borrow::Cow;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::NamespaceResourceScope;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, Resource};
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "example.kube-shard.io";
/// The version.
pub const VERSION: &str = "v1";
/// The plural.
pub const PLURAL: &str = "widgets";
/// The CRD's name.
pub const CRD_NAME: &str = "widgets.example.kube-shard.io";
/// The label every child ConfigMap carries (value: the Widget's name).
pub const CHILD_LABEL: &str = "example.kube-shard.io/widget";

/// A Widget.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Widget {
    #[serde(rename = "apiVersion", default = "api_version")]
    pub api_version: String,
    #[serde(default = "kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WidgetSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<WidgetStatus>,
}

fn api_version() -> String {
    format!("{GROUP}/{VERSION}")
}

fn kind() -> String {
    "Widget".to_owned()
}

/// What a Widget asks for. Every field is optional.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WidgetSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub color: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What the operator reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WidgetStatus {
    /// The `metadata.generation` last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The member that reconciled it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reconciled_by: Option<String>,
    /// The epoch of the fence the status was written under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

impl Widget {
    pub fn new(name: &str, namespace: &str, spec: WidgetSpec) -> Self {
        Widget {
            api_version: api_version(),
            kind: kind(),
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }
}

impl Resource for Widget {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Widget")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The CustomResourceDefinition.
pub fn crd() -> CustomResourceDefinition {
    let v = serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": "Widget",
                "listKind": "WidgetList",
                "plural": PLURAL,
                "singular": "widget",
                "shortNames": ["wdg"]
            },
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "subresources": {"status": {}},
                "additionalPrinterColumns": [
                    {"name": "Reconciled-By", "type": "string", "jsonPath": ".status.reconciledBy"},
                    {"name": "Epoch", "type": "integer", "jsonPath": ".status.epoch"},
                    {"name": "Observed", "type": "integer", "jsonPath": ".status.observedGeneration"}
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {"type": "object", "properties": {
                            "size": {"type": "integer"},
                            "color": {"type": "string"},
                            "message": {"type": "string"}
                        }},
                        "status": {"type": "object", "properties": {
                            "observedGeneration": {"type": "integer", "format": "int64"},
                            "reconciledBy": {"type": "string"},
                            "epoch": {"type": "integer", "format": "int64"}
                        }}
                    }
                }}
            }]
        }
    });
    serde_json::from_value(v).expect("the Widget CRD is valid")
}

/// Install the CRD if it is missing (several replicas may race: `AlreadyExists` is success), then wait
/// until it is `Established`.
pub async fn install_crd(client: Client, wait: Duration) -> Result<(), kube::Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client);
    match api.create(&PostParams::default(), &crd()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e),
    }
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let got = api.get(CRD_NAME).await?;
        let established = got
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if established || tokio::time::Instant::now() >= deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
