//! What the scenarios share: the cluster client and namespaces, Widgets and a writer that touches them,
//! the report file, the `kshard` binary, and reading Prometheus text. [`replicas`] runs replica processes
//! of the example operator; [`fences`] records the fence of every committed write and checks them.

pub mod fences;
pub mod links;
pub mod replicas;
pub mod workdir;

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, ObjectMeta, Patch,
    PatchParams, PostParams,
};
use kube::{Api, Client};
use kube_shard::{fnv1a64, ShardCount, ShardKey};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The label the example operator puts on every child ConfigMap (value: the Widget's name).
pub const CHILD_LABEL: &str = "example.kube-shard.io/widget";

/// The child ConfigMap of a Widget.
pub fn child_name(widget: &str) -> String {
    format!("{widget}-widget")
}

pub async fn client() -> Client {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "set KUBECONFIG to the cluster to test (kind, a bare apiserver, or `kshard-dev testserver --kubeconfig-out`)"
    );
    Client::try_default()
        .await
        .expect("a client from KUBECONFIG")
}

/// Print a figure and append it to `$E2E_REPORT` (one JSON object per line).
pub fn report(value: serde_json::Value) {
    eprintln!("e2e: {value}");
    if let Ok(path) = std::env::var("E2E_REPORT") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{value}");
        }
    }
}

pub fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (fnv1a64(&t.as_nanos().to_le_bytes()) >> 32) as u32
}

/// A fresh namespace.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = format!("{prefix}-{:08x}", rand_u32());
    let api: Api<Namespace> = Api::all(client.clone());
    api.create(
        &PostParams::default(),
        &Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        },
    )
    .await
    .expect("create namespace");
    name
}

/// Delete a namespace without waiting (a bare apiserver never finishes that). Its Widgets are deleted
/// first: they would stay in a Terminating namespace there, and an operator that watches all namespaces
/// (the namespace-key scenario) would keep reconciling them.
pub async fn drop_namespace(client: &Client, name: &str) {
    let widgets = widgets_api(client, name);
    let _ = widgets
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let api: Api<Namespace> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
}

pub fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.kube-shard.io"},
        "spec": {
            "group": "example.kube-shard.io",
            "names": {"kind": "Widget", "plural": "widgets", "singular": "widget", "listKind": "WidgetList"},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))
    .unwrap()
}

pub fn widget_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.kube-shard.io", "v1", "Widget"),
        "widgets",
    )
}

pub fn widgets_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &widget_resource())
}

/// Install the Widget CRD (if missing) and wait until Widgets are served in `ns`.
pub async fn install_widgets(client: &Client, ns: &str) -> Api<DynamicObject> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let _ = crds.create(&PostParams::default(), &widget_crd()).await;
    let api = widgets_api(client, ns);
    for _ in 0..120 {
        if api.list(&ListParams::default().limit(1)).await.is_ok() {
            return api;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the Widget CRD was not served within 60 s");
}

/// Create `prefix-0` .. `prefix-{n-1}`, 16 at a time.
pub async fn create_widgets(api: &Api<DynamicObject>, prefix: &str, n: usize) {
    let results: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            let mut w = DynamicObject::new(&format!("{prefix}-{i}"), &widget_resource());
            w.data = serde_json::json!({"spec": {"size": i}});
            async move { api.create(&PostParams::default(), &w).await }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    for r in results {
        r.expect("create widget");
    }
}

/// A Widget as the checks need it.
#[derive(Clone, Debug)]
pub struct WidgetView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: i64,
    pub observed: Option<i64>,
    pub reconciled_by: Option<String>,
    pub epoch: Option<u64>,
}

impl WidgetView {
    pub fn new(o: &DynamicObject) -> Self {
        let status = &o.data["status"];
        WidgetView {
            namespace: o.metadata.namespace.clone().unwrap_or_default(),
            name: o.metadata.name.clone().unwrap_or_default(),
            uid: o.metadata.uid.clone().unwrap_or_default(),
            generation: o.metadata.generation.unwrap_or(0),
            observed: status["observedGeneration"].as_i64(),
            reconciled_by: status["reconciledBy"].as_str().map(str::to_owned),
            epoch: status["epoch"].as_u64(),
        }
    }

    /// The logical shard under `key`.
    pub fn shard(&self, key: ShardKey, s: ShardCount) -> u32 {
        let value = match key {
            ShardKey::Namespace => &self.namespace,
            _ => &self.uid,
        };
        s.shard_of(fnv1a64(value.as_bytes()))
    }

    pub fn reconciled(&self) -> bool {
        self.observed == Some(self.generation)
    }
}

/// Every Widget of `namespaces`.
pub async fn list_widgets(client: &Client, namespaces: &[String]) -> Vec<WidgetView> {
    let mut out = Vec::new();
    for ns in namespaces {
        let list = widgets_api(client, ns)
            .list(&ListParams::default())
            .await
            .expect("list Widgets");
        out.extend(list.items.iter().map(WidgetView::new));
    }
    out
}

/// Changes the spec of the Widgets in `targets` (namespace, name), round robin, until stopped.
pub struct Writer {
    stop: Arc<AtomicBool>,
    touched: Arc<AtomicU64>,
    task: Option<tokio::task::JoinHandle<()>>,
}

/// A spec value no Widget had before (every touch changes the spec, so the generation moves).
static SIZE: AtomicI64 = AtomicI64::new(1_000_000);

async fn touch(client: &Client, ns: &str, name: &str) -> bool {
    let size = SIZE.fetch_add(1, Ordering::Relaxed);
    let patch = serde_json::json!({"spec": {"size": size}});
    widgets_api(client, ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .is_ok()
}

impl Writer {
    /// About `per_second` spec changes per second.
    pub fn start(client: &Client, targets: Vec<(String, String)>, per_second: u32) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let touched = Arc::new(AtomicU64::new(0));
        let (s, t, client) = (stop.clone(), touched.clone(), client.clone());
        let per_tick = (per_second as usize / 20).max(1);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut next = 0usize;
            while !s.load(Ordering::Relaxed) && !targets.is_empty() {
                tick.tick().await;
                let batch = (0..per_tick).map(|_| {
                    let (ns, name) = &targets[next % targets.len()];
                    next += 1;
                    touch(&client, ns, name)
                });
                let ok = futures::future::join_all(batch).await;
                t.fetch_add(ok.iter().filter(|o| **o).count() as u64, Ordering::Relaxed);
            }
        });
        Writer {
            stop,
            touched,
            task: Some(task),
        }
    }

    /// Stop and return the number of spec changes made.
    pub async fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
        self.touched.load(Ordering::Relaxed)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = &self.task {
            t.abort();
        }
    }
}

/// Change the spec of every Widget of `targets` once, 16 at a time; returns how many changed.
pub async fn touch_all(client: &Client, targets: &[(String, String)]) -> usize {
    let ok: Vec<bool> = futures::stream::iter(targets)
        .map(|(ns, name)| touch(client, ns, name))
        .buffer_unordered(16)
        .collect()
        .await;
    ok.into_iter().filter(|o| *o).count()
}

/// The `kshard` binary, as a private hard link (see [`private_binary`]): `KSHARD_BIN`, or built by this
/// test run.
pub fn kshard_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| private_binary("KSHARD_BIN", &["-p", "kshard"], "kshard"))
        .clone()
}

/// A workspace binary as a private hard link (or copy), so a rebuild of the original while the suite runs
/// cannot pull it away from under the replicas: the path in `env`, or built by this test run with `cargo
/// build <args>` into `target/e2e` (its own target dir, so the outer `cargo test` lock is not contended),
/// found there as `debug/<built>`. Links of earlier runs older than an hour are removed.
pub fn private_binary(env: &str, args: &[&str], built: &str) -> PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_owned();
    let target = root.join("target").join("e2e");
    let original: PathBuf = match std::env::var_os(env) {
        Some(p) => p.into(),
        None => {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = std::process::Command::new(cargo)
                .args(["build", "-q"])
                .args(args)
                .current_dir(&root)
                .env("CARGO_TARGET_DIR", &target)
                .status()
                .unwrap_or_else(|e| panic!("run cargo build {args:?}: {e}"));
            assert!(status.success(), "cargo build {args:?} failed");
            target.join("debug").join(built)
        }
    };
    let dir = target.join("bin");
    std::fs::create_dir_all(&dir).expect("create target/e2e/bin");
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|m| m.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(3600));
            if old {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let name = std::path::Path::new(built)
        .file_name()
        .expect("a file name")
        .to_string_lossy();
    let private = dir.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&private);
    if std::fs::hard_link(&original, &private).is_err() {
        std::fs::copy(&original, &private).unwrap_or_else(|e| {
            panic!("copy {} to {}: {e}", original.display(), private.display())
        });
    }
    private
}

/// GET `path` from `addr` (`host:port`): (status code, body). `None` when it does not answer within 2 s
/// (a stopped process accepts the connection but never answers).
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(2), get)
        .await
        .ok()
        .flatten()
}

/// The value of the first sample of `name` whose labels contain `label` (e.g. `resource="widgets"`; empty
/// matches any).
pub fn sample(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let labels = match series.strip_prefix(name)? {
            "" => "",
            rest => rest.strip_prefix('{')?.strip_suffix('}')?,
        };
        labels.contains(label).then(|| value.parse().ok())?
    })
}

/// A replica's Widget read path, from its metrics (the operator names that stream `widgets`:
/// `WIDGET_STREAM` in kshard/src/operator).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ReadPath {
    /// `kube_shard_read_objects_received_total`: objects received from LISTs and WATCH events.
    pub received: f64,
    /// `kube_shard_read_dropped_out_of_range_total`: objects a server sent outside the selector.
    pub dropped: f64,
    /// `kube_shard_read_objects_unwanted_total`: objects received outside the replica's wanted shards.
    pub unwanted: f64,
    /// `kube_shard_read_indexed_objects`: objects held in the read index.
    pub indexed: f64,
    /// `kube_shard_read_projected_objects`: objects in the owned projection.
    pub projected: f64,
}

impl ReadPath {
    pub fn parse(text: &str) -> Option<ReadPath> {
        let label = "resource=\"widgets\"";
        Some(ReadPath {
            received: sample(text, "kube_shard_read_objects_received_total", label)?,
            dropped: sample(text, "kube_shard_read_dropped_out_of_range_total", label)?,
            unwanted: sample(text, "kube_shard_read_objects_unwanted_total", label)?,
            indexed: sample(text, "kube_shard_read_indexed_objects", label)?,
            projected: sample(text, "kube_shard_read_projected_objects", label)?,
        })
    }
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// `a ÷ b` when `b > 0`, to 4 places.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0).then(|| round4(a / b))
}

/// Every Widget's child ConfigMap exists and was last written under the fence its parent's status was
/// written under: the same shard (the parent's) and the same epoch (so the same owner, who reconciled
/// the parent). Returns the number of children checked.
pub async fn check_children(
    client: &Client,
    widgets: &[WidgetView],
    key: ShardKey,
    s: ShardCount,
) -> Result<usize, String> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_shard::token::{FenceToken, FENCE_ANNOTATION};
    let namespaces: std::collections::BTreeSet<&str> =
        widgets.iter().map(|w| w.namespace.as_str()).collect();
    let mut fences = std::collections::HashMap::new();
    for ns in namespaces {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let list = api
            .list(&ListParams::default().labels(CHILD_LABEL))
            .await
            .map_err(|e| format!("list children: {e}"))?;
        for cm in list.items {
            let token = cm
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(FENCE_ANNOTATION))
                .and_then(|t| t.parse::<FenceToken>().ok());
            let name = cm.metadata.name.unwrap_or_default();
            fences.insert((ns.to_owned(), name), token);
        }
    }
    let mut bad = Vec::new();
    for w in widgets {
        let child = child_name(&w.name);
        match fences.get(&(w.namespace.clone(), child.clone())) {
            None => bad.push(format!("{}/{child}: missing", w.namespace)),
            Some(None) => bad.push(format!("{}/{child}: no fence annotation", w.namespace)),
            Some(Some(t)) if t.shard() != Some(w.shard(key, s)) || t.shard_epoch() != w.epoch => {
                bad.push(format!(
                    "{}/{child}: fence {t}, parent in shard {} at epoch {:?} by {:?}",
                    w.namespace,
                    w.shard(key, s),
                    w.epoch,
                    w.reconciled_by
                ))
            }
            Some(Some(_)) => {}
        }
    }
    match bad.len() {
        0 => Ok(widgets.len()),
        n => Err(format!("{n} children, e.g. {}", bad[0])),
    }
}
