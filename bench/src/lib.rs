//! # kube-shard-bench
//!
//! The engine behind `kshard-dev bench`: kube-shard measured side by side with the alternatives an operator
//! author would otherwise pick — one stock `kube_runtime` leader, static contiguous ranges, `hash % N`
//! and a 100-vnode consistent-hash ring — **in the same run**, with every figure given as a ratio (the
//! machines these run on are noisy; absolute times are printed for context only).
//!
//! One module per scenario; each returns a [`Report`]: tables (each naming its configuration) and one
//! JSON object. The pure scenarios ([`movement`], [`scale`]) run the real planner and codecs; the
//! [`recovery`] scenario runs kube-shard replicas and stock leaders on the embedded in-memory API server
//! (`kube-shard-testserver`).
//!
//! ```
//! use kube_shard_bench::{run, Options, Scenario};
//!
//! let mut opts = Options::default();
//! opts.quick = true;
//! let reports = run(Scenario::Scale, &opts).unwrap();
//! assert_eq!(reports[0].scenario, "scale");
//! println!("{}", reports[0].render());
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

pub mod coordination;
pub mod cpu;
pub mod failover;
pub mod handoff;
mod members;
pub mod memory;
pub mod mirror;
pub mod movement;
pub mod read;
pub mod recovery;
pub mod replica;
pub mod scale;
pub mod stats;
mod table;

use std::str::FromStr;

pub use table::Table;

/// One scenario of `kshard-dev bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Scenario {
    /// Every scenario that is implemented, in order.
    All,
    /// Every object needs a reconcile at once: kube-shard vs one stock leader.
    Recovery,
    /// Shards moved vs the optimum; keyspace remapped vs `hash % N`, static ranges and a ring.
    Movement,
    /// Coordinator step time and assignment / report sizes against the API limits.
    Scale,
    /// SIGKILL of one member: time until its shards are admitted elsewhere, vs the floor.
    Failover,
    /// A graceful leave under writes: per-shard stall and API writes per handoff.
    Handoff,
    /// Write requests and bytes per member per minute at rest, by object count and group size.
    Coordination,
    /// Read amplification, bytes and objects held per replica: server mode, fallback, static, unsharded.
    Read,
    /// The HA mirror's initial sync at one worker and at eight, every request delayed 50 ms.
    Mirror,
}

impl Scenario {
    /// The scenarios `all` runs, in order (pure and fast first).
    pub const IMPLEMENTED: [Scenario; 8] = [
        Scenario::Movement,
        Scenario::Scale,
        Scenario::Read,
        Scenario::Recovery,
        Scenario::Failover,
        Scenario::Handoff,
        Scenario::Coordination,
        Scenario::Mirror,
    ];

    /// The scenario's name on the command line.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Scenario::All => "all",
            Scenario::Recovery => "recovery",
            Scenario::Movement => "movement",
            Scenario::Scale => "scale",
            Scenario::Failover => "failover",
            Scenario::Handoff => "handoff",
            Scenario::Coordination => "coordination",
            Scenario::Read => "read",
            Scenario::Mirror => "mirror",
        }
    }
}

impl FromStr for Scenario {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Self, BenchError> {
        match s {
            "all" => Ok(Scenario::All),
            "recovery" => Ok(Scenario::Recovery),
            "movement" => Ok(Scenario::Movement),
            "scale" => Ok(Scenario::Scale),
            "failover" => Ok(Scenario::Failover),
            "handoff" => Ok(Scenario::Handoff),
            "coordination" => Ok(Scenario::Coordination),
            "read" => Ok(Scenario::Read),
            "mirror" => Ok(Scenario::Mirror),
            other => Err(BenchError::UnknownScenario(other.to_owned())),
        }
    }
}

/// What to run and how big.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Options {
    /// Objects (recovery, mirror); `None`: the scenario's default (10 000; 2 000 with `quick`, 1 000
    /// for mirror).
    pub objects: Option<usize>,
    /// kube-shard replicas (recovery); `None`: N = 2 and 4.
    pub replicas: Option<usize>,
    /// Fewer objects and repetitions, time-scaled group timings: the whole run in minutes.
    pub quick: bool,
    /// Random seed of the pure scenarios (membership orders, weights).
    pub seed: u64,
    /// How to start a replica process (`kshard-bench-replica`): `read` measures memory per replica
    /// with it; `None`: that table is left out.
    pub replica: Option<memory::ReplicaCommand>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            objects: None,
            replicas: None,
            quick: false,
            seed: 18,
            replica: None,
        }
    }
}

/// The result of one scenario: tables for people, one JSON object for tools.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Report {
    /// The scenario's name.
    pub scenario: &'static str,
    /// The tables, each titled with its configuration.
    pub tables: Vec<Table>,
    /// Lines printed under the tables (targets met or missed, caveats).
    pub notes: Vec<String>,
    /// The same figures as one JSON object.
    pub json: serde_json::Value,
}

impl Report {
    /// The tables and notes as text.
    #[must_use]
    pub fn render(&self) -> String {
        let mut out = format!("== {} ==\n", self.scenario);
        for t in &self.tables {
            out.push_str(&t.render());
            out.push('\n');
        }
        for n in &self.notes {
            out.push_str("* ");
            out.push_str(n);
            out.push('\n');
        }
        out
    }
}

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// Not a scenario name.
    #[error("unknown scenario {0:?}: one of all, recovery, movement, scale, failover, handoff, coordination, read, mirror")]
    UnknownScenario(String),
    /// An option out of range.
    #[error("{0}")]
    BadOption(String),
    /// The library refused an input it should have accepted.
    #[error("{0}")]
    Library(String),
    /// The embedded API server or a client failed.
    #[error("{0}")]
    Cluster(String),
}

/// The runtime every in-process scenario runs on: two worker threads, as the 2-core machines the tables
/// were taken on (the same for kube-shard and its baselines).
fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::Cluster(format!("tokio runtime: {e}")))
}

/// Run one scenario (or all): one report per scenario, in order.
pub fn run(scenario: Scenario, opts: &Options) -> Result<Vec<Report>, BenchError> {
    run_each(scenario, opts, |_| {})
}

/// Like [`run`], calling `each` with every report as soon as it is done (for progress output).
pub fn run_each(
    scenario: Scenario,
    opts: &Options,
    mut each: impl FnMut(&Report),
) -> Result<Vec<Report>, BenchError> {
    let list: Vec<Scenario> = match scenario {
        Scenario::All => Scenario::IMPLEMENTED.to_vec(),
        one => vec![one],
    };
    let mut out = Vec::new();
    for s in list {
        let report = match s {
            Scenario::Movement => movement::run(opts)?,
            Scenario::Scale => scale::run(opts)?,
            Scenario::Recovery => recovery::run(opts)?,
            Scenario::Failover => failover::run(opts)?,
            Scenario::Handoff => handoff::run(opts)?,
            Scenario::Coordination => coordination::run(opts)?,
            Scenario::Read => read::run(opts)?,
            Scenario::Mirror => mirror::run(opts)?,
            Scenario::All => unreachable!("expanded above"),
        };
        each(&report);
        out.push(report);
    }
    Ok(out)
}
