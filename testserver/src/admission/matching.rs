//! Which writes a policy's `spec.matchConstraints` and a binding's `spec.matchResources` select, decided as
//! kube-apiserver's `matching.Matcher` decides (k8s.io/apiserver/pkg/admission/plugin/policy/matching, with
//! the namespace, object and rules predicates under …/plugin/webhook/predicates).
//!
//! In order: the `namespaceSelector` (a selector that cannot be evaluated is remembered, not yet an answer),
//! the `objectSelector` (likewise), `excludeResourceRules` (a hit excludes), `resourceRules` (none listed:
//! every request), and only then a remembered selector error.

use serde_json::Value;

use super::Attempt;
use crate::{labels::LabelSelector, store::Store};

/// The store key of Namespaces (`store_key("", "namespaces")`).
const NAMESPACES: &str = "/namespaces";

/// Whether criteria select a write.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Match {
    Yes,
    No,
    /// The rules select it but a selector cannot be evaluated: the real server's error text, such as
    /// `namespaces "x" not found` or `Internal error occurred: …` for a malformed selector.
    Error(String),
}

/// Whether `criteria` (a `MatchResources` object) select `attempt`.
pub(super) fn matches(store: &Store, criteria: &Value, attempt: &Attempt<'_>) -> Match {
    let namespace = namespace_selected(store, &criteria["namespaceSelector"], attempt);
    if namespace == Ok(false) {
        return Match::No;
    }
    let object = object_selected(&criteria["objectSelector"], attempt);
    if object == Ok(false) {
        return Match::No;
    }
    if any_rule(&criteria["excludeResourceRules"], attempt) {
        return Match::No;
    }
    let rules = &criteria["resourceRules"];
    if rules.as_array().is_some_and(|a| !a.is_empty()) && !any_rule(rules, attempt) {
        return Match::No;
    }
    match namespace.and(object) {
        Ok(_) => Match::Yes,
        Err(e) => Match::Error(e),
    }
}

/// The request's namespace as kube-apiserver's request info has it: the object's namespace, or for a
/// `namespaces` request other than a create, its name (the path is `/namespaces/{name}`).
pub(super) fn request_namespace<'a>(attempt: &Attempt<'a>) -> Option<&'a str> {
    attempt.namespace.filter(|n| !n.is_empty()).or_else(|| {
        (attempt.info.plural == "namespaces" && attempt.operation != "CREATE")
            .then_some(attempt.name)
    })
}

/// The request's namespace when the store has no Namespace by that name (`None` for a Namespace object
/// itself and for cluster-scoped objects). Once a binding applies, kube-apiserver reads that Namespace (for
/// CEL's `namespaceObject`) and a missing one ends the request with its 404.
pub(super) fn missing_namespace<'a>(store: &Store, attempt: &Attempt<'a>) -> Option<&'a str> {
    let info = attempt.info;
    if info.group.is_empty() && info.kind == "Namespace" {
        return None;
    }
    request_namespace(attempt).filter(|ns| store.get(NAMESPACES, ns).is_none())
}

/// A selector, or the real server's wording for one it cannot convert.
fn parse(selector: &Value) -> Result<LabelSelector, String> {
    LabelSelector::from_object(selector).map_err(|e| format!("Internal error occurred: {e}"))
}

/// kube-apiserver's `MatchNamespaceSelector`: a cluster-scoped object other than a Namespace is always
/// selected; a Namespace's create or update is matched on the object's own labels; anything else on the
/// stored Namespace's labels (missing: the 404's message).
fn namespace_selected(
    store: &Store,
    selector: &Value,
    attempt: &Attempt<'_>,
) -> Result<bool, String> {
    let of_namespaces = attempt.info.plural == "namespaces";
    let namespace = request_namespace(attempt);
    if namespace.is_none() && !of_namespaces {
        return Ok(true);
    }
    let selector = parse(selector)?;
    if selector.is_empty() {
        return Ok(true);
    }
    let write = matches!(attempt.operation, "CREATE" | "UPDATE");
    if of_namespaces && attempt.subresource.is_none() && write {
        return Ok(selector.matches(attempt.object));
    }
    let name = namespace.unwrap_or_default();
    match store.get(NAMESPACES, name) {
        Some(ns) => Ok(selector.matches(&ns.value)),
        None => Err(format!("namespaces \"{name}\" not found")),
    }
}

/// kube-apiserver's `MatchObjectSelector`: the object's labels or the old object's (a create has no old
/// object, a delete no object; an absent one never matches, even `DoesNotExist`).
fn object_selected(selector: &Value, attempt: &Attempt<'_>) -> Result<bool, String> {
    let selector = parse(selector)?;
    if selector.is_empty() {
        return Ok(true);
    }
    let labelled = |o: &Value| !o.is_null() && selector.matches(o);
    Ok(labelled(attempt.object) || attempt.old.is_some_and(labelled))
}

fn any_rule(rules: &Value, attempt: &Attempt<'_>) -> bool {
    rules
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| rule_matches(rule, attempt))
}

/// One `NamedRuleWithOperations`: scope, operations, apiGroups, apiVersions, resources, resourceNames.
fn rule_matches(rule: &Value, attempt: &Attempt<'_>) -> bool {
    let info = attempt.info;
    let sub = attempt.subresource.unwrap_or_default();
    let any = |list: &Value, want: &dyn Fn(&str) -> bool| {
        list.as_array()
            .is_some_and(|a| a.iter().filter_map(Value::as_str).any(want))
    };
    let named = rule["resourceNames"]
        .as_array()
        .is_none_or(|a| a.is_empty() || a.iter().any(|n| n == attempt.name));
    scope_matches(rule["scope"].as_str(), attempt)
        && any(&rule["apiGroups"], &|g| g == "*" || g == info.group)
        && any(&rule["apiVersions"], &|v| v == "*" || v == info.version)
        && any(&rule["operations"], &|o| o == "*" || o == attempt.operation)
        && any(&rule["resources"], &|r| {
            resource_matches(r, &info.plural, sub)
        })
        && named
}

/// `plural[/subresource]`, either part `*`; no subresource named means the main resource only (`*`:
/// every main resource), while `plural/*` is the resource and all its subresources.
fn resource_matches(rule: &str, plural: &str, sub: &str) -> bool {
    let (rp, rs) = rule.split_once('/').unwrap_or((rule, ""));
    (rp == "*" || rp == plural) && (rs == "*" || rs == sub)
}

/// A rule's `scope`: `Namespaced` (namespaced objects), `Cluster` (cluster-scoped objects and Namespaces),
/// `*` or unset (all).
fn scope_matches(scope: Option<&str>, attempt: &Attempt<'_>) -> bool {
    let info = attempt.info;
    let namespace_object =
        info.group.is_empty() && info.version == "v1" && info.plural == "namespaces";
    let namespaced = request_namespace(attempt).is_some();
    match scope {
        None | Some("*") => true,
        Some("Namespaced") => !namespace_object && namespaced,
        Some("Cluster") => namespace_object || !namespaced,
        Some(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::resource_matches;

    /// The forms kube-apiserver's rules matcher accepts (checked against v1.36.2: `configmaps/*` also
    /// selects a ConfigMap's create).
    #[test]
    fn resource_rules() {
        let main = |rule: &str, plural: &str| resource_matches(rule, plural, "");
        assert!(main("widgets", "widgets"));
        assert!(!resource_matches("widgets", "widgets", "status"));
        assert!(resource_matches("widgets/status", "widgets", "status"));
        assert!(main("*", "widgets"));
        assert!(!resource_matches("*", "widgets", "status"));
        assert!(resource_matches("*/status", "widgets", "status"));
        assert!(!main("*/status", "widgets"));
        assert!(resource_matches("*/*", "widgets", "scale"));
        assert!(main("*/*", "widgets"));
        assert!(resource_matches("widgets/*", "widgets", "status"));
        assert!(main("widgets/*", "widgets"));
        assert!(!main("gadgets", "widgets"));
    }
}
