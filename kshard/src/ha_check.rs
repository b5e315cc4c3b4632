//! `kshard ha check`: flags and printing only; the engine is `kube_shard::ha::check`.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kube_shard::ha::check::{self, CheckReport};
use kube_shard::ha::switchover::Kind;
use kube_shard::ha::{HaClients, HaConfig, HaMode};

use crate::cli::CliError;
use crate::duration::parse_duration;

/// Read both clusters (and the witness) and list every HA setting that does not match.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// Kubeconfig of this cluster (default: the usual lookup).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the peer cluster.
    #[arg(long = "peer-kubeconfig")]
    peer_kubeconfig: PathBuf,
    /// Kubeconfig of the witness cluster, if the operators use one.
    #[arg(long = "witness-kubeconfig")]
    witness_kubeconfig: Option<PathBuf>,
    /// The operator's namespace (where the HA Lease and the identity live in each cluster).
    #[arg(short = 'n', long)]
    namespace: String,
    /// The witness Lease's namespace (default: `--namespace`).
    #[arg(long = "witness-namespace")]
    witness_namespace: Option<String>,
    /// The HA name (the Leases are `<name>-ha`, the identities `<name>-ha-identity`).
    #[arg(long)]
    name: String,
    /// A kind both mirrors must cover, `<plural>.<group>/<version>`; repeat (a cross-check of what
    /// the operators published).
    #[arg(long = "kind")]
    kinds: Vec<String>,
    /// Per request.
    #[arg(long = "request-timeout", value_parser = parse_duration, default_value = "5s")]
    request_timeout: Duration,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(a: &CheckArgs, out: &mut impl Write) -> Result<(), CliError> {
    let expected = a
        .kinds
        .iter()
        .map(|k| {
            k.parse::<Kind>()
                .map(|k| k.key())
                .map_err(|e| CliError::Usage(format!("--kind {k}: {e}")))
        })
        .collect::<Result<BTreeSet<String>, _>>()?;
    // the check reads only: the cluster id and rank here are placeholders the reads never use
    let cfg = HaConfig::builder(&a.name)
        .mode(HaMode::Standby)
        .cluster("check", 0)
        .namespace(&a.namespace)
        .witness_namespace(a.witness_namespace.as_deref().unwrap_or(&a.namespace))
        .kubeconfigs(
            a.kubeconfig.clone(),
            Some(a.peer_kubeconfig.clone()),
            a.witness_kubeconfig.clone(),
        )
        .build()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(async {
        let local = crate::operator::client_from(a.kubeconfig.as_deref()).await?;
        let peer = crate::operator::client_from(Some(&a.peer_kubeconfig)).await?;
        let witness = match &a.witness_kubeconfig {
            Some(p) => Some(crate::operator::client_from(Some(p)).await?),
            None => None,
        };
        let clients = HaClients::new(local, peer, witness);
        Ok::<_, CliError>(check::check(&cfg, &clients, &expected, a.request_timeout).await)
    })?;
    if a.json {
        serde_json::to_writer(&mut *out, &report)?;
        writeln!(out)?;
    } else {
        print(&report, out)?;
    }
    match report.findings.len() {
        0 => Ok(()),
        n => Err(CliError::failed(format!(
            "{n} HA setting(s) do not match (see above)"
        ))),
    }
}

fn print(r: &CheckReport, out: &mut impl Write) -> Result<(), CliError> {
    writeln!(
        out,
        "{:<8} {:<38} {:<12} {:<5} {:<10} kinds",
        "side", "kube-system uid", "cluster id", "rank", "witness"
    )?;
    for s in &r.sides {
        let uid = match &s.uid {
            Some(Ok(u)) => u.clone(),
            Some(Err(_)) => "unreadable".into(),
            None => "-".into(),
        };
        let (id, rank, witness, kinds) = match &s.identity {
            Some(Ok(i)) => (
                i.cluster.clone(),
                i.rank.to_string(),
                i.witness.clone().unwrap_or_else(|| "none".into()),
                i.kinds.as_ref().map_or("no mirror".into(), |k| {
                    k.iter().cloned().collect::<Vec<_>>().join(",")
                }),
            ),
            Some(Err(_)) => ("malformed".into(), "-".into(), "-".into(), "-".into()),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        writeln!(
            out,
            "{:<8} {uid:<38} {id:<12} {rank:<5} {witness:<10} {kinds}",
            s.side
        )?;
    }
    if r.findings.is_empty() {
        writeln!(out, "consistent: no mismatch")?;
    }
    for f in &r.findings {
        writeln!(out, "MISMATCH {}: {}", f.check, f.detail)?;
    }
    Ok(())
}
