//! What kube-apiserver's strategies do for built-in kinds without any controller: defaults on create
//! (Deployments, Jobs, CronJobs and pod templates, Services; a new Pod's admission defaults and status; a
//! new Job's generated selector), `stringData` → `data`, immutable Secrets and ConfigMaps,
//! Service `clusterIP` allocation, and the answers of the review resources (not stored).

use base64::{engine::general_purpose::STANDARD, Engine};
use serde_json::{json, Map, Value};

use crate::{
    resources::ResourceInfo,
    status::{ApiError, ApiResult},
    store::Store,
};

/// The Service network (realkube's `--service-cluster-ip-range`); `.1` is the `kubernetes` Service.
const SERVICE_NET: [u8; 3] = [10, 96, 0];

fn is(info: &ResourceInfo, group: &str, plural: &str) -> bool {
    info.builtin && info.group == group && info.plural == plural
}

/// Defaults and allocations on create (after the generic metadata is set).
pub(crate) fn on_create(store: &Store, info: &ResourceInfo, obj: &mut Value) -> ApiResult<()> {
    if info.status && !is(info, "", "namespaces") {
        // Strategies reset status on create; a Service starts with an empty load balancer.
        obj["status"] = if is(info, "", "services") {
            json!({"loadBalancer": {}})
        } else {
            json!({})
        };
    }
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "secrets") => string_data(obj),
        ("", "services") => service_defaults(store, info, obj)?,
        ("", "pods") if info.builtin => {
            pod_admission(obj);
            workload_defaults(info, obj);
        }
        ("batch", "jobs") if info.builtin => {
            job_selector(obj);
            workload_defaults(info, obj);
        }
        _ => workload_defaults(info, obj),
    }
    Ok(())
}

/// A new Pod: the Priority and DefaultTolerationSeconds admission plugins, the `enableServiceLinks`
/// default, and the status the real server starts it with (no node, so `Pending`).
fn pod_admission(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    set_default(spec, "enableServiceLinks", json!(true));
    if spec.get("priorityClassName").is_none() {
        set_default(spec, "priority", json!(0));
        set_default(spec, "preemptionPolicy", json!("PreemptLowerPriority"));
    }
    // DefaultTolerationSeconds: unless a toleration already covers the taint (an empty key or effect
    // matches any)
    let tolerations = spec.entry("tolerations").or_insert_with(|| json!([]));
    if tolerations.is_null() {
        *tolerations = json!([]);
    }
    if let Some(list) = tolerations.as_array_mut() {
        let empty = |v: &Value| v.as_str().is_none_or(str::is_empty);
        for key in [
            "node.kubernetes.io/not-ready",
            "node.kubernetes.io/unreachable",
        ] {
            let tolerated = list.iter().any(|t| {
                (empty(&t["key"]) || t["key"] == key)
                    && (empty(&t["effect"]) || t["effect"] == "NoExecute")
            });
            if !tolerated {
                list.push(json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}));
            }
        }
    }
    let qos = qos_class(&obj["spec"]);
    obj["status"] = json!({"phase": "Pending", "qosClass": qos});
}

/// `BestEffort` without requests or limits, `Guaranteed` when every container limits CPU and memory and
/// requests what it limits, else `Burstable`.
fn qos_class(spec: &Value) -> &'static str {
    let containers: Vec<&Value> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec[*k].as_array())
        .flatten()
        .collect();
    let set = |c: &Value, k: &str| c["resources"][k].as_object().is_some_and(|m| !m.is_empty());
    if containers
        .iter()
        .all(|c| !set(c, "requests") && !set(c, "limits"))
    {
        return "BestEffort";
    }
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| {
            let limit = &c["resources"]["limits"][*r];
            let request = &c["resources"]["requests"][*r];
            !limit.is_null() && (request.is_null() || request == limit)
        })
    });
    if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// A new Job without a selector of its own: the generated selector (`manualSelector: false`) and the
/// labels it selects on the pod template; the Job takes the template's labels when it has none.
fn job_selector(obj: &mut Value) {
    let uid = obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("manualSelector") == Some(&json!(true)) || spec.get("selector").is_some() {
        return;
    }
    spec.insert("manualSelector".into(), json!(false));
    spec.insert(
        "selector".into(),
        json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}),
    );
    let generated = json!({
        "batch.kubernetes.io/controller-uid": uid,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "job-name": name,
    });
    // the generated labels go on the pod template; the Job takes the template's labels when it has none
    let Some(template) = obj
        .pointer_mut("/spec/template")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let meta = template.entry("metadata").or_insert_with(|| json!({}));
    if meta.is_null() {
        *meta = json!({});
    }
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    if labels.is_null() {
        *labels = json!({});
    }
    let Some(labels) = labels.as_object_mut() else {
        return;
    };
    if let Some(add) = generated.as_object() {
        for (k, v) in add {
            labels.entry(k.clone()).or_insert(v.clone());
        }
    }
    let template_labels = Value::Object(labels.clone());
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        let none = m
            .get("labels")
            .and_then(Value::as_object)
            .is_none_or(Map::is_empty);
        if none {
            m.insert("labels".into(), template_labels);
        }
    }
}

/// The defaults of pods and pod templates, applied on every write (the real server defaults every
/// object it decodes: a container added by a patch gets them too).
fn workload_defaults(info: &ResourceInfo, obj: &mut Value) {
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "pods") => {
            if let Some(spec) = obj.get_mut("spec") {
                pod_spec_defaults(spec);
            }
        }
        ("apps", "deployments") => deployment_defaults(obj),
        ("apps", "replicasets" | "statefulsets" | "daemonsets")
        | ("", "replicationcontrollers") => {
            template_defaults(obj.pointer_mut("/spec/template/spec"));
        }
        ("batch", "jobs") => {
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                job_spec_defaults(spec);
            }
            template_defaults(obj.pointer_mut("/spec/template/spec"));
        }
        ("batch", "cronjobs") => {
            if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
                set_default(spec, "concurrencyPolicy", json!("Allow"));
                set_default(spec, "failedJobsHistoryLimit", json!(1));
                set_default(spec, "successfulJobsHistoryLimit", json!(3));
                set_default(spec, "suspend", json!(false));
            }
            template_defaults(obj.pointer_mut("/spec/jobTemplate/spec/template/spec"));
        }
        _ => {}
    }
}

/// Conversions and checks on every main-resource write of an existing object: `old` → `next`.
pub(crate) fn on_update(info: &ResourceInfo, old: &Value, next: &mut Value) -> ApiResult<()> {
    if !info.builtin {
        return Ok(());
    }
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "secrets") => {
            string_data(next);
            immutable(info, old, next)
        }
        ("", "configmaps") => immutable(info, old, next),
        ("", "services") => keep_cluster_ip(info, old, next),
        _ => {
            workload_defaults(info, next);
            Ok(())
        }
    }
}

/// `stringData` is write-only: merged into `data` (base64), then dropped.
fn string_data(obj: &mut Value) {
    let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|m| m.remove("stringData")) else {
        return;
    };
    if !obj["data"].is_object() {
        obj["data"] = json!({});
    }
    for (k, v) in sd {
        let text = v.as_str().unwrap_or_default();
        obj["data"][k] = json!(STANDARD.encode(text));
    }
}

/// An object created with `immutable: true` keeps its data, binaryData and immutability.
fn immutable(info: &ResourceInfo, old: &Value, next: &Value) -> ApiResult<()> {
    if old["immutable"] != json!(true) {
        return Ok(());
    }
    let name = old["metadata"]["name"].as_str().unwrap_or_default();
    for field in ["immutable", "data", "binaryData"] {
        let norm = |v: &Value| match v.get(field) {
            Some(Value::Object(m)) if m.is_empty() => Value::Null,
            Some(v) => v.clone(),
            None => Value::Null,
        };
        if norm(old) != norm(next) {
            return Err(ApiError::invalid(
                &info.group,
                &info.kind,
                name,
                field,
                "Forbidden: field is immutable when `immutable` is set",
            ));
        }
    }
    Ok(())
}

fn service_defaults(store: &Store, info: &ResourceInfo, svc: &mut Value) -> ApiResult<()> {
    if !svc["spec"].is_object() {
        svc["spec"] = json!({});
    }
    let spec = &mut svc["spec"];
    let ty = spec["type"].as_str().unwrap_or("ClusterIP").to_string();
    spec["type"] = json!(ty);
    if spec.get("sessionAffinity").is_none() {
        spec["sessionAffinity"] = json!("None");
    }
    if let Some(ports) = spec["ports"].as_array_mut() {
        for p in ports {
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
            if p.get("targetPort").is_none() {
                p["targetPort"] = p["port"].clone();
            }
        }
    }
    if ty == "ExternalName" {
        return Ok(());
    }
    if spec.get("internalTrafficPolicy").is_none() {
        spec["internalTrafficPolicy"] = json!("Cluster");
    }
    let ip = match spec["clusterIP"].as_str().filter(|s| !s.is_empty()) {
        Some(ip) => ip.to_string(),
        None => allocate_cluster_ip(store, info).ok_or_else(|| {
            ApiError::new(
                500,
                Some("InternalError"),
                "Internal error occurred: failed to allocate a serviceIP: range is full",
            )
        })?,
    };
    spec["clusterIP"] = json!(ip);
    spec["clusterIPs"] = json!([ip]);
    if ip != "None" || spec.get("ipFamilies").is_none() {
        spec["ipFamilies"] = json!(["IPv4"]);
    }
    if spec.get("ipFamilyPolicy").is_none() {
        spec["ipFamilyPolicy"] = json!("SingleStack");
    }
    Ok(())
}

/// The lowest free address of the Service network from `.2` (`.1` is the `kubernetes` Service;
/// the real allocator picks at random).
fn allocate_cluster_ip(store: &Store, info: &ResourceInfo) -> Option<String> {
    let used: Vec<String> = store
        .current(&info.store_key, None)
        .iter()
        .filter_map(|o| o.value["spec"]["clusterIP"].as_str().map(str::to_string))
        .collect();
    (2..=254u8)
        .map(|last| {
            format!(
                "{}.{}.{}.{last}",
                SERVICE_NET[0], SERVICE_NET[1], SERVICE_NET[2]
            )
        })
        .find(|ip| !used.contains(ip))
}

/// The address of the `kubernetes` Service the server creates for itself.
pub(crate) fn kubernetes_service_ip() -> String {
    format!("{}.{}.{}.1", SERVICE_NET[0], SERVICE_NET[1], SERVICE_NET[2])
}

/// An update that leaves `clusterIP` out keeps the allocated one; changing it is refused.
fn keep_cluster_ip(info: &ResourceInfo, old: &Value, next: &mut Value) -> ApiResult<()> {
    let old_ip = old["spec"]["clusterIP"].clone();
    if !next["spec"].is_object() {
        next["spec"] = json!({});
    }
    match next["spec"]["clusterIP"].as_str() {
        None | Some("") => {
            next["spec"]["clusterIP"] = old_ip;
            next["spec"]["clusterIPs"] = old["spec"]["clusterIPs"].clone();
            Ok(())
        }
        Some(ip) if Some(ip) == old_ip.as_str() => Ok(()),
        Some(_) => Err(ApiError::invalid(
            &info.group,
            &info.kind,
            old["metadata"]["name"].as_str().unwrap_or_default(),
            "spec.clusterIPs[0]",
            "Invalid value: field is immutable",
        )),
    }
}

fn set_default(obj: &mut Map<String, Value>, key: &str, value: Value) {
    obj.entry(key.to_string()).or_insert(value);
}

fn deployment_defaults(obj: &mut Value) {
    let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    set_default(spec, "replicas", json!(1));
    set_default(spec, "progressDeadlineSeconds", json!(600));
    set_default(spec, "revisionHistoryLimit", json!(10));
    strategy_defaults(spec.entry("strategy").or_insert_with(|| json!({})));
    template_defaults(obj.pointer_mut("/spec/template/spec"));
}

/// A Job's spec defaults (`SetDefaults_Job`).
fn job_spec_defaults(spec: &mut Map<String, Value>) {
    if spec.get("completions").is_none() && spec.get("parallelism").is_none() {
        spec.insert("completions".into(), json!(1));
        spec.insert("parallelism".into(), json!(1));
    }
    set_default(spec, "parallelism", json!(1));
    set_default(spec, "backoffLimit", json!(6));
    set_default(spec, "completionMode", json!("NonIndexed"));
    set_default(spec, "suspend", json!(false));
    if spec.get("podFailurePolicy").is_none() {
        set_default(spec, "podReplacementPolicy", json!("TerminatingOrFailed"));
    }
}

/// As the real server: an empty type is `RollingUpdate`, whose missing bounds are 25% each (kubectl's
/// `create deployment` sends `strategy: {}`).
fn strategy_defaults(strategy: &mut Value) {
    let Some(st) = strategy.as_object_mut() else {
        return;
    };
    if st
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .is_empty()
    {
        st.insert("type".into(), json!("RollingUpdate"));
    }
    if st.get("type").and_then(Value::as_str) == Some("RollingUpdate") {
        if let Some(ru) = st
            .entry("rollingUpdate")
            .or_insert_with(|| json!({}))
            .as_object_mut()
        {
            set_default(ru, "maxUnavailable", json!("25%"));
            set_default(ru, "maxSurge", json!("25%"));
        }
    }
}

fn template_defaults(spec: Option<&mut Value>) {
    if let Some(spec) = spec {
        pod_spec_defaults(spec);
    }
}

/// The defaults of a pod spec the real server fills in (the common ones; see the docs).
fn pod_spec_defaults(spec: &mut Value) {
    let Some(s) = spec.as_object_mut() else {
        return;
    };
    set_default(s, "dnsPolicy", json!("ClusterFirst"));
    set_default(s, "restartPolicy", json!("Always"));
    set_default(s, "schedulerName", json!("default-scheduler"));
    set_default(s, "securityContext", json!({}));
    set_default(s, "terminationGracePeriodSeconds", json!(30));
    for list in ["containers", "initContainers"] {
        if let Some(cs) = s.get_mut(list).and_then(Value::as_array_mut) {
            for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                let image = c.get("image").and_then(Value::as_str).unwrap_or_default();
                let tag = image.rsplit('/').next().unwrap_or_default();
                let latest =
                    !image.contains('@') && tag.split(':').nth(1).is_none_or(|t| t == "latest");
                let policy = if latest { "Always" } else { "IfNotPresent" };
                set_default(c, "imagePullPolicy", json!(policy));
                set_default(c, "resources", json!({}));
                set_default(c, "terminationMessagePath", json!("/dev/termination-log"));
                set_default(c, "terminationMessagePolicy", json!("File"));
            }
        }
    }
}

// === review resources ===

/// What a create of a review resource (not stored) answers: everyone is allowed (there is no
/// authorization) and a token is authenticated when the server would accept it.
pub(crate) fn review(info: &ResourceInfo, identity: &str, mut body: Value) -> ApiResult<Value> {
    body["apiVersion"] = json!(info.api_version());
    body["kind"] = json!(info.kind);
    body["metadata"] = json!({"creationTimestamp": null});
    body["status"] = match info.plural.as_str() {
        "selfsubjectaccessreviews" | "subjectaccessreviews" | "localsubjectaccessreviews" => {
            json!({"allowed": true, "reason": "kube-shard-testserver has no authorization"})
        }
        "selfsubjectrulesreviews" => json!({
            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}],
            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            "incomplete": false,
        }),
        "selfsubjectreviews" => json!({"userInfo": user_info(identity)}),
        "tokenreviews" => {
            let token = body["spec"]["token"].as_str().unwrap_or_default();
            match token
                .strip_prefix(crate::http::TOKEN_PREFIX)
                .filter(|i| !i.is_empty())
            {
                Some(id) => json!({"authenticated": true, "user": user_info(id)}),
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            }
        }
        _ => return Err(ApiError::method_not_allowed()),
    };
    Ok(body)
}

fn user_info(identity: &str) -> Value {
    json!({"username": identity, "groups": ["system:authenticated"]})
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn odd_job_and_pod_shapes_get_no_panic_and_real_tolerations() {
        let mut job = json!({"metadata": {"name": "j", "uid": "u"}, "spec": {"template": "x"}});
        super::job_selector(&mut job);
        let mut job = json!({"metadata": {"name": "j", "uid": "u", "labels": {"app": "a"}}, "spec": {"template": {"metadata": null}}});
        super::job_selector(&mut job);
        assert_eq!(
            job["metadata"]["labels"],
            json!({"app": "a"}),
            "the Job's own labels stay"
        );
        assert_eq!(
            job["spec"]["template"]["metadata"]["labels"]["job-name"],
            "j"
        );
        let mut pod = json!({"spec": {"tolerations": [{"operator": "Exists"}], "containers": []}});
        super::pod_admission(&mut pod);
        assert_eq!(
            pod["spec"]["tolerations"].as_array().unwrap().len(),
            1,
            "tolerates everything already"
        );
        let mut pod = json!({"spec": {"tolerations": null}});
        super::pod_admission(&mut pod);
        assert_eq!(pod["spec"]["tolerations"].as_array().unwrap().len(), 2);
        let mut pod = json!({"spec": {"tolerations": "x"}});
        super::pod_admission(&mut pod);
    }

    #[test]
    fn an_empty_strategy_gets_the_real_servers_defaults_and_a_set_one_is_kept() {
        let full = json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}});
        for given in [json!(null), json!({}), json!({"type": ""})] {
            let mut d = json!({"spec": {"strategy": given}});
            if d["spec"]["strategy"].is_null() {
                d["spec"].as_object_mut().unwrap().remove("strategy");
            }
            super::deployment_defaults(&mut d);
            assert_eq!(d["spec"]["strategy"], full);
        }
        let mut d = json!({"spec": {"strategy": {"type": "Recreate"}}});
        super::deployment_defaults(&mut d);
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
        let mut d = json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": 1}}}});
        super::deployment_defaults(&mut d);
        assert_eq!(
            d["spec"]["strategy"]["rollingUpdate"],
            json!({"maxSurge": 1, "maxUnavailable": "25%"})
        );
    }
}
