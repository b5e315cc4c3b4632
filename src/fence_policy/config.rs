//! [`FencePolicyConfig`] (what to generate, validated) and the [`PolicySet`] it generates.

use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    core::v1::ConfigMap,
};

use super::min_epoch::MinEpoch;
use super::status_field::StatusFenceField;
use super::types::{
    dns_subdomain, valid_annotation_key, ParamsRef, PolicyError, PolicyResource,
    DEFAULT_POLICY_NAME, SHARD_POLICY_SUFFIX, STATUS_POLICY_SUFFIX,
};
use crate::token::FENCE_ANNOTATION;

/// What to generate.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FencePolicyConfig {
    /// The resources whose main-resource UPDATEs are checked.
    pub resources: Vec<PolicyResource>,
    /// The annotation that carries the token ([`FENCE_ANNOTATION`]).
    pub annotation: String,
    /// The name of the policy and of its binding ([`DEFAULT_POLICY_NAME`]).
    pub name: String,
    /// With a parameter ConfigMap: also the per-shard policy (`<name>-shard`), bound to it with `paramRef`.
    pub params: Option<ParamsRef>,
    /// With a status field: also the policies on `<plural>/status` that compare the token in it
    /// (`<name>-status`, and `<name>-status-shard` with [`params`](Self::params)).
    pub status_field: Option<StatusFenceField>,
    /// With a minimum-epoch parameter: also the policy `<name>-min-epoch` bound to it.
    pub min_epoch: Option<MinEpoch>,
}

impl FencePolicyConfig {
    /// The per-object policy for `resources`, with the default annotation and name.
    #[must_use]
    pub fn new(resources: Vec<PolicyResource>) -> Self {
        FencePolicyConfig {
            resources,
            annotation: FENCE_ANNOTATION.to_owned(),
            name: DEFAULT_POLICY_NAME.to_owned(),
            params: None,
            status_field: None,
            min_epoch: None,
        }
    }

    /// Also generate the minimum-failover-epoch policy (`<name>-min-epoch`), bound to `min.params` (and that
    /// ConfigMap with `role: active`, `minFailoverEpoch: "0"`, for `kubectl apply`).
    #[must_use]
    pub fn min_epoch(mut self, min: MinEpoch) -> Self {
        self.min_epoch = Some(min);
        self
    }

    /// Also fence CRD `/status` writes through the status field `field` (what
    /// [`FencedApi::status_fence_field`](crate::ownership::fenced_write::FencedApi::status_fence_field)
    /// stamps): a per-object policy on `<plural>/status` (`<name>-status`), and with
    /// [`params`](Self::params) a per-shard one (`<name>-status-shard`). The same rules as the annotation's.
    #[must_use]
    pub fn status_field(mut self, field: StatusFenceField) -> Self {
        self.status_field = Some(field);
        self
    }

    /// Also generate the per-shard policy, bound to the parameter ConfigMap `params` (and that ConfigMap,
    /// empty, for `kubectl apply`: the binding refuses every covered write while it is missing).
    #[must_use]
    pub fn params(mut self, params: ParamsRef) -> Self {
        self.params = Some(params);
        self
    }

    /// Use another annotation key.
    #[must_use]
    pub fn annotation(mut self, key: impl Into<String>) -> Self {
        self.annotation = key.into();
        self
    }

    /// Use another name for the policy and its binding.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    pub(super) fn validate(&self) -> Result<(), PolicyError> {
        if self.resources.is_empty() {
            return Err(PolicyError::NoResource);
        }
        if !valid_annotation_key(&self.annotation) {
            return Err(PolicyError::Annotation(
                self.annotation.chars().take(128).collect(),
            ));
        }
        if let Some(m) = &self.min_epoch {
            m.validate()?;
        }
        let longest = self.name.len() + STATUS_POLICY_SUFFIX.len() + SHARD_POLICY_SUFFIX.len();
        if !dns_subdomain(&self.name) || longest > 253 {
            return Err(PolicyError::Name(self.name.chars().take(128).collect()));
        }
        Ok(())
    }
}

/// Generated policies and bindings.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PolicySet {
    /// The `ValidatingAdmissionPolicy` objects.
    pub policies: Vec<ValidatingAdmissionPolicy>,
    /// Their `ValidatingAdmissionPolicyBinding`s.
    pub bindings: Vec<ValidatingAdmissionPolicyBinding>,
    /// The per-shard level's parameter ConfigMap, empty (the coordinator fills it), when asked for.
    pub params: Option<ConfigMap>,
    /// The minimum-epoch parameter ConfigMap (`role: active`, `minFailoverEpoch: "0"`), when asked for.
    pub min_epoch_params: Option<ConfigMap>,
}

impl PolicySet {
    /// Every object as a YAML stream (`---` between documents), policies first, then bindings, then the
    /// parameter ConfigMaps.
    #[must_use]
    pub fn to_yaml(&self) -> String {
        let docs = self
            .policies
            .iter()
            .map(|p| serde_json::to_value(p).expect("serializable"))
            .chain(
                self.bindings
                    .iter()
                    .map(|b| serde_json::to_value(b).expect("serializable")),
            )
            .chain(
                self.params
                    .iter()
                    .chain(self.min_epoch_params.iter())
                    .map(|c| serde_json::to_value(c).expect("serializable")),
            );
        let mut out = String::new();
        for (i, doc) in docs.enumerate() {
            if i > 0 {
                out.push_str("---\n");
            }
            crate::yaml::write_document(&doc, &mut out);
        }
        out
    }
}
