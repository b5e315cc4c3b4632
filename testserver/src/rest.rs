//! Object semantics: create, get, update, patch, delete, deletecollection and the `/status` subresource,
//! as kube-apiserver's generic registry implements them for the served resources, plus the controllers
//! that run inside kube-apiserver itself (CRD establishment and instance cleanup).

use std::sync::Arc;

use kube_shard::token::{FENCE_ANNOTATION, FENCE_HEADER};
use serde_json::{json, Map, Value};

use crate::{
    accounting::Verb,
    audit::{FenceSource, RawFence, WriteFacts},
    controllers,
    history::Writer,
    resources::{ResourceInfo, CRD_GROUP},
    server::Inner,
    status::{qualified, ApiError, ApiResult},
    store::{obj_key, Change, ChangeKind, Obj, Store},
};

/// Who writes, and what they sent beside the body.
#[derive(Debug)]
pub(crate) struct WriteCtx<'a> {
    pub(crate) inner: &'a Inner,
    pub(crate) identity: &'a str,
    pub(crate) verb: Verb,
    pub(crate) fence_header: Option<String>,
    pub(crate) dry_run: bool,
    /// A server-side apply (its create path tolerates a resourceVersion).
    pub(crate) apply: bool,
    /// The field manager: the `fieldManager` parameter, else the User-Agent up to its first `/`.
    pub(crate) manager: String,
    /// The subresource written (`status`, `scale`, ...), for `managedFields`.
    pub(crate) subresource: Option<String>,
    /// `force=true`: an apply takes over conflicting fields.
    pub(crate) force: bool,
}

impl WriteCtx<'_> {
    fn writer<'w>(&'w self, api_version: &'w str, now: &'w str) -> crate::ssa::Writer<'w> {
        crate::ssa::Writer {
            manager: &self.manager,
            subresource: self.subresource.as_deref(),
            api_version,
            now,
        }
    }
}

/// What a handler answers.
#[derive(Debug)]
pub(crate) enum Reply {
    Object {
        code: u16,
        info: Arc<ResourceInfo>,
        obj: Arc<Obj>,
    },
    Json {
        code: u16,
        value: Value,
    },
}

pub(crate) fn system_ctx(inner: &Inner) -> WriteCtx<'_> {
    WriteCtx {
        inner,
        identity: "system:apiserver",
        verb: Verb::Create,
        fence_header: None,
        dry_run: false,
        apply: false,
        manager: "kube-apiserver".into(),
        subresource: None,
        force: false,
    }
}

/// The namespaces kube-apiserver creates itself.
pub(crate) fn bootstrap(inner: &Inner) {
    let mut store = inner.lock_store();
    let info = store
        .registry
        .get("", "v1", "namespaces")
        .expect("namespaces are built in");
    let ctx = system_ctx(inner);
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        create_locked(&mut store, &ctx, &info, None, obj, false).expect("bootstrap namespace");
    }
    let services = store
        .registry
        .get("", "v1", "services")
        .expect("services are built in");
    let kubernetes = json!({
        "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"clusterIP": crate::builtins::kubernetes_service_ip(),
                 "ports": [{"name": "https", "port": 443, "targetPort": 6443}]},
    });
    create_locked(
        &mut store,
        &ctx,
        &services,
        Some("default"),
        kubernetes,
        false,
    )
    .expect("bootstrap the kubernetes service");
    store.compact();
    drop(store);
    publish_rv(inner);
}

pub(crate) fn publish_rv(inner: &Inner) {
    let rv = inner.lock_store().rv;
    inner.rv_tx.send_if_modified(|v| {
        let changed = *v != rv;
        *v = rv;
        changed
    });
}

pub(crate) fn parse_body(body: &[u8]) -> ApiResult<Value> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}"))
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "couldn't get version/kind; json parse error: the body is not a JSON object",
        ));
    }
    Ok(v)
}

fn check_type(info: &ResourceInfo, obj: &mut Value) -> ApiResult<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "couldn't get version/kind; json parse error: the object is not a JSON object",
        ));
    }
    let want = info.api_version();
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str) {
        if av != want {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({av}) does not match the expected API version ({want})"
            )));
        }
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str) {
        if k != info.kind {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                info.kind
            )));
        }
    }
    obj["apiVersion"] = json!(want);
    obj["kind"] = json!(info.kind);
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    Ok(())
}

/// What the typed decoding of `ObjectMeta` (and of configmap/secret data) would refuse: 400 for wrong
/// JSON types, 422 for invalid label keys and values.
fn validate(info: &ResourceInfo, obj: &Value) -> ApiResult<()> {
    let decode = |field: &str, want: &str| {
        ApiError::bad_request(format!(
            "json: cannot unmarshal into Go struct field {}.{field} of type {want}",
            info.kind
        ))
    };
    let meta = obj["metadata"]
        .as_object()
        .ok_or_else(|| decode("metadata", "v1.ObjectMeta"))?;
    for f in [
        "name",
        "generateName",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
    ] {
        if meta.get(f).is_some_and(|v| !v.is_string() && !v.is_null()) {
            return Err(decode(&format!("metadata.{f}"), "string"));
        }
    }
    let string_map = |v: Option<&Value>| {
        v.is_none_or(|v| {
            v.is_null()
                || v.as_object()
                    .is_some_and(|m| m.values().all(Value::is_string))
        })
    };
    for f in ["labels", "annotations"] {
        if !string_map(meta.get(f)) {
            return Err(decode(&format!("metadata.{f}"), "map[string]string"));
        }
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let v = v.as_str().unwrap_or_default();
            if !crate::labels::valid_key(k) || !crate::labels::valid_value(v) {
                let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
                return Err(ApiError::invalid(
                    &info.group,
                    &info.kind,
                    name,
                    "metadata.labels",
                    &format!("Invalid value: {v:?}: a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"),
                ));
            }
        }
    }
    if meta.get("finalizers").is_some_and(|v| {
        !v.is_null() && !v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
    }) {
        return Err(decode("metadata.finalizers", "[]string"));
    }
    if meta.get("ownerReferences").is_some_and(|v| {
        !v.is_null()
            && !v.as_array().is_some_and(|a| {
                a.iter().all(|r| {
                    ["apiVersion", "kind", "name", "uid"]
                        .iter()
                        .all(|f| r[f].is_string())
                })
            })
    }) {
        return Err(decode("metadata.ownerReferences", "[]v1.OwnerReference"));
    }
    if info.builtin && (info.plural == "configmaps" || info.plural == "secrets") {
        for f in ["data", "binaryData", "stringData"] {
            if !string_map(obj.get(f)) {
                return Err(decode(f, "map[string]string"));
            }
        }
    }
    Ok(())
}

fn valid_name(info: &ResourceInfo, name: &str) -> Result<(), String> {
    let label = info.plural == "namespaces";
    let max = if label { 63 } else { 253 };
    let ok_chars = name.bytes().all(|b| {
        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (!label && b == b'.')
    });
    let ends = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if name.is_empty()
        || name.len() > max
        || !ok_chars
        || !ends(name.as_bytes().first())
        || !ends(name.as_bytes().last())
    {
        Err(if label {
            format!("Invalid value: {name:?}: a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
        } else {
            format!("Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
        })
    } else {
        Ok(())
    }
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj["metadata"].get(field).and_then(Value::as_str)
}

fn annotation_fence(obj: &Value) -> Option<String> {
    obj["metadata"]["annotations"]
        .get(FENCE_ANNOTATION)
        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
}

/// The fence a write carries: the header wins, else the annotation in the body (main resource only).
fn fence_of(ctx: &WriteCtx<'_>, body: Option<&Value>) -> Option<RawFence> {
    if let Some(h) = &ctx.fence_header {
        return Some(RawFence {
            raw: h.clone(),
            source: FenceSource::Header,
        });
    }
    body.and_then(annotation_fence).map(|raw| RawFence {
        raw,
        source: FenceSource::Annotation,
    })
}

/// The fence of a write that carries no object of its own (a subresource): the header only.
pub(crate) fn header_fence(ctx: &WriteCtx<'_>) -> Option<RawFence> {
    fence_of(ctx, None)
}

/// The header name, for the HTTP layer.
pub(crate) const FENCE_HEADER_NAME: &str = FENCE_HEADER;

fn audit(ctx: &WriteCtx<'_>, info: &ResourceInfo, fence: Option<&RawFence>, change: &Change) {
    if let Some(f) = fence {
        ctx.inner.auditor.record(
            f,
            &WriteFacts {
                identity: ctx.identity,
                verb: ctx.verb,
                resource: qualified(&info.group, &info.plural),
                namespace: &change.obj.namespace,
                name: change.obj.name(),
                uid: &change.obj.uid,
                rv: change.rv,
            },
        );
    }
}

/// Commit, then run what kube-apiserver runs itself (and the opt-in controllers).
fn commit(
    store: &mut Store,
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    key: String,
    value: Value,
    delete: bool,
    fence: Option<&RawFence>,
) -> Arc<Change> {
    let change = store.commit(info, key, value, delete);
    audit(ctx, info, fence, &change);
    ctx.inner.recorder.commit(
        Writer {
            identity: ctx.identity,
            verb: ctx.verb,
            fence,
        },
        info,
        &change,
    );
    after_commit(store, ctx, info, &change);
    change
}

fn after_commit(store: &mut Store, ctx: &WriteCtx<'_>, info: &ResourceInfo, change: &Change) {
    if info.group == CRD_GROUP && info.plural == "customresourcedefinitions" {
        crd_changed(store, ctx, change);
    }
    if ctx.inner.config.controllers {
        controllers::after_commit(store, ctx, info, change);
    }
}

// === create ===

pub(crate) fn create(
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    body: &[u8],
) -> ApiResult<Reply> {
    let obj = parse_body(body)?;
    let mut store = ctx.inner.lock_store();
    let created = create_locked(&mut store, ctx, info, namespace, obj, ctx.dry_run)?;
    drop(store);
    publish_rv(ctx.inner);
    Ok(Reply::Object {
        code: 201,
        info: info.clone(),
        obj: created,
    })
}

pub(crate) fn create_locked(
    store: &mut Store,
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    mut obj: Value,
    dry_run: bool,
) -> ApiResult<Arc<Obj>> {
    check_type(info, &mut obj)?;
    let fence = fence_of(ctx, Some(&obj));
    if meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) && !ctx.apply {
        // etcd3's store refuses it; the registry answers an internal error.
        return Err(ApiError::new(
            500,
            Some("InternalError"),
            "Internal error occurred: resourceVersion should not be set on objects to be created",
        ));
    }
    let name = match meta_str(&obj, "name").filter(|n| !n.is_empty()) {
        Some(n) => n.to_string(),
        None => match meta_str(&obj, "generateName").filter(|n| !n.is_empty()) {
            Some(g) => format!("{g}{}", ctx.inner.entropy.suffix()),
            None => {
                return Err(ApiError::invalid(
                    &info.group,
                    &info.kind,
                    "",
                    "metadata.name",
                    "Required value: name or generateName is required",
                ))
            }
        },
    };
    validate(info, &obj)?;
    valid_name(info, &name)
        .map_err(|why| ApiError::invalid(&info.group, &info.kind, &name, "metadata.name", &why))?;
    let ns = if info.namespaced {
        let ns = namespace.unwrap_or_default();
        match meta_str(&obj, "namespace") {
            Some(b) if !b.is_empty() && b != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
            _ => {}
        }
        check_namespace_open(store, info, ns, &name)?;
        Some(ns)
    } else {
        None
    };
    let key = obj_key(ns, &name);
    if store.get(&info.store_key, &key).is_some() {
        return Err(ApiError::already_exists(&info.group, &info.plural, &name));
    }
    let applied = if ctx.apply {
        let now = ctx.inner.clock.rfc3339();
        let av = info.api_version();
        let config = obj.clone();
        let done = crate::ssa::apply(
            &info.ty,
            &ctx.writer(&av, &now),
            None,
            &config,
            ctx.force,
            info.status.then_some(false),
        )?;
        Some(done["metadata"]["managedFields"].clone())
    } else {
        None
    };
    {
        let meta = obj["metadata"].as_object_mut().expect("checked object");
        meta.insert("name".into(), json!(name));
        match ns {
            Some(ns) => meta.insert("namespace".into(), json!(ns)),
            None => meta.remove("namespace"),
        };
        meta.insert("uid".into(), json!(ctx.inner.entropy.uid()));
        meta.insert("creationTimestamp".into(), json!(ctx.inner.clock.rfc3339()));
        for f in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "managedFields",
            "selfLink",
            "resourceVersion",
        ] {
            meta.remove(f);
        }
        if info.generation {
            meta.insert("generation".into(), json!(1));
        } else {
            meta.remove("generation");
        }
    }
    if info.status && !info.builtin {
        // A custom resource with a status subresource drops status on create.
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
    }
    defaults_on_create(store, info, &mut obj, &ctx.inner.clock.rfc3339())?;
    match applied {
        Some(Value::Null) | None if !ctx.apply => {
            let (now, av) = (ctx.inner.clock.rfc3339(), info.api_version());
            crate::ssa::record_update(
                &info.ty,
                &ctx.writer(&av, &now),
                None,
                &mut obj,
                info.builtin,
            );
        }
        Some(Value::Null) | None => {}
        Some(entries) => obj["metadata"]["managedFields"] = entries,
    }
    crate::admission::admit_logged(
        &ctx.inner.refusals,
        store,
        &crate::admission::Attempt {
            info,
            operation: "CREATE",
            subresource: None,
            namespace: ns,
            name: &name,
            identity: ctx.identity,
            dry_run,
            object: &obj,
            old: None,
            fence_header: ctx.fence_header.as_deref(),
        },
    )?;
    if dry_run {
        let mut preview = obj;
        preview["metadata"]["resourceVersion"] = json!("");
        return Ok(Arc::new(Obj::new(preview)));
    }
    let change = commit(store, ctx, info, key, obj, false, fence.as_ref());
    Ok(change.obj.clone())
}

fn check_namespace_open(store: &Store, info: &ResourceInfo, ns: &str, name: &str) -> ApiResult<()> {
    match store.get("/namespaces", ns) {
        None => Err(ApiError::not_found("", "namespaces", ns)),
        Some(n) if n.value["metadata"].get("deletionTimestamp").is_some() => Err(ApiError::new(
            403,
            Some("Forbidden"),
            format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                qualified(&info.group, &info.plural)
            ),
        )
        .with_details(json!({
            "name": name, "group": info.group, "kind": info.plural,
            "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {ns} is being terminated"), "field": "metadata.namespace"}],
        }))),
        Some(_) => Ok(()),
    }
}

fn defaults_on_create(
    store: &Store,
    info: &ResourceInfo,
    obj: &mut Value,
    now: &str,
) -> ApiResult<()> {
    if !info.builtin {
        return Ok(());
    }
    crate::builtins::on_create(store, info, obj)?;
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "namespaces") => {
            obj["spec"] = json!({"finalizers": ["kubernetes"]});
            obj["status"] = json!({"phase": "Active"});
            let name = obj["metadata"]["name"].clone();
            let labels = obj["metadata"]
                .as_object_mut()
                .expect("object")
                .entry("labels")
                .or_insert_with(|| json!({}));
            if let Some(l) = labels.as_object_mut() {
                l.insert("kubernetes.io/metadata.name".into(), name);
            }
        }
        ("", "secrets") if obj.get("type").is_none_or(|t| t.as_str() == Some("")) => {
            obj["type"] = json!("Opaque");
        }
        (CRD_GROUP, "customresourcedefinitions") => crd_defaults(obj, now)?,
        _ => {}
    }
    Ok(())
}

// === CRDs ===

fn crd_defaults(crd: &mut Value, now: &str) -> ApiResult<()> {
    let name = meta_str(crd, "name").unwrap_or_default().to_string();
    let invalid = |field: &str, why: &str| {
        ApiError::invalid(CRD_GROUP, "CustomResourceDefinition", &name, field, why)
    };
    let group = crd
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("spec.group", "Required value"))?
        .to_string();
    let plural = crd
        .pointer("/spec/names/plural")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("spec.names.plural", "Required value"))?
        .to_string();
    if crd
        .pointer("/spec/names/kind")
        .and_then(Value::as_str)
        .is_none()
    {
        return Err(invalid("spec.names.kind", "Required value"));
    }
    if name != format!("{plural}.{group}") {
        return Err(invalid(
            "metadata.name",
            &format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    if crd.pointer("/spec/scope").and_then(Value::as_str).is_none() {
        return Err(invalid("spec.scope", "Required value"));
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            invalid(
                "spec.versions",
                "Invalid value: must have exactly one version marked as storage version",
            )
        })?;
    let storage: Vec<&str> = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .filter_map(|v| v.get("name").and_then(Value::as_str))
        .collect();
    if storage.len() != 1 {
        return Err(invalid(
            "spec.versions",
            "Invalid value: must have exactly one version marked as storage version",
        ));
    }
    let mut accepted = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    if accepted.get("singular").is_none() {
        accepted["singular"] = json!(accepted["kind"].as_str().unwrap_or_default().to_lowercase());
    }
    if accepted.get("listKind").is_none() {
        accepted["listKind"] = json!(format!(
            "{}List",
            accepted["kind"].as_str().unwrap_or_default()
        ));
    }
    crd["status"] = json!({
        "acceptedNames": accepted,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "lastTransitionTime": now, "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "lastTransitionTime": now, "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"},
        ],
        "storedVersions": [storage[0]],
    });
    let meta = crd["metadata"].as_object_mut().expect("object");
    let fins = meta.entry("finalizers").or_insert_with(|| json!([]));
    if let Some(f) = fins.as_array_mut() {
        if !f.iter().any(|x| x == CRD_CLEANUP) {
            f.push(json!(CRD_CLEANUP));
        }
    }
    Ok(())
}

const CRD_CLEANUP: &str = "customresourcecleanup.apiextensions.k8s.io";

/// Serve a created or updated CRD; on deletion, delete its instances and stop serving it (what the
/// apiextensions finalizer controller inside kube-apiserver does).
fn crd_changed(store: &mut Store, ctx: &WriteCtx<'_>, change: &Change) {
    let crd = &change.obj.value;
    let group = crd
        .pointer("/spec/group")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let plural = crd
        .pointer("/spec/names/plural")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    match change.kind {
        ChangeKind::Added | ChangeKind::Modified
            if crd["metadata"].get("deletionTimestamp").is_none() =>
        {
            store.registry.register_crd(crd);
        }
        ChangeKind::Added | ChangeKind::Modified => {
            // Terminating: delete every instance, then drop our finalizer.
            if let Some(info) = store.registry.by_store_key(&format!("{group}/{plural}")) {
                let keys: Vec<String> = {
                    let mut v = Vec::new();
                    store.scan_at(&info.store_key, None, store.rv, None, |k, _| {
                        v.push(k.to_string());
                        true
                    });
                    v
                };
                for key in keys {
                    if let Some(o) = store.get(&info.store_key, &key) {
                        let final_state = o.value.clone();
                        let gone = store.commit(&info, key, final_state, true);
                        let system = Writer {
                            identity: system_ctx(ctx.inner).identity,
                            verb: Verb::Delete,
                            fence: None,
                        };
                        ctx.inner.recorder.commit(system, &info, &gone);
                    }
                }
                store.drop_subs(&info.store_key);
            }
            store.registry.unregister(&group, &plural);
            let crd_info = store
                .registry
                .get(CRD_GROUP, "v1", "customresourcedefinitions")
                .expect("built in");
            let mut next = crd.clone();
            remove_finalizer(&mut next, CRD_CLEANUP);
            let sys = system_ctx(ctx.inner);
            finish_update(
                store,
                &sys,
                &crd_info,
                change.key.clone(),
                &change.obj,
                next,
                None,
            );
        }
        ChangeKind::Deleted => {
            store.registry.unregister(&group, &plural);
        }
    }
}

pub(crate) fn remove_finalizer(obj: &mut Value, fin: &str) {
    if let Some(f) = obj["metadata"]
        .get_mut("finalizers")
        .and_then(Value::as_array_mut)
    {
        f.retain(|x| x != fin);
    }
}

// === get ===

pub(crate) fn get(
    inner: &Inner,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    name: &str,
) -> ApiResult<Reply> {
    let store = inner.lock_store();
    let obj = store
        .get(&info.store_key, &obj_key(namespace, name))
        .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
    Ok(Reply::Object {
        code: 200,
        info: info.clone(),
        obj,
    })
}

// === update and patch ===

fn has_deletion_blockers(obj: &Value) -> bool {
    let meta_fins = obj["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|a| !a.is_empty());
    let ns_fins = obj["kind"] == "Namespace"
        && obj["spec"]["finalizers"]
            .as_array()
            .is_some_and(|a| !a.is_empty());
    meta_fins || ns_fins
}

fn without(obj: &Value, skip_status: bool) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        if skip_status {
            m.remove("status");
        }
    }
    v
}

/// Commit `next` as the new state of `old` (or nothing when nothing changed; or a deletion when the
/// last finalizer of an object being deleted went away).
pub(crate) fn finish_update(
    store: &mut Store,
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    key: String,
    old: &Obj,
    mut next: Value,
    fence: Option<&RawFence>,
) -> Arc<Obj> {
    if let Some(m) = next["metadata"].as_object_mut() {
        m.insert("resourceVersion".into(), json!(old.rv.to_string()));
    }
    if !ctx.apply {
        let (now, av) = (ctx.inner.clock.rfc3339(), info.api_version());
        crate::ssa::record_update(
            &info.ty,
            &ctx.writer(&av, &now),
            Some(&old.value),
            &mut next,
            info.builtin,
        );
    }
    if info.generation && without(&old.value, info.status) != without(&next, info.status) {
        let g = old.value["metadata"]["generation"].as_i64().unwrap_or(0);
        next["metadata"]["generation"] = json!(g + 1);
    }
    if next == old.value {
        return Arc::new(Obj::new(old.value.clone()));
    }
    let deleting = next["metadata"].get("deletionTimestamp").is_some();
    if ctx.dry_run {
        return Arc::new(Obj::new(next));
    }
    let gone = deleting && !has_deletion_blockers(&next);
    let change = commit(store, ctx, info, key, next.clone(), gone, fence);
    if gone {
        // The write that removes the last finalizer answers the object as last stored (its
        // resourceVersion is the one before the deletion), as the real server does.
        let mut last = next;
        last["metadata"]["resourceVersion"] = json!(old.rv.to_string());
        return Arc::new(Obj::new(last));
    }
    change.obj.clone()
}

/// Build the next state of a main-resource write (`body` is the full object) or a status write.
fn next_state(
    info: &ResourceInfo,
    old: &Obj,
    mut body: Value,
    status_write: bool,
) -> ApiResult<Value> {
    let name = old.name().to_string();
    if let Some(rv) = meta_str(&body, "resourceVersion").filter(|r| !r.is_empty()) {
        if rv != old.rv.to_string() {
            return Err(ApiError::conflict_modified(
                &info.group,
                &info.plural,
                &name,
            ));
        }
    }
    if let Some(uid) = meta_str(&body, "uid").filter(|u| !u.is_empty()) {
        if uid != old.uid {
            return Err(ApiError::conflict(
                &info.group,
                &info.plural,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    old.uid
                ),
            ));
        }
    }
    if status_write {
        let mut next = old.value.clone();
        match body.as_object_mut().and_then(|m| m.remove("status")) {
            Some(s) => next["status"] = s,
            None => {
                if let Some(m) = next.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        return Ok(next);
    }
    check_type(info, &mut body)?;
    validate(info, &body)?;
    if let Some(n) = meta_str(&body, "name") {
        if n != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
    }
    if info.namespaced {
        if let Some(ns) = meta_str(&body, "namespace").filter(|n| !n.is_empty()) {
            if ns != old.namespace {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
    }
    let old_meta = &old.value["metadata"];
    let meta = body["metadata"].as_object_mut().expect("checked object");
    meta.insert("name".into(), json!(name));
    if info.namespaced {
        meta.insert("namespace".into(), json!(old.namespace));
    } else {
        meta.remove("namespace");
    }
    for f in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        match old_meta.get(f) {
            Some(v) => meta.insert(f.into(), v.clone()),
            None => meta.remove(f),
        };
    }
    if info.status {
        match old.value.get("status") {
            Some(s) => body["status"] = s.clone(),
            None => {
                if let Some(m) = body.as_object_mut() {
                    m.remove("status");
                }
            }
        }
    }
    if info.plural == "namespaces" && info.builtin {
        // spec.finalizers change only through /finalize.
        body["spec"] = old.value["spec"].clone();
    }
    crate::builtins::on_update(info, &old.value, &mut body)?;
    Ok(body)
}

/// An UPDATE past its preconditions: ValidatingAdmissionPolicies first (as on the real server, where a
/// stale resourceVersion is a 409 before admission runs), then the commit.
#[allow(clippy::too_many_arguments)]
fn admit_and_finish(
    store: &mut Store,
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    (namespace, name, subresource): (Option<&str>, &str, Option<&str>),
    key: String,
    old: &Obj,
    next: Value,
    fence: Option<&RawFence>,
) -> ApiResult<Arc<Obj>> {
    crate::admission::admit_logged(
        &ctx.inner.refusals,
        store,
        &crate::admission::Attempt {
            info,
            operation: "UPDATE",
            subresource,
            namespace,
            name,
            identity: ctx.identity,
            dry_run: ctx.dry_run,
            object: &next,
            old: Some(&old.value),
            fence_header: ctx.fence_header.as_deref(),
        },
    )?;
    Ok(finish_update(store, ctx, info, key, old, next, fence))
}

pub(crate) fn update(
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    name: &str,
    subresource: Option<&str>,
    body: &[u8],
) -> ApiResult<Reply> {
    let body = parse_body(body)?;
    let status_write = subresource == Some("status");
    let fence = fence_of(ctx, (!status_write).then_some(&body));
    let key = obj_key(namespace, name);
    let mut store = ctx.inner.lock_store();
    let old = store
        .get(&info.store_key, &key)
        .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
    let next = if subresource == Some("finalize") {
        let mut next = old.value.clone();
        next["spec"]["finalizers"] = body["spec"]["finalizers"].clone();
        next
    } else {
        next_state(info, &old, body, status_write)?
    };
    let obj = admit_and_finish(
        &mut store,
        ctx,
        info,
        (namespace, name, subresource),
        key,
        &old,
        next,
        fence.as_ref(),
    )?;
    drop(store);
    publish_rv(ctx.inner);
    Ok(Reply::Object {
        code: 200,
        info: info.clone(),
        obj,
    })
}

/// RFC 7386 JSON merge patch.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Strategic,
    Apply,
    Json,
}

impl PatchType {
    pub(crate) fn from_content_type(ct: &str) -> ApiResult<Self> {
        let media = ct.split(';').next().unwrap_or_default().trim();
        match media {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Ok(PatchType::Apply),
            "application/json-patch+json" => Ok(PatchType::Json),
            _ => Err(ApiError::unsupported_media(ct)),
        }
    }
}

/// Apply a merge, strategic merge (`ty` is the object's type) or JSON patch to `target` (an apply
/// here is approximated as a merge patch: see `ssa` for server-side apply).
pub(crate) fn apply_patch(
    target: &mut Value,
    ptype: PatchType,
    patch: Value,
    ty: &crate::schema::Ty,
) -> ApiResult<()> {
    match ptype {
        PatchType::Strategic => {
            *target = crate::smp::apply(crate::schema::Schemas::builtin(), ty, target, &patch)
                .map_err(|e| {
                    ApiError::new(
                        422,
                        Some("Invalid"),
                        format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ),
                    )
                })?;
        }
        PatchType::Merge | PatchType::Apply => {
            if !patch.is_object() {
                return Err(ApiError::bad_request(
                    "error decoding patch: not a JSON object",
                ));
            }
            merge_patch(target, &patch);
        }
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            // On a copy, without the crate's undo: json-patch 4.2's `patch` panics when a `move`
            // fails after removing its source and the undo then meets the missing path (found by the
            // `json_patch` fuzz target; `fuzz/regressions/json_patch/move-undo-panic`). A failed patch
            // leaves the stored object as it was either way.
            let mut patched = target.clone();
            for op in ops.0 {
                // kube-apiserver's json-patch passes a `test` of `null` on a path that does not exist
                // (kube's `finalizer` helper tests `/metadata/finalizers` so before adding the first one)
                if let json_patch::PatchOperation::Test(t) = &op {
                    if t.value.is_null() && patched.pointer(t.path.as_str()).is_none() {
                        continue;
                    }
                }
                json_patch::patch_unsafe(&mut patched, &[op]).map_err(|_| {
                    ApiError::new(
                        422,
                        Some("Invalid"),
                        "the server rejected our request due to an error in our request",
                    )
                    .with_details(json!({}))
                })?;
            }
            *target = patched;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn patch(
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    name: &str,
    subresource: Option<&str>,
    ptype: PatchType,
    field_manager: Option<&str>,
    body: &[u8],
) -> ApiResult<Reply> {
    let patch: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
    if ptype == PatchType::Apply && field_manager.is_none_or(str::is_empty) {
        return Err(ApiError::invalid(
            "meta.k8s.io",
            "PatchOptions",
            "",
            "fieldManager",
            "Required value: is required for apply patch",
        ));
    }
    let status_write = subresource == Some("status");
    let fence = fence_of(
        ctx,
        (!status_write && ptype != PatchType::Json).then_some(&patch),
    );
    let key = obj_key(namespace, name);
    let mut store = ctx.inner.lock_store();
    let Some(old) = store.get(&info.store_key, &key) else {
        if ptype == PatchType::Apply && !status_write {
            let mut obj = patch;
            if obj.is_object() && !obj["metadata"].is_object() {
                obj["metadata"] = json!({});
            }
            if let Some(n) = meta_str(&obj, "name") {
                if n != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({n}) does not match the name on the URL ({name})"
                    )));
                }
            }
            if obj.is_object() {
                obj["metadata"]["name"] = json!(name);
            }
            let created = create_locked(&mut store, ctx, info, namespace, obj, ctx.dry_run)?;
            drop(store);
            publish_rv(ctx.inner);
            return Ok(Reply::Object {
                code: 201,
                info: info.clone(),
                obj: created,
            });
        }
        return Err(ApiError::not_found(&info.group, &info.plural, name));
    };
    if ptype == PatchType::Strategic && !info.builtin {
        return Err(ApiError::unsupported_media(
            "application/strategic-merge-patch+json",
        ));
    }
    let patched = if ptype == PatchType::Apply {
        let (now, av) = (ctx.inner.clock.rfc3339(), info.api_version());
        let status_only = info.status.then_some(status_write);
        crate::ssa::apply(
            &info.ty,
            &ctx.writer(&av, &now),
            Some(&old.value),
            &patch,
            ctx.force,
            status_only,
        )?
    } else {
        let mut patched = old.value.clone();
        apply_patch(&mut patched, ptype, patch, &info.ty)?;
        patched
    };
    let next = next_state(info, &old, patched, status_write)?;
    let obj = admit_and_finish(
        &mut store,
        ctx,
        info,
        (namespace, name, subresource),
        key,
        &old,
        next,
        fence.as_ref(),
    )?;
    drop(store);
    publish_rv(ctx.inner);
    Ok(Reply::Object {
        code: 200,
        info: info.clone(),
        obj,
    })
}

// === delete ===

/// `DeleteOptions` as far as they matter here.
#[derive(Debug, Default)]
pub(crate) struct DeleteOptions {
    uid: Option<String>,
    resource_version: Option<String>,
    propagation: Option<String>,
    /// `dryRun: ["All"]` in the body (kube sends it there).
    pub(crate) dry_run: bool,
}

impl DeleteOptions {
    pub(crate) fn parse(body: &[u8], query_propagation: Option<&str>) -> ApiResult<Self> {
        let mut o = DeleteOptions {
            propagation: query_propagation.map(str::to_string),
            ..Default::default()
        };
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(o);
        }
        let v = parse_body(body)?;
        o.uid = v
            .pointer("/preconditions/uid")
            .and_then(Value::as_str)
            .map(str::to_string);
        o.resource_version = v
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        o.dry_run = v
            .get("dryRun")
            .and_then(Value::as_array)
            .is_some_and(|a| a.iter().any(|d| d == "All"));
        if let Some(p) = v.get("propagationPolicy").and_then(Value::as_str) {
            o.propagation = Some(p.to_string());
        } else if v.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
            o.propagation = Some("Orphan".into());
        }
        Ok(o)
    }
}

pub(crate) fn delete(
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    name: &str,
    opts: &DeleteOptions,
) -> ApiResult<Reply> {
    let key = obj_key(namespace, name);
    let fence = fence_of(ctx, None);
    let mut store = ctx.inner.lock_store();
    let old = store
        .get(&info.store_key, &key)
        .ok_or_else(|| ApiError::not_found(&info.group, &info.plural, name))?;
    // ValidatingAdmissionPolicies see a DELETE with `object` null and `oldObject` the stored object
    crate::admission::admit_logged(
        &ctx.inner.refusals,
        &store,
        &crate::admission::Attempt {
            info,
            operation: "DELETE",
            subresource: None,
            namespace,
            name,
            identity: ctx.identity,
            dry_run: opts.dry_run,
            object: &Value::Null,
            old: Some(&old.value),
            fence_header: ctx.fence_header.as_deref(),
        },
    )?;
    let reply = delete_locked(&mut store, ctx, info, key, &old, opts, fence.as_ref())?;
    drop(store);
    publish_rv(ctx.inner);
    Ok(reply)
}

pub(crate) fn delete_locked(
    store: &mut Store,
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    key: String,
    old: &Arc<Obj>,
    opts: &DeleteOptions,
    fence: Option<&RawFence>,
) -> ApiResult<Reply> {
    let name = old.name().to_string();
    if let Some(uid) = opts.uid.as_deref() {
        if uid != old.uid {
            return Err(ApiError::conflict(
                &info.group,
                &info.plural,
                &name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    old.uid
                ),
            ));
        }
    }
    if let Some(rv) = opts.resource_version.as_deref() {
        if rv != old.rv.to_string() {
            return Err(ApiError::conflict(
                &info.group,
                &info.plural,
                &name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    old.rv
                ),
            ));
        }
    }
    let mut next = old.value.clone();
    let gc_finalizer = match opts.propagation.as_deref() {
        Some("Orphan") => Some("orphan"),
        Some("Foreground") => Some("foregroundDeletion"),
        _ => None,
    };
    if let Some(f) = gc_finalizer {
        let fins = next["metadata"]
            .as_object_mut()
            .expect("object")
            .entry("finalizers")
            .or_insert_with(|| json!([]));
        if let Some(a) = fins.as_array_mut() {
            if !a.iter().any(|x| x == f) {
                a.push(json!(f));
            }
        }
    }
    if has_deletion_blockers(&next) {
        if next["metadata"].get("deletionTimestamp").is_none() {
            next["metadata"]["deletionTimestamp"] = json!(ctx.inner.clock.rfc3339());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            if info.builtin && info.plural == "namespaces" {
                if !next["status"].is_object() {
                    next["status"] = json!({});
                }
                next["status"]["phase"] = json!("Terminating");
            }
        }
        let obj = finish_update(store, ctx, info, key, old, next, fence);
        return Ok(Reply::Object {
            code: 200,
            info: info.clone(),
            obj,
        });
    }
    if ctx.dry_run {
        return Ok(Reply::Object {
            code: 200,
            info: info.clone(),
            obj: old.clone(),
        });
    }
    let change = commit(store, ctx, info, key, old.value.clone(), true, fence);
    if info.builtin {
        Ok(Reply::Json {
            code: 200,
            value: json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                "details": if info.group.is_empty() {
                    json!({"name": name, "kind": info.plural, "uid": old.uid})
                } else {
                    json!({"name": name, "group": info.group, "kind": info.plural, "uid": old.uid})
                },
            }),
        })
    } else {
        Ok(Reply::Object {
            code: 200,
            info: info.clone(),
            obj: change.obj.clone(),
        })
    }
}
