//! Fences enforced by the apiserver itself: a generator of `ValidatingAdmissionPolicy` objects (CEL, GA since
//! Kubernetes 1.30, no webhook server) that refuse the writes a deposed owner may still send.
//!
//! **Per object** (this module today): on an UPDATE of a main resource the policy compares the fence token in
//! the annotation ([`FENCE_ANNOTATION`] by default, `"<shard>/<epoch>"`) with the one on the stored object
//! (`oldObject`) and refuses the write when
//!
//! - its epoch is **lower** than the stored one (so committed fence epochs on one object never decrease, with
//!   no assumption about clients' clocks or pauses, also for writes that carry no resourceVersion),
//! - its shard **differs** from the stored token's shard,
//! - it **removes** the fence, or
//! - the new token is **malformed or oversized** (shard more than 9 digits, epoch more than 18: every `int()`
//!   in the policy is guarded by `matches()`, so a bad token is refused with a clear message, never with a CEL
//!   runtime error).
//!
//! An object without a fence, or whose stored token is malformed, may be stamped by any writer: a wrong shard
//! on a first stamp is the audit's job (Kubernetes CEL has no hash function to check it against the uid).
//! DELETEs carry no token and are not checked. `/status` UPDATEs are matched too: a built-in kind's status
//! write may change annotations (checked on kube-apiserver 1.36: a Deployment's `/status` patch set a lower
//! fence), while a CRD's status write copies the stored metadata, so its fence compares equal and passes —
//! status writes of CRDs are not fenced by this level.
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

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use serde_json::{json, Value};

use crate::token::FENCE_ANNOTATION;

/// The default name of the per-object policy and of its binding.
pub const DEFAULT_POLICY_NAME: &str = "kube-shard-fence";

/// The token the policy accepts: `"<shard>/<epoch>"`, shard at most 9 decimal digits, epoch at most 18 (so
/// that CEL's `int()`, a signed 64-bit integer, never overflows).
pub const TOKEN_PATTERN: &str = "^[0-9]{1,9}/[0-9]{1,18}$";

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
    /// The new token is not `"<shard>/<epoch>"` within the digit limits.
    pub const MALFORMED: &str =
        "the kube-shard fence annotation must be SHARD/EPOCH in decimal, shard at most 9 digits, epoch at most 18";
    /// The token names another shard than the stored one.
    pub const SHARD: &str =
        "the kube-shard fence names another shard than the stored object's fence";
    /// The token's epoch is lower than the stored one: the writer lost the shard.
    pub const STALE: &str =
        "stale kube-shard fence: its epoch is lower than the stored object's (the writer lost the shard)";
}

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
}

impl FencePolicyConfig {
    /// The per-object policy for `resources`, with the default annotation and name.
    #[must_use]
    pub fn new(resources: Vec<PolicyResource>) -> Self {
        FencePolicyConfig {
            resources,
            annotation: FENCE_ANNOTATION.to_owned(),
            name: DEFAULT_POLICY_NAME.to_owned(),
        }
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
        let policy = per_object_policy(self);
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": self.name, "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
            "spec": {"policyName": self.name, "validationActions": ["Deny"]},
        });
        Ok(PolicySet {
            policies: vec![serde_json::from_value(policy).expect("a well-formed policy")],
            bindings: vec![serde_json::from_value(binding).expect("a well-formed binding")],
        })
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
        if !dns_subdomain(&self.name) {
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
}

impl PolicySet {
    /// Every object as a YAML stream (`---` between documents), policies first.
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

fn per_object_policy(config: &FencePolicyConfig) -> Value {
    let rules: Vec<Value> = config
        .resources
        .iter()
        .map(|r| {
            json!({
                "apiGroups": [r.group],
                "apiVersions": ["*"],
                // `/status` too: a built-in kind's status write may change annotations (a CRD's copies the
                // stored metadata, so the fence compares equal there and passes)
                "resources": [r.plural, format!("{}/status", r.plural)],
                "operations": ["UPDATE"],
            })
        })
        .collect();
    let key = &config.annotation; // validated: no quote or backslash can reach the CEL string literal
    let read = |obj: &str| {
        format!("has({obj}.metadata.annotations) && '{key}' in {obj}.metadata.annotations ? {obj}.metadata.annotations['{key}'] : ''")
    };
    let both = "!(variables.oldOk && variables.newOk)";
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": config.name, "labels": {"app.kubernetes.io/managed-by": "kube-shard"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "variables": [
                {"name": "oldFence", "expression": read("oldObject")},
                {"name": "newFence", "expression": read("object")},
                {"name": "oldOk", "expression": format!("variables.oldFence.matches('{TOKEN_PATTERN}')")},
                {"name": "newOk", "expression": format!("variables.newFence.matches('{TOKEN_PATTERN}')")},
            ],
            "validations": [
                {
                    "expression": "variables.oldFence == '' || variables.newFence != ''",
                    "message": messages::REMOVED,
                    "reason": "Invalid",
                },
                {
                    "expression": "variables.newFence == '' || variables.newOk",
                    "message": messages::MALFORMED,
                    "reason": "Invalid",
                },
                {
                    "expression": format!("{both} || int(variables.newFence.split('/')[0]) == int(variables.oldFence.split('/')[0])"),
                    "message": messages::SHARD,
                    "reason": "Invalid",
                },
                {
                    "expression": format!("{both} || int(variables.newFence.split('/')[1]) >= int(variables.oldFence.split('/')[1])"),
                    "message": messages::STALE,
                    "reason": "Invalid",
                },
            ],
        },
    })
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
        for v in p["spec"]["validations"].as_array().unwrap() {
            let e = v["expression"].as_str().unwrap();
            if e.contains("int(") {
                assert!(
                    e.starts_with("!(variables.oldOk && variables.newOk) || "),
                    "{e}"
                );
            }
        }
        for m in [
            messages::REMOVED,
            messages::MALFORMED,
            messages::SHARD,
            messages::STALE,
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
}
