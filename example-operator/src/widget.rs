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
/// The status field that carries the fence token on `/status` writes (declared in the CRD as a string;
/// the reconcile's `FencedApi` stamps it, the fence policy compares it).
pub const STATUS_FENCE_FIELD: &str = ".status.kubeShardFence";
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
                            "epoch": {"type": "integer", "format": "int64"},
                            "kubeShardFence": {"type": "string"}
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

/// The parameter ConfigMap of the per-shard fence level for group `group`: `<group>-fence`.
#[must_use]
pub fn fence_params_name(group: &str) -> String {
    format!("{group}-fence")
}

/// Install the fence policies (both levels, [`kube_shard::fence_policy`]) for Widgets and their child
/// ConfigMaps, bound to the parameter ConfigMap `<group>-fence` in `namespace` — created first, empty, since
/// the per-shard binding refuses every ConfigMap write while it is missing — and, for Widget `/status`
/// writes, the status-field policies on [`STATUS_FENCE_FIELD`]. Idempotent (`AlreadyExists` is
/// success: every replica may pass it); an existing object is left as it is.
pub async fn install_fence_policy(
    client: Client,
    group: &str,
    namespace: &str,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_shard::fence_policy::{FencePolicyConfig, ParamsRef};
    let params: ParamsRef = format!("{namespace}/{}", fence_params_name(group)).parse()?;
    let set = FencePolicyConfig::new(vec![
        format!("{PLURAL}.{GROUP}").parse()?,
        "configmaps".parse()?,
    ])
    .params(params)
    .status_field(STATUS_FENCE_FIELD.parse()?)
    .generate()?;
    let exists_ok = |r: Result<(), kube::Error>| match r {
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        other => other,
    };
    let pp = PostParams::default();
    if let Some(cm) = &set.params {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        exists_ok(api.create(&pp, cm).await.map(|_| ()))?;
    }
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    for p in &set.policies {
        exists_ok(policies.create(&pp, p).await.map(|_| ()))?;
    }
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(client);
    for b in &set.bindings {
        exists_ok(bindings.create(&pp, b).await.map(|_| ()))?;
    }
    Ok(())
}
