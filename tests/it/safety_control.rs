//! The control-plane findings finished after the first round (`review-safety.md` F8 part B, F9) and the
//! format rule of `docs/protocol.md` ("Formats"), on testserver's in-memory API server in paused time.
//! Each test failed before its fix (the failure is quoted in its doc comment).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{DeleteParams, ObjectMeta};
use kube::Api;
use kube_shard_testserver::TestServer;

use crate::group::{
    check_fences, each_shard_owned_once, settled, setup, until, FenceLog, Member, CP_NS, GROUP,
};
use crate::safety_group::renew_lease_forever;

fn server() -> TestServer {
    TestServer::builder().shard_selector(true).build()
}

/// A member Lease of group `GROUP` for member `name`, carrying `report` as its member report.
fn member_lease(name: &str, report: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(format!("{GROUP}-{name}")),
            labels: Some(
                [
                    ("kube-shard.io/group".to_string(), GROUP.to_string()),
                    ("kube-shard.io/role".to_string(), "member".to_string()),
                ]
                .into(),
            ),
            annotations: Some(
                [
                    (
                        "kube-shard.io/incarnation".to_string(),
                        "0123456789abcdef".to_string(),
                    ),
                    ("kube-shard.io/report".to_string(), report.to_string()),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(3),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

/// Formats: a member of another build (its report in another format) joins a settled group. Every member
/// raises the alarm (health, metric, Event) and admits nothing while it is there; once its Lease is gone
/// they admit again. Before: the foreign report was ignored as undecodable and both members kept
/// admitting ("a admits shard 0 beside a member of another build").
#[tokio::test(start_paused = true)]
async fn a_member_of_another_report_format_holds_admission_loudly() {
    let server = server();
    setup(&server).await;
    let log = FenceLog::default();
    let ms = settled(&server, &["a", "b"], &log).await;
    let stop = Arc::new(AtomicBool::new(false));
    let report = r#"{"format":2,"ready":true,"generation":1,"highest":1}"#;
    let z = renew_lease_forever(&server, "z", member_lease("z", report), stop.clone());
    until(
        Duration::from_secs(10),
        "both members hold admission",
        || {
            ms.iter().all(|m| {
                m.ownership().admission_hold().is_some()
                    && metric(m, "kube_shard_foreign_report_format").ends_with(" 1")
            })
        },
    )
    .await;
    for m in &ms {
        for s in 0..16 {
            assert!(
                m.ownership().admit_shard(s).is_err(),
                "{} admits shard {s} beside a member of another build",
                m.name
            );
        }
        let why = m.handle.health().foreign_format();
        assert!(
            why.as_deref()
                .is_some_and(|w| w.contains("demo-z") && w.contains("format 2")),
            "{}'s health does not say why it holds: {why:?}",
            m.name
        );
        assert!(!m.handle.health().is_ready(), "{} is ready", m.name);
    }
    let events: Api<Event> = Api::namespaced(server.client("admin"), CP_NS);
    let alarms = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ForeignReportFormat"))
        .count();
    assert!(alarms >= 2, "{alarms} ForeignReportFormat Events");

    // the other build leaves: admission resumes
    stop.store(true, Ordering::Relaxed);
    z.await.unwrap();
    let leases: Api<Lease> = Api::namespaced(server.client("admin"), CP_NS);
    leases
        .delete(&format!("{GROUP}-z"), &DeleteParams::default())
        .await
        .unwrap();
    until(Duration::from_secs(10), "admission resumes", || {
        ms.iter().all(|m| {
            m.ownership().admission_hold().is_none() && m.handle.health().foreign_format().is_none()
        })
    })
    .await;
    let refs: Vec<&Member> = ms.iter().collect();
    until(Duration::from_secs(10), "every shard admitted once", || {
        each_shard_owned_once(&refs)
    })
    .await;
    check_fences(&log);
}

/// The text of one metric family of a member's registry.
fn metric(m: &Member, name: &str) -> String {
    let mut registry = prometheus_client::registry::Registry::default();
    m.handle.metrics().register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .filter(|l| l.starts_with(name))
        .collect::<Vec<_>>()
        .join("\n")
}
