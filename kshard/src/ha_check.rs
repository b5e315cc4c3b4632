//! `kshard ha check`: flags and printing only; the engine is `kube_shard_ha::check`.

use std::collections::BTreeSet;
use std::io::Write;
use std::time::Duration;

use clap::Args;
use kube_shard_ha::check::{self, CheckReport};
use kube_shard_ha::switchover::Kind;

use crate::cli::CliError;
use crate::ha_cmd::Clusters;
use kube_shard_example_operator::run::parse_duration;

/// Read both clusters (and the witness) and list every HA setting that does not match.
#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    #[command(flatten)]
    at: Clusters,
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
    // the check reads only: the cluster id and rank are placeholders the reads never use
    let cfg = a.at.config("check", 0, None)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let report = rt.block_on(async {
        let clients = a.at.clients().await?;
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
        n => Err(CliError::HaMismatch(n)),
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
