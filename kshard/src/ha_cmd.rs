//! `kshard ha status|promote`: flags and printing only; the engine is `kube_shard::ha::ops`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use kube_shard::ha::ops::{self, PairStatus};
use kube_shard::ha::{HaClients, HaConfig, HaMode, Timings};

use crate::cli::CliError;
use crate::duration::parse_duration;

#[derive(Debug, Args)]
pub(crate) struct HaArgs {
    #[command(subcommand)]
    command: HaCommand,
}

#[derive(Debug, Subcommand)]
enum HaCommand {
    /// Both clusters' HA Leases (and the witness's) side by side: who is active at which epoch, limbo.
    Status(StatusArgs),
    /// Promote this cluster (the one `--kubeconfig` reaches) to Active. Without a witness this is the
    /// only way: `--force --old-active-stopped`.
    Promote(PromoteArgs),
}

/// Where the HA Leases are.
#[derive(Debug, Args)]
struct Pair {
    /// Kubeconfig of this cluster (default: the usual lookup).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the peer cluster.
    #[arg(long = "peer-kubeconfig")]
    peer_kubeconfig: PathBuf,
    /// Kubeconfig of the witness cluster, if one is used.
    #[arg(long = "witness-kubeconfig")]
    witness_kubeconfig: Option<PathBuf>,
    /// The operator's namespace (where the HA Lease lives in each cluster).
    #[arg(short = 'n', long)]
    namespace: String,
    /// The witness Lease's namespace in the witness cluster.
    #[arg(long = "witness-namespace", default_value = "kube-shard-ha")]
    witness_namespace: String,
    /// The HA name: the Leases are `<name>-ha`.
    #[arg(long)]
    name: String,
    /// This cluster's id (`--ha-cluster-id` of its operator).
    #[arg(long = "cluster-id")]
    cluster_id: String,
    /// This cluster's rank (`--ha-rank` of its operator).
    #[arg(long)]
    rank: u64,
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    pair: Pair,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PromoteArgs {
    #[command(flatten)]
    pair: Pair,
    /// Unplanned failover: promote without a demotion token.
    #[arg(long)]
    force: bool,
    /// Assert that the old Active is stopped (or cut from its own apiserver): if it is alive behind a
    /// partition that leaves it its own apiserver, both act until it reads the peer's Lease.
    #[arg(long = "old-active-stopped")]
    old_active_stopped: bool,
    /// Promote although a mirrored kind never completed a full LIST (no kind is mirrored in this
    /// release: the flag is accepted and changes nothing).
    #[arg(long = "allow-unsynced")]
    allow_unsynced: bool,
    /// Give up when not armed (or the Lease not written) within this time.
    #[arg(long, value_parser = parse_duration, default_value = "120s")]
    timeout: Duration,
    /// The operators' HA timings (they must match the running operators': the waits honour the
    /// published ones too).
    #[arg(long = "lease-duration", value_parser = parse_duration, default_value = "15s")]
    lease_duration: Duration,
    #[arg(long = "renew-deadline", value_parser = parse_duration, default_value = "10s")]
    renew_deadline: Duration,
    #[arg(long = "retry-period", value_parser = parse_duration, default_value = "2s")]
    retry_period: Duration,
    #[arg(long = "request-timeout", value_parser = parse_duration, default_value = "2500ms")]
    request_timeout: Duration,
    #[arg(long = "grace", value_parser = parse_duration, default_value = "2s")]
    grace: Duration,
}

impl Pair {
    fn config(&self, timings: Option<Timings>) -> Result<HaConfig, CliError> {
        let mut b = HaConfig::builder(&self.name)
            .mode(HaMode::Standby)
            .cluster(&self.cluster_id, self.rank)
            .namespace(&self.namespace)
            .witness_namespace(&self.witness_namespace)
            .kubeconfigs(
                self.kubeconfig.clone(),
                Some(self.peer_kubeconfig.clone()),
                self.witness_kubeconfig.clone(),
            );
        if let Some(t) = timings {
            b = b.timings(t);
        }
        b.build().map_err(|e| CliError::Usage(e.to_string()))
    }

    async fn clients(&self) -> Result<HaClients, CliError> {
        let local = crate::operator::client_from(self.kubeconfig.as_deref()).await?;
        let peer = crate::operator::client_from(Some(&self.peer_kubeconfig)).await?;
        let witness = match &self.witness_kubeconfig {
            Some(p) => Some(crate::operator::client_from(Some(p)).await?),
            None => None,
        };
        Ok(HaClients::new(local, peer, witness))
    }
}

pub(crate) fn run(args: &HaArgs, out: &mut impl Write) -> Result<(), CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match &args.command {
        HaCommand::Status(a) => {
            let cfg = a.pair.config(None)?;
            let st = rt.block_on(async {
                let clients = a.pair.clients().await?;
                Ok::<_, CliError>(ops::read_pair(&cfg, &clients, Duration::from_secs(5)).await)
            })?;
            print_status(&st, &a.pair.cluster_id, a.json, out)
        }
        HaCommand::Promote(a) => promote(&rt, a, out),
    }
}

fn promote(
    rt: &tokio::runtime::Runtime,
    a: &PromoteArgs,
    out: &mut impl Write,
) -> Result<(), CliError> {
    if !a.force {
        return Err(CliError::Usage(
            "planned switchover (`promote --token`) is not built yet: use `--force --old-active-stopped` for an unplanned failover".into(),
        ));
    }
    if !a.old_active_stopped {
        return Err(CliError::Usage(
            "--force needs --old-active-stopped: stop the old Active (or cut it from its own apiserver) first; without a witness nothing else keeps it from acting".into(),
        ));
    }
    let timings = Timings::new(
        a.lease_duration,
        a.renew_deadline,
        a.retry_period,
        a.request_timeout,
        a.grace,
    );
    let cfg = a.pair.config(Some(timings))?;
    if a.allow_unsynced {
        writeln!(
            out,
            "note: --allow-unsynced: no kind is mirrored in this release"
        )?;
    }
    let epoch = rt.block_on(async {
        let clients = a.pair.clients().await?;
        let mut last = String::new();
        ops::force_promote(
            &cfg,
            clients,
            kube_shard::ha::handle::tokio_clock(),
            a.timeout,
            |line| {
                if line != last {
                    eprintln!("kshard ha promote: {line}");
                    last = line.to_string();
                }
            },
        )
        .await
        .map_err(|e| CliError::failed(e.to_string()))
    })?;
    writeln!(
        out,
        "promoted: {} is Active at epoch {epoch} (n={}); writes the old Active committed after the mirror's position are lost",
        a.pair.cluster_id,
        epoch.n()
    )?;
    Ok(())
}

fn print_status(
    st: &PairStatus,
    me: &str,
    json: bool,
    out: &mut impl Write,
) -> Result<(), CliError> {
    if json {
        serde_json::to_writer(&mut *out, st)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "HA Lease {} (this cluster: {me})", st.lease)?;
    let cell = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let cols: Vec<&str> = st.leases.iter().map(|l| l.cluster).collect();
    let row = |out: &mut dyn Write, name: &str, vals: Vec<String>| -> std::io::Result<()> {
        write!(out, "{name:<14}")?;
        for v in vals {
            write!(out, "{v:<22}")?;
        }
        writeln!(out)
    };
    row(out, "", cols.iter().map(|c| c.to_string()).collect())?;
    row(
        out,
        "state",
        st.leases.iter().map(|l| l.state.to_string()).collect(),
    )?;
    row(
        out,
        "holder",
        st.leases.iter().map(|l| cell(l.holder.clone())).collect(),
    )?;
    row(
        out,
        "epoch (n)",
        st.leases
            .iter()
            .map(|l| cell(l.epoch.map(|e| format!("{e} ({})", e / 1000))))
            .collect(),
    )?;
    row(
        out,
        "version",
        st.leases
            .iter()
            .map(|l| cell(l.resource_version.clone()))
            .collect(),
    )?;
    writeln!(
        out,
        "active: {}",
        match (&st.active, st.highest_epoch) {
            (Some(c), Some(e)) => format!("{c} at epoch {e}"),
            _ => "none".into(),
        }
    )?;
    writeln!(out, "limbo: {}", st.limbo.as_deref().unwrap_or("no"))?;
    if let Some(a) = &st.alarm {
        writeln!(out, "ALARM: {a}")?;
    }
    Ok(())
}
