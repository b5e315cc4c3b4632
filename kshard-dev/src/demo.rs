//! `kshard-dev demo` and `kshard-dev demo ha`: flags and printing. The scenarios are
//! `kube_shard_harness::demo` (what they do, step by step, is documented there); each replica is this
//! binary re-run as `kshard-dev operator ...`.
//!
//! Output contract: with `--json`, exactly one JSON object on stdout at the end (progress goes to stderr);
//! the exit code is 0 only when every invariant held.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kube_shard::{ShardCount, ShardKey};
use kube_shard_harness::demo::ha::HaDemoOptions;
use kube_shard_harness::demo::DemoOptions;
use kube_shard_harness::operator::ReplicaProgram;
use serde::Serialize;

use crate::DevError;

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Widgets to create.
    #[arg(long, default_value_t = 2000)]
    objects: usize,
    /// Replica processes to start (then scaled to one more, then one is killed).
    #[arg(long, default_value_t = 3)]
    replicas: u32,
    /// The number of logical shards S.
    #[arg(long, default_value = "256", value_parser = parse_count)]
    shards: ShardCount,
    /// The shard key: `uid` or `namespace`.
    #[arg(long, default_value = "uid", value_parser = parse_key)]
    hash_key: ShardKey,
    /// The embedded server's ShardedListAndWatch gate (KEP-5866 shardSelector).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    shard_selector: String,
    /// The fence ValidatingAdmissionPolicies on the embedded server (`kshard-dev operator
    /// --install-fence-policy`), and the count of the writes they refused.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    fence_policy: String,
    /// Run against a real cluster instead of the embedded server (replicas run locally with it).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The namespace of the Widgets and of the group's Leases and assignment.
    #[arg(long, short = 'n', default_value = "kshard-demo")]
    namespace: String,
    /// The shard group.
    #[arg(long, default_value = "widgets")]
    group: String,
    /// Widget spec changes per second made by the writer.
    #[arg(long, default_value_t = 400)]
    write_rate: u32,
    /// Print exactly one JSON object with the results on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
    /// Keep the work directory (kubeconfigs, replica logs, fence log).
    #[arg(long)]
    keep: bool,
    #[command(subcommand)]
    command: Option<DemoCommand>,
}

/// `kshard-dev demo <subcommand>` (none: the sharded operator demo).
#[derive(Debug, clap::Subcommand)]
pub(crate) enum DemoCommand {
    /// Cross-cluster Active/Standby end to end: mirror lag, a planned switchover, an unplanned
    /// failover, the old Active's return and a failback (`kshard-dev demo ha --json`).
    Ha(HaDemoArgs),
}

#[derive(Debug, Args)]
pub(crate) struct HaDemoArgs {
    /// Widgets the writer works on (`w-0..N`).
    #[arg(long, default_value_t = 200)]
    objects: usize,
    /// Writes a second (creates, spec changes, deletes).
    #[arg(long, default_value_t = 40)]
    write_rate: u32,
    /// The shortest run: a 3 s lag window and short settle times (about 40 s in all).
    #[arg(long)]
    quick: bool,
    /// Print exactly one JSON object with the results on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
    /// The namespace of the Widgets and of the HA Leases and checkpoints. Default: `kshard-demo-ha` on
    /// the embedded servers, a fresh `kshard-demo-ha-<random>` on real clusters.
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Before the failure, hold the mirror's watch on the Active this many seconds (testserver's
    /// frozen watches), so that the unplanned failover loses what was written meanwhile and the old
    /// Active comes back with divergent objects. 0: the mirror runs freely.
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    stall_mirror: f64,
    /// Run against two real clusters: this kubeconfig's is `a` (Active first). Needs
    /// `--standby-kubeconfig`. The kubeconfig user must be allowed to impersonate users and groups (the
    /// participants' identities), to install the Widget CRD and to create namespaces and
    /// ValidatingAdmissionPolicies; the demo reaches the cluster through its own local TCP proxy.
    #[arg(long, value_name = "PATH", requires = "standby_kubeconfig")]
    active_kubeconfig: Option<PathBuf>,
    /// The real Standby cluster `b` (with `--active-kubeconfig`).
    #[arg(long, value_name = "PATH", requires = "active_kubeconfig")]
    standby_kubeconfig: Option<PathBuf>,
    /// PLANTED BUG for the tests: after the planned switchover, drop one mirrored write on the new
    /// Active (delete one Widget it should hold), so the lost-write oracle must report it; the run
    /// ends after that phase.
    #[arg(long, hide = true)]
    plant_lost_write: bool,
}

fn parse_key(s: &str) -> Result<ShardKey, String> {
    s.parse().map_err(|e: kube_shard::KeyError| e.to_string())
}

fn parse_count(s: &str) -> Result<ShardCount, String> {
    s.parse().map_err(|e: kube_shard::ShardError| e.to_string())
}

/// A terminal gets the live view, unless the output is JSON.
fn view(json: bool) -> bool {
    std::io::stdout().is_terminal() && !json
}

impl DemoArgs {
    fn options(&self) -> Result<DemoOptions, DevError> {
        // each replica is this binary, re-run as `kshard-dev operator ...`
        let exe = std::env::current_exe()?;
        let mut o = DemoOptions::new(ReplicaProgram::new(exe, &["operator"]));
        o.objects = self.objects;
        o.replicas = self.replicas;
        o.shards = self.shards;
        o.hash_key = self.hash_key;
        o.shard_selector = self.shard_selector == "on";
        o.fence_policy = self.fence_policy == "on";
        o.kubeconfig = self.kubeconfig.clone();
        o.namespace = self.namespace.clone();
        o.group = self.group.clone();
        o.write_rate = self.write_rate;
        o.view = view(self.json);
        o.keep = self.keep;
        Ok(o)
    }
}

impl HaDemoArgs {
    fn options(&self) -> HaDemoOptions {
        let mut o = HaDemoOptions::default();
        o.objects = self.objects;
        o.write_rate = self.write_rate;
        o.quick = self.quick;
        o.view = view(self.json);
        o.namespace = self.namespace.clone();
        o.stall_mirror = self.stall_mirror;
        o.real = self
            .active_kubeconfig
            .clone()
            .zip(self.standby_kubeconfig.clone());
        o.plant_lost_write = self.plant_lost_write;
        o
    }
}

pub(crate) fn run(mut args: DemoArgs) -> Result<(), DevError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if let Some(DemoCommand::Ha(ha)) = args.command.take() {
        let opts = ha.options();
        let report = rt.block_on(kube_shard_harness::demo::ha::run(&opts));
        rt.shutdown_timeout(Duration::from_secs(2));
        let report = report?;
        return print(&report, ha.json, report.invariants_held, &report.failures);
    }
    let report = rt.block_on(kube_shard_harness::demo::run(&args.options()?))?;
    print(&report, args.json, report.invariants_held, &report.failures)
}

/// The report (one line with `--json`, else indented), and the verdict as the exit status.
fn print(
    report: &impl Serialize,
    json: bool,
    held: bool,
    failures: &[String],
) -> Result<(), DevError> {
    if json {
        println!("{}", serde_json::to_string(report)?);
    } else {
        println!("{}", serde_json::to_string_pretty(report)?);
    }
    if held {
        Ok(())
    } else {
        Err(DevError::InvariantsViolated(failures.join("; ")))
    }
}
