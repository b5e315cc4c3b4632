//! The assignment's recovery paths with a real group on testserver, in paused time: an older assignment
//! written back (a restored backup, a re-applied manifest) before a fresh coordinator process starts or
//! while the running one must reassign, and a fence-parameter key days ahead.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use kube_shard::group::assignment::DATA_KEY;
use kube_shard_testserver::TestServer;

use crate::group::{
    assignment, builder, check_fences, each_shard_owned_once, owned_count, settled, spawn,
    spawn_with, until, FenceLog, Member, CP_NS, GROUP, LEASE,
};

/// `RUST_LOG=kube_shard=info` shows the group's logs (with `--nocapture`).
pub(crate) fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_timer(Virtual)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Log lines stamped with the test's (paused, virtual) clock: seconds since the first line.
struct Virtual;

impl tracing_subscriber::fmt::time::FormatTime for Virtual {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        static START: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
        if tokio::runtime::Handle::try_current().is_err() {
            return write!(w, "-");
        }
        let now = tokio::time::Instant::now();
        let start = *START.get_or_init(|| now);
        write!(
            w,
            "{:>9.3}s",
            now.saturating_duration_since(start).as_secs_f64()
        )
    }
}

fn assignment_api(server: &TestServer) -> Api<ConfigMap> {
    Api::namespaced(server.client("admin"), CP_NS)
}

async fn assignment_text(server: &TestServer) -> String {
    let name = format!("{GROUP}-assignment");
    let cm = assignment_api(server).get(&name).await.unwrap();
    cm.data.unwrap()[DATA_KEY].clone()
}

/// An admin writes `text` over the assignment (its generation is whatever `text` says).
pub(crate) async fn write_back(server: &TestServer, text: String) {
    let name = format!("{GROUP}-assignment");
    let api = assignment_api(server);
    let mut cm = api.get(&name).await.unwrap();
    cm.data.as_mut().unwrap().insert(DATA_KEY.into(), text);
    api.replace(&name, &PostParams::default(), &cm)
        .await
        .unwrap();
}

/// a and b settle, c joins and takes its share: the text of the assignment before c joined, and the
/// members.
pub(crate) async fn owners_moved_since_a_backup() -> (TestServer, FenceLog, Vec<Member>, String) {
    let (server, log) = crate::support::group_server().await;
    crate::oracle_support::record_group(&server);
    let mut ms = settled(&server, &["a", "b"], &log).await;
    let backup = assignment_text(&server).await;
    ms.push(spawn(&server, "c", &log));
    {
        let refs: Vec<&Member> = ms.iter().collect();
        until(Duration::from_secs(60), "c owns its share", || {
            each_shard_owned_once(&refs) && owned_count(refs[2]) > 0
        })
        .await;
    }
    (server, log, ms, backup)
}

fn coordinator(ms: &[Member]) -> Option<usize> {
    ms.iter().position(|m| m.handle.status().coordinator)
}

/// A restored backup names owners that have moved on since; a fresh coordinator process then starts from
/// it. Members keep what they hold at higher epochs, the coordinator writes a newer view over it and
/// names the holders again: every owner change in the committed history stays justified by a release or
/// a takeover, and no two fences overlap.
#[tokio::test(start_paused = true)]
async fn a_restored_assignment_read_by_a_fresh_coordinator_moves_no_shard_without_evidence() {
    logs();
    let (server, log, mut ms, backup) = owners_moved_since_a_backup().await;
    write_back(&server, backup).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // the coordinator process restarts (a rolling update, or the cure for a frozen coordinator)
    let i = coordinator(&ms).expect("a coordinator");
    let old = ms.remove(i);
    old.kill();
    ms.push(spawn(&server, "d", &log));
    tokio::time::sleep(LEASE * 4).await;
    let refs: Vec<&Member> = ms.iter().collect();
    until(Duration::from_secs(60), "every shard admitted once", || {
        each_shard_owned_once(&refs)
    })
    .await;
    crate::oracle_support::check_ownership_history(&server);
    check_fences(&log);
}

/// An older assignment written back while the coordinator runs: an alarm, members ignore it, and the
/// coordinator writes over it rather than conflict on every pass — a member that dies afterwards is still taken over
/// and its shards owned again.
#[tokio::test(start_paused = true)]
async fn an_older_assignment_written_back_never_stops_the_coordinator() {
    let logs = crate::support::Logs::default();
    let _capture = logs.capture();
    let (server, log, mut ms, backup) = owners_moved_since_a_backup().await;
    let newer = assignment(&server).await.unwrap().view.generation;
    write_back(&server, backup).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !logs
            .lines_with("older assignment was written over")
            .is_empty(),
        "no alarm for an older assignment written back"
    );
    // kill a member that is not the coordinator
    let i = coordinator(&ms).expect("a coordinator");
    let victim = ms.remove((i + 1) % ms.len());
    let lost: BTreeSet<u32> = victim.handle.status().owned.iter().collect();
    assert!(!lost.is_empty());
    victim.kill();
    let refs: Vec<&Member> = ms.iter().collect();
    until(LEASE * 6, "the dead member's shards owned again", || {
        each_shard_owned_once(&refs)
    })
    .await;
    assert!(assignment(&server).await.unwrap().view.generation > newer);
    crate::oracle_support::check_ownership_history(&server);
    check_fences(&log);
}

/// One shard's fence-parameter key set three days above its epoch (an edit, a key copied from another
/// group): no re-grant can reach it within the one-day step members accept, so the coordinator says so —
/// an Event naming the key — and never climbs generations out of the members' reach: three lease periods
/// later no member refuses the assignment.
#[tokio::test(start_paused = true)]
async fn a_fence_key_days_ahead_is_alarmed_and_never_freezes_the_group() {
    const PARAMS: &str = "demo-fence";
    let (server, log) = crate::support::group_server().await;
    let ms: Vec<Member> = ["a", "b"]
        .iter()
        .map(|n| spawn_with(builder(&server, n).fence_params(PARAMS), n, &log))
        .collect();
    let refs: Vec<&Member> = ms.iter().collect();
    until(Duration::from_secs(60), "settled", || {
        each_shard_owned_once(&refs)
    })
    .await;
    tokio::time::sleep(LEASE).await;
    let epoch = assignment(&server).await.unwrap().view.shards[&3].epoch;
    let key = epoch + 3 * 24 * 3600 * 1000;
    let patch = serde_json::json!({"data": {"3": key.to_string()}});
    assignment_api(&server)
        .patch(PARAMS, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    tokio::time::sleep(LEASE * 3).await;
    for m in &ms {
        assert_eq!(
            m.handle.health().assignment_refused(),
            None,
            "{} refuses the assignment",
            m.name
        );
    }
    let events = Api::<Event>::namespaced(server.client("admin"), CP_NS)
        .list(&Default::default())
        .await
        .unwrap();
    let named = format!("\"3\" = {key}");
    assert!(
        events.items.iter().any(|e| {
            e.reason.as_deref() == Some("FenceKeyOutOfReach")
                && e.note.as_deref().is_some_and(|t| t.contains(&named))
        }),
        "no alarm names the key"
    );
    check_fences(&log);
}

/// A rebuild (an assignment written again above a rolled-back one, or re-created without a view of the
/// last) is marked as one in the stored assignment, so a coordinator that did not write it — its writer
/// replaced right after the write — holds planning as the writer would have: until every live member
/// applied it and the fences they held before can no longer be valid. Here one member's watches are
/// frozen, so it applies the marked generation only once the coordinator tells it through its Lease, a
/// lease period later; a new member joins meanwhile. While the member is behind, nothing is planned (the
/// stored assignment stays the rebuild); then the newcomer gets its share. Before the mark was read, the
/// coordinator planned the newcomer's share at once: "planned at generation …, above the rebuild …,
/// while b had applied only …".
#[tokio::test(start_paused = true)]
async fn a_rebuild_written_by_another_coordinator_holds_planning_until_every_member_applied_it() {
    use kube_shard::group::assignment::{Assignment, REBUILT_ANNOTATION};
    let (server, log) = crate::support::group_server().await;
    crate::oracle_support::record_group(&server);
    let mut ms = settled(&server, &["a", "b"], &log).await;
    tokio::time::sleep(LEASE * 2).await;
    let lead = coordinator(&ms).expect("a coordinator");
    let behind = 1 - lead;
    server.faults().freeze_watches(
        kube_shard_testserver::Scope::identity(ms[behind].name.as_str()),
        true,
    );
    // the rebuild, as the replaced coordinator wrote it: the same owners, a higher generation, marked
    let mut rebuilt = Assignment::decode(
        &assignment_text(&server).await,
        crate::group::s(),
        kube_shard::ShardKey::Uid,
    )
    .unwrap();
    let generation = rebuilt.view.generation + 1_000;
    rebuilt.view.generation = generation;
    let name = format!("{GROUP}-assignment");
    let api = assignment_api(&server);
    let mut cm = api.get(&name).await.unwrap();
    cm.data
        .as_mut()
        .unwrap()
        .insert(DATA_KEY.into(), rebuilt.encode());
    cm.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(REBUILT_ANNOTATION.into(), generation.to_string());
    api.replace(&name, &PostParams::default(), &cm)
        .await
        .unwrap();
    ms.push(spawn(&server, "c", &log));
    // until the frozen member applied the rebuild, the stored assignment stays the rebuild
    let start = tokio::time::Instant::now();
    while ms[behind].handle.status().generation < generation {
        assert!(
            start.elapsed() < LEASE * 10,
            "the frozen member never applied the rebuild"
        );
        let stored = assignment(&server).await.expect("an assignment");
        assert_eq!(
            stored.view.generation,
            generation,
            "planned at generation {}, above the rebuild {generation}, while {} had applied only {}",
            stored.view.generation,
            ms[behind].name,
            ms[behind].handle.status().generation
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.faults().freeze_watches(
        kube_shard_testserver::Scope::identity(ms[behind].name.as_str()),
        false,
    );
    until(
        Duration::from_secs(60),
        "the newcomer owns its share",
        || owned_count(&ms[2]) > 0 && each_shard_owned_once(&ms.iter().collect::<Vec<_>>()),
    )
    .await;
    check_fences(&log);
    crate::oracle_support::check_ownership_history(&server);
}
