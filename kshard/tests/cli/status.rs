//! `kshard operator` replicas on the embedded API server, observed with `kshard status`: a settled group, the
//! health endpoints, and a graceful leave on SIGTERM.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use kube_shard_harness::process::ReplicaProcess;
use kube_shard_harness::server::{BackgroundServer, ServeOptions};
use serde_json::Value;

use crate::replicas;

fn operator(kubeconfig: &Path, name: &str) -> (ReplicaProcess, String) {
    operator_with(kubeconfig, name, &[])
}

/// `kshard operator` as member `name` of group `g` (16 shards, two expected members, short timings) with
/// `extra` flags, started through the harness; its log beside the kubeconfig.
fn operator_with(kubeconfig: &Path, name: &str, extra: &[&str]) -> (ReplicaProcess, String) {
    let mut flags = replicas::flags(kubeconfig, name, "g");
    flags.expected = 2;
    flags.extra = ["--gc-interval", "500ms"]
        .iter()
        .chain(extra)
        .map(OsString::from)
        .collect();
    let p = replicas::start(&flags, kubeconfig);
    let addr = p.metrics_addr().unwrap_or_default().to_owned();
    (p, addr)
}

fn status(kubeconfig: &Path, json: bool) -> Option<String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kshard"));
    cmd.arg("status")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", "default", "--group", "g"]);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kshard status`'s error when it fails.
fn status_error(kubeconfig: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .arg("status")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", "default", "--group", "g"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn kshard(args: &[&str], kubeconfig: &Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", "default", "--group", "g", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kshard {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).unwrap();
    buf
}

/// The embedded API server (gate on, plain HTTP) writing its kubeconfig to `<dir>/kubeconfig`.
pub(crate) fn testserver() -> (tempfile::TempDir, BackgroundServer) {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = ServeOptions::default();
    opts.shard_selector = true;
    opts.plain_http = true;
    let server = BackgroundServer::start(&dir.path().join("kubeconfig"), opts).unwrap();
    assert!(server.url().starts_with("http://"));
    (dir, server)
}

/// A runtime and a client from a kubeconfig.
pub(crate) fn client_for(kc: &Path) -> (tokio::runtime::Runtime, kube::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async {
        let yaml = std::fs::read_to_string(kc).unwrap();
        let kcfg = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kcfg, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    });
    (rt, client)
}

fn until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn status_shows_a_settled_group_and_a_graceful_leave() {
    let (dir, _server) = testserver();
    let kc = dir.path().join("kubeconfig");

    // before anything runs there is no group, and the error says which RBAC a member would lack
    assert!(status(&kc, true).is_none());
    let why = status_error(&kc);
    assert!(
        why.contains("no member Lease") && why.contains("leases in API group coordination.k8s.io"),
        "{why}"
    );

    let (mut a, a_addr) = operator(&kc, "member-a");
    let (_b, b_addr) = operator(&kc, "member-b");
    let mut last = Value::Null;
    until(Duration::from_secs(40), "a settled group", || {
        let Some(text) = status(&kc, true) else {
            return false;
        };
        last = serde_json::from_str(&text).unwrap();
        let members = last["members"].as_array().unwrap();
        members.len() == 2
            && members
                .iter()
                .all(|m| m["owned"] == 8 && m["ready"] == true)
            && last["unowned_count"] == 0
            && last["multi_owned_count"] == 0
            && last["owned_not_serving_count"] == 0
            && last["moves_in_flight"] == 0
    });
    assert_eq!(last["shards"], 16);
    assert_eq!(last["key"], "uid");
    assert!(last["coordinator"].as_str().unwrap().starts_with("member-"));
    assert_eq!(last["ring"].as_str().unwrap().len(), 64);

    let text = status(&kc, false).unwrap();
    assert!(
        text.contains("member-a") && text.contains("member-b"),
        "{text}"
    );
    assert!(text.contains("ring 0 |"), "{text}");
    assert!(text.contains("unowned 0"), "{text}");

    assert!(http_get(&a_addr, "/healthz").starts_with("HTTP/1.1 200"));
    assert!(http_get(&a_addr, "/readyz").starts_with("HTTP/1.1 200"));
    let sample_of = |metrics: &str, name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{group=\"g\",member=\"member-a/")))
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    // a member's cluster-wide gauges come from the reports it last observed: they settle one pass after
    // what `kshard status` reads from the server
    let mut metrics = String::new();
    until(Duration::from_secs(10), "member-a's gauges settled", || {
        metrics = http_get(&a_addr, "/metrics");
        sample_of(&metrics, "kube_shard_unowned_shards").as_deref() == Some("0")
    });
    let sample = |name: &str| sample_of(&metrics, name);
    assert_eq!(
        sample("kube_shard_owned_shards").as_deref(),
        Some("8"),
        "{metrics}"
    );
    assert_eq!(
        sample("kube_shard_unowned_shards").as_deref(),
        Some("0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kube_shard_read_fallback{resource=\"widgets\"} 0"),
        "{metrics}"
    );

    // explain, pin (the shard moves and the new owner reconciles the Widget), pause/resume, unpin
    let (rt, client) = client_for(&kc);
    let ar = kube::api::ApiResource {
        group: "example.kube-shard.io".into(),
        version: "v1".into(),
        api_version: "example.kube-shard.io/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client, "default", &ar);
    let w: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "example.kube-shard.io/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 3}
    }))
    .unwrap();
    rt.block_on(widgets.create(&Default::default(), &w))
        .unwrap();
    let e = kshard(&["explain", "Widget", "default/w1"], &kc);
    let shard = e["shard"].as_u64().unwrap();
    let owner = e["owner"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(e["key"], "uid");
    assert_eq!(e["handoff"], "stable");
    let other = if owner == "member-a" {
        "member-b"
    } else {
        "member-a"
    };
    until(Duration::from_secs(10), "the owner reconciles w1", || {
        let w = rt.block_on(widgets.get("w1")).unwrap();
        w.data["status"]["reconciledBy"] == owner.as_str()
    });
    let p = kshard(&["pin", &shard.to_string(), other], &kc);
    assert_eq!(p["pins"][shard.to_string()], other);
    let mut moved = Value::Null;
    until(Duration::from_secs(20), "the pinned shard moves", || {
        moved = kshard(
            &["explain", "widgets.example.kube-shard.io", "default/w1"],
            &kc,
        );
        moved["owner"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{other}/"))
            && moved["handoff"] == "stable"
    });
    assert!(moved["epoch"].as_u64().unwrap() > e["epoch"].as_u64().unwrap());
    assert_eq!(moved["pinned_to"], other);
    until(
        Duration::from_secs(10),
        "the new owner reconciles w1",
        || {
            let w = rt.block_on(widgets.get("w1")).unwrap();
            w.data["status"]["reconciledBy"] == other && w.data["status"]["epoch"] == moved["epoch"]
        },
    );
    assert_eq!(kshard(&["pause"], &kc)["paused"], true);
    assert_eq!(kshard(&["status"], &kc)["paused"], true);
    assert_eq!(kshard(&["resume"], &kc)["paused"], false);
    let u = kshard(&["unpin", &shard.to_string()], &kc);
    assert!(u["pins"].as_object().unwrap().is_empty());

    // drain member-b: it hands everything off (the command waits), stays a member, and gets its share
    // back when undrained
    let d = kshard(&["drain", "member-b", "--timeout", "30s"], &kc);
    assert_eq!(d["drained"], serde_json::json!(["member-b"]), "{d}");
    assert_eq!(d["holds"], 0, "{d}");
    assert!(d["waited_seconds"].as_f64().is_some(), "{d}");
    let v: Value = serde_json::from_str(&status(&kc, true).unwrap()).unwrap();
    let by_name = |v: &Value, n: &str| {
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_name(&v, "member-b")["owned"], 0, "{v}");
    assert_eq!(by_name(&v, "member-b")["drained"], true, "{v}");
    assert_eq!(by_name(&v, "member-a")["owned"], 16, "{v}");
    assert_eq!(v["unowned_count"], 0, "{v}");
    let text = status(&kc, false).unwrap();
    assert!(text.contains("(drained)"), "{text}");
    let u = kshard(&["undrain", "member-b"], &kc);
    assert_eq!(u["drained"], serde_json::json!([]), "{u}");
    until(
        Duration::from_secs(20),
        "member-b has its share again",
        || {
            let v: Value = serde_json::from_str(&status(&kc, true).unwrap()).unwrap();
            by_name(&v, "member-b")["owned"] == 8 && v["moves_in_flight"] == 0
        },
    );

    // the singleton runs on the coordinator only, and collects a child whose Widget is gone (a bare API
    // server has no garbage collector)
    let coordinator = kshard(&["status"], &kc)["coordinator"]
        .as_str()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let term_of = |addr: &str| -> u64 {
        http_get(addr, "/metrics")
            .lines()
            .find(|l| l.starts_with("kshard_singleton_term "))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap()
    };
    let (lead, other_addr) = if coordinator == "member-a" {
        (&a_addr, &b_addr)
    } else {
        (&b_addr, &a_addr)
    };
    until(Duration::from_secs(10), "the singleton runs", || {
        term_of(lead) > 0
    });
    assert_eq!(term_of(other_addr), 0, "the singleton runs once");
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(widgets.clone().into_client(), "default");
    let orphan: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "orphan-widget", "labels": {"example.kube-shard.io/widget": "orphan"},
            "ownerReferences": [{"apiVersion": "example.kube-shard.io/v1", "kind": "Widget",
                "name": "orphan", "uid": "00000000-0000-4000-8000-000000000000", "controller": true}]}
    }))
    .unwrap();
    rt.block_on(cms.create(&Default::default(), &orphan))
        .unwrap();
    until(
        Duration::from_secs(10),
        "the orphaned child is collected",
        || rt.block_on(cms.get_opt("orphan-widget")).unwrap().is_none(),
    );
    assert!(
        rt.block_on(cms.get_opt(&format!("{}-widget", "w1")))
            .unwrap()
            .is_some(),
        "a child with a live Widget stays"
    );

    // SIGTERM: a graceful leave, the other member takes everything
    let code = replicas::processes()
        .block_on(a.terminate(Duration::from_secs(30)))
        .unwrap_or_else(|e| panic!("leave did not end: {e}"));
    assert!(code.success(), "graceful leave exits 0: {code:?}");
    until(Duration::from_secs(20), "member-b owns everything", || {
        let Some(text) = status(&kc, true) else {
            return false;
        };
        let v: Value = serde_json::from_str(&text).unwrap();
        let members = v["members"].as_array().unwrap();
        members.len() == 1
            && members[0]["name"] == "member-b"
            && members[0]["owned"] == 16
            && v["unowned_count"] == 0
    });
}

#[test]
fn shadow_operator_owns_shards_but_reconciles_nothing_and_a_legacy_leader_holds_it_back() {
    let (dir, _server) = testserver();
    let kc = dir.path().join("kubeconfig");
    let (rt, client) = client_for(&kc);
    // a legacy leader that keeps renewing its lease
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), "default");
    let lease = |holder: Option<&str>| -> k8s_openapi::api::coordination::v1::Lease {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "old-leader"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 2,
                     "renewTime": k8s_openapi::jiff::Timestamp::now().to_string()}
        }))
        .unwrap()
    };
    rt.block_on(leases.create(&Default::default(), &lease(Some("old"))))
        .unwrap();
    let renew = || {
        let l = rt.block_on(leases.get("old-leader")).unwrap();
        let mut l2 = lease(Some("old"));
        l2.metadata.resource_version = l.metadata.resource_version;
        let _ = rt.block_on(leases.replace("old-leader", &Default::default(), &l2));
    };
    let (_shadow, _) = operator_with(&kc, "member-a", &["--shadow"]);
    let (_gated, _) = operator_with(&kc, "member-b", &["--legacy-leader-lease", "old-leader"]);
    until(Duration::from_secs(40), "a settled group", || {
        let Some(text) = status(&kc, true) else {
            renew();
            return false;
        };
        let v: Value = serde_json::from_str(&text).unwrap();
        renew();
        v["members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["owned"] == 8)
            && v["members"].as_array().unwrap().len() == 2
    });
    let ar = kube::api::ApiResource {
        group: "example.kube-shard.io".into(),
        version: "v1".into(),
        api_version: "example.kube-shard.io/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let widgets: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client.clone(), "default", &ar);
    for i in 0..8 {
        let w: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "example.kube-shard.io/v1", "kind": "Widget",
            "metadata": {"name": format!("w{i}")}, "spec": {"size": i}
        }))
        .unwrap();
        rt.block_on(widgets.create(&Default::default(), &w))
            .unwrap();
    }
    // while the legacy leader renews, nobody reconciles: the shadow member never, the gated one not yet
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        renew();
        std::thread::sleep(Duration::from_millis(300));
    }
    let reconciled_by = || -> Vec<String> {
        rt.block_on(widgets.list(&Default::default()))
            .unwrap()
            .items
            .iter()
            .filter_map(|w| w.data["status"]["reconciledBy"].as_str().map(str::to_owned))
            .collect()
    };
    assert!(reconciled_by().is_empty(), "{:?}", reconciled_by());
    // the legacy leader stops: the gated member reconciles its Widgets; the shadow member still nothing
    until(
        Duration::from_secs(20),
        "the gated member reconciles",
        || !reconciled_by().is_empty(),
    );
    std::thread::sleep(Duration::from_secs(2));
    let by = reconciled_by();
    assert!(by.iter().all(|m| m == "member-b"), "{by:?}");
}
