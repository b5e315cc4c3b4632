//! Fences enforced by the apiserver itself: a generator of `ValidatingAdmissionPolicy` objects (CEL, GA since
//! Kubernetes 1.30, no webhook server) that refuse the writes a deposed owner may still send.
//!
//! **Per object**: on an UPDATE of a main resource the policy compares the fence token in
//! the annotation ([`FENCE_ANNOTATION`] by default, `"<failover-epoch>:<shard>/<epoch>"`, see
//! [`crate::token`]) with the one on the stored object (`oldObject`). Failover epochs first: a **lower** one
//! is refused, a **higher** one accepted whatever the shard part says. When they are equal and neither token
//! is a mirror's (`<f>:mirror`), the shard rules: the write is refused when
//!
//! - its shard epoch is **lower** than the stored one (so committed fence tokens on one object never go
//!   back, with no assumption about clients' clocks or pauses, also for writes that carry no
//!   resourceVersion), or
//! - its shard **differs** from the stored token's shard.
//!
//! Whatever the epochs, it is refused when it **removes** the fence, or when the new token is **malformed or
//! oversized** (failover epoch more than 10 digits, shard more than 9, epoch more than 18: every `int()` in
//! the policy is guarded by `matches()`, so a bad token is refused with a clear message, never with a CEL
//! runtime error). A failover epoch is never compared with a shard epoch.
//!
//! An object without a fence, or whose stored token is malformed, may be stamped by any writer: a wrong shard
//! on a first stamp is the audit's job (Kubernetes CEL has no hash function to check it against the uid).
//! DELETEs carry no token and are not checked. `/status` UPDATEs are matched too: a built-in kind's status
//! write may change annotations (checked on kube-apiserver 1.36: a Deployment's `/status` patch set a lower
//! fence), while a CRD's status write copies the stored metadata, so its annotation compares equal and
//! passes.
//!
//! **Status-field fences** ([`FencePolicyConfig::status_field`], e.g. `.status.kubeShardFence`): for CRD
//! `/status` writes, [`FencedApi`](crate::ownership::fenced_write::FencedApi) stamps the token into a status
//! field the user's CRD schema declares, and further policies on `<plural>/status` compare it with the same
//! rules (per object; per shard with [`FencePolicyConfig::params`]). Built-in kinds' `/status` is not covered
//! by them (their status has no such field).
//!
//! **Per shard** ([`FencePolicyConfig::params`]): a second policy, bound with `paramRef` to a ConfigMap in
//! which the coordinator publishes each shard's current epoch (`data["<shard>"]`, see
//! [`crate::group::ShardGroupBuilder::fence_params`]), refuses a fenced CREATE or main-resource UPDATE whose
//! shard epoch is lower than its shard's: a deposed owner's late write is refused even on an object the new
//! owner never wrote. The floors are shard epochs of the group in this cluster and are compared only with
//! shard epochs (whatever the token's failover epoch); mirror tokens have no floor. Malformed tokens are
//! left to the per-object policy; the parameter ConfigMap itself is excluded (`excludeResourceRules`),
//! since a `Deny` binding refuses every covered write while it is missing.
//!
//! **Minimum failover epoch** ([`FencePolicyConfig::min_epoch`], HA.md "Fenced by the server"): a policy
//! bound to a parameter ConfigMap holding `minFailoverEpoch` and `role` (`active` or `standby`) refuses the
//! operator identities' creates and updates whose token's failover epoch is below the minimum (an unfenced
//! one too while `standby`), and all their deletes while `standby`. A promotion sets it on the old Active's
//! cluster (`kube_shard_ha::min_epoch`) and waits until a probe write (a dry-run create of the ConfigMap
//! [`MIN_EPOCH_PROBE`], which the policy judges whoever sends it) is refused.
//!
//! Pure: no I/O. The policy objects are returned typed (ready for [`kube::Api::create`]) and as YAML.
//!
//! ```
//! use kube_shard::fence_policy::{FencePolicyConfig, PolicyResource};
//!
//! let config = FencePolicyConfig::new(vec!["widgets.example.com".parse().unwrap()]);
//! let set = config.generate().unwrap();
//! assert_eq!(set.policies.len(), 1);
//! assert!(set.to_yaml().contains("kind: ValidatingAdmissionPolicyBinding"));
//! ```

use std::{fmt, str::FromStr};

use k8s_openapi::api::{
    admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding},
    core::v1::ConfigMap,
};
use serde_json::json;

use crate::token::FENCE_ANNOTATION;

mod min_epoch;
mod policies;
mod status_field;

pub use min_epoch::{MinEpoch, MIN_EPOCH_KEY, MIN_EPOCH_PROBE, MIN_EPOCH_SUFFIX, ROLE_KEY};
use policies::{binding, per_object_policy, per_shard_policy, typed, Carrier};
pub use status_field::StatusFenceField;

/// The default name of the per-object policy and of its binding.
pub const DEFAULT_POLICY_NAME: &str = "kube-shard-fence";

/// The token the policy accepts: `"<failover-epoch>:<shard>/<epoch>"`, `"<failover-epoch>:mirror"`, or a
/// legacy `"<shard>/<epoch>"` (failover epoch 0, see [`crate::token`]); failover epoch at most 10 decimal
/// digits, shard at most 9, epoch at most 18 (so that CEL's `int()`, a signed 64-bit integer, never
/// overflows).
pub const TOKEN_PATTERN: &str =
    "^([0-9]{1,10}:([0-9]{1,9}/[0-9]{1,18}|mirror)|[0-9]{1,9}/[0-9]{1,18})$";

/// The refusal messages of the per-object policy (the apiserver prefixes them with
/// `<plural>.<group> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied
/// request: `).
pub mod messages {
    /// Every refusal message of the fence policy contains this (how
    /// [`is_fence_refused`](crate::ownership::fenced_write::Error::is_fence_refused) recognises them).
    pub const MARK: &str = "kube-shard fence";
    /// The write removes the fence annotation of a fenced object.
    pub const REMOVED: &str =
        "the kube-shard fence annotation may not be removed from a fenced object";
    /// The new token is not `"<failover-epoch>:<shard>/<epoch>"` (or `:mirror`, or legacy) within the limits.
    pub const MALFORMED: &str =
        "the kube-shard fence annotation must be FAILOVER:SHARD/EPOCH or FAILOVER:mirror in decimal, failover epoch at most 10 digits, shard at most 9, epoch at most 18";
    /// The token's failover epoch is lower than the stored one's: a deposed Active wrote.
    pub const FAILOVER_STALE: &str =
        "stale kube-shard fence: its failover epoch is lower than the stored object's (the writer's cluster was deposed)";
    /// The token names another shard than the stored one.
    pub const SHARD: &str =
        "the kube-shard fence names another shard than the stored object's fence";
    /// The token's epoch is lower than the stored one: the writer lost the shard.
    pub const STALE: &str =
        "stale kube-shard fence: its epoch is lower than the stored object's (the writer lost the shard)";
    /// Per shard: the token's epoch is lower than its shard's current epoch in the parameter ConfigMap.
    pub const SHARD_STALE: &str =
        "stale kube-shard fence: its epoch is lower than its shard's current epoch (the writer lost the shard)";
    /// Per shard: the parameter ConfigMap's value for the token's shard is not a decimal epoch.
    pub const PARAM_MALFORMED: &str =
        "the kube-shard fence parameter for this shard is not a decimal epoch of at most 18 digits";
    /// Status field: the `/status` write removes the fence field of a fenced object.
    pub const STATUS_REMOVED: &str =
        "the kube-shard fence status field may not be removed from a fenced object";
    /// Status field: the new token is malformed (as [`MALFORMED`]).
    pub const STATUS_MALFORMED: &str =
        "the kube-shard fence status field must be FAILOVER:SHARD/EPOCH or FAILOVER:mirror in decimal, failover epoch at most 10 digits, shard at most 9, epoch at most 18";
    /// Minimum epoch: the operator identity's write carries a failover epoch below the cluster's minimum.
    pub const MIN_EPOCH_STALE: &str =
        "stale kube-shard fence: the operator's write is below this cluster's minimum failover epoch (a newer Active was promoted)";
    /// Minimum epoch: the operator identity deletes while the cluster is Standby.
    pub const MIN_EPOCH_DELETE: &str =
        "kube-shard fence: the operator may not delete while this cluster is Standby (a newer Active was promoted)";
    /// Minimum epoch: the parameter's `minFailoverEpoch` is not a decimal.
    pub const MIN_EPOCH_MALFORMED: &str =
        "the kube-shard fence minimum-epoch parameter minFailoverEpoch is not a decimal of at most 10 digits";
}

/// A parameter value the per-shard policy accepts: a decimal epoch of at most 18 digits.
pub const EPOCH_PATTERN: &str = "^[0-9]{1,18}$";

/// The suffix of the per-shard policy's and binding's name (`kube-shard-fence-shard` by default).
pub const SHARD_POLICY_SUFFIX: &str = "-shard";

/// The suffix of the status-field policies' and bindings' names (`kube-shard-fence-status` per object,
/// `kube-shard-fence-status-shard` per shard).
pub const STATUS_POLICY_SUFFIX: &str = "-status";

/// A resource the policy covers, `PLURAL.GROUP` (`configmaps` for the core group).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyResource {
    /// The resource's plural name, e.g. `widgets`.
    pub plural: String,
    /// The API group, empty for the core group.
    pub group: String,
}

impl FromStr for PolicyResource {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (plural, group) = s.split_once('.').unwrap_or((s, ""));
        let label = |p: &str| {
            !p.is_empty()
                && p.len() <= 63
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if !label(plural) || (!group.is_empty() && !group.split('.').all(label)) {
            return Err(PolicyError::Resource(s.chars().take(128).collect()));
        }
        Ok(PolicyResource {
            plural: plural.to_owned(),
            group: group.to_owned(),
        })
    }
}

impl fmt::Display for PolicyResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.plural)
        } else {
            write!(f, "{}.{}", self.plural, self.group)
        }
    }
}

/// Bad generator input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Not `PLURAL.GROUP` with lowercase DNS labels.
    #[error("invalid resource {0:?}: expected PLURAL.GROUP (lowercase DNS labels; PLURAL alone for the core group)")]
    Resource(String),
    /// No resource given.
    #[error("a fence policy needs at least one resource")]
    NoResource,
    /// Not a qualified annotation key (`[prefix/]name`).
    #[error("invalid annotation key {0:?}: expected [DNS-subdomain/]name of [A-Za-z0-9._-]")]
    Annotation(String),
    /// Not a valid object name.
    #[error("invalid policy name {0:?}: expected a lowercase DNS subdomain")]
    Name(String),
    /// Not `NAMESPACE/NAME` of a ConfigMap.
    #[error("invalid parameter ConfigMap {0:?}: expected NAMESPACE/NAME (lowercase DNS names)")]
    Params(String),
    /// An operator identity for the minimum-epoch policy that is empty or holds a quote or backslash.
    #[error("invalid operator identity {0:?}: expected a non-empty user name without quotes or backslashes")]
    Identity(String),
    /// Not `.status.NAME[.NAME...]` of CEL identifiers.
    #[error("invalid status fence field {0:?}: expected .status.NAME[.NAME...], NAME a CEL identifier ([A-Za-z_][A-Za-z0-9_]*, no __, not a reserved word), at most 8 names")]
    StatusField(String),
}

/// The parameter ConfigMap of the per-shard level: one key per shard (`"17"`), its value the shard's current
/// epoch in decimal. The coordinator keeps it ([`crate::group::ShardGroupBuilder::fence_params`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParamsRef {
    /// Its namespace (the shard group's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl FromStr for ParamsRef {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PolicyError::Params(s.chars().take(128).collect());
        let (namespace, name) = s.split_once('/').ok_or_else(bad)?;
        if !dns_label(namespace) || !dns_subdomain(name) {
            return Err(bad());
        }
        Ok(ParamsRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

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

    /// The policies and their bindings.
    pub fn generate(&self) -> Result<PolicySet, PolicyError> {
        self.validate()?;
        let annotation = Carrier::Annotation(&self.annotation);
        let mut set = PolicySet {
            policies: vec![typed(per_object_policy(self, &self.name, annotation))],
            bindings: vec![typed(binding(&self.name, None))],
            params: None,
            min_epoch_params: None,
        };
        if let Some(p) = &self.params {
            let name = format!("{}{SHARD_POLICY_SUFFIX}", self.name);
            set.policies
                .push(typed(per_shard_policy(self, &name, p, annotation)));
            set.bindings.push(typed(binding(&name, Some(p))));
        }
        if let Some(field) = &self.status_field {
            let status = Carrier::Status(field);
            let name = format!("{}{STATUS_POLICY_SUFFIX}", self.name);
            set.policies
                .push(typed(per_object_policy(self, &name, status)));
            set.bindings.push(typed(binding(&name, None)));
            if let Some(p) = &self.params {
                let name = format!("{name}{SHARD_POLICY_SUFFIX}");
                set.policies
                    .push(typed(per_shard_policy(self, &name, p, status)));
                set.bindings.push(typed(binding(&name, Some(p))));
            }
        }
        if let Some(m) = &self.min_epoch {
            let name = format!("{}{MIN_EPOCH_SUFFIX}", self.name);
            set.policies.push(typed(min_epoch::policy(self, &name, m)));
            set.bindings.push(typed(binding(&name, Some(&m.params))));
            set.min_epoch_params = Some(typed(min_epoch::initial_params(&m.params)));
        }
        if let Some(p) = &self.params {
            set.params = Some(typed(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": p.name, "namespace": p.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
            })));
        }
        Ok(set)
    }

    fn validate(&self) -> Result<(), PolicyError> {
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

/// `[prefix/]name`: prefix a DNS subdomain, name at most 63 of `[A-Za-z0-9._-]` starting and ending
/// alphanumeric (the apiserver's rule for annotation keys).
fn valid_annotation_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    name_ok && prefix.is_none_or(dns_subdomain)
}

fn dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && dns_subdomain(s)
}

fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_parse_core_and_groups() {
        let r: PolicyResource = "configmaps".parse().unwrap();
        assert_eq!((r.plural.as_str(), r.group.as_str()), ("configmaps", ""));
        let r: PolicyResource = "widgets.example.com".parse().unwrap();
        assert_eq!(
            (r.plural.as_str(), r.group.as_str()),
            ("widgets", "example.com")
        );
        assert_eq!(r.to_string(), "widgets.example.com");
        for bad in ["", ".x", "Widgets.x", "w..x", "w.x.", "w'x", "w/x"] {
            assert!(bad.parse::<PolicyResource>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        let r = vec!["widgets.example.com".parse().unwrap()];
        assert_eq!(
            FencePolicyConfig::new(vec![]).generate().unwrap_err(),
            PolicyError::NoResource
        );
        for bad in ["", "a'b", "x/", "/x", "-a", "a b", "Ex.com/x"] {
            assert!(
                FencePolicyConfig::new(r.clone())
                    .annotation(bad)
                    .generate()
                    .is_err(),
                "{bad:?}"
            );
        }
        assert!(FencePolicyConfig::new(r.clone())
            .annotation("example.com/Fence_1")
            .generate()
            .is_ok());
        assert!(FencePolicyConfig::new(r).name("Bad").generate().is_err());
    }

    #[test]
    fn policy_guards_every_int_and_matches_main_resource_updates() {
        let set = FencePolicyConfig::new(vec![
            "widgets.example.com".parse().unwrap(),
            "configmaps".parse().unwrap(),
        ])
        .generate()
        .unwrap();
        let p = serde_json::to_value(&set.policies[0]).unwrap();
        let rules = p["spec"]["matchConstraints"]["resourceRules"]
            .as_array()
            .unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0]["resources"], json!(["widgets", "widgets/status"]));
        assert_eq!(rules[1]["apiGroups"], json!([""]));
        assert_eq!(rules[0]["operations"], json!(["UPDATE"]));
        // every int() is behind the matches() of both tokens (`shardRules` implies them)
        for v in p["spec"]["validations"].as_array().unwrap() {
            let e = v["expression"].as_str().unwrap();
            if e.contains("int(") {
                assert!(e.starts_with("!variables.shardRules || "), "{e}");
            }
        }
        let vars = p["spec"]["variables"].as_array().unwrap();
        for v in vars {
            let (name, e) = (
                v["name"].as_str().unwrap(),
                v["expression"].as_str().unwrap(),
            );
            if e.contains("int(") {
                assert!(
                    e.starts_with("variables.oldOk && ") || e.starts_with("variables.newOk && "),
                    "{name}: {e}"
                );
            }
        }
        assert!(vars[8]["expression"]
            .as_str()
            .unwrap()
            .starts_with("variables.oldOk && variables.newOk && variables.newF == variables.oldF"));
        for m in [
            messages::REMOVED,
            messages::MALFORMED,
            messages::FAILOVER_STALE,
            messages::SHARD,
            messages::STALE,
            messages::MIN_EPOCH_STALE,
            messages::MIN_EPOCH_DELETE,
            messages::MIN_EPOCH_MALFORMED,
        ] {
            assert!(m.contains(messages::MARK), "{m}");
        }
        let b = serde_json::to_value(&set.bindings[0]).unwrap();
        assert_eq!(b["spec"]["policyName"], "kube-shard-fence");
        assert_eq!(b["spec"]["validationActions"], json!(["Deny"]));
    }

    #[test]
    fn yaml_has_both_documents() {
        let set = FencePolicyConfig::new(vec!["configmaps".parse().unwrap()])
            .annotation("example.com/fence")
            .generate()
            .unwrap();
        let y = set.to_yaml();
        assert!(
            y.starts_with("apiVersion: admissionregistration.k8s.io/v1\n"),
            "{y}"
        );
        assert!(y.contains("\n---\n"));
        assert!(y.contains("'example.com/fence' in oldObject.metadata.annotations"));
    }

    #[test]
    fn params_add_the_per_shard_policy_bound_with_param_ref() {
        let set = FencePolicyConfig::new(vec!["widgets.example.com".parse().unwrap()])
            .params("ops/widgets-fence".parse().unwrap())
            .generate()
            .unwrap();
        assert_eq!((set.policies.len(), set.bindings.len()), (2, 2));
        let p = serde_json::to_value(&set.policies[1]).unwrap();
        assert_eq!(p["metadata"]["name"], "kube-shard-fence-shard");
        assert_eq!(
            p["spec"]["paramKind"],
            json!({"apiVersion": "v1", "kind": "ConfigMap"})
        );
        let c = &p["spec"]["matchConstraints"];
        assert_eq!(
            c["resourceRules"][0]["operations"],
            json!(["CREATE", "UPDATE"])
        );
        assert_eq!(c["resourceRules"][0]["resources"], json!(["widgets"]));
        assert_eq!(
            c["excludeResourceRules"][0]["resourceNames"],
            json!(["widgets-fence"])
        );
        // every int() is behind a matches(): `ok` guards the token, `floorOk` the parameter
        let vars = p["spec"]["variables"].as_array().unwrap();
        assert!(vars[3]["expression"]
            .as_str()
            .unwrap()
            .starts_with("variables.ok && "));
        let stale = p["spec"]["validations"][1]["expression"].as_str().unwrap();
        assert!(stale.starts_with("!variables.floorOk || "), "{stale}");
        let b = serde_json::to_value(&set.bindings[1]).unwrap();
        assert_eq!(
            b["spec"]["paramRef"],
            json!({"name": "widgets-fence", "namespace": "ops", "parameterNotFoundAction": "Deny"})
        );
        let cm = set.params.as_ref().unwrap();
        assert_eq!(cm.metadata.namespace.as_deref(), Some("ops"));
        assert!(
            set.to_yaml()
                .ends_with("  name: widgets-fence\n  namespace: ops\n"),
            "{}",
            set.to_yaml()
        );
        for bad in ["ops", "/x", "ops/", "o.ps/x", "ops/X"] {
            assert!(bad.parse::<ParamsRef>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn min_epoch_adds_its_policy_binding_and_parameter() {
        let min = MinEpoch::new(
            "ops/widgets-ha-min-epoch".parse().unwrap(),
            vec!["system:serviceaccount:ops:op".into()],
        );
        let set = FencePolicyConfig::new(vec!["widgets.example.com".parse().unwrap()])
            .min_epoch(min.clone())
            .generate()
            .unwrap();
        let p = serde_json::to_value(&set.policies[1]).unwrap();
        assert_eq!(p["metadata"]["name"], "kube-shard-fence-min-epoch");
        let rules = &p["spec"]["matchConstraints"]["resourceRules"];
        assert_eq!(
            rules[0]["operations"],
            json!(["CREATE", "UPDATE", "DELETE"])
        );
        assert_eq!(rules[1]["resourceNames"], json!([MIN_EPOCH_PROBE]));
        assert_eq!(
            p["spec"]["matchConstraints"]["excludeResourceRules"][0]["resourceNames"],
            json!(["widgets-ha-min-epoch"])
        );
        let mine = p["spec"]["variables"][1]["expression"].as_str().unwrap();
        assert!(
            mine.ends_with("in ['system:serviceaccount:ops:op']"),
            "{mine}"
        );
        // the int() of the minimum is behind minOk, the token's behind ok
        let stale = p["spec"]["validations"][2]["expression"].as_str().unwrap();
        assert!(
            stale.contains("!variables.minOk || (variables.ok ? "),
            "{stale}"
        );
        let b = serde_json::to_value(&set.bindings[1]).unwrap();
        assert_eq!(b["spec"]["paramRef"]["parameterNotFoundAction"], "Deny");
        let cm = set.min_epoch_params.as_ref().unwrap();
        let data = cm.data.as_ref().unwrap();
        assert_eq!(
            (data[MIN_EPOCH_KEY].as_str(), data[ROLE_KEY].as_str()),
            ("0", "active")
        );
        assert!(set.to_yaml().contains("name: widgets-ha-min-epoch"));
        for bad in [
            vec![],
            vec![String::new()],
            vec!["a'b".into()],
            vec!["a\\b".into()],
        ] {
            let r = FencePolicyConfig::new(vec!["w.x".parse().unwrap()])
                .min_epoch(MinEpoch::new("ops/m".parse().unwrap(), bad.clone()))
                .generate();
            assert!(matches!(r, Err(PolicyError::Identity(_))), "{bad:?}");
        }
    }

    #[test]
    fn status_field_adds_policies_on_status_with_the_same_rules() {
        let field: StatusFenceField = ".status.kubeShardFence".parse().unwrap();
        let cfg = FencePolicyConfig::new(vec!["widgets.example.com".parse().unwrap()])
            .status_field(field);
        let set = cfg.clone().generate().unwrap();
        let names: Vec<_> = set
            .policies
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["kube-shard-fence", "kube-shard-fence-status"]);
        let p = serde_json::to_value(&set.policies[1]).unwrap();
        let rule = &p["spec"]["matchConstraints"]["resourceRules"][0];
        assert_eq!(rule["resources"], json!(["widgets/status"]));
        assert_eq!(rule["operations"], json!(["UPDATE"]));
        let old = p["spec"]["variables"][0]["expression"].as_str().unwrap();
        assert!(
            old.starts_with("has(oldObject.status) && has(oldObject.status.kubeShardFence) ? "),
            "{old}"
        );
        let msgs: Vec<_> = p["spec"]["validations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["message"].as_str().unwrap())
            .collect();
        assert_eq!(
            msgs,
            [
                messages::STATUS_REMOVED,
                messages::STATUS_MALFORMED,
                messages::FAILOVER_STALE,
                messages::SHARD,
                messages::STALE
            ]
        );
        assert!(msgs.iter().all(|m| m.contains(messages::MARK)));
        // with params: the per-shard rule applies to the status field too
        let set = cfg
            .params("ops/widgets-fence".parse().unwrap())
            .generate()
            .unwrap();
        let names: Vec<_> = set
            .bindings
            .iter()
            .map(|b| b.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "kube-shard-fence",
                "kube-shard-fence-shard",
                "kube-shard-fence-status",
                "kube-shard-fence-status-shard"
            ]
        );
        let p = serde_json::to_value(&set.policies[3]).unwrap();
        let rule = &p["spec"]["matchConstraints"]["resourceRules"][0];
        assert_eq!(rule["resources"], json!(["widgets/status"]));
        assert_eq!(rule["operations"], json!(["UPDATE"]));
        assert!(p["spec"]["variables"][0]["expression"]
            .as_str()
            .unwrap()
            .contains("object.status.kubeShardFence"));
        assert_eq!(
            p["spec"]["validations"][1]["message"],
            messages::SHARD_STALE
        );
        assert!(set.bindings[3].spec.param_ref.is_some());
    }
}
