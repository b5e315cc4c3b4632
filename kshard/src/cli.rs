//! Argument parsing and the pure subcommands (`hash`, `selector`).

use std::io::{self, Write};

use clap::{Args, Parser, Subcommand};
use kube_shard::group::admin::Edit;
use kube_shard::{
    fnv1a64, SelectorError, ShardCount, ShardError, ShardKey, ShardSelector, ShardSet,
};

/// kube-shard: active-active sharding for kube-rs operators.
#[derive(Debug, Parser)]
#[command(name = "kshard", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the FNV-1a 64 hash and logical shard of each value, as the apiserver computes them.
    Hash(HashArgs),
    /// Print the canonical KEP-5866 selector for a set of owned shards, or check an expression.
    Selector(SelectorArgs),
    /// Run the sharded example operator (Widgets): the example's container runs it.
    #[command(hide = true)]
    Operator(Box<crate::operator::OperatorArgs>),
    /// Developer tool (`kshard-dev demo`): run when `kshard-dev` is installed beside `kshard`.
    #[command(hide = true, disable_help_flag = true)]
    Demo(crate::dev::Forwarded),
    /// Developer tool (`kshard-dev testserver`): run when `kshard-dev` is installed beside `kshard`.
    #[command(hide = true, disable_help_flag = true)]
    Testserver(crate::dev::Forwarded),
    /// Developer tool (`kshard-dev bench`): run when `kshard-dev` is installed beside `kshard`.
    #[command(hide = true, disable_help_flag = true)]
    Bench(crate::dev::Forwarded),
    /// Show a live shard group: members, coordinator, generation, moves, unowned shards, the ring.
    Status(crate::ops::GroupArgs),
    /// Where an object lives: its hash, shard, and the shard's owner and epoch.
    Explain(crate::ops::ExplainArgs),
    /// Pin a shard to a member (the coordinator moves it there and keeps it there).
    Pin(crate::ops::PinArgs),
    /// Remove a shard's pin.
    Unpin(crate::ops::UnpinArgs),
    /// Stop rebalancing (moves in progress finish; leaves and takeovers still happen).
    Pause(crate::ops::GroupArgs),
    /// Resume rebalancing.
    Resume(crate::ops::GroupArgs),
    /// Drain a member: its shards move to the others (ordinary handoffs) and it gets none until undrained.
    Drain(crate::ops::DrainArgs),
    /// Undrain a member: it is planned again and receives its share.
    Undrain(crate::ops::UndrainArgs),
    /// Print ValidatingAdmissionPolicies (and bindings) with which the apiserver refuses stale fenced writes.
    FencePolicy(FencePolicyArgs),
    /// Cross-cluster Active/Standby: `status` (both sides), `promote --force --old-active-stopped`.
    Ha(Box<crate::ha_cmd::HaArgs>),
}

#[derive(Debug, Args)]
struct FencePolicyArgs {
    /// A resource to protect, `PLURAL.GROUP` (`PLURAL` alone for the core group); repeatable.
    #[arg(long = "resource", value_name = "PLURAL.GROUP", required = true)]
    resources: Vec<String>,
    /// The annotation that carries the fence token.
    #[arg(long, default_value = kube_shard::token::FENCE_ANNOTATION)]
    annotation: String,
    /// The name of the policy and of its binding.
    #[arg(long, default_value = kube_shard::fence_policy::DEFAULT_POLICY_NAME)]
    name: String,
    /// Also the per-shard policy, bound to this parameter ConfigMap (`NAMESPACE/NAME`) that the coordinator
    /// keeps (`ShardGroupBuilder::fence_params`); the empty ConfigMap is printed too.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    params: Option<String>,
    /// Also fence CRD `/status` writes through this status field (e.g. `.status.kubeShardFence`, declared
    /// in the CRD's schema as a string; `FencedApi::status_fence_field` stamps it).
    #[arg(long, value_name = "PATH")]
    status_fence_field: Option<String>,
    /// Also the minimum-failover-epoch policy (HA), bound to this parameter ConfigMap (`NAMESPACE/NAME`;
    /// a promotion sets `<ha-name>-ha-min-epoch` in the HA namespace); the ConfigMap (role active, minimum
    /// 0) is printed too. Needs `--operator-identity`.
    #[arg(long, value_name = "NAMESPACE/NAME", requires = "operator_identities")]
    min_epoch_params: Option<String>,
    /// The operator's identity (user name) whose writes the minimum-epoch policy judges; repeatable.
    #[arg(
        long = "operator-identity",
        value_name = "USER",
        requires = "min_epoch_params"
    )]
    operator_identities: Vec<String>,
}

#[derive(Debug, Args)]
struct KeyArgs {
    /// The shard key: `uid` (object.metadata.uid) or `namespace` (object.metadata.namespace).
    #[arg(long, default_value = "uid", value_parser = parse_key)]
    key: ShardKey,
    /// The number of logical shards S: a power of two from 1 to 65536.
    #[arg(long, default_value = "256", value_parser = parse_count)]
    shards: ShardCount,
}

#[derive(Debug, Args)]
struct HashArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// Print a JSON array of {"value","hash","shard"} instead of tab-separated lines.
    #[arg(long)]
    json: bool,
    /// The field values to hash (uids or namespaces), exactly as stored.
    #[arg(required = true)]
    values: Vec<String>,
}

#[derive(Debug, Args)]
struct SelectorArgs {
    #[command(flatten)]
    key: KeyArgs,
    /// The owned logical shards, like `0-63,128,130-131`.
    #[arg(long, required_unless_present = "check", conflicts_with = "check")]
    owned: Option<String>,
    /// Check a selector expression: print its canonical form (exit 0) or the reason it is refused (exit 2).
    #[arg(long, value_name = "EXPR")]
    check: Option<String>,
}

fn parse_key(s: &str) -> Result<ShardKey, String> {
    s.parse().map_err(|e: kube_shard::KeyError| e.to_string())
}

fn parse_count(s: &str) -> Result<ShardCount, String> {
    s.parse().map_err(|e: ShardError| e.to_string())
}

/// A failure of a subcommand, with its exit code.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    #[error("{0}")]
    Selector(#[from] SelectorError),
    #[error("{0}")]
    Shard(#[from] ShardError),
    #[error(
        "owning no shards means sending no request: there is no selector for an empty shard set"
    )]
    NothingOwned,
    #[error("cannot write output: {0}")]
    Io(#[from] io::Error),
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Policy(#[from] kube_shard::fence_policy::PolicyError),
    #[error("{0}")]
    Admin(#[from] kube_shard::group::admin::AdminError),
    #[error("{0}")]
    Forwarded(#[from] crate::dev::ForwardError),
    #[error("{0}")]
    Operator(#[from] kube_shard_example_operator::run::RunError),
    #[error("{0}")]
    Explain(#[from] crate::ops::ExplainError),
    #[error("{0}")]
    Status(#[from] crate::status::StatusError),
    #[error("{0}")]
    Switch(#[from] kube_shard_ha::switchover::SwitchError),
    #[error("{0}")]
    Promote(#[from] kube_shard_ha::failover::ForceFailed),
    #[error("not demoted: the peer is not a valid promotion target: {0}")]
    NotATarget(#[from] kube_shard_ha::promotion::TargetRefused),
    #[error("{error}\nthe token (for `promote --token` or `demote --cancel`): {token}")]
    SwitchedHalfway {
        error: kube_shard_ha::switchover::SwitchError,
        token: String,
    },
    #[error("{member} still holds {held} shards after {waited:?}: is another member live (a drained member keeps its shards when it is the only one)? is the group paused?")]
    DrainTimedOut {
        member: String,
        held: usize,
        waited: std::time::Duration,
    },
    #[error("{0} HA setting(s) do not match (see above)")]
    HaMismatch(usize),
    #[error("{0}")]
    Usage(String),
}

impl CliError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Forwarded(e) => e.exit_code(),
            CliError::Operator(kube_shard_example_operator::run::RunError::Usage(_)) => 2,
            CliError::Io(_)
            | CliError::Json(_)
            | CliError::Admin(_)
            | CliError::Operator(_)
            | CliError::Explain(_)
            | CliError::Status(_)
            | CliError::Switch(_)
            | CliError::Promote(_)
            | CliError::NotATarget(_)
            | CliError::SwitchedHalfway { .. }
            | CliError::DrainTimedOut { .. }
            | CliError::HaMismatch(_) => 1,
            _ => 2,
        }
    }
}

pub(crate) fn run(cli: Cli) -> Result<(), CliError> {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    match cli.command {
        Command::Hash(args) => hash(&args, &mut out),
        Command::Selector(args) => selector(&args, &mut out),
        Command::Demo(args) => Ok(crate::dev::forward("demo", &args)?),
        Command::Testserver(args) => Ok(crate::dev::forward("testserver", &args)?),
        Command::Bench(args) => Ok(crate::dev::forward("bench", &args)?),
        Command::Operator(args) => {
            drop(out);
            crate::operator::run(*args)
        }
        Command::Status(args) => crate::status::status(&args, &mut out),
        Command::Explain(args) => crate::ops::explain(&args, &mut out),
        Command::Pin(args) => crate::ops::edit(
            &args.group,
            Edit::Pin {
                shard: args.shard,
                member: args.member.clone(),
            },
            &mut out,
        ),
        Command::Unpin(args) => crate::ops::edit(&args.group, Edit::Unpin(args.shard), &mut out),
        Command::Pause(args) => crate::ops::edit(&args, Edit::Pause, &mut out),
        Command::Resume(args) => crate::ops::edit(&args, Edit::Resume, &mut out),
        Command::Drain(args) => crate::ops::drain(&args, &mut out),
        Command::Undrain(args) => {
            crate::ops::edit(&args.group, Edit::Undrain(args.member.clone()), &mut out)
        }
        Command::FencePolicy(args) => fence_policy(&args, &mut out),
        Command::Ha(args) => crate::ha_cmd::run(&args, &mut out),
    }
}

fn fence_policy(args: &FencePolicyArgs, out: &mut impl Write) -> Result<(), CliError> {
    let resources = args
        .resources
        .iter()
        .map(|r| r.parse())
        .collect::<Result<Vec<_>, _>>()?;
    let mut config = kube_shard::fence_policy::FencePolicyConfig::new(resources)
        .annotation(args.annotation.as_str())
        .name(args.name.as_str());
    if let Some(p) = &args.params {
        config = config.params(p.parse()?);
    }
    if let Some(f) = &args.status_fence_field {
        config = config.status_field(f.parse()?);
    }
    if let Some(p) = &args.min_epoch_params {
        config = config.min_epoch(kube_shard::fence_policy::MinEpoch::new(
            p.parse()?,
            args.operator_identities.clone(),
        ));
    }
    let set = config.generate()?;
    out.write_all(set.to_yaml().as_bytes())?;
    Ok(())
}

#[derive(serde::Serialize)]
struct HashRow<'a> {
    value: &'a str,
    hash: String,
    shard: u32,
}

fn hash(args: &HashArgs, out: &mut impl Write) -> Result<(), CliError> {
    let rows: Vec<HashRow<'_>> = args
        .values
        .iter()
        .map(|v| {
            let h = fnv1a64(v.as_bytes());
            HashRow {
                value: v,
                hash: format!("{h:016x}"),
                shard: args.key.shards.shard_of(h),
            }
        })
        .collect();
    if args.json {
        serde_json::to_writer(&mut *out, &rows)?;
        writeln!(out)?;
    } else {
        for row in rows {
            writeln!(out, "{}\t{}\t{}", row.value, row.hash, row.shard)?;
        }
    }
    Ok(())
}

fn selector(args: &SelectorArgs, out: &mut impl Write) -> Result<(), CliError> {
    if let Some(expr) = &args.check {
        let sel: ShardSelector = expr.parse()?;
        writeln!(out, "{sel}")?;
        return Ok(());
    }
    let owned = args.owned.as_deref().unwrap_or_default();
    let shards = ShardSet::parse(owned, args.key.shards)?;
    if shards.is_empty() {
        return Err(CliError::NothingOwned);
    }
    let sel = ShardSelector::for_shards(args.key.key, args.key.shards, &shards)?;
    writeln!(out, "{sel}")?;
    Ok(())
}
