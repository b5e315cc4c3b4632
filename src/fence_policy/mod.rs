//! Fences enforced by the apiserver itself: a generator of `ValidatingAdmissionPolicy` objects (CEL, GA since
//! Kubernetes 1.30, no webhook server) that refuse the writes a deposed owner may still send.
//!
//! - **Per object**: an UPDATE is refused when its fence token ([`crate::token`]) is behind the stored
//!   object's, names another shard, is malformed, or was removed.
//! - **Status field** ([`FencePolicyConfig::status_field`]): the same rules on a CRD's `/status` writes.
//! - **Per shard** ([`FencePolicyConfig::params`]): a write below its shard's current epoch, which the
//!   coordinator publishes ([`crate::group::ShardGroupBuilder::fence_params`]), is refused.
//! - **Minimum failover epoch** ([`FencePolicyConfig::min_epoch`]): the HA floor, probed by [`MIN_EPOCH_PROBE`].
//!
//! Pure: the objects are returned typed (for [`kube::Api::create`]) and as YAML. See `docs/fence-policy.md`.
//!
//! ```
//! use kube_shard::fence_policy::{FencePolicyConfig, PolicyResource};
//!
//! let config = FencePolicyConfig::new(vec!["widgets.example.com".parse().unwrap()]);
//! let set = config.generate().unwrap();
//! assert_eq!(set.policies.len(), 1);
//! assert!(set.to_yaml().contains("kind: ValidatingAdmissionPolicyBinding"));
//! ```

mod config;
mod min_epoch;
mod policies;
mod status_field;
mod types;

pub use config::{FencePolicyConfig, PolicySet};
pub use min_epoch::{MinEpoch, MIN_EPOCH_KEY, MIN_EPOCH_PROBE, MIN_EPOCH_SUFFIX, ROLE_KEY};
pub use status_field::StatusFenceField;
pub(crate) use types::messages;
pub use types::{
    ParamsRef, PolicyError, PolicyResource, DEFAULT_POLICY_NAME, EPOCH_PATTERN,
    SHARD_POLICY_SUFFIX, STATUS_POLICY_SUFFIX, TOKEN_PATTERN,
};

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
