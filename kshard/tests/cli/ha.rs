//! `kshard ha status` and `kshard ha promote --force --old-active-stopped` against two embedded API
//! servers (cluster `a`, the stopped Active, and cluster `b`, the Standby), with short HA timings.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::{ObjectMeta, PostParams};
use kube::Api;
use kube_shard_harness::process::ReplicaProcess;
use kube_shard_harness::server::{BackgroundServer, ServeOptions};
use serde_json::Value;

use crate::replicas;

/// An embedded API server (plain HTTP) as cluster `name`, its kubeconfig in `dir`.
fn testserver(dir: &Path, name: &str) -> (PathBuf, BackgroundServer) {
    let kc = dir.join(format!("{name}.kubeconfig"));
    let mut opts = ServeOptions::default();
    opts.plain_http = true;
    let server = BackgroundServer::start(&kc, opts).unwrap();
    (kc, server)
}

async fn client(kc: &Path) -> kube::Client {
    let yaml = std::fs::read_to_string(kc).unwrap();
    let kcfg = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kcfg, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

/// An HA Lease as the operators write it: `<cluster>/<epoch>`, timings 3 s / 2 s / 500 ms.
fn ha_lease(holder: &str, epoch: i32) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some("widgets-ha".into()),
            annotations: Some(BTreeMap::from([(
                "kube-shard.io/ha-timings".to_string(),
                "v1 renewDeadlineMs=2000 requestTimeoutMs=500".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(format!("{holder}/{epoch}")),
            lease_duration_seconds: Some(3),
            lease_transitions: Some(epoch),
            ..LeaseSpec::default()
        }),
    }
}

fn ha(args: &[&str], own: &Path, peer: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kshard"))
        .arg("ha")
        .args(args)
        .arg("--kubeconfig")
        .arg(own)
        .arg("--peer-kubeconfig")
        .arg(peer)
        .args(["-n", "default", "--name", "widgets"])
        .args(["--cluster-id", "b", "--rank", "2"])
        .output()
        .unwrap()
}

const TIMINGS: [&str; 10] = [
    "--lease-duration",
    "3s",
    "--renew-deadline",
    "2s",
    "--retry-period",
    "500ms",
    "--request-timeout",
    "500ms",
    "--grace",
    "500ms",
];

fn status(b: &Path, a: &Path) -> Value {
    let out = ha(&["status", "--json"], b, a);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn ha_status_shows_both_sides_and_promote_force_takes_over_a_stopped_active() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _sa) = testserver(dir.path(), "a");
    let (b, _sb) = testserver(dir.path(), "b");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // the old Active `a` wrote both HA Leases at epoch 1001, then stopped
    let (la, lb): (Api<Lease>, Api<Lease>) = rt.block_on(async {
        (
            Api::namespaced(client(&a).await, "default"),
            Api::namespaced(client(&b).await, "default"),
        )
    });
    rt.block_on(async {
        la.create(&PostParams::default(), &ha_lease("a", 1001))
            .await
            .unwrap();
        lb.create(&PostParams::default(), &ha_lease("a", 1001))
            .await
            .unwrap();
    });

    let st = status(&b, &a);
    assert_eq!(st["active"], "a");
    assert_eq!(st["highest_epoch"], 1001);
    assert_eq!(st["limbo"], Value::Null);
    assert_eq!(st["leases"][0]["cluster"], "local");
    assert_eq!(st["leases"][0]["holder"], "a/1001");
    assert_eq!(st["leases"][1]["cluster"], "peer");
    assert_eq!(st["leases"][1]["holder"], "a/1001");
    // the table names both sides
    let out = ha(&["status"], &b, &a);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("local") && text.contains("peer"), "{text}");
    assert!(text.contains("active: a at epoch 1001"), "{text}");
    assert!(text.contains("limbo: no"), "{text}");

    // --force alone is refused: the human must assert the old Active is stopped
    let out = ha(&["promote", "--force"], &b, &a);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--old-active-stopped"));

    let mut args = vec![
        "promote",
        "--force",
        "--old-active-stopped",
        "--timeout",
        "30s",
    ];
    args.extend(TIMINGS);
    // b holds a Widget that is not a copy, and no mirror ever ran on b (no checkpoint): the runbook's
    // command, without `--kind`, is refused and changes nothing
    install_widget_crd(&rt, &b);
    let wb = widget_api(&rt, &b);
    until(std::time::Duration::from_secs(10), "the CRD served", || {
        rt.block_on(wb.create(&Default::default(), &widget("mine")))
            .is_ok()
    });
    let out = ha(&args, &b, &a);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--allow-no-mirror"),
        "promoted a Standby with no mirror and an object it did not copy: {}{err}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(status(&b, &a)["active"], "a", "nothing was written");
    rt.block_on(wb.delete("mine", &Default::default())).unwrap();
    args.push("--allow-no-mirror");
    let t = std::time::Instant::now();
    let out = ha(&args, &b, &a);
    let took = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("promoted: b is Active at epoch 2002"),
        "{stdout}"
    );
    assert!(stdout.contains("override: --allow-no-mirror"), "{stdout}");
    // armed after the full wait (max(3 s, 2 s + 0.5 s) + 0.5 s) from the command's start, not sooner
    assert!(took >= std::time::Duration::from_millis(3_500), "{took:?}");
    let st = status(&b, &a);
    assert_eq!(st["active"], "b", "{st}");
    assert_eq!(st["highest_epoch"], 2002);
    assert_eq!(st["leases"][0]["holder"], "b/2002");

    // a record of a higher epoch that b's own Lease does not hold: limbo
    rt.block_on(async {
        let mut l = la.get("widgets-ha").await.unwrap();
        let spec = l.spec.as_mut().unwrap();
        spec.holder_identity = Some("b/3002".into());
        spec.lease_transitions = Some(3002);
        la.replace("widgets-ha", &PostParams::default(), &l)
            .await
            .unwrap();
    });
    let st = status(&b, &a);
    assert_eq!(st["active"], Value::Null);
    assert!(
        st["limbo"].as_str().unwrap().contains("3002"),
        "{}",
        st["limbo"]
    );
    let out = ha(&["status"], &b, &a);
    assert!(String::from_utf8_lossy(&out.stdout).contains("limbo: epoch 3002"));
}

fn ha_operator(
    own: &Path,
    peer: &Path,
    name: &str,
    mode: &str,
    cluster: &str,
    rank: &str,
) -> ReplicaProcess {
    ha_operator_with(own, peer, [name, mode, cluster, rank], &[])
}

/// `kshard operator` as member `name` of cluster `cluster` (mode, rank), with `extra` flags.
fn ha_operator_with(own: &Path, peer: &Path, who: [&str; 4], extra: &[&str]) -> ReplicaProcess {
    let [name, mode, cluster, rank] = who;
    let mut flags = replicas::flags(own, name, "widgets");
    flags.expected = 1;
    let peer = peer.to_str().expect("a UTF-8 path");
    let ha = [
        "--ha-mode",
        mode,
        "--ha-cluster-id",
        cluster,
        "--ha-rank",
        rank,
        "--ha-remote-kubeconfig",
        peer,
    ];
    flags.extra = ha.iter().chain(extra).map(OsString::from).collect();
    replicas::start(&flags, own)
}

/// The demo's Widget CRD on `kc`'s cluster (what `kshard operator --install-crd` installs).
fn install_widget_crd(rt: &tokio::runtime::Runtime, kc: &Path) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
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
    .unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(rt.block_on(client(kc)));
    rt.block_on(api.create(&PostParams::default(), &crd))
        .unwrap();
}

/// A Widget named `name` (size 3).
fn widget(name: &str) -> kube::api::DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "example.kube-shard.io/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": {"size": 3}
    }))
    .unwrap()
}

fn widget_api(rt: &tokio::runtime::Runtime, kc: &Path) -> Api<kube::api::DynamicObject> {
    let ar = kube::api::ApiResource {
        group: "example.kube-shard.io".into(),
        version: "v1".into(),
        api_version: "example.kube-shard.io/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    };
    let c = rt.block_on(client(kc));
    Api::namespaced_with(c, "default", &ar)
}

fn until(limit: std::time::Duration, what: &str, mut f: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// `kshard operator --ha-*`: the Active cluster's operator bootstraps epoch 1001 and reconciles, the
/// Standby's reconciles nothing; an unknown `--ha-mode`, and an HA mode without `--ha-rank`, are start-up
/// errors.
#[test]
fn ha_operator_flags_make_one_cluster_active_and_the_other_reconcile_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _sa) = testserver(dir.path(), "a");
    let (b, _sb) = testserver(dir.path(), "b");

    // `kshard operator` for cluster a with `mode` and `extra`: a start-up refusal (exit 2) and its stderr
    let refused = |mode: &str, extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
            .arg("operator")
            .arg("--kubeconfig")
            .arg(&a)
            .args(["--ha-mode", mode, "--ha-cluster-id", "a", "--ha-rank", "1"])
            .arg("--ha-remote-kubeconfig")
            .arg(&b)
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused("primary", &[]);
    assert!(
        err.contains("primary") && err.contains("active") && err.contains("standby"),
        "{err}"
    );
    // the lag bound needs the mirror (which confirms the lag) and a witness (automatic promotion)
    let lag = ["--ha-max-auto-promote-lag", "60s"];
    let err = refused("active", &lag);
    assert!(err.contains("--ha-mirror"), "{err}");
    let with_mirror = [&lag[..], &["--ha-mirror", "--ha-peer-cluster-id", "b"]].concat();
    let err = refused("active", &with_mirror);
    assert!(err.contains("--ha-witness-kubeconfig"), "{err}");
    // a witness without the mirror never sees the lag confirmed: refused unless unbounded by name
    let witness = ["--ha-witness-kubeconfig", b.to_str().unwrap()];
    let err = refused("standby", &witness);
    assert!(err.contains("--ha-auto-promote-without-lag-bound"), "{err}");
    let both = [&witness[..], &lag, &["--ha-auto-promote-without-lag-bound"]].concat();
    let err = refused("standby", &both);
    assert!(err.contains("--ha-max-auto-promote-lag"), "{err}");
    // the rank is required in an HA mode: a default shared by both sides makes equal epochs
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .arg("operator")
        .arg("--kubeconfig")
        .arg(&a)
        .args(["--ha-mode", "standby", "--ha-cluster-id", "a"])
        .arg("--ha-remote-kubeconfig")
        .arg(&b)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--ha-rank is required"), "{err}");

    let _oa = ha_operator(&a, &b, "a-0", "active", "a", "1");
    let _ob = ha_operator(&b, &a, "b-0", "standby", "b", "2");
    // bootstrap: every HA Lease seen missing for lease_duration + grace (17 s), then created
    let mut last = Value::Null;
    until(
        std::time::Duration::from_secs(60),
        "a active at 1001",
        || {
            let out = ha(&["status", "--json"], &b, &a);
            if !out.status.success() {
                return false;
            }
            last = serde_json::from_slice(&out.stdout).unwrap();
            last["active"] == "a" && last["highest_epoch"] == 1001
        },
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let w: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "example.kube-shard.io/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 3}
    }))
    .unwrap();
    let (wa, wb) = (widget_api(&rt, &a), widget_api(&rt, &b));
    rt.block_on(wa.create(&Default::default(), &w)).unwrap();
    rt.block_on(wb.create(&Default::default(), &w)).unwrap();
    until(
        std::time::Duration::from_secs(20),
        "the Active reconciles w1",
        || rt.block_on(wa.get("w1")).unwrap().data["status"]["reconciledBy"] == "a-0",
    );
    std::thread::sleep(std::time::Duration::from_secs(5));
    let on_b = rt.block_on(wb.get("w1")).unwrap();
    assert!(
        on_b.data["status"]["reconciledBy"].is_null(),
        "the Standby reconciled: {}",
        on_b.data
    );
}

/// Write the mirror's position for `kind` from `source` into the checkpoint on `kc`'s cluster (the mirror
/// is not built yet: the test stands in for it).
fn write_position(rt: &tokio::runtime::Runtime, kc: &Path, kind: &str, source: &str, rv: u64) {
    write_entry(rt, kc, kind, &format!("v1 source={source} rv={rv}"));
}

/// Set `key` to `value` in the checkpoint on `kc`'s cluster.
fn write_entry(rt: &tokio::runtime::Runtime, kc: &Path, key: &str, value: &str) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api: Api<ConfigMap> = Api::namespaced(rt.block_on(client(kc)), "default");
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("widgets-ha-mirror".into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(key.to_string(), value.to_string())])),
        ..ConfigMap::default()
    };
    rt.block_on(async {
        match api.get_opt("widgets-ha-mirror").await.unwrap() {
            None => api.create(&PostParams::default(), &cm).await.unwrap(),
            Some(old) => {
                let mut cm = cm;
                let mut data = old.data.clone().unwrap_or_default();
                data.extend(cm.data.take().unwrap());
                cm.data = Some(data);
                cm.metadata.resource_version = old.metadata.resource_version;
                api.replace("widgets-ha-mirror", &PostParams::default(), &cm)
                    .await
                    .unwrap()
            }
        }
    });
}

/// What a mirror of Widgets from `source` records of itself in the checkpoint on `kc`'s cluster when it
/// starts (the stand-in's): the promotion checks read the mirrored kinds there.
fn write_record(rt: &tokio::runtime::Runtime, kc: &Path, source: &str) {
    write_entry(
        rt,
        kc,
        "mirror",
        &format!("v1 source={source} kinds={KIND} namespaces=* own=-"),
    );
}

/// The stand-in mirror's acknowledgement of catch-up requests: while it lives, every request
/// `promote --token` leaves in the checkpoint on `kc`'s cluster is answered as the mirror answers once
/// caught up and holding (`caught-up: <id> failed=0`).
struct Acknowledger {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Acknowledger {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn acknowledger(kc: &Path) -> Acknowledger {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_shard_ha::switchover::{DemotionToken, CATCH_UP_KEY, CAUGHT_UP_KEY};
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (flag, kc) = (stop.clone(), kc.to_path_buf());
    let thread = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let api: Api<ConfigMap> = Api::namespaced(client(&kc).await, "default");
            while !flag.load(std::sync::atomic::Ordering::SeqCst) {
                let data = api
                    .get_opt("widgets-ha-mirror")
                    .await
                    .ok()
                    .flatten()
                    .and_then(|c| c.data)
                    .unwrap_or_default();
                let asked = data
                    .get(CATCH_UP_KEY)
                    .and_then(|t| t.parse::<DemotionToken>().ok());
                if let Some(t) = asked {
                    let ack = format!("{} failed=0", t.id);
                    if data.get(CAUGHT_UP_KEY) != Some(&ack) {
                        let patch = serde_json::json!({"data": {CAUGHT_UP_KEY: ack}});
                        let _ = api
                            .patch(
                                "widgets-ha-mirror",
                                &kube::api::PatchParams::default(),
                                &kube::api::Patch::Merge(&patch),
                            )
                            .await;
                    }
                }
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        });
    });
    Acknowledger {
        stop,
        thread: Some(thread),
    }
}

fn ha_as(args: &[&str], own: &Path, peer: &Path, id: &str, rank: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kshard"))
        .arg("ha")
        .args(args)
        .arg("--kubeconfig")
        .arg(own)
        .arg("--peer-kubeconfig")
        .arg(peer)
        .args(["-n", "default", "--name", "widgets"])
        .args(["--cluster-id", id, "--rank", rank])
        .output()
        .unwrap()
}

const KIND: &str = "widgets.example.kube-shard.io/v1";

/// `kshard ha demote`, `promote --token` and `switchover` on two `kshard-dev testserver` processes with a
/// `kshard operator` in each: a → b with the token, then b → a in one command.
#[test]
fn ha_demote_promote_token_and_switchover_move_the_active_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _sa) = testserver(dir.path(), "a");
    let (b, _sb) = testserver(dir.path(), "b");
    let _oa = ha_operator(&a, &b, "a-0", "active", "a", "1");
    let _ob = ha_operator(&b, &a, "b-0", "standby", "b", "2");
    until(
        std::time::Duration::from_secs(60),
        "a active at 1001",
        || {
            let out = ha(&["status", "--json"], &b, &a);
            out.status.success() && {
                let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                v["active"] == "a" && v["highest_epoch"] == 1001
            }
        },
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let demote = [
        "demote",
        "--kind",
        KIND,
        "--group",
        "widgets",
        "--drain-timeout",
        "30s",
    ];
    // no mirror recorded on b: the demotion is refused before anything is written
    let out = ha_as(&demote, &a, &b, "a", "1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("--allow-no-mirror"),
        "{err}"
    );
    // the mirror (stand-in) records itself on b: a `--kind` that differs is refused, naming the kinds
    write_record(&rt, &b, "a");
    let out = ha_as(
        &["demote", "--kind", "configmaps/v1", "--group", "widgets"],
        &a,
        &b,
        "a",
        "1",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("missing widgets.example.kube-shard.io")
            && err.contains("not mirrored here: configmaps"),
        "{err}"
    );
    let st = status(&b, &a);
    assert_eq!(st["active"], "a", "nothing was written: {st}");
    // without `--kind`, the kinds are the mirror's
    let out = ha_as(
        &["demote", "--group", "widgets", "--drain-timeout", "30s"],
        &a,
        &b,
        "a",
        "1",
    );
    let token = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        token.starts_with("v1;src=a/") && token.contains(";e=1001;"),
        "{token}"
    );
    // the mirror (stand-in) reaches the token on b
    let source = token
        .split(';')
        .nth(1)
        .unwrap()
        .strip_prefix("src=")
        .unwrap();
    let krv: u64 = token
        .split(";k=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    write_position(&rt, &b, "widgets.example.kube-shard.io", source, krv);
    let _ack_b = acknowledger(&b);
    // a wrong token is refused and changes nothing
    let wrong = token.replace(";e=1001;", ";e=2001;");
    let out = ha_as(
        &["promote", "--token", &wrong, "--timeout", "5s"],
        &b,
        &a,
        "b",
        "2",
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("stale"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut args = vec!["promote", "--token", token.as_str(), "--timeout", "30s"];
    args.extend(TIMINGS);
    let t = std::time::Instant::now();
    let out = ha_as(&args, &b, &a, "b", "2");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("promoted: b is Active at epoch 2002"),
        "{stdout}"
    );
    eprintln!("[cli] promote --token took {:?}", t.elapsed());
    let st = status(&b, &a);
    assert_eq!(st["active"], "b", "{st}");
    // back in one command: b's token is taken and used on a (the stand-in mirror on a is far ahead)
    let src_b = {
        let out = ha_as(&["status", "--json"], &b, &a, "b", "2");
        assert!(out.status.success());
        let rt2 = &rt;
        let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(rt2.block_on(client(&b)));
        format!(
            "b/{}",
            rt2.block_on(ns.get("kube-system"))
                .unwrap()
                .metadata
                .uid
                .unwrap()
        )
    };
    write_record(&rt, &a, "b");
    write_position(
        &rt,
        &a,
        "widgets.example.kube-shard.io",
        &src_b,
        u64::MAX / 4,
    );
    let _ack_a = acknowledger(&a);
    let sw = [
        "switchover",
        "--kind",
        KIND,
        "--group",
        "widgets",
        "--peer-cluster-id",
        "a",
        "--peer-rank",
        "1",
        "--timeout",
        "30s",
    ];
    let out = ha_as(&sw, &b, &a, "b", "2");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("switched over: a is Active at epoch 3001"),
        "{stdout}"
    );
    let st = status(&b, &a);
    assert_eq!(st["active"], "a", "{st}");
    assert_eq!(st["highest_epoch"], 3001);
}

const WIDGET_KIND: &str = "widgets.example.kube-shard.io/v1";

fn mirror_status(b: &Path, a: &Path) -> Value {
    let out = ha(
        &[
            "status",
            "--json",
            "--kind",
            WIDGET_KIND,
            "--peer-cluster-id",
            "a",
        ],
        b,
        a,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `kshard operator --ha-mirror`: the Standby's operator mirrors the Active's Widgets and records its
/// phase; `kshard ha status --kind` shows the mirror's row; `promote --force --kind` refuses a target
/// holding a Widget that is not a copy, then promotes, and the Standby's operator adopts and reconciles.
#[test]
fn ha_operator_mirror_duty_status_rows_and_the_promotion_target_check() {
    let dir = tempfile::tempdir().unwrap();
    let (a, _sa) = testserver(dir.path(), "a");
    let (b, _sb) = testserver(dir.path(), "b");
    let mirror = |peer: &'static str| {
        [
            "--ha-mirror",
            "--ha-peer-cluster-id",
            peer,
            "--ha-prune-grace",
            "2s",
        ]
    };
    let oa = ha_operator_with(&a, &b, ["a-0", "active", "a", "1"], &mirror("b"));
    let _ob = ha_operator_with(&b, &a, ["b-0", "standby", "b", "2"], &mirror("a"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (wa, wb) = (widget_api(&rt, &a), widget_api(&rt, &b));
    let w = |name: &str| -> kube::api::DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "example.kube-shard.io/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": {"size": 3}
        }))
        .unwrap()
    };
    until(std::time::Duration::from_secs(60), "the CRD on a", || {
        rt.block_on(wa.create(&Default::default(), &w("w1")))
            .is_ok()
    });
    let mut last = Value::Null;
    until(std::time::Duration::from_secs(90), "b mirrors w1", || {
        last = mirror_status(&b, &a);
        let k = &last["mirror"]["kinds"][0];
        last["mirror"]["duty"] == "mirroring"
            && k["behind"] == 0
            && k["position"].is_u64()
            && rt.block_on(wb.get_opt("w1")).unwrap().is_some_and(|c| {
                c.metadata
                    .labels
                    .unwrap_or_default()
                    .get("kube-shard.io/mirrored-from")
                    .map(String::as_str)
                    == Some("a")
            })
    });
    assert_eq!(last["mirror"]["kinds"][0]["divergent"], 0, "{last}");
    assert_eq!(last["mirror"]["was_active"], Value::Null, "{last}");
    let text = String::from_utf8_lossy(
        &ha(
            &["status", "--kind", WIDGET_KIND, "--peer-cluster-id", "a"],
            &b,
            &a,
        )
        .stdout,
    )
    .to_string();
    eprintln!("[cli] kshard ha status --kind:\n{text}");
    assert!(
        text.contains("mirror of a: duty mirroring")
            && text.contains("widgets.example.kube-shard.io"),
        "{text}"
    );

    // a dies; b holds a Widget it did not mirror: not a promotion target. The runbook's command, no
    // `--kind`: the checks read the mirrored kinds from b's checkpoint
    drop(oa);
    rt.block_on(wb.create(&Default::default(), &w("mine")))
        .unwrap();
    let mut args = vec![
        "promote",
        "--force",
        "--old-active-stopped",
        "--timeout",
        "30s",
    ];
    args.extend(TIMINGS);
    let out = ha(&args, &b, &a);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("not promoted")
            && err.contains("mine")
            && err.contains("--allow-divergent"),
        "{err}"
    );
    assert_eq!(mirror_status(&b, &a)["active"], "a", "nothing was written");
    // a `--kind` that is not the mirror's is refused, naming the difference
    let mut other = args.clone();
    other.extend(["--kind", "configmaps/v1"]);
    let out = ha(&other, &b, &a);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("missing widgets.example.kube-shard.io")
            && err.contains("--allow-kind-mismatch"),
        "{err}"
    );

    rt.block_on(wb.delete("mine", &Default::default())).unwrap();
    args.extend(["--kind", WIDGET_KIND, "--peer-cluster-id", "a"]);
    let out = ha(&args, &b, &a);
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{err}");
    assert!(
        err.contains("mirrored up to resourceVersion") && err.contains("full LIST of"),
        "{err}"
    );
    assert!(!stdout.contains("override"), "{stdout}");
    // b's operator's mirror held before the candidacy (the duty then stops it)
    assert!(err.contains("the mirror holds"), "{err}");
    // b's operator adopts (its duty) and then reconciles the adopted Widget
    until(
        std::time::Duration::from_secs(60),
        "b reconciles w1",
        || rt.block_on(wb.get("w1")).unwrap().data["status"]["reconciledBy"] == "b-0",
    );
    let st = mirror_status(&b, &a);
    assert_eq!(st["active"], "b", "{st}");
    assert_eq!(st["mirror"]["duty"], "active", "{st}");
    assert!(
        st["mirror"]["was_active"]
            .as_str()
            .is_some_and(|e| e.starts_with('2')),
        "{st}"
    );
}

/// Publish the identity of a side (what a running operator writes at start) in the cluster of `kc`.
fn publish_identity(rt: &tokio::runtime::Runtime, kc: &Path, id: &str, rank: u64, mirrored: bool) {
    use kube_shard_ha::identity::{publish, Identity};
    rt.block_on(async {
        let c = client(kc).await;
        let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.clone());
        let uid = ns.get("kube-system").await.unwrap().metadata.uid.unwrap();
        let mut b = kube_shard_ha::HaConfig::builder("widgets")
            .mode(kube_shard_ha::HaMode::Standby)
            .cluster(id, rank)
            .namespace("default")
            .kubeconfigs(None, Some("/peer".into()), None);
        if mirrored {
            b = b.mirrored_kinds(["widgets.example.kube-shard.io/v1".parse().unwrap()]);
        }
        let cfg = b.build().unwrap();
        publish(&c, &cfg, &Identity::of(&cfg, uid)).await.unwrap();
    });
}

fn check(a: &Path, b: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(["ha", "check", "--kubeconfig"])
        .arg(a)
        .arg("--peer-kubeconfig")
        .arg(b)
        .args(["-n", "default", "--name", "widgets"])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// `kshard ha check` lists each mismatch of the two published identities and exits non-zero; a
/// consistent pair passes.
#[test]
fn ha_check_names_each_mismatch_and_passes_a_consistent_pair() {
    let dir = tempfile::tempdir().unwrap();
    let (ka, _sa) = testserver(dir.path(), "a");
    let (kb, _sb) = testserver(dir.path(), "b");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (ok, out) = check(&ka, &kb);
    assert!(!ok && out.contains("no identity published"), "{out}");
    publish_identity(&rt, &ka, "site-a", 1, true);
    publish_identity(&rt, &kb, "site-b", 2, true);
    let (ok, out) = check(&ka, &kb);
    assert!(ok && out.contains("consistent"), "{out}");
    for (id, rank, mirrored, want) in [
        ("site-b", 1, true, "MISMATCH rank"),
        ("site-a", 2, true, "MISMATCH cluster id"),
        ("site-b", 2, false, "MISMATCH mirrored kinds"),
    ] {
        publish_identity(&rt, &kb, id, rank, mirrored);
        let (ok, out) = check(&ka, &kb);
        assert!(!ok && out.contains(want), "{id} {rank}: {out}");
    }
    // both kubeconfigs at one cluster
    let (ok, out) = check(&ka, &ka);
    assert!(!ok && out.contains("MISMATCH two clusters"), "{out}");
}

/// The mirror's scope flags refuse bad input before any request: a malformed label selector is named, and
/// a built-in kind in `kshard ha status --kind` parses with a selector; `leave` needs a reason.
#[test]
fn ha_scope_flags_refuse_a_malformed_label_selector_by_name() {
    let none = Path::new("/nonexistent/kubeconfig");
    let out = ha(
        &[
            "status",
            "--kind",
            "configmaps/v1",
            "--peer-cluster-id",
            "a",
            "--mirror-labels",
            "app in (shop",
        ],
        none,
        none,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("\"app in (shop\"") && err.contains("unclosed parenthesis"),
        "{err}"
    );
    let out = ha(&["leave"], none, none);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--reason"), "{err}");
}
