//! ValidatingAdmissionPolicies (admissionregistration.k8s.io/v1) evaluated on writes (creates, updates and
//! single-object deletes, where `object` is null; not `deletecollection`), with kube-apiserver's
//! answer: **422, reason `Invalid`** (or the validation's `reason`), message `<plural>.<group> "<name>" is
//! forbidden: ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>`.
//!
//! Served, matching (in [`matching`], as kube-apiserver v1.36.2 matches, checked against it): a binding
//! applies when its policy's `matchConstraints` and the binding's own `matchResources` (if any) both select
//! the write. Each has `namespaceSelector` and `objectSelector` (`matchLabels`, `matchExpressions` with `In`,
//! `NotIn`, `Exists`, `DoesNotExist`; absent or empty: everything), `resourceRules` (none in a binding's
//! `matchResources`: whatever the policy selects) and `excludeResourceRules`. The namespace selector sees a
//! namespaced object's Namespace as stored, a Namespace's own new labels on its create or update (the stored
//! ones on its delete), and always selects other cluster-scoped objects; the object selector selects when
//! the object's or the old object's labels match (a create has no old object, a delete no object). Rules:
//! apiGroups, apiVersions, resources (`plural/subresource`, `*`, `*/status`, `plural/*` which includes the
//! main resource), operations, `scope`, resourceNames. Writes of admission configuration (webhook
//! configurations, admission policies and their bindings) are never subject to policies.
//! Served, evaluation: `variables` (evaluated in order, bound as `variables.<name>`), `validations`
//! (`expression`, `message`, `messageExpression`, `reason`), `failurePolicy`, bindings with
//! `validationActions` (`Deny` refuses; `Warn`/`Audit` alone do not).
//! Parameters: `paramKind` ConfigMap (`v1`) with a binding's `paramRef` by `name` or `selector`, in
//! `paramRef.namespace` or else the request's namespace; the policy is evaluated once per parameter found
//! (bound as `params`), and refuses when any evaluation fails; none found with `Allow` passes. CEL: the `cel`
//! interpreter with kube-cel's Kubernetes string, list and regex libraries; `object`, `oldObject`, `params`,
//! `request` (operation, name, namespace, dryRun, subResource, kind, resource, userInfo.username) are bound.
//!
//! Configuration errors refuse as the real server's do: under `failurePolicy: Fail` (the default), whatever
//! the binding's `validationActions`, 422 `Invalid` with `ValidatingAdmissionPolicy '<policy>' denied request:
//! failed to configure policy: <error>` (or `… with binding '<binding>' denied request: failed to configure
//! binding: <error>`); under `Ignore` the policy or binding is skipped. They are: a selector needing a
//! Namespace the store lacks (`namespaces "<ns>" not found`; an error only when the rest of the criteria
//! select the write), a `Deny` `parameterNotFoundAction` with no parameter found (`no params found for policy
//! binding with `Deny` parameterNotFoundAction`), a `paramRef` without namespace for a cluster-scoped object,
//! and what the real server refuses to store but testserver stores as sent: a policy without
//! `matchConstraints`, a malformed selector (an unknown operator, invalid key or value, `In` without values,
//! a wrong JSON type; message `Internal error occurred: <testserver's wording>`). None of these panics.
//! Once a binding applies to a namespaced write whose Namespace is missing (the real server then reads it,
//! for CEL's `namespaceObject`), the answer is that Namespace's 404 `namespaces "<ns>" not found`, whatever
//! the failurePolicy or any refusal before (on the real server only deletes get there: NamespaceLifecycle
//! refuses creates and updates in a missing namespace first).
//!
//! Not served: another `paramKind` than ConfigMap and a `paramKind` without `paramRef` or the reverse (such a
//! binding is skipped); `matchConditions` and `auditAnnotations` (ignored: the validations run as if every
//! condition held); `matchPolicy: Equivalent` (rules match the request's own group, version and resource
//! only); CEL's `namespaceObject` and `authorizer`; type checking of expressions. Policies and parameters
//! take effect at once (the real server loads policies asynchronously, in about a second, and parameters
//! through an informer: see `docs/fence-policy.md` for the measured lag). Compiled expressions are cached
//! per thread.

mod matching;

use std::collections::HashMap;

use kube_cel::{cel, KubeCelExt};
use serde_json::{json, Value};

use self::matching::Match;
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
    if exempt(attempt) {
        return Ok(());
    }
    let bindings = store.current(&store_key(GROUP, "validatingadmissionpolicybindings"), None);
    if bindings.is_empty() {
        return Ok(());
    }
    let policies = store.current(&store_key(GROUP, "validatingadmissionpolicies"), None);
    let mut walk = Walk {
        store,
        attempt,
        gone: matching::missing_namespace(store, attempt),
        first: None,
    };
    for policy in &policies {
        let bound: Vec<&Value> = bindings
            .iter()
            .map(|b| &b.value)
            .filter(|b| b["spec"]["policyName"].as_str() == Some(policy.name()))
            .collect();
        if !bound.is_empty() {
            walk.policy(&policy.value, &bound)?;
        }
    }
    walk.first.map_or(Ok(()), Err)
}

/// Writes of admission configuration (webhook configurations, admission policies and their bindings) are
/// never subject to policies, as on the real server.
fn exempt(attempt: &Attempt<'_>) -> bool {
    const KINDS: [&str; 6] = [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "MutatingAdmissionPolicy",
        "MutatingAdmissionPolicyBinding",
    ];
    attempt.info.group == GROUP && KINDS.contains(&attempt.info.kind.as_str())
}

/// kube-apiserver v1.36.2's error when a `Deny` binding finds no parameter.
const NO_PARAMS: &str = "no params found for policy binding with `Deny` parameterNotFoundAction";

/// One admission of a write over the policies that have bindings (kube-apiserver's validating dispatcher).
struct Walk<'a> {
    store: &'a Store,
    attempt: &'a Attempt<'a>,
    /// The request's namespace when the store lacks it: the first binding that applies ends the request
    /// with that Namespace's 404, whatever was refused before.
    gone: Option<&'a str>,
    /// The first refusal, kept while a 404 may still come (`gone`).
    first: Option<ApiError>,
}

impl Walk<'_> {
    fn policy(&mut self, policy: &Value, bindings: &[&Value]) -> ApiResult<()> {
        let (spec, name) = (
            &policy["spec"],
            policy["metadata"]["name"].as_str().unwrap_or_default(),
        );
        let constraints = &spec["matchConstraints"];
        let matched = if constraints.is_null() {
            Match::Error("policy contained no match constraints, a required field".to_owned())
        } else {
            matching::matches(self.store, constraints, self.attempt)
        };
        match matched {
            Match::No => Ok(()),
            Match::Error(e) => self.config_error(spec, name, None, &e),
            Match::Yes => bindings
                .iter()
                .try_for_each(|b| self.binding(spec, name, b)),
        }
    }

    fn binding(&mut self, spec: &Value, policy: &str, binding: &Value) -> ApiResult<()> {
        let name = binding["metadata"]["name"].as_str().unwrap_or_default();
        let b = &binding["spec"];
        if !b["matchResources"].is_null() {
            match matching::matches(self.store, &b["matchResources"], self.attempt) {
                Match::No => return Ok(()),
                Match::Error(e) => return self.config_error(spec, policy, Some(name), &e),
                Match::Yes => {}
            }
        }
        let params = match params_for(self.store, spec, b, self.attempt) {
            Params::Found(p) => p,
            Params::Skip => return Ok(()),
            Params::Error(e) => return self.config_error(spec, policy, Some(name), &e),
        };
        if let Some(ns) = self.gone {
            return Err(ApiError::not_found("", "namespaces", ns));
        }
        let deny = b["validationActions"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "Deny"));
        if !deny {
            return Ok(());
        }
        for param in &params {
            if let Some((reason, msg)) = evaluate(spec, self.attempt, param) {
                return self.refuse(denied(self.attempt, policy, Some(name), &reason, &msg));
            }
        }
        Ok(())
    }

    /// A configuration error (the real server's `addConfigError`): under `failurePolicy: Ignore` nothing,
    /// else a refusal, reason `Invalid`, whatever the binding's `validationActions`.
    fn config_error(
        &mut self,
        spec: &Value,
        policy: &str,
        binding: Option<&str>,
        err: &str,
    ) -> ApiResult<()> {
        if spec["failurePolicy"] == "Ignore" {
            return Ok(());
        }
        let what = if binding.is_some() {
            "binding"
        } else {
            "policy"
        };
        let msg = format!("failed to configure {what}: {err}");
        self.refuse(denied(self.attempt, policy, binding, "Invalid", &msg))
    }

    /// The refusal is the answer, unless a Namespace 404 may still come (kept as the first).
    fn refuse(&mut self, e: ApiError) -> ApiResult<()> {
        if self.gone.is_none() {
            return Err(e);
        }
        self.first.get_or_insert(e);
        Ok(())
    }
}

enum Params {
    /// Evaluate once per parameter (`Null`: the policy takes none; none at all: none found, `Allow`).
    Found(Vec<Value>),
    /// A form not served: the binding is skipped.
    Skip,
    /// The real server's configuration error for the binding.
    Error(String),
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
        .or(matching::request_namespace(attempt));
    let Some(ns) = ns else {
        return Params::Error(
            "cannot use namespaced paramRef in policy binding that matches cluster-scoped resources"
                .to_owned(),
        );
    };
    let found = match configmaps(store, ns, pref) {
        Ok(found) => found,
        Err(e) => return Params::Error(e),
    };
    if found.is_empty() && pref["parameterNotFoundAction"] != "Allow" {
        Params::Error(NO_PARAMS.to_owned())
    } else {
        Params::Found(found)
    }
}

/// The ConfigMaps in `ns` a `paramRef` names or selects (`Err`: a malformed selector).
fn configmaps(store: &Store, ns: &str, pref: &Value) -> Result<Vec<Value>, String> {
    let key = store_key("", "configmaps");
    if let Some(name) = pref["name"].as_str().filter(|n| !n.is_empty()) {
        let found = store.get(&key, &obj_key(Some(ns), name));
        return Ok(found.map(|o| o.value.clone()).into_iter().collect());
    }
    let selector = LabelSelector::from_object(&pref["selector"])?;
    Ok(store
        .current(&key, Some(ns))
        .iter()
        .filter(|o| selector.matches(&o.value))
        .map(|o| o.value.clone())
        .collect())
}

/// The refusal, as kube-apiserver words it (checked against v1.36.2); `binding` is `None` for an error of
/// the policy itself.
fn denied(
    attempt: &Attempt<'_>,
    policy: &str,
    binding: Option<&str>,
    reason: &str,
    msg: &str,
) -> ApiError {
    let info = attempt.info;
    let inner = match binding {
        Some(b) => {
            format!("ValidatingAdmissionPolicy '{policy}' with binding '{b}' denied request: {msg}")
        }
        None => format!("ValidatingAdmissionPolicy '{policy}' denied request: {msg}"),
    };
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

/// The first failing validation's `(reason, message)`, or `None` when all pass.
fn evaluate(spec: &Value, attempt: &Attempt<'_>, params: &Value) -> Option<(String, String)> {
    let fail_closed = spec["failurePolicy"].as_str() != Some("Ignore");
    let mut ctx = cel::Context::default();
    ctx.register_all();
    ctx.add_function("matches", matches_cached);
    // Binding converts the whole JSON tree into CEL values, twice (the interpreter's two value forms): the
    // cost of an admission on every write. Bind only what an expression of the policy names, and leave
    // out `managedFields` unless one names it — what no expression reads cannot change a result.
    let names = Referenced::of(spec);
    let bind = |ctx: &mut cel::Context<'_>, name: &str, v: &Value| {
        let value = if names.managed_fields {
            cel::to_value(v)
        } else {
            cel::to_value(without_managed_fields(v).as_ref())
        };
        ctx.add_variable_from_value(name.to_owned(), value.unwrap_or(cel::Value::Null));
    };
    if names.object {
        bind(&mut ctx, "object", attempt.object);
    }
    if names.old_object {
        bind(&mut ctx, "oldObject", attempt.old.unwrap_or(&Value::Null));
    }
    if names.request {
        bind(&mut ctx, "request", &request(attempt));
    }
    if names.params {
        bind(&mut ctx, "params", params);
    }
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

/// Which of the request's variables a policy's expressions name (by text: a name that only appears
/// inside a string literal binds a variable needlessly, never the reverse).
struct Referenced {
    object: bool,
    old_object: bool,
    request: bool,
    params: bool,
    managed_fields: bool,
}

impl Referenced {
    fn of(spec: &Value) -> Referenced {
        let mut all = String::new();
        for key in [
            "variables",
            "validations",
            "matchConditions",
            "auditAnnotations",
        ] {
            for item in spec[key].as_array().into_iter().flatten() {
                for field in ["expression", "messageExpression", "valueExpression"] {
                    if let Some(e) = item[field].as_str() {
                        all.push_str(e);
                        all.push('\n');
                    }
                }
            }
        }
        Referenced {
            // `oldObject` does not contain `object` (case-sensitive), so each is found on its own
            object: all.contains("object"),
            old_object: all.contains("oldObject"),
            request: all.contains("request"),
            params: all.contains("params"),
            managed_fields: all.contains("managedFields"),
        }
    }
}

/// `v` without `metadata.managedFields` (borrowed when it has none).
fn without_managed_fields(v: &Value) -> std::borrow::Cow<'_, Value> {
    if v["metadata"].get("managedFields").is_none() {
        return std::borrow::Cow::Borrowed(v);
    }
    let mut owned = v.clone();
    if let Some(meta) = owned["metadata"].as_object_mut() {
        meta.remove("managedFields");
    }
    std::borrow::Cow::Owned(owned)
}

/// CEL's `matches`, with the compiled pattern kept per thread (the interpreter's own compiles the regular
/// expression on every call: a fence policy matches two patterns on every write).
fn matches_cached(
    ftx: &cel::FunctionContext<'_, '_>,
    cel::extractors::This(this): cel::extractors::This<std::sync::Arc<String>>,
    pattern: std::sync::Arc<String>,
) -> Result<bool, cel::ExecutionError> {
    thread_local! {
        static PATTERNS: std::cell::RefCell<HashMap<String, regex::Regex>> = Default::default();
    }
    PATTERNS.with(|cache| {
        let mut cache = cache.borrow_mut();
        if !cache.contains_key(pattern.as_str()) {
            let re = regex::Regex::new(&pattern)
                .map_err(|err| ftx.error(format!("'{pattern}' not a valid regex:\n{err}")))?;
            if cache.len() >= PROGRAM_CACHE {
                cache.clear();
            }
            cache.insert(pattern.to_string(), re);
        }
        Ok(cache[pattern.as_str()].is_match(&this))
    })
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
    use super::*;

    fn configmaps() -> ResourceInfo {
        let kind = crate::kinds::KINDS
            .iter()
            .find(|k| k.group.is_empty() && k.plural == "configmaps")
            .expect("configmaps are built in");
        ResourceInfo::builtin(kind)
    }

    fn verdict(spec: Value, object: &Value, params: &Value) -> Option<(String, String)> {
        let info = configmaps();
        let attempt = Attempt {
            info: &info,
            operation: "UPDATE",
            subresource: None,
            namespace: Some("ns"),
            name: "cm",
            identity: "tester",
            dry_run: false,
            object,
            old: Some(object),
            fence_header: None,
        };
        evaluate(&spec, &attempt, params)
    }

    fn spec(expr: &str) -> Value {
        json!({"validations": [{"expression": expr, "message": "refused"}]})
    }

    #[test]
    fn an_expression_that_names_managed_fields_still_reads_them() {
        let object = json!({"metadata": {"name": "cm", "managedFields": [{"manager": "kubectl"}]}});
        let params = Value::Null;
        let reads = "object.metadata.managedFields[0].manager == 'kubectl'";
        assert_eq!(verdict(spec(reads), &object, &params), None);
        // and one that does not name them is evaluated without them, with the same answer
        assert_eq!(
            verdict(spec("object.metadata.name == 'cm'"), &object, &params),
            None
        );
        assert!(verdict(spec("object.metadata.name == 'other'"), &object, &params).is_some());
    }

    #[test]
    fn params_and_old_object_are_bound_when_named() {
        let object = json!({"metadata": {"name": "cm"}, "data": {"k": "v"}});
        let params = json!({"data": {"17": "4"}});
        let both =
            "params.data['17'] == '4' && oldObject.data.k == 'v' && request.operation == 'UPDATE'";
        assert_eq!(verdict(spec(both), &object, &params), None);
    }

    #[test]
    fn matches_keeps_its_answers_and_its_error_for_a_bad_pattern() {
        let object = json!({"metadata": {"name": "cm-17"}});
        let params = Value::Null;
        for _ in 0..2 {
            // the second round reads the kept pattern
            assert_eq!(
                verdict(
                    spec("object.metadata.name.matches('^cm-[0-9]+$')"),
                    &object,
                    &params
                ),
                None
            );
            assert!(
                verdict(spec("object.metadata.name.matches('^x')"), &object, &params).is_some()
            );
        }
        let (_, message) = verdict(spec("object.metadata.name.matches('(')"), &object, &params)
            .expect("a pattern that does not compile fails the expression (fail closed)");
        assert!(message.contains("not a valid regex"), "{message}");
    }
}
