//! The schema check at start (HA.md "The mirror": "served versions and a schema hash are compared on
//! both sides"): a mirrored custom resource must be defined alike on the source and the target —
//! the same scope, and per version the same `served` flag, schema and subresources — or the mirror
//! refuses to start with the first difference named. Copies of an object whose schema differs would
//! be pruned, defaulted or refused differently by the target, and the poison list would fill with them.
//! Built-in kinds have no definition to compare: their group/version and scope are compared by the
//! mirror's discovery. A kind an aggregated API server serves (its APIService names a service) is refused.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::{Api, Client};
use serde_json::Value;
use tracing::warn;

use super::error::{api_err, MirrorError};
use crate::checkpoint::Kind;

/// What a definition fixes for the copies: per version name, (`served`, schema, subresources); and
/// the scope.
fn shape(crd: &CustomResourceDefinition) -> (String, BTreeMap<String, Value>) {
    let versions = crd
        .spec
        .versions
        .iter()
        .map(|v| {
            let mut m = serde_json::Map::new();
            m.insert("served".into(), Value::Bool(v.served));
            m.insert(
                "schema".into(),
                serde_json::to_value(&v.schema).unwrap_or(Value::Null),
            );
            m.insert(
                "subresources".into(),
                serde_json::to_value(&v.subresources).unwrap_or(Value::Null),
            );
            (v.name.clone(), Value::Object(m))
        })
        .collect();
    (crd.spec.scope.clone(), versions)
}

/// The first difference between the source's and the target's definitions (`None`: alike).
#[must_use]
pub fn differs(
    source: &CustomResourceDefinition,
    target: &CustomResourceDefinition,
) -> Option<String> {
    let ((ss, sv), (ts, tv)) = (shape(source), shape(target));
    if ss != ts {
        return Some(format!("scope {ss} on the source, {ts} on the target"));
    }
    for (name, s) in &sv {
        let Some(t) = tv.get(name) else {
            return Some(format!("version {name} is not defined on the target"));
        };
        for field in ["served", "schema", "subresources"] {
            if s.get(field) != t.get(field) {
                return Some(format!("version {name}: {field} differs"));
            }
        }
    }
    tv.keys()
        .find(|n| !sv.contains_key(*n))
        .map(|n| format!("version {n} is defined on the target only"))
}

async fn definition(
    c: &Client,
    name: &str,
    side: &str,
) -> Result<Option<CustomResourceDefinition>, MirrorError> {
    Api::<CustomResourceDefinition>::all(c.clone())
        .get_opt(name)
        .await
        .map_err(api_err(format!(
            "reading the definition {name} on the {side}"
        )))
}

/// The service behind `kind`'s group and version when an aggregated API server serves it (its
/// APIService names a service; a local one, as every built-in and CRD group has, names none). `None`
/// also when the APIService cannot be read (no permission: the check is skipped, with a warning).
async fn aggregated(c: &Client, kind: &Kind, side: &str) -> Result<Option<String>, MirrorError> {
    let name = format!("{}.{}", kind.version, kind.group);
    match Api::<APIService>::all(c.clone()).get_opt(&name).await {
        Ok(a) => Ok(a.and_then(|a| a.spec.and_then(|s| s.service)).map(|s| {
            format!(
                "{}/{}",
                s.namespace.unwrap_or_default(),
                s.name.unwrap_or_default()
            )
        })),
        Err(kube::Error::Api(e)) if matches!(e.code, 401 | 403) => {
            warn!(kind = %kind.key(), side, "mirror: cannot read APIService {name} ({}): not checked for an aggregated API", e.code);
            Ok(None)
        }
        Err(e) => Err(api_err(format!(
            "reading the APIService {name} on the {side}"
        ))(e)),
    }
}

/// Compare `kind`'s definitions on both sides (core and built-in groups have none: nothing to do), and
/// refuse a kind an aggregated API server serves: its resourceVersions, consistent LISTs and admission
/// (the switchover freeze) are that server's, not the cluster's, and the mirror's rules rest on them.
pub(super) async fn check(
    source: &Client,
    target: &Client,
    kind: &Kind,
) -> Result<(), MirrorError> {
    if kind.group.is_empty() {
        return Ok(());
    }
    for (c, side) in [(source, "source"), (target, "target")] {
        if let Some(service) = aggregated(c, kind, side).await? {
            return Err(MirrorError::Kind(
                kind.key(),
                format!("served by an aggregated API server on the {side} (service {service}): not mirrored"),
            ));
        }
    }
    if !kind.group.contains('.') {
        return Ok(());
    }
    let name = format!("{}.{}", kind.plural, kind.group);
    let (s, t) = (
        definition(source, &name, "source").await?,
        definition(target, &name, "target").await?,
    );
    let why = match (s, t) {
        (None, None) => return Ok(()), // a built-in group (apps, batch.…): discovery compared it
        (Some(_), None) => "defined on the source only".to_string(),
        (None, Some(_)) => "defined on the target only".to_string(),
        (Some(s), Some(t)) => match differs(&s, &t) {
            None => return Ok(()),
            Some(d) => d,
        },
    };
    Err(MirrorError::Kind(
        kind.key(),
        format!("the two clusters define it differently ({why}): install the same CRD on both"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(scope: &str, versions: Value) -> CustomResourceDefinition {
        serde_json::from_value(json!({
            "metadata": {"name": "widgets.example.com"},
            "spec": {
                "group": "example.com", "scope": scope,
                "names": {"plural": "widgets", "kind": "Widget"},
                "versions": versions,
            }
        }))
        .unwrap()
    }

    fn v1(extra: Value) -> Value {
        json!({"name": "v1", "served": true, "storage": true,
               "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": extra}}},
               "subresources": {"status": {}}})
    }

    #[test]
    fn alike_definitions_pass_and_each_difference_is_named() {
        let base = crd("Namespaced", json!([v1(json!({"type": "object"}))]));
        assert_eq!(differs(&base, &base.clone()), None);
        let cases = [
            (
                crd("Cluster", json!([v1(json!({"type": "object"}))])),
                "scope",
            ),
            (
                crd("Namespaced", json!([v1(json!({"type": "string"}))])),
                "schema differs",
            ),
            (
                crd(
                    "Namespaced",
                    json!([v1(json!({"type": "object"})), {"name": "v2", "served": true, "storage": false}]),
                ),
                "v2 is defined on the target only",
            ),
            (crd("Namespaced", json!([])), "not defined on the target"),
        ];
        for (target, want) in cases {
            let d = differs(&base, &target).expect("a difference");
            assert!(d.contains(want), "{d} lacks {want}");
        }
        let mut no_status = v1(json!({"type": "object"}));
        no_status["subresources"] = json!({});
        let d = differs(&base, &crd("Namespaced", json!([no_status]))).unwrap();
        assert!(d.contains("subresources"), "{d}");
        // the storage version may differ (a migration in progress on one side)
        let mut other_storage = v1(json!({"type": "object"}));
        other_storage["storage"] = json!(false);
        assert_eq!(
            differs(&base, &crd("Namespaced", json!([other_storage]))),
            None
        );
    }
}
