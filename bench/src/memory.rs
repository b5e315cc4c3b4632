//! Memory per replica in **server mode**, with replicas as real processes (the `read` scenario's
//! memory table). The embedded API server serves plain HTTP on a loopback port; N group members and
//! one stock unsharded reflector run as `kshard-bench-replica` processes, beside the same binary with
//! **zero objects** (N members of a second group and one unsharded reflector reading an empty
//! namespace). Every process has 2 tokio workers and the same allocator ([`ALLOCATOR`]). After every replica
//! has synced (members balanced, nothing moving) and a quiet period, each process's RSS is read from
//! `/proc/PID/smaps_rollup` and its allocator's live bytes from its last status line; a replica's
//! *object memory* is its figure minus the zero-object figure of the same kind.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube_shard::ShardCount;
use kube_shard_harness::process::{Launch, ReplicaProcess};
use tokio::time::Instant;

use crate::failover::Timings;
use crate::recovery::cluster::{self, Ledger, NS};
use crate::replica::{ReplicaMode, ReplicaSpec, Status};
use crate::BenchError;

/// Every replica process's allocator (`kshard-bench-replica`'s global allocator: one for all, so RSS
/// compares).
pub const ALLOCATOR: &str = "jemalloc, background purge";
/// The namespace the zero-object replicas read (no `Item` in it).
const EMPTY_NS: &str = "bench-empty";

/// How to start a replica process: a program and its leading arguments (the spec's JSON is appended).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaCommand {
    /// The program (`kshard-bench-replica`).
    pub program: PathBuf,
    /// Arguments before the spec.
    pub args: Vec<String>,
}

impl ReplicaCommand {
    /// `program` with no leading arguments.
    #[must_use]
    pub fn new(program: impl Into<PathBuf>) -> Self {
        ReplicaCommand {
            program: program.into(),
            args: Vec::new(),
        }
    }
}

/// One process's figures after the quiet period.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Usage {
    /// Objects in its store.
    pub held: u64,
    /// `Rss` from `smaps_rollup`, bytes.
    pub rss: u64,
    /// `Anonymous` from `smaps_rollup`, bytes.
    pub anonymous: u64,
    /// The allocator's live bytes.
    pub live: u64,
    /// Threads (`/proc/PID/status`).
    pub threads: u64,
    /// Objects whose copy the member's index still holds beside the store's.
    pub index_copies: u64,
}

/// Every process's figures.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Memory {
    /// The group members over the objects.
    pub members: Vec<Usage>,
    /// The group members over zero objects.
    pub members_zero: Vec<Usage>,
    /// The unsharded reflector over the objects.
    pub unsharded: Usage,
    /// The unsharded reflector over zero objects.
    pub unsharded_zero: Usage,
    /// The quiet period after sync.
    pub quiet: Duration,
}

fn mean(v: &[Usage], f: impl Fn(&Usage) -> u64) -> f64 {
    v.iter().map(|u| f(u) as f64).sum::<f64>() / v.len().max(1) as f64
}

impl Memory {
    /// A member's mean object memory (its figure minus the zero-object members' mean) ÷ the unsharded
    /// reflector's object memory, by `f` (RSS or live bytes).
    #[must_use]
    pub fn ratio(&self, f: impl Fn(&Usage) -> u64 + Copy) -> f64 {
        let member = mean(&self.members, f) - mean(&self.members_zero, f);
        let unsharded = f(&self.unsharded) as f64 - f(&self.unsharded_zero) as f64;
        crate::stats::ratio(member, unsharded)
    }
}

struct Proc {
    name: String,
    process: ReplicaProcess,
    last: Arc<Mutex<Option<Status>>>,
}

impl Proc {
    fn status(&self) -> Option<Status> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn spawn(
    cmd: &ReplicaCommand,
    dir: &Path,
    name: &str,
    spec: &ReplicaSpec,
) -> Result<Proc, BenchError> {
    let json =
        serde_json::to_string(spec).map_err(|e| BenchError::Cluster(format!("spec: {e}")))?;
    let launch = Launch::new(&cmd.program).args(&cmd.args).arg(json);
    let last = Arc::new(Mutex::new(None));
    let sink = last.clone();
    let log = dir.join(format!("{name}.log"));
    let process = ReplicaProcess::start_with_lines(name, &launch, &log, move |line| {
        if let Ok(st) = serde_json::from_str::<Status>(line) {
            *sink.lock().unwrap_or_else(|e| e.into_inner()) = Some(st);
        }
    })
    .map_err(|e| BenchError::Cluster(e.to_string()))?;
    Ok(Proc {
        name: name.to_owned(),
        process,
        last,
    })
}

/// `Field:   N kB` lines of a `/proc` file, in bytes.
fn proc_field(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(field)?.strip_prefix(':')?;
        let mut parts = rest.split_whitespace();
        let n: u64 = parts.next()?.parse().ok()?;
        Some(if parts.next() == Some("kB") {
            n * 1024
        } else {
            n
        })
    })
}

fn usage(p: &Proc) -> Result<Usage, BenchError> {
    let pid = p
        .process
        .pid()
        .ok_or_else(|| BenchError::Cluster(format!("replica {} exited", p.name)))?;
    let read = |file: &str| {
        std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .map_err(|e| BenchError::Cluster(format!("/proc/{pid}/{file}: {e}")))
    };
    let rollup = read("smaps_rollup")?;
    let status = read("status")?;
    let st = p.status().unwrap_or_default();
    Ok(Usage {
        held: st.held,
        rss: proc_field(&rollup, "Rss").unwrap_or(0),
        anonymous: proc_field(&rollup, "Anonymous").unwrap_or(0),
        live: st.live_bytes,
        threads: proc_field(&status, "Threads").unwrap_or(0),
        index_copies: st.index_copies,
    })
}

/// Members of one group synced: every stream initialised, every shard owned once, nothing moving,
/// `objects` held in all.
fn group_synced(procs: &[Proc], objects: u64) -> bool {
    let s = ShardCount::DEFAULT.get();
    let st: Vec<Status> = procs.iter().filter_map(Proc::status).collect();
    st.len() == procs.len()
        && st.iter().all(|x| x.initialized && x.moving == 0)
        && st.iter().map(|x| x.owned_shards).sum::<u32>() == s
        && st.iter().map(|x| x.held).sum::<u64>() == objects
}

fn unsharded_synced(p: &Proc, objects: u64) -> bool {
    p.status()
        .is_some_and(|x| x.initialized && x.held == objects)
}

/// Run the replicas (see the module docs) and measure them after sync plus `quiet`.
pub async fn measure(
    cmd: &ReplicaCommand,
    n: usize,
    objects: usize,
    t: Timings,
    quiet: Duration,
) -> Result<Memory, BenchError> {
    let ledger = Ledger::default();
    let server = cluster::setup_with(objects, &ledger, true).await?;
    let http = server
        .serve_plain_http()
        .await
        .map_err(|e| BenchError::Cluster(format!("serving HTTP: {e}")))?;
    let dir = std::env::temp_dir().join(format!("kshard-bench-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir)
        .map_err(|e| BenchError::Cluster(format!("{}: {e}", dir.display())))?;
    let kubeconfig = |identity: &str| -> Result<PathBuf, BenchError> {
        let path = dir.join(format!("{identity}.kubeconfig"));
        http.write_kubeconfig(&path, identity)
            .map_err(|e| BenchError::Cluster(format!("{}: {e}", path.display())))?;
        Ok(path)
    };
    let spec = |name: &str, ns: &str, mode: ReplicaMode| -> Result<ReplicaSpec, BenchError> {
        Ok(ReplicaSpec {
            group_kubeconfig: kubeconfig(name)?,
            read_kubeconfig: kubeconfig(&format!("{name}-read"))?,
            namespace: ns.to_owned(),
            mode,
            timings: t,
        })
    };
    let member = |name: String, group: &str| ReplicaMode::Member {
        name,
        group: group.to_owned(),
        replicas: n as u32,
    };
    let (mut members, mut zero) = (Vec::new(), Vec::new());
    for i in 0..n {
        let name = format!("mem-{i}");
        let s = spec(&name, NS, member(name.clone(), "bench-mem"))?;
        members.push(spawn(cmd, &dir, &name, &s)?);
        let name = format!("zero-{i}");
        let s = spec(&name, EMPTY_NS, member(name.clone(), "bench-zero"))?;
        zero.push(spawn(cmd, &dir, &name, &s)?);
    }
    let s = spec("unsharded", NS, ReplicaMode::Unsharded)?;
    let unsharded = spawn(cmd, &dir, "unsharded", &s)?;
    let s = spec("unsharded-zero", EMPTY_NS, ReplicaMode::Unsharded)?;
    let unsharded_zero = spawn(cmd, &dir, "unsharded-zero", &s)?;

    let limit = t.lease * 10 + Duration::from_secs(120);
    let began = Instant::now();
    let objects = objects as u64;
    while !(group_synced(&members, objects)
        && group_synced(&zero, 0)
        && unsharded_synced(&unsharded, objects)
        && unsharded_synced(&unsharded_zero, 0))
    {
        if began.elapsed() > limit {
            return Err(BenchError::Cluster(format!(
                "memory: the replica processes did not sync within {limit:?} (logs in {})",
                dir.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(quiet).await;
    let all = |v: &[Proc]| v.iter().map(usage).collect::<Result<Vec<_>, _>>();
    let out = Memory {
        members: all(&members)?,
        members_zero: all(&zero)?,
        unsharded: usage(&unsharded)?,
        unsharded_zero: usage(&unsharded_zero)?,
        quiet,
    };
    for mut p in members
        .into_iter()
        .chain(zero)
        .chain([unsharded, unsharded_zero])
    {
        p.process.kill().await;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_fields_are_read_in_bytes() {
        let rollup = "55d0-7ffd ---p 00000000 00:00 0  [rollup]\nRss:               13400 kB\nPss:    9000 kB\nAnonymous:          4096 kB\n";
        assert_eq!(proc_field(rollup, "Rss"), Some(13400 * 1024));
        assert_eq!(proc_field(rollup, "Anonymous"), Some(4096 * 1024));
        assert_eq!(proc_field("Threads:\t5\n", "Threads"), Some(5));
        assert_eq!(proc_field(rollup, "Swap"), None);
    }

    #[test]
    fn object_memory_is_each_figure_minus_its_zero_object_baseline() {
        let u = |rss| Usage {
            rss,
            ..Usage::default()
        };
        let m = Memory {
            members: vec![u(130), u(150)],
            members_zero: vec![u(100), u(100)],
            unsharded: u(300),
            unsharded_zero: u(100),
            quiet: Duration::ZERO,
        };
        // (140 − 100) ÷ (300 − 100)
        assert!((m.ratio(|u| u.rss) - 0.2).abs() < 1e-9);
    }
}
