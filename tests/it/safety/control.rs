//! Control-plane progress under a stuck or slow API (a stuck assignment watch, a hung lease LIST, a slow
//! coordinator pass, a whole group restarted under its old names) and the format rule of `docs/protocol.md`
//! ("Formats"), on testserver's in-memory API server in paused time.
//! Each test failed before its fix (the failure is quoted in its doc comment).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::api::DeleteParams;
use kube::Api;
use kube_shard::group::assignment::Handoff;
use kube_shard_testserver::{FailRule, Scope, TestServer, Verb};

use crate::group::{
    assignment, check_fences, edit_assignment, settled, until, FenceLog, Member, CP_NS, DRAIN,
    GROUP, LEASE,
};
use crate::safety::group::renew_lease_forever;
use crate::support::{ends_owned_once, group_lease, group_server, settled_group};

/// Formats: a member of another build (its report in another format) joins a settled group. Every member
/// raises the alarm (health, metric, Event) and admits nothing while it is there; once its Lease is gone
/// they admit again. Before: the foreign report was ignored as undecodable and both members kept
/// admitting ("a admits shard 0 beside a member of another build").
#[tokio::test(start_paused = true)]
async fn a_member_of_another_report_format_holds_admission_loudly() {
    let (server, log, ms) = settled_group(&["a", "b"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let report = r#"{"format":3,"ready":true,"generation":1,"highest":1}"#;
    let z = renew_lease_forever(
        &server,
        "z",
        group_lease(&format!("{GROUP}-z"), "z", Some(report)),
        stop.clone(),
    );
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
    ends_owned_once(&refs, &log).await;
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

/// Settle `a` and `b`, freeze the assignment watch of the one that does not coordinate (its renewals still
/// work; with `no_direct_reads`, every GET of a ConfigMap it sends fails too), and move one of its shards to
/// the coordinator: by a pin, or (with `no_direct_reads`) by writing the move into the assignment. Returns the members, the frozen member's index and the shard.
async fn stalled_move(
    server: &TestServer,
    log: &FenceLog,
    no_direct_reads: bool,
) -> (Vec<Member>, usize, u32) {
    let ms = settled(server, &["a", "b"], log).await;
    let frozen = usize::from(ms[0].handle.status().coordinator);
    let lead = 1 - frozen;
    assert!(ms[lead].handle.status().coordinator, "a coordinator");
    let who = Scope::identity(ms[frozen].name.as_str());
    server
        .faults()
        .freeze_watches(who.clone().resource("configmaps"), true);
    if no_direct_reads {
        server.faults().fail_next(
            who,
            FailRule::status(500)
                .verb(Verb::Get)
                .resource("configmaps")
                .times(1_000_000),
        );
    }
    let target = ms[lead].handle.status().member;
    let shard = ms[frozen].handle.status().owned.iter().next().unwrap();
    edit_assignment(server, |a| {
        if no_direct_reads {
            // a move the planner does not repeat once cancelled
            let id = a.next_move_id;
            a.view.shards.get_mut(&shard).unwrap().handoff = Handoff::Moving {
                id,
                to: target.clone(),
            };
            a.next_move_id = id + 1;
        } else {
            // a pin: the coordinator moves the shard, and the planner keeps it there
            a.pins.insert(shard, target.name.to_string());
        }
    })
    .await;
    (ms, frozen, shard)
}

/// Wait until `shard`'s handoff in the assignment is `Stable` again; returns how long it took.
async fn move_ends(server: &TestServer, shard: u32, limit: Duration) -> Duration {
    let start = tokio::time::Instant::now();
    loop {
        let a = assignment(server).await.unwrap();
        if a.view.shards[&shard].handoff == Handoff::Stable {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for the move to end: {:?}",
            a.view.shards[&shard]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A source whose assignment watch is stuck (frozen open) never applies `Draining`. Before the fix the move
/// stayed `Draining` for good ("timed out after 120s waiting for the move to end"). Now the coordinator tells
/// the source through its own Lease (read at every renewal), the source reads the assignment directly, drains
/// and releases: the move completes although the watch stays frozen.
#[tokio::test(start_paused = true)]
async fn a_source_with_a_stuck_assignment_watch_is_told_through_its_lease() {
    let (server, log) = group_server().await;
    let (ms, frozen, shard) = stalled_move(&server, &log, false).await;
    until(
        Duration::from_secs(5),
        "the coordinator starts the move",
        || ms[1 - frozen].handle.status().moves_in_flight > 0,
    )
    .await;
    let waited = move_ends(&server, shard, Duration::from_secs(120)).await;
    let a = assignment(&server).await.unwrap();
    assert_eq!(
        a.view.shards[&shard].owner.name.as_ref(),
        ms[1 - frozen].name.as_str(),
        "the move completed through the lease channel (after {waited:?}), not cancelled"
    );
    assert!(
        waited < LEASE * 3 + DRAIN,
        "the lease channel took {waited:?}"
    );
    let refs: Vec<&Member> = ms.iter().collect();
    ends_owned_once(&refs, &log).await;
}

/// When even the direct read fails (the source's assignment watch is frozen and every GET of the ConfigMap it
/// sends fails), the move must not stay `Draining` forever. Before the fix: "timed out after 120s waiting for
/// the move to end". After the stall timeout the coordinator cancels it and re-grants the source at a new
/// epoch; the source keeps admitting the shard throughout.
#[tokio::test(start_paused = true)]
async fn a_draining_move_without_release_is_cancelled_after_the_stall_timeout() {
    let (server, log) = group_server().await;
    let (ms, frozen, shard) = stalled_move(&server, &log, true).await;
    let before = assignment(&server).await.unwrap().view.shards[&shard].epoch;
    let stall = crate::group::builder(&server, "x")
        .build()
        .unwrap()
        .config()
        .drain_stall_timeout();
    let limit = stall + LEASE * 2;
    let start = tokio::time::Instant::now();
    loop {
        assert!(
            ms[frozen].ownership().admit_shard(shard).is_ok(),
            "the source stopped admitting shard {shard} without having applied Draining"
        );
        let a = assignment(&server).await.unwrap();
        let e = &a.view.shards[&shard];
        if e.handoff == Handoff::Stable {
            assert_eq!(e.owner.name.as_ref(), ms[frozen].name.as_str(), "cancelled");
            assert!(e.epoch > before, "re-granted at a new epoch");
            break;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for the move to end: {e:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(start.elapsed() >= stall / 2, "cancelled early");
    check_fences(&log);
}

/// The coordinator's lease watch hangs in a LIST that never answers (a black-holed connection: kube's watcher
/// bounds neither a LIST nor a watch start). Before the fix it stayed blind for good and a new member never
/// got shards ("timed out after 60s waiting for c owns shards"). Now a lease watch silent for a lease period
/// is restarted, and the new LIST answers.
#[tokio::test(start_paused = true)]
async fn a_hung_lease_list_is_restarted() {
    let (server, log, mut ms) = settled_group(&["a", "b"]).await;
    let lead = usize::from(ms[1].handle.status().coordinator);
    assert!(ms[lead].handle.status().coordinator, "a coordinator");
    let lists = Scope::identity(ms[lead].name.as_str())
        .verb(Verb::List)
        .resource("leases");
    // the coordinator's lease watch ends and cannot restart for a while; the history it would resume
    // from is compacted away, so it lists again — and that LIST hangs for an hour (later ones answer)
    let lead_id = Scope::identity(ms[lead].name.as_str());
    server.faults().fail_next(
        lead_id.clone(),
        FailRule::status(500)
            .verb(Verb::Watch)
            .resource("leases")
            .times(3),
    );
    server.faults().close_watches(lead_id.resource("leases"));
    server
        .faults()
        .latency(lists.clone(), Some(Duration::from_secs(3600)));
    tokio::time::sleep(Duration::from_millis(600)).await;
    server.faults().compact();
    // its watch retries back off for several seconds before the 410 sends it to LIST
    tokio::time::sleep(Duration::from_secs(20)).await;
    server.faults().latency(lists, None);
    ms.push(crate::group::spawn(&server, "c", &log));
    let c = &ms[2];
    until(Duration::from_secs(60), "c owns shards", || {
        crate::group::owned_count(c) > 0
    })
    .await;
    let refs: Vec<&Member> = ms.iter().collect();
    ends_owned_once(&refs, &log).await;
}

/// The coordinator's pass shares the member task with its renewals. Writes answered after 0.95 s (within the
/// per-call bound of 1 s) — its coordinator Lease, a takeover, the assignment — made one pass outlast the
/// coordinator's fence (RENEW − MARGIN = 1.8 s). Before the fix two things failed, each shown again with its
/// fix planted away: the task took one watch event per slow round, so its lease watch looked silent and it
/// judged nobody ("the victim's shards were not taken over"); and with the watches drained, it refused its
/// own owned shards during slow passes ("the coordinator refused its owned shards 6 times during slow
/// passes"). Now every delivered event is applied before acting, and a renewal that falls due goes between
/// the pass's requests.
#[tokio::test(start_paused = true)]
async fn a_slow_coordinator_pass_never_fences_the_coordinator() {
    let (server, log, ms) = settled_group(&["a", "b", "c"]).await;
    tokio::time::sleep(LEASE).await;
    let lead = ms
        .iter()
        .position(|m| m.handle.status().coordinator)
        .expect("a coordinator");
    let victim = (lead + 1) % 3;
    let me = Scope::identity(ms[lead].name.as_str());
    let slow = Some(Duration::from_millis(950));
    // every write of the coordinator's but its renewals is slow (within the 1 s bound per call): the
    // coordinator Lease, the victim's takeover, the assignment
    for lease in [
        format!("{GROUP}-coordinator"),
        format!("{GROUP}-{}", ms[victim].name),
    ] {
        server.faults().latency(
            me.clone().verb(Verb::Update).resource("leases").name(lease),
            slow,
        );
    }
    server
        .faults()
        .latency(me.verb(Verb::Update).resource("configmaps"), slow);
    ms[victim].kill();
    let lead_id = ms[lead].handle.status().member;
    // sample the coordinator's admission of what it owns every 50 ms, until the takeover is done and a
    // few more slow passes ran
    let mut refused = 0;
    let mut done_at = None;
    let start = tokio::time::Instant::now();
    while done_at.is_none_or(|t: tokio::time::Instant| t.elapsed() < LEASE * 2) {
        assert!(
            start.elapsed() < LEASE * 8,
            "the victim's shards were not taken over"
        );
        let owned = crate::group::owners(&[&ms[lead]]);
        if owned
            .keys()
            .any(|s| ms[lead].ownership().admit_shard(*s).is_err())
        {
            refused += 1;
        }
        let held: usize = ms
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != victim)
            .map(|(_, m)| crate::group::owned_count(m))
            .sum();
        if held == 16 && done_at.is_none() {
            done_at = Some(tokio::time::Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        ms[lead].handle.status().member,
        lead_id,
        "the coordinator rejoined"
    );
    assert_eq!(
        refused, 0,
        "the coordinator refused its owned shards {refused} times during slow passes"
    );
    check_fences(&log);
}

/// Every member restarts under its old name at once (a StatefulSet rolled in one go, a node failure):
/// each finds its Lease held by its previous incarnation, which nobody renews. Found by `kshard-dev bench`
/// before this fix: the claim waited for a lease watch that showed recent events, and with nobody renewing
/// it stayed silent for good — "timed out after 60s waiting for the restarted members to own shards".
/// Now a claim may also rest on the member's own reads: the same resourceVersion read for `lease + grace`,
/// claimed with it as precondition.
#[tokio::test(start_paused = true)]
async fn every_member_restarted_under_its_old_name_rejoins() {
    let (server, log, ms) = settled_group(&["a", "b"]).await;
    let old: Vec<_> = ms.iter().map(|m| m.handle.status().member).collect();
    for m in &ms {
        m.kill();
    }
    let restarted: Vec<Member> = ["a", "b"]
        .iter()
        .map(|n| crate::group::spawn(&server, n, &log))
        .collect();
    until(
        Duration::from_secs(60),
        "the restarted members to own shards",
        || restarted.iter().all(|m| crate::group::owned_count(m) > 0),
    )
    .await;
    for (m, old) in restarted.iter().zip(&old) {
        let now = m.handle.status().member;
        assert_ne!(&now, old, "{} came back as a new incarnation", m.name);
    }
    let refs: Vec<&Member> = restarted.iter().collect();
    ends_owned_once(&refs, &log).await;
}
