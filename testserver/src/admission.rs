//! ValidatingAdmissionPolicies (admissionregistration.k8s.io/v1) evaluated on writes (creates, updates and
//! single-object deletes, where `object` is null; not `deletecollection`), with kube-apiserver's
//! answer: **422, reason `Invalid`** (or the validation's `reason`), message `<plural>.<group> "<name>" is
//! forbidden: ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>`.
//!
//! Served: `matchConstraints.resourceRules` and `excludeResourceRules` (apiGroups, apiVersions, resources incl.
//! `plural/subresource`, `*` and `*/status`, operations, resourceNames), `variables` (evaluated in order, bound
//! as `variables.<name>`), `validations` (`expression`, `message`, `messageExpression`, `reason`),
//! `failurePolicy`, bindings with `validationActions` (`Deny` refuses; `Warn`/`Audit` alone do not).
//! Parameters: `paramKind` ConfigMap (`v1`) with a binding's `paramRef` by `name` or `selector` (`matchLabels`,
//! `matchExpressions`), in `paramRef.namespace` or else the request's namespace; the policy is evaluated once
//! per parameter found (bound as `params`), and refuses when any evaluation fails; none found with
//! `parameterNotFoundAction: Deny` (or unset) refuses as kube-apiserver v1.36.2 does (`failed to configure
//! binding: no params found for policy binding with `Deny` parameterNotFoundAction`), with `Allow` the binding
//! is skipped. CEL: the `cel` interpreter with kube-cel's Kubernetes string, list and regex libraries;
//! `object`, `oldObject`, `params`, `request` (operation, name, namespace, dryRun, subResource, kind, resource,
//! userInfo.username) are bound.
//! Not served (a binding that needs them is skipped): another `paramKind` than ConfigMap, a `paramKind`
//! without `paramRef` or the reverse, `matchConditions`, namespace and object selectors, a binding's own
//! `matchResources`, `auditAnnotations`; no type checking of expressions. Policies and parameters take effect
//! at once (the real server loads policies asynchronously, in about a second, and parameters through an
//! informer: see `docs/fence-policy.md` for the measured lag). Compiled expressions are cached per thread.

use std::collections::HashMap;

use kube_cel::{cel, KubeCelExt};
use serde_json::{json, Value};

use crate::{
    labels::LabelSelector,
    resources::{store_key, ResourceInfo},
    status::{qualified, ApiError, ApiResult},
    store::{obj_key, Store},
};

const GROUP: &str = "admissionregistration.k8s.io";

/// The write being admitted.
pub(crate) struct Attempt<'a> {
    pub(crate) info: &'a ResourceInfo,
    /// `CREATE`, `UPDATE` or `DELETE` (a single-object delete: `object` is null).
    pub(crate) operation: &'static str,
    pub(crate) subresource: Option<&'a str>,
    pub(crate) namespace: Option<&'a str>,
    pub(crate) name: &'a str,
    pub(crate) identity: &'a str,
    pub(crate) dry_run: bool,
    pub(crate) object: &'a Value,
    pub(crate) old: Option<&'a Value>,
    /// The `x-kube-shard-fence` header, for the refusal log.
    pub(crate) fence_header: Option<&'a str>,
}

/// [`admit`], a refusal recorded in `log` (with the store's resourceVersion).
pub(crate) fn admit_logged(
    log: &crate::refusals::RefusalLog,
    store: &Store,
    attempt: &Attempt<'_>,
) -> ApiResult<()> {
    admit(store, attempt).inspect_err(|e| log.record(store.rv, attempt, &e.message))
}

/// Refuse `attempt` when a bound policy denies it.
pub(crate) fn admit(store: &Store, attempt: &Attempt<'_>) -> ApiResult<()> {
    let bindings = store.current(&store_key(GROUP, "validatingadmissionpolicybindings"), None);
    if bindings.is_empty() {
        return Ok(());
    }
    let policies = store.current(&store_key(GROUP, "validatingadmissionpolicies"), None);
    for binding in &bindings {
        let b = &binding.value;
        let Some(pname) = b["spec"]["policyName"].as_str() else {
            continue;
        };
        let deny = b["spec"]["validationActions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "Deny"));
        if !deny {
            continue;
        }
        let Some(policy) = policies.iter().find(|p| p.name() == pname) else {
            continue;
        };
        let spec = &policy.value["spec"];
        if !matches(&spec["matchConstraints"], attempt) {
            continue;
        }
        let bname = b["metadata"]["name"].as_str().unwrap_or_default();
        let params = match params_for(store, spec, &b["spec"], attempt) {
            Params::Found(p) => p,
            Params::Skip => continue,
            Params::NotFound => {
                return Err(denied(attempt, pname, bname, "Invalid", NO_PARAMS));
            }
        };
        for param in &params {
            if let Some((reason, msg)) = evaluate(spec, attempt, param) {
                return Err(denied(attempt, pname, bname, &reason, &msg));
            }
        }
    }
    Ok(())
}

/// kube-apiserver v1.36.2's message when a `Deny` binding finds no parameter.
const NO_PARAMS: &str =
    "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction";

enum Params {
    /// Evaluate once per parameter (`Null`: the policy takes none).
    Found(Vec<Value>),
    /// The binding does not apply (`Allow` and none found, or a form not served).
    Skip,
    /// None found, `Deny`: refuse.
    NotFound,
}

/// The parameters a binding selects for `attempt`.
fn params_for(store: &Store, policy: &Value, binding: &Value, attempt: &Attempt<'_>) -> Params {
    let (kind, pref) = (&policy["paramKind"], &binding["paramRef"]);
    match (kind.is_null(), pref.is_null()) {
        (true, true) => return Params::Found(vec![Value::Null]),
        (false, false) => {}
        _ => return Params::Skip,
    }
    if kind["apiVersion"] != "v1" || kind["kind"] != "ConfigMap" {
        return Params::Skip;
    }
    let ns = pref["namespace"]
        .as_str()
        .filter(|n| !n.is_empty())
        .or(attempt.namespace);
    let key = store_key("", "configmaps");
    let found: Vec<Value> = if let Some(name) = pref["name"].as_str().filter(|n| !n.is_empty()) {
        store
            .get(&key, &obj_key(ns, name))
            .map(|o| o.value.clone())
            .into_iter()
            .collect()
    } else {
        let Some(selector) = label_selector(&pref["selector"]) else {
            return Params::Skip;
        };
        store
            .current(&key, ns)
            .iter()
            .filter(|o| selector.matches(&o.value))
            .map(|o| o.value.clone())
            .collect()
    };
    if !found.is_empty() {
        Params::Found(found)
    } else if pref["parameterNotFoundAction"] == "Allow" {
        Params::Skip
    } else {
        Params::NotFound
    }
}

/// A `metav1.LabelSelector` object as a parsed selector (`None`: malformed).
fn label_selector(sel: &Value) -> Option<LabelSelector> {
    let mut parts: Vec<String> = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        for (k, v) in m {
            parts.push(format!("{k}={}", v.as_str()?));
        }
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str()?;
        let values: Vec<&str> = e["values"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        parts.push(match e["operator"].as_str()? {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.to_owned(),
            "DoesNotExist" => format!("!{key}"),
            _ => return None,
        });
    }
    LabelSelector::parse(&parts.join(",")).ok()
}

/// The refusal, as kube-apiserver words it (checked against v1.36.2).
fn denied(attempt: &Attempt<'_>, policy: &str, binding: &str, reason: &str, msg: &str) -> ApiError {
    let info = attempt.info;
    let inner = format!(
        "ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {msg}"
    );
    let (code, reason) = match reason {
        "Forbidden" => (403, "Forbidden"),
        "Unauthorized" => (401, "Unauthorized"),
        "RequestEntityTooLarge" => (413, "RequestEntityTooLarge"),
        _ => (422, "Invalid"),
    };
    let what = qualified(&info.group, &info.plural);
    let mut details =
        json!({"name": attempt.name, "kind": info.plural, "causes": [{"message": inner}]});
    if !info.group.is_empty() {
        details["group"] = json!(info.group);
    }
    ApiError::new(
        code,
        Some(reason),
        format!("{what} \"{}\" is forbidden: {inner}", attempt.name),
    )
    .with_details(details)
}

fn matches(constraints: &Value, attempt: &Attempt<'_>) -> bool {
    let hit = |rules: &Value| {
        rules
            .as_array()
            .into_iter()
            .flatten()
            .any(|rule| rule_matches(rule, attempt))
    };
    hit(&constraints["resourceRules"]) && !hit(&constraints["excludeResourceRules"])
}

fn rule_matches(rule: &Value, attempt: &Attempt<'_>) -> bool {
    let info = attempt.info;
    let resource = match attempt.subresource {
        Some(sub) => format!("{}/{sub}", info.plural),
        None => info.plural.clone(),
    };
    let any = |list: &Value, want: &dyn Fn(&str) -> bool| {
        list.as_array()
            .is_some_and(|a| a.iter().filter_map(Value::as_str).any(want))
    };
    let named = rule["resourceNames"]
        .as_array()
        .is_none_or(|a| a.is_empty() || a.iter().any(|n| n == attempt.name));
    any(&rule["apiGroups"], &|g| g == "*" || g == info.group)
        && any(&rule["apiVersions"], &|v| v == "*" || v == info.version)
        && any(&rule["operations"], &|o| o == "*" || o == attempt.operation)
        && any(&rule["resources"], &|r| resource_matches(r, &resource))
        && named
}

/// `*` (main resources), `*/*`, `*/status`, `plural/*`, or exact.
fn resource_matches(rule: &str, resource: &str) -> bool {
    let (rp, rs) = rule.split_once('/').unwrap_or((rule, ""));
    let (p, s) = resource.split_once('/').unwrap_or((resource, ""));
    (rp == "*" || rp == p) && (rs == s || (rs == "*" && !s.is_empty()) || (rule == "*/*"))
}

/// The first failing validation's `(reason, message)`, or `None` when all pass.
fn evaluate(spec: &Value, attempt: &Attempt<'_>, params: &Value) -> Option<(String, String)> {
    let fail_closed = spec["failurePolicy"].as_str() != Some("Ignore");
    let mut ctx = cel::Context::default();
    ctx.register_all();
    let bind = |ctx: &mut cel::Context<'_>, name: &str, v: &Value| {
        let value = cel::to_value(v).unwrap_or(cel::Value::Null);
        ctx.add_variable_from_value(name.to_owned(), value);
    };
    bind(&mut ctx, "object", attempt.object);
    bind(&mut ctx, "oldObject", attempt.old.unwrap_or(&Value::Null));
    bind(&mut ctx, "request", &request(attempt));
    bind(&mut ctx, "params", params);
    let mut variables: HashMap<String, cel::Value> = HashMap::new();
    for var in spec["variables"].as_array().into_iter().flatten() {
        let (Some(name), Some(expr)) = (var["name"].as_str(), var["expression"].as_str()) else {
            continue;
        };
        ctx.add_variable_from_value("variables", variables.clone());
        // A variable that fails is left unbound: an expression that uses it then fails.
        if let Ok(v) = run(&ctx, expr) {
            variables.insert(name.to_owned(), v);
        }
    }
    ctx.add_variable_from_value("variables", variables);
    for validation in spec["validations"].as_array().into_iter().flatten() {
        let expr = validation["expression"].as_str().unwrap_or_default();
        let reason = validation["reason"]
            .as_str()
            .unwrap_or("Invalid")
            .to_owned();
        let message = match run(&ctx, expr) {
            Ok(cel::Value::Bool(true)) => continue,
            Ok(cel::Value::Bool(false)) => message(&ctx, validation, expr),
            Ok(_) if fail_closed => {
                format!("expression '{expr}' resulted in error: no such overload")
            }
            Err(e) if fail_closed => format!("expression '{expr}' resulted in error: {e}"),
            _ => continue,
        };
        return Some((reason, message));
    }
    None
}

fn message(ctx: &cel::Context<'_>, validation: &Value, expr: &str) -> String {
    if let Some(me) = validation["messageExpression"].as_str() {
        if let Ok(cel::Value::String(s)) = run(ctx, me) {
            if !s.trim().is_empty() {
                return s.to_string();
            }
        }
    }
    match validation["message"].as_str() {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => format!("failed expression: {expr}"),
    }
}

thread_local! {
    /// Compiled expressions by source, per thread: policies change rarely, writes are many (compiling every
    /// expression on every write made a fenced write cost milliseconds).
    static PROGRAMS: std::cell::RefCell<HashMap<String, cel::Program>> = Default::default();
}

/// Compiled programs kept per thread at most (then the cache starts over).
const PROGRAM_CACHE: usize = 512;

/// Compile every CEL expression `policies` (ValidatingAdmissionPolicy objects or their specs) would run —
/// `variables`, `validations` and their `messageExpression`s — and drop the programs. What it leaves behind
/// is the CEL parser's process-wide state (the ANTLR parser's lazily built ATN and its DFA and
/// prediction-context caches, `lazy_static`s of the `cel` crate): parsing an expression the first time in
/// a process walks the ATN and creates std `HashMap`s and `HashSet`s on the calling thread, each of which
/// moves that thread's hash keys on; parsing it again walks the cached DFA and creates none. See
/// [`crate::warm_admission`].
pub(crate) fn warm(policies: &[Value]) {
    for p in policies {
        let spec = if p["spec"].is_object() { &p["spec"] } else { p };
        let variables = spec["variables"].as_array().into_iter().flatten();
        let validations = spec["validations"].as_array().into_iter().flatten();
        let exprs = variables
            .filter_map(|v| v["expression"].as_str())
            .chain(validations.flat_map(|v| {
                [v["expression"].as_str(), v["messageExpression"].as_str()]
                    .into_iter()
                    .flatten()
            }));
        for e in exprs {
            let _ = cel::Program::compile(e);
        }
    }
}

fn run(ctx: &cel::Context<'_>, expr: &str) -> Result<cel::Value, String> {
    PROGRAMS.with(|cache| {
        let mut cache = cache.borrow_mut();
        if !cache.contains_key(expr) {
            let program = cel::Program::compile(expr).map_err(|e| e.to_string())?;
            if cache.len() >= PROGRAM_CACHE {
                cache.clear();
            }
            cache.insert(expr.to_owned(), program);
        }
        cache[expr].execute(ctx).map_err(|e| e.to_string())
    })
}

fn request(attempt: &Attempt<'_>) -> Value {
    let info = attempt.info;
    json!({
        "operation": attempt.operation,
        "name": attempt.name,
        "namespace": attempt.namespace.unwrap_or_default(),
        "dryRun": attempt.dry_run,
        "subResource": attempt.subresource.unwrap_or_default(),
        "kind": {"group": info.group, "version": info.version, "kind": info.kind},
        "resource": {"group": info.group, "version": info.version, "resource": info.plural},
        "userInfo": {"username": attempt.identity},
    })
}

#[cfg(test)]
mod tests {
    use super::resource_matches;

    #[test]
    fn resource_rules() {
        assert!(resource_matches("widgets", "widgets"));
        assert!(!resource_matches("widgets", "widgets/status"));
        assert!(resource_matches("widgets/status", "widgets/status"));
        assert!(resource_matches("*", "widgets"));
        assert!(!resource_matches("*", "widgets/status"));
        assert!(resource_matches("*/status", "widgets/status"));
        assert!(resource_matches("*/*", "widgets/scale"));
        assert!(resource_matches("widgets/*", "widgets/status"));
        assert!(!resource_matches("widgets/*", "widgets"));
        assert!(!resource_matches("gadgets", "widgets"));
    }
}
