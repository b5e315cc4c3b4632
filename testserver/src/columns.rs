//! The `Table` columns of a few built-in kinds beyond Name and Age, as the real server prints them
//! (`kubectl get`): the others get Name and Age only (a documented difference).

use serde_json::{json, Value};

use crate::resources::ResourceInfo;

/// One column: its definition and how a cell is read from the object.
#[derive(Debug)]
pub(crate) struct Column {
    pub(crate) name: &'static str,
    pub(crate) ty: &'static str,
    /// 0: always shown; 1: `-o wide` only.
    pub(crate) priority: u8,
    pub(crate) cell: fn(&Value) -> Value,
}

impl Column {
    pub(crate) fn definition(&self) -> Value {
        json!({"name": self.name, "type": self.ty, "format": "", "description": "", "priority": self.priority})
    }
}

const fn col(
    name: &'static str,
    ty: &'static str,
    priority: u8,
    cell: fn(&Value) -> Value,
) -> Column {
    Column {
        name,
        ty,
        priority,
        cell,
    }
}

/// Columns between Name and Age, and after Age (the wide ones), of `info`.
pub(crate) fn of(info: &ResourceInfo) -> (Vec<Column>, Vec<Column>) {
    if !info.builtin {
        return (Vec::new(), Vec::new());
    }
    match (info.group.as_str(), info.plural.as_str()) {
        ("", "configmaps") => (vec![col("Data", "integer", 0, data_count)], vec![]),
        ("", "secrets") => (
            vec![
                col("Type", "string", 0, |o| o["type"].clone()),
                col("Data", "integer", 0, data_count),
            ],
            vec![],
        ),
        ("", "namespaces") => (
            vec![col("Status", "string", 0, |o| o["status"]["phase"].clone())],
            vec![],
        ),
        ("", "services") => (
            vec![
                col("Type", "string", 0, |o| o["spec"]["type"].clone()),
                col("Cluster-IP", "string", 0, cluster_ip),
                col("External-IP", "string", 0, external_ip),
                col("Port(s)", "string", 0, ports),
            ],
            vec![col("Selector", "string", 1, |o| {
                json!(map_or_none(&o["spec"]["selector"]))
            })],
        ),
        ("apps", "deployments") => (
            vec![
                col("Ready", "string", 0, |o| {
                    json!(format!(
                        "{}/{}",
                        int(&o["status"]["readyReplicas"]),
                        int(&o["spec"]["replicas"])
                    ))
                }),
                col("Up-to-date", "integer", 0, |o| {
                    json!(int(&o["status"]["updatedReplicas"]))
                }),
                col("Available", "integer", 0, |o| {
                    json!(int(&o["status"]["availableReplicas"]))
                }),
            ],
            vec![
                col("Containers", "string", 1, |o| json!(containers(o, "name"))),
                col("Images", "string", 1, |o| json!(containers(o, "image"))),
                col("Selector", "string", 1, |o| {
                    json!(crate::scale::selector_string(&o["spec"]["selector"]))
                }),
            ],
        ),
        _ => (Vec::new(), Vec::new()),
    }
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

fn data_count(o: &Value) -> Value {
    let n = |f: &str| o[f].as_object().map_or(0, |m| m.len());
    json!(n("data") + n("binaryData"))
}

fn cluster_ip(o: &Value) -> Value {
    json!(o["spec"]["clusterIP"]
        .as_str()
        .filter(|s| !s.is_empty())
        .unwrap_or("<none>"))
}

fn external_ip(o: &Value) -> Value {
    let spec = &o["spec"];
    let listed: Vec<&str> = spec["externalIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let text = match spec["type"].as_str() {
        Some("ExternalName") => spec["externalName"]
            .as_str()
            .unwrap_or("<none>")
            .to_string(),
        Some("LoadBalancer") if listed.is_empty() => "<pending>".to_string(),
        _ if listed.is_empty() => "<none>".to_string(),
        _ => listed.join(","),
    };
    json!(text)
}

fn ports(o: &Value) -> Value {
    let ps: Vec<String> = o["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let proto = p["protocol"].as_str().unwrap_or("TCP");
            match p["nodePort"].as_i64() {
                Some(np) => format!("{}:{np}/{proto}", int(&p["port"])),
                None => format!("{}/{proto}", int(&p["port"])),
            }
        })
        .collect();
    json!(if ps.is_empty() {
        "<none>".to_string()
    } else {
        ps.join(",")
    })
}

fn map_or_none(m: &Value) -> String {
    match m.as_object() {
        Some(m) if !m.is_empty() => m
            .iter()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect::<Vec<_>>()
            .join(","),
        _ => "<none>".to_string(),
    }
}

fn containers(o: &Value, field: &str) -> String {
    o["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c[field].as_str())
        .collect::<Vec<_>>()
        .join(",")
}
