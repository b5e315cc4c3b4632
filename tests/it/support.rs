//! Shared preambles of the group, safety and read-path tests, and the log capture some of them assert on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kube_shard_testserver::TestServer;

use crate::group::{settled, setup, FenceLog, Member};

pub(crate) use crate::harness::group_server;

/// [`group_server`] drawing uids and `generateName` suffixes from `seed` (`crate::seeds`).
pub(crate) async fn group_server_seeded(seed: u64) -> (TestServer, FenceLog) {
    let server = TestServer::builder()
        .shard_selector(true)
        .seed(seed)
        .build();
    setup(&server).await;
    (server, FenceLog::default())
}

/// A testserver (shard selectors honoured or not: `gate`) holding `n` seeded ConfigMaps, name → uid: the
/// start of the read-path tests.
pub(crate) async fn seeded(gate: bool, n: usize) -> (TestServer, BTreeMap<String, String>) {
    let server = TestServer::builder().shard_selector(gate).build();
    let all = crate::read_path::watcher::seed(&server.client("admin"), n).await;
    (server, all)
}

/// [`group_server`] with `names` spawned and settled (every shard owned exactly once).
pub(crate) async fn settled_group(names: &[&str]) -> (TestServer, FenceLog, Vec<Member>) {
    let (server, log) = group_server().await;
    let ms = settled(&server, names, &log).await;
    (server, log, ms)
}

/// The end of most group tests: within 60 s every shard is admitted by exactly one of `members`, and no
/// fences overlapped.
pub(crate) async fn ends_owned_once(members: &[&Member], log: &FenceLog) {
    crate::group::until(
        std::time::Duration::from_secs(60),
        "every shard admitted once",
        || crate::group::each_shard_owned_once(members),
    )
    .await;
    crate::group::check_fences(log);
}

/// A member Lease of the test group named `name`, held by `holder` (incarnation `0123456789abcdef`,
/// renewed now), with `report` as its member report when given: what a member of this or another build
/// (or a hostile writer) would put there.
pub(crate) fn group_lease(
    name: &str,
    holder: &str,
    report: Option<&str>,
) -> k8s_openapi::api::coordination::v1::Lease {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use kube::api::ObjectMeta;
    let mut annotations = BTreeMap::from([(
        "kube-shard.io/incarnation".to_string(),
        "0123456789abcdef".to_string(),
    )]);
    if let Some(r) = report {
        annotations.insert("kube-shard.io/report".to_string(), r.to_string());
    }
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                (
                    "kube-shard.io/group".to_string(),
                    crate::group::GROUP.to_string(),
                ),
                ("kube-shard.io/role".to_string(), "member".to_string()),
            ])),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(3),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..LeaseSpec::default()
        }),
    }
}

/// Log lines written while it is the thread's default subscriber (the paused-time runtime runs every task
/// of the test on this thread).
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

impl Logs {
    pub(crate) fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let sub = tracing_subscriber::fmt()
            .with_writer(self.clone())
            .with_ansi(false) // plain text to match, whatever the terminal
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_default(sub)
    }

    pub(crate) fn errors(&self) -> Vec<String> {
        self.lines_with("ERROR")
    }

    /// The lines captured so far that contain `text`.
    pub(crate) fn lines_with(&self, text: &str) -> Vec<String> {
        let all = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        all.lines()
            .filter(|l| l.contains(text))
            .map(str::to_owned)
            .collect()
    }
}
