//! `kshard ha status|promote`: flags and printing only; the engines are `kube_shard_ha::status` and `kube_shard_ha::failover`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use kube_shard_ha::mirror::{KindSet, MirrorConfig};
use kube_shard_ha::promotion::{
    check_promotion, mirror_report, MirrorReport, Overrides, PromotionChecks, PromotionPath,
};
use kube_shard_ha::status::PairStatus;
use kube_shard_ha::switchover::{
    self, DemoteOptions, DemotionToken, FreezeScope, Kind, PromoteOptions,
};
use kube_shard_ha::{HaClients, HaConfig, HaMode, Timings};

use crate::cli::CliError;
use kube_shard_example_operator::run::parse_duration;

#[derive(Debug, Args)]
pub(crate) struct HaArgs {
    #[command(subcommand)]
    command: HaCommand,
}

#[derive(Debug, Subcommand)]
enum HaCommand {
    /// Both clusters' HA Leases (and the witness's) side by side: who is active at which epoch, limbo.
    Status(StatusArgs),
    /// Promote this cluster (the one `--kubeconfig` reaches) to Active: planned, with the demotion token
    /// of `kshard ha demote` (`--token`), or unplanned (`--force --old-active-stopped`).
    Promote(PromoteArgs),
    /// Planned switchover, first half, on the Active: mark it demoting, wait for every member's
    /// `ha-drained` ack, freeze the covered kinds, print the demotion token. `--cancel` undoes it while
    /// the peer has not promoted.
    Demote(DemoteArgs),
    /// Planned switchover with both sides reachable: `demote` on this cluster (the Active), then
    /// `promote --token` on the peer.
    Switchover(SwitchoverArgs),
    /// Both clusters' (and the witness's) HA settings compared: one cluster id or one rank on both
    /// sides, an identity from another cluster, witness, timings and mirrored kinds; exit 1 on any.
    Check(crate::ha_check::CheckArgs),
    /// Take this cluster out of HA: mark it (never a promotion target again, no mirror starts) and lift
    /// its switchover freeze. Refused while it leads the pair, and while its mirror duty is recorded
    /// mirroring unless `--operator-stopped`.
    Leave(LeaveArgs),
}

#[derive(Debug, Args)]
struct LeaveArgs {
    #[command(flatten)]
    pair: Pair,
    /// Assert that this cluster's operator (its elector and mirror duty) is stopped.
    #[arg(long = "operator-stopped")]
    operator_stopped: bool,
    /// Why (recorded in the checkpoint's mark).
    #[arg(long)]
    reason: String,
}

/// What a demotion covers and waits for.
#[derive(Debug, Args)]
struct DemoteFlags {
    /// A covered (mirrored) kind, `<plural>.<group>/<version>` (core: `<plural>/<version>`); repeat.
    /// Default: the kinds the Standby's mirror records in its checkpoint; given, they must be those
    /// (a cross-check).
    #[arg(long = "kind")]
    kinds: Vec<String>,
    /// The Active's shard group: every member Lease must acknowledge `ha-drained` (without it: wait out
    /// the term).
    #[arg(long)]
    group: Option<String>,
    /// The group's namespace (default: `--namespace`).
    #[arg(long = "group-namespace")]
    group_namespace: Option<String>,
    /// An identity the freeze lets write (the garbage collector, ...); repeat.
    #[arg(long = "freeze-exempt")]
    freeze_exempt: Vec<String>,
    /// Give up (no token) when a member has not acknowledged within this time.
    #[arg(long = "drain-timeout", value_parser = parse_duration, default_value = "60s")]
    drain_timeout: Duration,
    /// The freeze's namespaces when the peer's checkpoint records no mirror (repeat; otherwise the
    /// recorded mirror's scope is frozen, and these must be it).
    #[arg(long = "mirror-namespace")]
    mirror_namespaces: Vec<String>,
    /// The freeze's label selector when the peer's checkpoint records no mirror (otherwise the
    /// recorded mirror's selector is frozen, and this must be it).
    #[arg(long = "mirror-labels")]
    mirror_labels: Option<String>,
}

/// The `--kind` words (`<plural>.<group>/<version>`), a usage error naming the first bad one.
fn parse_kinds(words: &[String]) -> Result<Vec<Kind>, CliError> {
    words
        .iter()
        .map(|k| k.parse::<Kind>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// The overrides of the promotion checks, each named for what it risks (`--allow-unsynced` is
/// `promote --force`'s own).
#[derive(Debug, Args)]
struct OverrideFlags {
    /// Promote although the Standby holds objects of the mirrored kinds that are not copies of the
    /// peer's (divergent: they become live objects of the new Active; run failback first instead).
    #[arg(long = "allow-divergent")]
    allow_divergent: bool,
    /// Go on although `--kind` (or `--mirror-namespace`) differs from the kinds (scope) the Standby's
    /// mirror records in its checkpoint; the checkpoint's are used and checked.
    #[arg(long = "allow-kind-mismatch")]
    allow_kind_mismatch: bool,
    /// Promote although no mirror ever ran on the Standby (no checkpoint records one): nothing shows
    /// what it holds of the peer's objects.
    #[arg(long = "allow-no-mirror")]
    allow_no_mirror: bool,
}

impl OverrideFlags {
    fn overrides(&self, allow_unsynced: bool) -> Overrides {
        Overrides::none()
            .unsynced(allow_unsynced)
            .divergent(self.allow_divergent)
            .kind_mismatch(self.allow_kind_mismatch)
            .no_mirror(self.allow_no_mirror)
    }
}

/// The result line's note of the overrides given ("" without one).
fn override_note(o: &Overrides) -> String {
    let f = o.flags();
    if f.is_empty() {
        String::new()
    } else {
        format!(" (override: {})", f.join(", "))
    }
}

/// Before a demotion, the Standby's (the peer's) promotion checks: its mirror, read from its
/// checkpoint, gives the kinds to cover; `--kind` is a cross-check. Refused as `promote --token` would
/// refuse, before anything is written. `cfg` is this cluster's: the checkpoint has the same name and
/// namespace on both.
async fn planned_kinds(
    cfg: &HaConfig,
    peer: &kube::Client,
    flags: &DemoteFlags,
    overrides: Overrides,
) -> Result<(Vec<Kind>, FreezeScope), CliError> {
    let given = parse_kinds(&flags.kinds)?;
    let checks = PromotionChecks::default()
        .kinds(given.clone())
        .source(Some(cfg.cluster_id.clone()))
        .namespaces(flags.mirror_namespaces.clone())
        .labels(flags.mirror_labels.as_deref())
        .map_err(|e| CliError::Usage(e.to_string()))?
        .overrides(overrides);
    let checked = check_promotion(cfg, peer, &checks, PromotionPath::BeforeDemotion).await?;
    for o in &checked.overridden {
        say(&format!("override {o}"));
    }
    match checked.mirror {
        Some(m) => Ok((m.kinds.mirrored().cloned().collect(), FreezeScope::of(&m))),
        None if !given.is_empty() => Ok((
            given,
            FreezeScope::new(
                flags.mirror_namespaces.clone(),
                flags.mirror_labels.as_deref(),
            )?,
        )),
        None => Err(CliError::Usage(
            "--kind is required: the peer's checkpoint records no mirror".into(),
        )),
    }
}

impl DemoteFlags {
    fn options(&self, (kinds, scope): (Vec<Kind>, FreezeScope)) -> DemoteOptions {
        let mut o = DemoteOptions::new(kinds)
            .scope(scope)
            .drain_timeout(self.drain_timeout)
            .freeze_exempt(self.freeze_exempt.clone());
        if let Some(g) = &self.group {
            o = o.group(g, self.group_namespace.clone());
        }
        o
    }
}

#[derive(Debug, Args)]
struct DemoteArgs {
    #[command(flatten)]
    pair: Pair,
    #[command(flatten)]
    flags: DemoteFlags,
    #[command(flatten)]
    overrides: OverrideFlags,
    /// Undo a demotion (lift the freeze, resume at the same epoch): refused once the peer promoted.
    #[arg(long)]
    cancel: bool,
}

#[derive(Debug, Args)]
struct SwitchoverArgs {
    #[command(flatten)]
    pair: Pair,
    #[command(flatten)]
    flags: DemoteFlags,
    #[command(flatten)]
    overrides: OverrideFlags,
    /// The peer's (the Standby's) cluster id.
    #[arg(long = "peer-cluster-id")]
    peer_cluster_id: String,
    /// The peer's rank.
    #[arg(long = "peer-rank")]
    peer_rank: u64,
    /// How long the promotion waits for the peer's mirror.
    #[arg(long, value_parser = parse_duration, default_value = "10m")]
    timeout: Duration,
}

/// The clusters of an HA pair and where its objects are.
#[derive(Debug, Args)]
pub(crate) struct Clusters {
    /// Kubeconfig of this cluster (default: the usual lookup).
    #[arg(long)]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the peer cluster.
    #[arg(long = "peer-kubeconfig")]
    pub(crate) peer_kubeconfig: PathBuf,
    /// Kubeconfig of the witness cluster, if one is used.
    #[arg(long = "witness-kubeconfig")]
    pub(crate) witness_kubeconfig: Option<PathBuf>,
    /// The operator's namespace (where the HA Lease lives in each cluster).
    #[arg(short = 'n', long)]
    pub(crate) namespace: String,
    /// The witness Lease's namespace in the witness cluster (default: `--namespace`, as the operator
    /// and the library use).
    #[arg(long = "witness-namespace")]
    pub(crate) witness_namespace: Option<String>,
    /// The HA name: the Leases are `<name>-ha`.
    #[arg(long)]
    pub(crate) name: String,
}

impl Clusters {
    /// The HA configuration of cluster `id` at `rank` in this pair.
    pub(crate) fn config(
        &self,
        id: &str,
        rank: u64,
        timings: Option<Timings>,
    ) -> Result<HaConfig, CliError> {
        let mut b = HaConfig::builder(&self.name)
            .mode(HaMode::Standby)
            .cluster(id, rank)
            .namespace(&self.namespace)
            .witness_namespace(self.witness_namespace.as_deref().unwrap_or(&self.namespace))
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

    pub(crate) async fn clients(&self) -> Result<HaClients, CliError> {
        let local = crate::operator::client_from(self.kubeconfig.as_deref()).await?;
        let peer = crate::operator::client_from(Some(&self.peer_kubeconfig)).await?;
        let witness = match &self.witness_kubeconfig {
            Some(p) => Some(crate::operator::client_from(Some(p)).await?),
            None => None,
        };
        Ok(HaClients::new(local, peer, witness))
    }
}

/// Where the HA Leases are, and which side this is.
#[derive(Debug, Args)]
struct Pair {
    #[command(flatten)]
    at: Clusters,
    /// This cluster's id (`--ha-cluster-id` of its operator).
    #[arg(long = "cluster-id")]
    cluster_id: String,
    /// This cluster's rank (`--ha-rank` of its operator).
    #[arg(long)]
    rank: u64,
}

/// This cluster's mirror (its kinds, scope and source).
#[derive(Debug, Args)]
struct MirrorFlags {
    /// A mirrored kind, `<plural>.<group>/<version>` (core: `<plural>/<version>`); repeat.
    #[arg(long = "kind")]
    kinds: Vec<String>,
    /// The mirror's namespaces (repeat; default: every namespace).
    #[arg(long = "mirror-namespace")]
    mirror_namespaces: Vec<String>,
    /// The mirror's label selector (`kubectl -l` syntax); required for built-in kinds unless
    /// `--mirror-whole-builtin-kinds`.
    #[arg(long = "mirror-labels")]
    mirror_labels: Option<String>,
    /// Mirror built-in kinds without a label selector: every object of them in scope is the
    /// operator's.
    #[arg(long = "mirror-whole-builtin-kinds")]
    mirror_whole_builtin_kinds: bool,
    /// The peer's cluster id, the mirror's source (with `promote --token` the token names it).
    #[arg(long = "peer-cluster-id")]
    peer_cluster_id: Option<String>,
}

impl MirrorFlags {
    /// The mirror of `--kind` (`None` without one): `peer` is the source the token names, else
    /// `--peer-cluster-id`.
    fn config(&self, cfg: &HaConfig, peer: Option<&str>) -> Result<Option<MirrorConfig>, CliError> {
        if self.kinds.is_empty() {
            return Ok(None);
        }
        let kinds = parse_kinds(&self.kinds)?;
        let Some(peer) = peer.or(self.peer_cluster_id.as_deref()) else {
            return Err(CliError::Usage(
                "--kind needs --peer-cluster-id (the mirror's source)".into(),
            ));
        };
        let set = kinds
            .iter()
            .fold(KindSet::builder(), |b, k| b.mirrored(k.clone()))
            .build(&kinds)
            .map_err(|e| CliError::Usage(e.to_string()))?;
        let mut m = MirrorConfig::new(cfg.clone(), peer, set);
        if !self.mirror_namespaces.is_empty() {
            m = m.namespaces(self.mirror_namespaces.clone());
        }
        if let Some(l) = &self.mirror_labels {
            m = m.labels(l).map_err(|e| CliError::Usage(e.to_string()))?;
        }
        Ok(Some(m.whole_builtin_kinds(self.mirror_whole_builtin_kinds)))
    }
}

#[derive(Debug, Args)]
struct StatusArgs {
    #[command(flatten)]
    pair: Pair,
    /// With `--kind`: the mirror's rows (position, the Active's version, objects behind, divergent).
    #[command(flatten)]
    mirror: MirrorFlags,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PromoteArgs {
    #[command(flatten)]
    pair: Pair,
    /// Planned switchover: the demotion token `kshard ha demote` printed.
    #[arg(long)]
    token: Option<String>,
    /// Unplanned failover: promote without a demotion token.
    #[arg(long)]
    force: bool,
    /// Assert that the old Active is stopped (or cut from its own apiserver): if it is alive behind a
    /// partition that leaves it its own apiserver, both act until it reads the peer's Lease.
    #[arg(long = "old-active-stopped")]
    old_active_stopped: bool,
    /// With `--force`: promote although a mirrored kind has no record of a completed full LIST from
    /// the peer (the objects not copied yet are lost).
    #[arg(long = "allow-unsynced")]
    allow_unsynced: bool,
    /// With `--token`: promote although objects are on the mirror's failed list, once it caught up but
    /// for them; the result (and a Warning Event) lists every object lost.
    #[arg(long = "accept-failed")]
    accept_failed: bool,
    #[command(flatten)]
    overrides: OverrideFlags,
    /// Cross-checks of this cluster's mirror, which the checks read from its checkpoint: a promotion
    /// target is refused while it holds objects of the mirrored kinds that are not copies of the
    /// peer's (divergent: run failback first); with `--force`, also while a kind has not synced; with
    /// `--token`, while the token's kinds are not the mirror's.
    #[command(flatten)]
    mirror: MirrorFlags,
    /// Give up when not armed (or the Lease not written) within this time; with `--token`, when the
    /// mirror has not reached the token within it (then a per-kind report, nothing changed).
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
        self.at.config(&self.cluster_id, self.rank, timings)
    }

    async fn clients(&self) -> Result<HaClients, CliError> {
        self.at.clients().await
    }
}

pub(crate) fn run(args: &HaArgs, out: &mut impl Write) -> Result<(), CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match &args.command {
        HaCommand::Status(a) => {
            let cfg = a.pair.config(None)?;
            let mirror = a.mirror.config(&cfg, None)?;
            let (st, report) = rt.block_on(async {
                let clients = a.pair.clients().await?;
                let st =
                    kube_shard_ha::status::read_pair(&cfg, &clients, Duration::from_secs(5)).await;
                let report = match &mirror {
                    Some(m) => Some(mirror_report(m, &clients.local, &clients.peer).await),
                    None => None,
                };
                Ok::<_, CliError>((st, report))
            })?;
            if a.json {
                let mut v = serde_json::to_value(&st)?;
                if let (Some(r), Some(o)) = (&report, v.as_object_mut()) {
                    o.insert("mirror".into(), serde_json::to_value(r)?);
                }
                serde_json::to_writer(&mut *out, &v)?;
                writeln!(out)?;
                return Ok(());
            }
            print_status(&st, &a.pair.cluster_id, false, out)?;
            if let Some(r) = &report {
                print_mirror(r, out)?;
            }
            Ok(())
        }
        HaCommand::Promote(a) => promote(&rt, a, out),
        HaCommand::Demote(a) => demote(&rt, a, out),
        HaCommand::Switchover(a) => switch(&rt, a, out),
        HaCommand::Check(a) => crate::ha_check::run(a, out),
        HaCommand::Leave(a) => {
            let cfg = a.pair.config(None)?;
            let opts =
                switchover::LeaveOptions::new(&a.reason).operator_stopped(a.operator_stopped);
            rt.block_on(async {
                let clients = a.pair.clients().await?;
                switchover::leave(&cfg, &clients, &opts)
                    .await
                    .map_err(CliError::from)
            })?;
            writeln!(
                out,
                "left HA: {} is never a promotion target again, and its freeze is lifted",
                a.pair.cluster_id
            )?;
            Ok(())
        }
    }
}

fn say(line: &str) {
    eprintln!("kshard ha: {line}");
}

fn demote(
    rt: &tokio::runtime::Runtime,
    a: &DemoteArgs,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let cfg = a.pair.config(None)?;
    rt.block_on(async {
        let clients = a.pair.clients().await?;
        if a.cancel {
            switchover::cancel(&cfg, &clients).await?;
            writeln!(
                out,
                "cancelled: {} is Active again (the freeze is lifted)",
                a.pair.cluster_id
            )?;
            return Ok(());
        }
        let overrides = a.overrides.overrides(false);
        let kinds = planned_kinds(&cfg, &clients.peer, &a.flags, overrides).await?;
        let token = switchover::demote(&cfg, &clients, &a.flags.options(kinds), say).await?;
        if !overrides.flags().is_empty() {
            say(&format!("demoted{}", override_note(&overrides)));
        }
        writeln!(out, "{token}")?;
        Ok(())
    })
}

/// The peer's HA configuration as a Standby, for the promotion half of a switchover.
fn peer_config(a: &SwitchoverArgs) -> Result<HaConfig, CliError> {
    let at = &a.pair.at;
    HaConfig::builder(&at.name)
        .mode(HaMode::Standby)
        .cluster(&a.peer_cluster_id, a.peer_rank)
        .namespace(&at.namespace)
        .witness_namespace(at.witness_namespace.as_deref().unwrap_or(&at.namespace))
        .kubeconfigs(
            Some(at.peer_kubeconfig.clone()),
            Some(at.kubeconfig.clone().unwrap_or_default()),
            at.witness_kubeconfig.clone(),
        )
        .build()
        .map_err(|e| CliError::Usage(e.to_string()))
}

fn switch(
    rt: &tokio::runtime::Runtime,
    a: &SwitchoverArgs,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let cfg = a.pair.config(None)?;
    let overrides = a.overrides.overrides(false);
    let peer_cfg = peer_config(a)?;
    rt.block_on(async {
        let clients = a.pair.clients().await?;
        let kinds = planned_kinds(&cfg, &clients.peer, &a.flags, overrides).await?;
        let opts = a.flags.options(kinds.clone());
        let token = switchover::demote(&cfg, &clients, &opts, say).await?;
        say(&format!("demoted; token {token}"));
        let swapped = kube_shard_ha::HaClients::new(
            clients.peer.clone(),
            clients.local.clone(),
            clients.witness.clone(),
        );
        let checks = PromotionChecks::default()
            .kinds(kinds.0)
            .source(Some(a.pair.cluster_id.clone()))
            .overrides(overrides);
        let epoch = switchover::promote_with_token(
            &peer_cfg,
            swapped,
            kube_shard::rt::Clock::system(),
            &token,
            &PromoteOptions::new(a.timeout).checks(checks),
            say,
        )
        .await
        .map_err(|error| CliError::SwitchedHalfway {
            error,
            token: token.to_string(),
        })?;
        writeln!(
            out,
            "switched over: {} is Active at epoch {epoch} (n={}){}",
            a.peer_cluster_id,
            epoch.n(),
            override_note(&overrides)
        )?;
        Ok(())
    })
}

fn promote_token(
    rt: &tokio::runtime::Runtime,
    a: &PromoteArgs,
    token: &str,
    out: &mut impl Write,
) -> Result<(), CliError> {
    let token: DemotionToken = token
        .parse()
        .map_err(|e: kube_shard_ha::checkpoint::ParseError| CliError::Usage(e.to_string()))?;
    let cfg = a.pair.config(Some(a.timings()))?;
    let opts = PromoteOptions::new(a.timeout)
        .checks(a.checks()?)
        .accept_failed(a.accept_failed);
    let promoted = rt.block_on(async {
        let clients = a.pair.clients().await?;
        switchover::promote_by_token(
            &cfg,
            clients,
            kube_shard::rt::Clock::system(),
            &token,
            &opts,
            say,
        )
        .await
        .map_err(CliError::from)
    })?;
    let epoch = promoted.epoch;
    writeln!(
        out,
        "promoted: {} is Active at epoch {epoch} (n={}) with the demotion token{}",
        a.pair.cluster_id,
        epoch.n(),
        override_note(&opts.checks.overrides)
    )?;
    if !promoted.accepted.is_empty() {
        writeln!(
            out,
            "accepted losing {} object(s) (--accept-failed; also in a Warning Event):",
            promoted.accepted.len()
        )?;
        for l in &promoted.accepted {
            writeln!(out, "  {l}")?;
        }
    }
    Ok(())
}

impl PromoteArgs {
    /// The promotion checks' cross-checks (`--kind`, `--peer-cluster-id`, `--mirror-namespace`) and
    /// overrides.
    fn checks(&self) -> Result<PromotionChecks, CliError> {
        Ok(PromotionChecks::default()
            .kinds(parse_kinds(&self.mirror.kinds)?)
            .source(self.mirror.peer_cluster_id.clone())
            .namespaces(self.mirror.mirror_namespaces.clone())
            .labels(self.mirror.mirror_labels.as_deref())
            .map_err(|e| CliError::Usage(e.to_string()))?
            .overrides(self.overrides.overrides(self.allow_unsynced)))
    }

    fn timings(&self) -> Timings {
        Timings::new(
            self.lease_duration,
            self.renew_deadline,
            self.retry_period,
            self.request_timeout,
            self.grace,
        )
    }
}

fn promote(
    rt: &tokio::runtime::Runtime,
    a: &PromoteArgs,
    out: &mut impl Write,
) -> Result<(), CliError> {
    match (&a.token, a.force) {
        (Some(_), true) => {
            return Err(CliError::Usage("--token and --force exclude each other".into()))
        }
        (Some(t), false) => return promote_token(rt, a, t, out),
        (None, false) => {
            return Err(CliError::Usage(
                "give --token T (planned switchover: the token `kshard ha demote` printed) or --force --old-active-stopped (unplanned failover)".into(),
            ))
        }
        (None, true) => {}
    }
    if !a.old_active_stopped {
        return Err(CliError::Usage(
            "--force needs --old-active-stopped: stop the old Active (or cut it from its own apiserver) first; without a witness nothing else keeps it from acting".into(),
        ));
    }
    let cfg = a.pair.config(Some(a.timings()))?;
    // the checks run in the library, with the mirror read from this cluster's checkpoint; with a
    // mirror, it holds before the candidacy (no copy write after the takeover)
    let opts = kube_shard_ha::failover::ForceOptions::new(a.timeout).checks(a.checks()?);
    let epoch = rt.block_on(async {
        let clients = a.pair.clients().await?;
        let mut last = String::new();
        kube_shard_ha::failover::force_promote_with(
            &cfg,
            clients,
            kube_shard::rt::Clock::system(),
            &opts,
            |line| {
                if line != last {
                    eprintln!("kshard ha promote: {line}");
                    last = line.to_string();
                }
            },
        )
        .await
        .map_err(CliError::from)
    })?;
    writeln!(
        out,
        "promoted: {} is Active at epoch {epoch} (n={}); writes the old Active committed after the mirror's position are lost{}",
        a.pair.cluster_id,
        epoch.n(),
        override_note(&opts.checks.overrides)
    )?;
    Ok(())
}

fn print_mirror(r: &MirrorReport, out: &mut impl Write) -> Result<(), CliError> {
    writeln!(
        out,
        "mirror of {}: duty {}; was-active mark {}",
        r.source,
        r.duty.as_deref().unwrap_or("(none recorded)"),
        r.was_active.as_deref().unwrap_or("no")
    )?;
    if let Some(h) = &r.hold {
        writeln!(out, "hold: {h}")?;
    }
    let cell = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    writeln!(
        out,
        "{:<32}{:>14}{:>14}{:>8}{:>11}",
        "kind", "position", "active rv", "behind", "divergent"
    )?;
    for k in &r.kinds {
        writeln!(
            out,
            "{:<32}{:>14}{:>14}{:>8}{:>11}",
            k.kind,
            cell(k.position.map(|p| p.to_string())),
            cell(k.active_rv.map(|p| p.to_string())),
            cell(k.behind.map(|p| p.to_string())),
            k.divergent
        )?;
        if let Some(e) = &k.error {
            writeln!(out, "  {}: {e}", k.kind)?;
        }
    }
    Ok(())
}

/// Both clusters' HA Leases side by side, a row per field.
fn print_lease_table(st: &PairStatus, out: &mut impl Write) -> std::io::Result<()> {
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
    print_lease_table(st, out)?;
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
