//! A request of the group the API server refuses (403) is a missing Role, not a timing problem: the member
//! logs it at error naming the verb, the resource, the namespace and the object, [`Health`] and the status
//! carry it, its Lease shows it when the Lease is writable, and after one renew deadline the task ends with
//! [`GroupError::Forbidden`]. Transient failures (5xx) keep the old behaviour: retried, never an error.
//!
//! [`Health`]: kube_shard::group::Health

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_shard::group::{GroupError, PermissionError, PERMISSION_ERROR};
use kube_shard_testserver::{FailRule, Scope, Verb};
use tokio::time::Instant;

use super::*;
use crate::support::Logs;

/// Refuse `verb` of `member` on `resource` with 403, for good: on the object `name`, or (`None`) on any —
/// a create names its object in its body, which a fault cannot match.
fn refuse(server: &TestServer, member: &str, verb: Verb, resource: &str, name: Option<&str>) {
    let mut target = Scope::identity(member).verb(verb).resource(resource);
    if let Some(name) = name {
        target = target.name(name);
    }
    server
        .faults()
        .fail_next(target, FailRule::status(403).times(1_000_000));
}

/// The refusal `member` publishes on its Lease, waited for at most `limit`.
async fn published_refusal(server: &TestServer, member: &str, limit: Duration) -> String {
    let leases: Api<Lease> = Api::namespaced(server.client("admin"), CP_NS);
    let name = format!("{GROUP}-{member}");
    let start = Instant::now();
    loop {
        let lease = leases.get_opt(&name).await.unwrap();
        let ann = lease
            .and_then(|l| l.metadata.annotations)
            .unwrap_or_default();
        if let Some(p) = ann.get(PERMISSION_ERROR) {
            return p.clone();
        }
        assert!(
            start.elapsed() < limit,
            "{member} published no refusal on its Lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn what(p: &PermissionError) -> (&str, &str, &str, Option<&str>, u16) {
    (p.verb, p.resource, &p.namespace, p.name.as_deref(), p.code)
}

/// The member's Lease cannot be created: it never joins, says why (log, Health, status), and its task
/// ends with `Forbidden` one renew deadline after the first refusal — not a minute later through
/// liveness, and never as a bare self-fence.
#[tokio::test(start_paused = true)]
async fn a_member_refused_its_lease_says_so_and_stops_within_a_renew_deadline() {
    let (server, _log) = crate::support::group_server().await;
    let lease = format!("{GROUP}-a");
    refuse(&server, "a", Verb::Create, "leases", None);
    refuse(&server, "a", Verb::Update, "leases", Some(&lease));
    let logs = Logs::default();
    let _guard = logs.capture();
    let (handle, task) = builder(&server, "a").build().unwrap().start();
    let started = Instant::now();
    let task = tokio::spawn(task);
    until(RENEW, "the refusal in Health", || {
        handle.health().permission_error().is_some()
    })
    .await;
    let refused = handle.health().permission_error().unwrap();
    let expected = (
        "create",
        "coordination.k8s.io/leases",
        CP_NS,
        Some(lease.as_str()),
        403,
    );
    assert_eq!(what(&refused), expected);
    assert!(!handle.health().is_ready(), "ready while refused");
    assert!(
        handle.health().is_live(),
        "not live before a renew deadline"
    );
    assert_eq!(handle.status().permission_error.as_ref(), Some(&refused));
    assert_eq!(handle.status().namespace, CP_NS);
    assert!(handle.metrics().snapshot().permission_denied);

    let result = task.await.unwrap();
    let took = started.elapsed();
    assert!(
        took >= RENEW && took < RENEW + RETRY,
        "ended after {took:?}, not one renew deadline ({RENEW:?}) after the first refusal"
    );
    let Err(GroupError::Forbidden {
        verb,
        resource,
        namespace,
        name,
        code,
        ..
    }) = &result
    else {
        panic!("ended with {result:?}");
    };
    let got = (*verb, *resource, namespace.as_str(), name.as_deref(), *code);
    assert_eq!(got, expected);
    let text = result.unwrap_err().to_string();
    assert!(
        text.contains(
            "forbidden: cannot create coordination.k8s.io/leases in namespace control (demo-a)"
        ) && text.contains("deploy/rbac.yaml"),
        "{text}"
    );
    assert!(!handle.health().is_live(), "live after the task ended");
    assert!(handle.health().task_error().is_some());
    let errors = logs.errors();
    let named = "forbidden: cannot create coordination.k8s.io/leases in namespace control (demo-a)";
    assert!(
        errors
            .iter()
            .any(|l| l.contains(named) && l.contains("verb=create")),
        "no error log names the refusal: {errors:?}"
    );
    assert!(
        !errors.iter().any(|l| l.contains("self-fenced")),
        "a refusal reported as a self-fence: {errors:?}"
    );
}

/// The coordinator may not create the assignment ConfigMap: its own Lease is writable, so it publishes
/// the refusal there for `kshard status` (and an Event), and its task ends with `Forbidden` naming the
/// ConfigMap.
#[tokio::test(start_paused = true)]
async fn a_refused_assignment_write_is_published_on_the_members_lease() {
    let (server, _log) = crate::support::group_server().await;
    let assignment = format!("{GROUP}-assignment");
    // the only ConfigMap the member creates
    refuse(&server, "a", Verb::Create, "configmaps", None);
    let (handle, task) = builder(&server, "a").build().unwrap().start();
    let task = tokio::spawn(task);
    until(LEASE * 3, "the refusal in Health", || {
        handle.health().permission_error().is_some()
    })
    .await;
    let first = Instant::now();
    let refused = handle.health().permission_error().unwrap();
    let expected = (
        "create",
        "configmaps",
        CP_NS,
        Some(assignment.as_str()),
        403,
    );
    assert_eq!(what(&refused), expected);

    let published = published_refusal(&server, "a", RENEW).await;
    assert!(
        published.starts_with(
            "forbidden: cannot create configmaps in namespace control (demo-assignment)"
        ),
        "{published}"
    );
    let members = kube_shard::group::admin::GroupRef::new(server.client("admin"), CP_NS, GROUP)
        .member_leases()
        .await
        .unwrap();
    assert_eq!(members.len(), 1);
    assert_eq!(
        members[0].permission_error.as_deref(),
        Some(published.as_str())
    );

    let result = task.await.unwrap();
    assert!(
        first.elapsed() < RENEW,
        "ended {:?} after the refusal was seen",
        first.elapsed()
    );
    assert!(
        matches!(&result, Err(GroupError::Forbidden { resource, name, .. })
            if *resource == "configmaps" && name.as_deref() == Some(assignment.as_str())),
        "{result:?}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(server.client("admin"), CP_NS);
    let denied = events.list(&Default::default()).await.unwrap().items;
    assert!(
        denied
            .iter()
            .any(|e| e.reason.as_deref() == Some("PermissionDenied")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("demo-assignment"))),
        "no PermissionDenied Event"
    );
}

/// 503s on the member's Lease for longer than a renew deadline are an outage, not a missing Role: the
/// member self-fences as before, records no permission error, keeps running and un-fences once the
/// server answers again.
#[tokio::test(start_paused = true)]
async fn transient_errors_self_fence_but_are_not_permission_errors() {
    let (server, log) = crate::support::group_server().await;
    let a = spawn(&server, "a", &log);
    until(Duration::from_secs(30), "settled", || {
        each_shard_owned_once(&[&a])
    })
    .await;
    let target = Scope::identity("a")
        .verb(Verb::Update)
        .resource("leases")
        .name(format!("{GROUP}-a"));
    server
        .faults()
        .fail_next(target, FailRule::status(503).times(1_000_000));
    until(RENEW * 2, "self-fenced", || a.handle.status().self_fenced).await;
    tokio::time::sleep(RENEW).await;
    assert_eq!(a.handle.health().permission_error(), None);
    assert!(!a.task.is_finished(), "the task ended on 503s");
    server.faults().clear();
    until(LEASE * 3, "renewing again", || {
        !a.handle.status().self_fenced
    })
    .await;
    assert_eq!(a.handle.status().permission_error, None);
    check_fences(&log);
}

/// A joined member whose renewals start being refused (its Role lost `update`): the refusal of the renewal
/// is recorded from the first one, and the task ends with `Forbidden` for `update` one renew deadline
/// later, where before it only self-fenced and waited for liveness to fail.
#[tokio::test(start_paused = true)]
async fn refused_renewals_end_the_task_with_forbidden() {
    let (server, _log) = crate::support::group_server().await;
    let (handle, task) = builder(&server, "a").build().unwrap().start();
    let task = tokio::spawn(task);
    until(LEASE * 3, "joined", || handle.status().joined).await;
    let lease = format!("{GROUP}-a");
    refuse(&server, "a", Verb::Update, "leases", Some(&lease));
    until(RETRY * 2, "the refusal in Health", || {
        handle.health().permission_error().is_some()
    })
    .await;
    let first = Instant::now();
    let result = task.await.unwrap();
    assert!(
        first.elapsed() <= RENEW,
        "ended {:?} later",
        first.elapsed()
    );
    assert!(
        matches!(&result, Err(GroupError::Forbidden { verb, name, .. })
            if *verb == "update" && name.as_deref() == Some(lease.as_str())),
        "{result:?}"
    );
    assert!(
        handle.ownership().admit_shard(0).is_err(),
        "admitting after the end"
    );
}
