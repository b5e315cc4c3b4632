//! Planned switchover (HA.md contract 2): the engine of `kshard ha demote`, `promote --token`,
//! `switchover` and `demote --cancel`; the CLI only parses and prints.
//!
//! - [`demote`] (the Active): marks its HA Leases `demoting` ([`HaState`]), waits for every member's
//!   `ha-drained` ack (a member missing at `drain_timeout` fails it, and no token is issued), freezes the
//!   covered kinds, then records and returns the [`DemotionToken`].
//! - [`promote_with_token`] (the Standby): [`check_promotion`], the token table, a wait until the mirror has
//!   caught up to the token and holds ([`CAUGHT_UP_KEY`]), then a takeover with no wait ([`TokenTakeover`]).
//! - [`cancel`]: the Active back to `active` at the same epoch; the freeze is lifted last.
//!
//! See `docs/ha.md#planned-switchover`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

mod accept;
mod error;
mod freeze;
mod io;
mod leave;

use crate::checkpoint::edit::edit_checkpoint;
use crate::checkpoint::{caught_up, parse_hold, position};
pub use crate::checkpoint::{
    DemotionToken, Kind, CATCH_UP_KEY, CAUGHT_UP_KEY, HOLD_KEY, USED_TOKENS_KEY,
};
pub use crate::config::checkpoint_name;
pub use accept::Lost;
use error::{api_err, report_text};
pub use error::{KindProgress, SwitchError};
pub use freeze::{freeze_objects, FreezeScope, FREEZE_MARK};
pub use io::{freeze_name, unfreeze};
use io::{lease_api, my_epoch, read_lease, resolve};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::discovery::{ApiCapabilities, Scope};
use kube::{Api, Client};
pub use leave::{leave, LeaveOptions};
use tracing::{info, warn};

use crate::config::HaConfig;
use crate::driver::{spawn, HaClients, PromoteError};
use crate::elector::TokenTakeover;
use crate::epoch::FailoverEpoch;
use crate::metrics::HaMetrics;
use crate::promotion::{check_promotion, PromotionChecks, PromotionPath};
use crate::record::{HaState, Record, STATE_ANNOTATION};
use kube_shard::group::report::{GATE_DRAINED, GROUP_LABEL, ROLE_LABEL};
use kube_shard::rt::Clock;

/// Settings of [`demote`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DemoteOptions {
    /// The Active's shard group (its member Leases ack `ha-drained`); `None`: a single process, the
    /// demoter waits out the term's last possible end plus the longest fenced-write timeout.
    pub group: Option<String>,
    /// The group's namespace (default: the HA namespace).
    pub group_namespace: Option<String>,
    /// The covered (mirrored) kinds: frozen, and in the token.
    pub kinds: Vec<Kind>,
    /// Identities the freeze lets write (for example the garbage collector).
    pub freeze_exempt: Vec<String>,
    /// What the freeze covers within the kinds: the peer's mirror's scope (default: the whole kinds,
    /// refused for built-in kinds).
    pub scope: FreezeScope,
    /// How long to wait for the acks.
    pub drain_timeout: Duration,
    /// How long to wait for the freeze probe to be refused.
    pub freeze_timeout: Duration,
    /// PLANTED BUG for the tests: take the token without waiting for the acks.
    #[doc(hidden)]
    pub skip_acks: bool,
}

impl DemoteOptions {
    /// Defaults: no group, a 60 s drain timeout, a 30 s freeze timeout, nothing exempt.
    #[must_use]
    pub fn new(kinds: Vec<Kind>) -> Self {
        DemoteOptions {
            group: None,
            group_namespace: None,
            kinds,
            freeze_exempt: Vec::new(),
            scope: FreezeScope::default(),
            drain_timeout: Duration::from_secs(60),
            freeze_timeout: Duration::from_secs(30),
            skip_acks: false,
        }
    }

    /// The Active's shard group (in `namespace`, default the HA namespace).
    #[must_use]
    pub fn group(mut self, group: impl Into<String>, namespace: Option<String>) -> Self {
        self.group = Some(group.into());
        self.group_namespace = namespace;
        self
    }

    /// How long to wait for the members' acks.
    #[must_use]
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// Identities the freeze lets write.
    #[must_use]
    pub fn freeze_exempt(mut self, ids: Vec<String>) -> Self {
        self.freeze_exempt = ids;
        self
    }

    /// Freeze only `scope` of the kinds: the scope of the mirror that copies them.
    #[must_use]
    pub fn scope(mut self, scope: FreezeScope) -> Self {
        self.scope = scope;
        self
    }
}

/// Set the state of the Lease `name` that names `cluster` at `epoch`: `next(current)` gives the new state
/// (`None`: leave it). Conditional writes; on a conflict re-read and retry only while it still names them.
async fn set_state(
    api: &Api<Lease>,
    name: &str,
    cluster: &str,
    epoch: FailoverEpoch,
    next: impl Fn(&HaState) -> Option<HaState>,
) -> Result<HaState, SwitchError> {
    loop {
        let (mut l, r) = read_lease(api, name).await?;
        if r.cluster != cluster || r.epoch != epoch {
            return Err(SwitchError::NotActive(format!(
                "HA Lease {name} names {} now, not {cluster}/{epoch}",
                r.holder()
            )));
        }
        let Some(new) = next(&r.state) else {
            return Ok(r.state);
        };
        let ann = l.metadata.annotations.get_or_insert_with(Default::default);
        match new.text() {
            Some(t) => ann.insert(STATE_ANNOTATION.into(), t),
            None => ann.remove(STATE_ANNOTATION),
        };
        match api.replace(name, &PostParams::default(), &l).await {
            Ok(_) => return Ok(new),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(api_err(format!("writing HA Lease {name}"))(e)),
        }
    }
}

/// Write a state into every HA Lease that names this cluster at `epoch`: the own Lease (required), then the
/// peer's and the witness's when they name it. Every process of the cluster then finds each of its
/// resourceVersions stale, so none writes an older state into any Lease again (its next write conflicts,
/// and the re-read shows the newer state, which it adopts).
async fn set_state_all(
    cfg: &HaConfig,
    clients: &HaClients,
    epoch: FailoverEpoch,
    next: impl Fn(&HaState) -> Option<HaState>,
) -> Result<HaState, SwitchError> {
    let name = cfg.lease_name();
    let own = set_state(
        &lease_api(&clients.local, &cfg.namespace),
        &name,
        &cfg.cluster_id,
        epoch,
        &next,
    )
    .await?;
    let mut others = vec![lease_api(&clients.peer, &cfg.namespace)];
    if let Some(w) = &clients.witness {
        others.push(lease_api(w, &cfg.witness_namespace));
    }
    // the same state (the same seq) everywhere: a process holding an older one adopts it wherever it reads
    for api in others {
        let same = |_: &HaState| Some(own.clone());
        if let Err(e) = set_state(&api, &name, &cfg.cluster_id, epoch, same).await {
            tracing::debug!(error = %e, "HA switchover: a Lease not naming this cluster keeps its state");
        }
    }
    Ok(own)
}

/// `kshard ha demote`: the mark, the acks, the freeze, then the token (recorded in the Lease). Run again
/// on a cluster already holding a token, it returns that token.
pub async fn demote(
    cfg: &HaConfig,
    clients: &HaClients,
    opts: &DemoteOptions,
    mut progress: impl FnMut(&str),
) -> Result<DemotionToken, SwitchError> {
    if opts.kinds.is_empty() {
        return Err(SwitchError::Input("no kind to cover (--kind)".into()));
    }
    if let Some(k) = opts
        .kinds
        .iter()
        .find(|k| opts.scope.is_whole() && crate::mirror::scope::is_builtin(k))
    {
        return Err(SwitchError::Input(format!(
            "{k} is a built-in kind: freezing it without the mirror's scope (--mirror-namespace, \
             --mirror-labels) would refuse every write of it in the whole cluster"
        )));
    }
    let name = cfg.lease_name();
    let own = lease_api(&clients.local, &cfg.namespace);
    let (epoch, state) = my_epoch(cfg, clients).await?;
    if let Some(t) = state.token.as_deref() {
        progress("already demoted: the token recorded in the Lease");
        return t.parse().map_err(SwitchError::from);
    }
    let marked = set_state_all(cfg, clients, epoch, |s| {
        (!s.demoting).then(|| HaState {
            seq: s.seq + 1,
            demoting: true,
            token: None,
        })
    })
    .await?;
    info!(epoch = %epoch, seq = marked.seq, "HA demote: marked demoting");
    progress(&format!(
        "marked demoting at epoch {epoch}: members stop admitting"
    ));
    let t0 = tokio::time::Instant::now();
    if opts.skip_acks {
        progress("PLANTED BUG: not waiting for the members' acks");
    } else if let Some(group) = &opts.group {
        let ns = opts.group_namespace.as_deref().unwrap_or(&cfg.namespace);
        wait_acks(
            &clients.local,
            ns,
            group,
            epoch,
            opts.drain_timeout,
            &mut progress,
        )
        .await?;
    } else {
        let (_, r) = read_lease(&own, &name).await?;
        let wait = r.timings.renew_deadline + r.timings.request_timeout + cfg.timings.grace;
        progress(&format!("no group: waiting out the term ({wait:?})"));
        tokio::time::sleep(wait).await;
    }
    info!(waited = ?t0.elapsed(), "HA demote: drained");
    let resolved = resolve_all(&clients.local, &opts.kinds).await?;
    freeze(&clients.local, cfg, &resolved, opts).await?;
    progress("frozen: the covered kinds refuse writes");
    let token = take_token(&clients.local, cfg, epoch, &resolved).await?;
    let text = token.to_string();
    set_state_all(cfg, clients, epoch, |s| {
        Some(HaState {
            seq: s.seq + 1,
            demoting: true,
            token: Some(text.clone()),
        })
    })
    .await?;
    info!(token = %text, "HA demote: token taken");
    Ok(token)
}

async fn wait_acks(
    client: &Client,
    ns: &str,
    group: &str,
    epoch: FailoverEpoch,
    timeout: Duration,
    progress: &mut impl FnMut(&str),
) -> Result<(), SwitchError> {
    let api: Api<Lease> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("{GROUP_LABEL}={group},{ROLE_LABEL}=member"));
    let t0 = tokio::time::Instant::now();
    let want = epoch.wire().to_string();
    let mut last = Vec::new();
    loop {
        let leases = api
            .list(&lp)
            .await
            .map_err(api_err("listing member Leases"))?;
        let pending: Vec<String> = leases
            .items
            .iter()
            .filter(|l| {
                l.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(GATE_DRAINED))
                    != Some(&want)
            })
            .map(|l| l.metadata.name.clone().unwrap_or_default())
            .collect();
        if leases.items.is_empty() {
            return Err(SwitchError::Input(format!(
                "group {group} has no member Leases in {ns}"
            )));
        }
        if pending.is_empty() {
            return Ok(());
        }
        if t0.elapsed() >= timeout {
            return Err(SwitchError::NotDrained {
                epoch,
                pending,
                waited: t0.elapsed(),
            });
        }
        if pending != last {
            progress(&format!("waiting for ha-drained({epoch}) from {pending:?}"));
            last = pending;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

type Resolved = Vec<(Kind, ApiResource, ApiCapabilities)>;

async fn resolve_all(client: &Client, kinds: &[Kind]) -> Result<Resolved, SwitchError> {
    let mut out = Vec::new();
    for k in kinds {
        let (ar, caps) = resolve(k, client).await?;
        out.push((k.clone(), ar, caps));
    }
    Ok(out)
}

async fn apply<K>(api: &Api<K>, obj: &K, name: &str) -> Result<(), SwitchError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + fmt::Debug,
{
    match api
        .get_opt(name)
        .await
        .map_err(api_err(format!("reading {name}")))?
    {
        None => api.create(&PostParams::default(), obj).await.map(|_| ()),
        Some(old) => {
            let mut o = obj.clone();
            o.meta_mut().resource_version = old.meta().resource_version.clone();
            api.replace(name, &PostParams::default(), &o)
                .await
                .map(|_| ())
        }
    }
    .map_err(api_err(format!("writing {name}")))
}

async fn freeze(
    client: &Client,
    cfg: &HaConfig,
    kinds: &Resolved,
    opts: &DemoteOptions,
) -> Result<(), SwitchError> {
    let timeout = opts.freeze_timeout;
    let scope = &opts.scope.clone().with_own(crate::mirror::OwnObjects::new(
        &cfg.name,
        &cfg.namespace,
        &cfg.witness_namespace,
        None,
    ));
    let name = freeze_name(cfg);
    let plain: Vec<Kind> = kinds.iter().map(|(k, _, _)| k.clone()).collect();
    let (policy, binding) = freeze_objects(&name, &plain, &opts.freeze_exempt, scope)?;
    apply(&Api::all(client.clone()), &policy, &name).await?;
    apply(&Api::all(client.clone()), &binding, &name).await?;
    let t0 = tokio::time::Instant::now();
    for (k, ar, caps) in kinds {
        loop {
            match probe(client, cfg, (k, ar, caps), scope).await {
                Ok(()) => break,
                Err(why) if t0.elapsed() >= timeout => {
                    return Err(SwitchError::Freeze(format!("the probe write of {k} was not refused by the freeze within {timeout:?}: {why}")))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    Ok(())
}

/// A dry-run write of an object in the freeze's scope (an update of an existing one, else a create):
/// `Ok` when the freeze refuses it.
async fn probe(
    client: &Client,
    cfg: &HaConfig,
    (kind, ar, caps): (&Kind, &ApiResource, &ApiCapabilities),
    scope: &FreezeScope,
) -> Result<(), String> {
    let namespaced = caps.scope == Scope::Namespaced;
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let ns = probe_namespace(cfg, scope, namespaced);
    let api: Api<DynamicObject> = match &ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
        None => Api::all_with(client.clone(), ar),
    };
    let mut lp = ListParams::default().limit(50);
    if let Some(l) = &scope.labels {
        lp = lp.labels(&l.to_string());
    }
    let existing = api
        .list(&lp)
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .find(|o| freeze::covers(kind, scope, o));
    let res = match existing {
        Some(o) => {
            let api: Api<DynamicObject> = match o.metadata.namespace.as_deref() {
                Some(ns) => Api::namespaced_with(client.clone(), ns, ar),
                None => Api::all_with(client.clone(), ar),
            };
            api.replace(&o.metadata.name.clone().unwrap_or_default(), &dry, &o)
                .await
        }
        None => {
            let mut o = DynamicObject::new("kube-shard-freeze-probe", ar);
            o.metadata.namespace = ns;
            o.metadata.labels = scope.labels.as_ref().map(freeze::satisfying_labels);
            api.create(&dry, &o).await
        }
    };
    match res {
        Err(kube::Error::Api(s)) if s.message.contains(FREEZE_MARK) => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(_) => Err("the dry-run write was accepted".into()),
    }
}

/// Where the probe writes a namespaced kind: the first namespace of the scope, else the HA namespace
/// (`None` for a cluster-scoped kind).
fn probe_namespace(cfg: &HaConfig, scope: &FreezeScope, namespaced: bool) -> Option<String> {
    namespaced.then(|| {
        scope
            .namespaces
            .as_ref()
            .and_then(|s| s.iter().next().cloned())
            .unwrap_or_else(|| cfg.namespace.clone())
    })
}

async fn kube_system_uid(client: &Client) -> Result<String, SwitchError> {
    let ns: Api<Namespace> = Api::all(client.clone());
    let n = ns
        .get("kube-system")
        .await
        .map_err(api_err("reading namespace kube-system"))?;
    n.metadata
        .uid
        .ok_or_else(|| SwitchError::Input("kube-system has no uid".into()))
}

fn parse_rv(s: Option<&str>, what: &str) -> Result<u64, SwitchError> {
    s.and_then(|v| v.parse().ok()).ok_or_else(|| {
        SwitchError::Input(format!("{what}: resourceVersion {s:?} is not an integer"))
    })
}

async fn take_token(
    client: &Client,
    cfg: &HaConfig,
    epoch: FailoverEpoch,
    kinds: &Resolved,
) -> Result<DemotionToken, SwitchError> {
    let mut out = BTreeMap::new();
    for (k, ar, _) in kinds {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
        // no resourceVersion: a consistent (quorum) LIST, taken after the freeze's probe was refused
        let l = api
            .list(&ListParams::default().limit(1))
            .await
            .map_err(api_err(format!("listing {k}")))?;
        out.insert(
            k.key(),
            parse_rv(l.metadata.resource_version.as_deref(), &k.to_string())?,
        );
    }
    Ok(DemotionToken {
        cluster: cfg.cluster_id.clone(),
        uid: kube_system_uid(client).await?,
        epoch,
        kinds: out,
        id: format!("{:016x}", kube_shard::rt::next_u64()),
    })
}

/// Record the mirror's position of `kind` from `source` (`<cluster>/<uid>`) in the checkpoint of the
/// cluster `client` reaches: what the mirror persists (and tests write in its place).
pub async fn write_position(
    client: &Client,
    cfg: &HaConfig,
    kind: &str,
    source: &str,
    rv: u64,
) -> Result<(), SwitchError> {
    Ok(edit_checkpoint(client, cfg, |data| {
        data.insert(
            kind.to_string(),
            crate::mirror::checkpoint::position_text(source, rv),
        );
    })
    .await?)
}

/// Settings of [`promote_with_token`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PromoteOptions {
    /// How long to wait for the mirror, and then for the Lease takeover.
    pub timeout: Duration,
    /// The promotion checks' cross-checks and overrides. The checks always run, with this cluster's
    /// mirror read from its checkpoint ([`check_promotion`]): no mirror, a token whose kinds are not
    /// the mirror's, or divergent objects → refused before anything is written.
    pub checks: PromotionChecks,
    /// Promote although objects are on the mirror's failed list (poison): once the mirror caught up to
    /// the token but for them, the promotion lists what it loses (in [`Promoted::accepted`] and a
    /// Warning Event) and goes on. Without it, a failed object holds the position below the token.
    pub accept_failed: bool,
}

/// A token promotion's result.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Promoted {
    /// The new failover epoch.
    pub epoch: FailoverEpoch,
    /// With `accept_failed`: the objects not copied at their demotion-time version (empty otherwise).
    pub accepted: Vec<Lost>,
}

impl PromoteOptions {
    /// Wait at most `timeout`; no cross-check, no override.
    #[must_use]
    pub fn new(timeout: Duration) -> Self {
        PromoteOptions {
            timeout,
            checks: PromotionChecks::default(),
            accept_failed: false,
        }
    }

    /// Promote although objects failed, listing them ([`PromoteOptions::accept_failed`]).
    #[must_use]
    pub fn accept_failed(mut self, yes: bool) -> Self {
        self.accept_failed = yes;
        self
    }

    /// The checks' cross-checks and overrides.
    #[must_use]
    pub fn checks(mut self, checks: PromotionChecks) -> Self {
        self.checks = checks;
        self
    }
}

/// The token table against the source (the peer) and the checkpoint; waits while the mirror is behind.
async fn check_token(
    cfg: &HaConfig,
    clients: &HaClients,
    token: &DemotionToken,
    (opts, mirror): (&PromoteOptions, Option<&crate::mirror::MirrorConfig>),
    progress: &mut impl FnMut(&str),
) -> Result<Vec<Lost>, SwitchError> {
    let timeout = opts.timeout;
    let cm_api: Api<ConfigMap> = Api::namespaced(clients.local.clone(), &cfg.namespace);
    let cp_name = checkpoint_name(cfg);
    let data = |cm: Option<ConfigMap>| cm.and_then(|c| c.data).unwrap_or_default();
    let cp = data(
        cm_api
            .get_opt(&cp_name)
            .await
            .map_err(api_err("reading the checkpoint"))?,
    );
    if cp
        .get(USED_TOKENS_KEY)
        .is_some_and(|u| u.lines().any(|l| l == token.id))
    {
        return Err(SwitchError::Refused(format!(
            "token {} was already used",
            token.id
        )));
    }
    let peer_uid = kube_system_uid(&clients.peer).await?;
    let name = cfg.lease_name();
    let (_, src) = read_lease(&lease_api(&clients.peer, &cfg.namespace), &name).await?;
    if token.uid != peer_uid || token.cluster == cfg.cluster_id {
        return Err(SwitchError::Refused(format!(
            "foreign source {} (the peer is {}/{peer_uid})",
            token.source(),
            src.cluster
        )));
    }
    let text = token.to_string();
    if src.cluster != token.cluster
        || src.epoch != token.epoch
        || src.state.token.as_deref() != Some(&text)
    {
        return Err(SwitchError::Refused(format!(
            "stale: the token is for {}/{}, the source's HA Lease is {} ({})",
            token.cluster,
            token.epoch,
            src.holder(),
            if src.state.token.is_some() {
                "another token"
            } else if src.state.demoting {
                "demoting, no token"
            } else {
                "not demoting"
            }
        )));
    }
    // ask the mirror (another process) to catch up to the token by one consistent LIST per kind
    edit_checkpoint(&clients.local, cfg, |d| {
        d.insert(CATCH_UP_KEY.to_string(), text.clone());
    })
    .await?;
    let t0 = tokio::time::Instant::now();
    loop {
        let cp = data(
            cm_api
                .get_opt(&cp_name)
                .await
                .map_err(api_err("reading the checkpoint"))?,
        );
        let report: Vec<KindProgress> = token
            .kinds
            .iter()
            .map(|(k, rv)| KindProgress {
                kind: k.clone(),
                token_rv: *rv,
                position: position(&cp, k, &token.source()),
            })
            .collect();
        let reached = report
            .iter()
            .all(|r| r.position.is_some_and(|p| p >= r.token_rv));
        let held = cp.get(CAUGHT_UP_KEY).and_then(|a| caught_up(a, &token.id));
        if let (false, Some(failed @ 1..), true, Some(m)) =
            (reached, held, opts.accept_failed, mirror)
        {
            // caught up but for its failed objects, which hold the position below the token
            let lost = accept::lost_objects(&clients.local, &clients.peer, m, token).await?;
            progress(&format!(
                "--accept-failed: the mirror caught up but for {failed} failed object(s); promoting \
                 without {} object(s):\n{}",
                lost.len(),
                lost.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
            ));
            ahead_of_token(&clients.peer, token).await?;
            return Ok(lost);
        }
        if let (false, Some(failed @ 1..)) = (reached, held) {
            return Err(SwitchError::Refused(format!(
                "the mirror caught up to the token but for {failed} failed object(s), which hold its \
                 position below the token (the `MirrorSyncFailed` Events on the HA Lease name them); `--accept-failed` \
                 promotes without them and lists what is lost"
            )));
        }
        if let (true, Some(failed)) = (reached, held) {
            if failed > 0 {
                progress(&format!(
                    "the mirror caught up and holds, with {failed} object(s) on its failed list (not copied: the `MirrorSyncFailed` Events name them)"
                ));
            }
            break;
        }
        if t0.elapsed() >= timeout {
            return Err(if reached {
                SwitchError::NotHeld {
                    waited: t0.elapsed(),
                }
            } else {
                SwitchError::Behind {
                    report,
                    waited: t0.elapsed(),
                }
            });
        }
        if reached {
            progress("the mirror reached the token: waiting for it to apply the catch-up and hold");
        } else {
            progress(&format!(
                "waiting for the mirror:\n{}",
                report_text(&report)
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ahead_of_token(&clients.peer, token).await?;
    Ok(Vec::new())
}

/// A forced promotion's hold (HA.md "Promotion and adoption": stop the mirror before the new epoch): ask
/// the mirror of `cfg`'s cluster (through its checkpoint on `local`) to hold, and wait at most `wait` for
/// its acknowledgement. `source_epoch` is the old Active's epoch. Returns the request's id, and whether a
/// mirror acknowledged it (a cluster may run none).
pub(crate) async fn request_hold(
    local: &Client,
    cfg: &HaConfig,
    source_epoch: u64,
    wait: Duration,
) -> Result<(String, bool), SwitchError> {
    let id = format!("force-{:016x}", kube_shard::rt::next_u64());
    let text = format!("e={source_epoch} id={id}");
    edit_checkpoint(local, cfg, |d| {
        d.insert(HOLD_KEY.to_string(), text.clone());
    })
    .await?;
    let api: Api<ConfigMap> = Api::namespaced(local.clone(), &cfg.namespace);
    let t0 = tokio::time::Instant::now();
    loop {
        let acked = api
            .get_opt(&checkpoint_name(cfg))
            .await
            .map_err(api_err("reading the checkpoint"))?
            .and_then(|c| c.data)
            .and_then(|d| d.get(CAUGHT_UP_KEY).and_then(|a| caught_up(a, &id)))
            .is_some();
        if acked || t0.elapsed() >= wait {
            return Ok((id, acked));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Take back a forced promotion's hold request `id` (the promotion failed): the mirror mirrors on.
pub(crate) async fn withdraw_hold(local: &Client, cfg: &HaConfig, id: &str) {
    let r = edit_checkpoint(local, cfg, |d| {
        if d.get(HOLD_KEY)
            .and_then(|t| parse_hold(t))
            .is_some_and(|(_, i)| i == id)
        {
            d.remove(HOLD_KEY);
        }
    })
    .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, id, "promote --force: withdrawing the hold request failed; the mirror keeps holding until it is removed");
    }
}

/// Take back a catch-up request this promotion made (it failed before the takeover): the mirror
/// releases its hold and mirrors on. Best effort: a request left behind keeps the mirror holding, which
/// is safe and shown by `kshard ha status`.
async fn withdraw(local: &Client, cfg: &HaConfig, token: &DemotionToken) {
    let text = token.to_string();
    let r = edit_checkpoint(local, cfg, |d| {
        if d.get(CATCH_UP_KEY) == Some(&text) {
            d.remove(CATCH_UP_KEY);
        }
    })
    .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, token = %token.id, "promote: withdrawing the catch-up request failed; the mirror keeps holding until it is removed");
    }
}

/// A source object above the token: the old Active accepted writes after its demotion.
async fn ahead_of_token(source: &Client, token: &DemotionToken) -> Result<(), SwitchError> {
    for (key, rv) in &token.kinds {
        let (plural, group) = key.split_once('.').unwrap_or((key, ""));
        let gv = kube::core::GroupVersion::gv(group, "");
        let g = kube::discovery::oneshot::pinned_group(
            source,
            &kube::core::GroupVersion::gv(group, &preferred(source, &gv).await?),
        )
        .await
        .map_err(api_err(format!("discovering {key}")))?;
        let Some((ar, _)) = g
            .recommended_resources()
            .into_iter()
            .find(|(r, _)| r.plural == plural)
        else {
            return Err(SwitchError::Refused(format!(
                "{key} is not served by the source"
            )));
        };
        let api: Api<DynamicObject> = Api::all_with(source.clone(), &ar);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(api_err(format!("listing {key}")))?;
        for o in list.items {
            let orv = parse_rv(o.metadata.resource_version.as_deref(), key)?;
            if orv > *rv {
                return Err(SwitchError::Refused(format!(
                    "the old Active accepted writes after its demotion: {key} {}/{} at resourceVersion {orv} > the token's {rv}",
                    o.metadata.namespace.unwrap_or_default(),
                    o.metadata.name.unwrap_or_default()
                )));
            }
        }
    }
    Ok(())
}

async fn preferred(client: &Client, gv: &kube::core::GroupVersion) -> Result<String, SwitchError> {
    if gv.group.is_empty() {
        return Ok("v1".into());
    }
    let d = kube::discovery::oneshot::group(client, &gv.group)
        .await
        .map_err(api_err(format!("discovering group {}", gv.group)))?;
    Ok(d.preferred_version_or_latest().to_string())
}

/// `kshard ha promote --token T` on the Standby of `cfg`: the token table, then the takeover. Returns the
/// new epoch once this cluster's own HA Lease records it.
pub async fn promote_with_token(
    cfg: &HaConfig,
    clients: HaClients,
    clock: Clock,
    token: &DemotionToken,
    opts: &PromoteOptions,
    progress: impl FnMut(&str),
) -> Result<FailoverEpoch, SwitchError> {
    promote_by_token(cfg, clients, clock, token, opts, progress)
        .await
        .map(|p| p.epoch)
}

/// [`promote_with_token`], with what `--accept-failed` accepted losing.
pub async fn promote_by_token(
    cfg: &HaConfig,
    clients: HaClients,
    clock: Clock,
    token: &DemotionToken,
    opts: &PromoteOptions,
    mut progress: impl FnMut(&str),
) -> Result<Promoted, SwitchError> {
    let checked = check_promotion(
        cfg,
        &clients.local,
        &opts.checks,
        PromotionPath::DemotionToken(token),
    )
    .await?;
    for o in &checked.overridden {
        progress(&format!("override {o}"));
    }
    let mirror = checked.mirror.as_ref();
    let accepted = match check_token(cfg, &clients, token, (opts, mirror), &mut progress).await {
        Ok(l) => l,
        Err(e) => {
            withdraw(&clients.local, cfg, token).await;
            return Err(e);
        }
    };
    let id = token.id.clone();
    edit_checkpoint(&clients.local, cfg, |d| {
        let used = d.entry(USED_TOKENS_KEY.into()).or_default();
        if !used.lines().any(|l| l == id) {
            used.push_str(&id);
            used.push('\n');
        }
    })
    .await?;
    let (local, peer) = (clients.local.clone(), clients.peer.clone());
    let (_handle, control, task) = spawn(cfg, clients, clock, HaMetrics::default());
    let _abort = Abort(task);
    let t0 = tokio::time::Instant::now();
    // the elector must have read every Lease before it picks the next epoch
    loop {
        let st = control
            .status()
            .await
            .map_err(|e| SwitchError::Promote(e.to_string()))?;
        if st.leases.iter().all(|l| l.state != "unknown") {
            break;
        }
        if t0.elapsed() >= opts.timeout {
            withdraw(&local, cfg, token).await;
            return Err(SwitchError::Promote(
                "the HA Leases could not be read".into(),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t = TokenTakeover {
        source: token.cluster.clone(),
        epoch: token.epoch,
        token: token.to_string(),
    };
    let epoch = match control.promote_with_token(t).await {
        Ok(e) => e,
        Err(e) => {
            withdraw(&local, cfg, token).await;
            return Err(SwitchError::Promote(match e {
                PromoteError::Refused(r) => r.to_string(),
                other => other.to_string(),
            }));
        }
    };
    progress(&format!("taking the Leases over at epoch {epoch}"));
    let me = Record::holder_of(&cfg.cluster_id, epoch);
    loop {
        let st = control
            .status()
            .await
            .map_err(|e| SwitchError::Promote(e.to_string()))?;
        let own = st.leases.first().and_then(|l| l.holder.clone());
        if own.as_deref() == Some(me.as_str()) && st.role == "active" {
            // the old Active's Lease is written once the own one is held (or before it, without a witness)
            tokio::time::sleep(cfg.timings.retry_period).await;
            unfreeze(&local, cfg).await?;
            // HA.md "Fenced by the server": the minimum epoch on the old Active's cluster
            super::min_epoch::after_promotion(
                &local,
                &peer,
                cfg,
                epoch,
                super::min_epoch::PROMOTION_TIMEOUT.min(opts.timeout),
                &mut progress,
            )
            .await;
            if !accepted.is_empty() {
                accepted_event(cfg, &local, epoch, &accepted);
            }
            return Ok(Promoted { epoch, accepted });
        }
        if st.role == "standby" || t0.elapsed() >= opts.timeout {
            return Err(SwitchError::Promote(format!(
                "epoch {epoch} was not recorded in this cluster's HA Lease (see `kshard ha status`): role {}",
                st.role
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A Warning Event on the new Active naming what `--accept-failed` lost (the first 20 objects; the
/// result lists them all).
fn accepted_event(cfg: &HaConfig, local: &Client, epoch: FailoverEpoch, lost: &[Lost]) {
    let names: Vec<String> = lost.iter().take(20).map(ToString::to_string).collect();
    let more = lost.len().saturating_sub(names.len());
    let events = crate::events::HaEvents::new(
        local.clone(),
        &cfg.namespace,
        &cfg.lease_name(),
        &cfg.cluster_id,
    );
    events.emit(
        true,
        crate::events::reason::PROMOTED_ACCEPTING_LOSS,
        format!(
            "promoted at epoch {epoch} with --accept-failed, without {} object(s) the mirror had not copied: {}{}",
            lost.len(),
            names.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        ),
    );
}

/// `kshard ha demote --cancel` on the demoting Active: refused once the peer promoted; else the Lease a
/// token promotion writes first is set back first (the witness, else the own Lease: the write that
/// serialises with a token promotion), and only then the freeze lifted. If that write fails — the peer
/// promoted meanwhile — the freeze stays: users' writes to the covered kinds stay refused on this cluster,
/// never accepted by a cluster that is no longer Active.
pub async fn cancel(cfg: &HaConfig, clients: &HaClients) -> Result<(), SwitchError> {
    let (epoch, state) = my_epoch(cfg, clients)
        .await
        .map_err(|e| SwitchError::Cancel(format!("{e} (the peer may have promoted)")))?;
    if !state.demoting {
        return Err(SwitchError::Cancel("this cluster is not demoting".into()));
    }
    let name = cfg.lease_name();
    // one state (one seq) everywhere, above every copy of the demoting one
    let active = HaState {
        seq: state.seq + 1,
        demoting: false,
        token: None,
    };
    let back = |s: &HaState| s.demoting.then(|| active.clone());
    if let Some(w) = &clients.witness {
        set_state(
            &lease_api(w, &cfg.witness_namespace),
            &name,
            &cfg.cluster_id,
            epoch,
            back,
        )
        .await
        .map_err(|e| SwitchError::Cancel(format!("the witness: {e}")))?;
    }
    let own = lease_api(&clients.local, &cfg.namespace);
    let (_, r) = read_lease(&own, &name).await?;
    if r.cluster != cfg.cluster_id || r.epoch != epoch {
        return Err(SwitchError::Cancel(format!(
            "this cluster's Lease names {} now",
            r.holder()
        )));
    }
    set_state(&own, &name, &cfg.cluster_id, epoch, back)
        .await
        .map_err(|e| {
            SwitchError::Cancel(format!(
                "{e} (the peer may have promoted): the freeze stays on this cluster"
            ))
        })?;
    unfreeze(&clients.local, cfg).await?;
    let peer = lease_api(&clients.peer, &cfg.namespace);
    // the peer's copy only speeds its view up; this cluster's Lease, written above, is what counts
    if let Err(err) = set_state(&peer, &name, &cfg.cluster_id, epoch, back).await {
        warn!(error = %err, "the cancel is in this cluster's Lease; the peer's copy was not updated");
    }
    // a catch-up request of this term's token left on the peer keeps its mirror holding: take it back
    let me = cfg.cluster_id.clone();
    let r = edit_checkpoint(&clients.peer, cfg, |d| {
        let ours = d
            .get(CATCH_UP_KEY)
            .and_then(|t| t.parse::<DemotionToken>().ok())
            .is_some_and(|t| t.cluster == me && t.epoch == epoch);
        if ours {
            d.remove(CATCH_UP_KEY);
        }
    })
    .await;
    if let Err(err) = r {
        warn!(error = %err, "the peer's mirror may keep holding at the cancelled token: remove `{CATCH_UP_KEY}` from its checkpoint");
    }
    Ok(())
}

struct Abort(Option<tokio::task::JoinHandle<()>>);

impl Drop for Abort {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}

/// The kind keys of a token (for reports).
#[must_use]
pub fn token_kinds(t: &DemotionToken) -> BTreeSet<String> {
    t.kinds.keys().cloned().collect()
}

#[cfg(test)]
mod tests {
    use crate::checkpoint::caught_up;

    #[test]
    fn an_acknowledgement_counts_only_for_its_own_token() {
        assert_eq!(caught_up("ab failed=0", "ab"), Some(0));
        assert_eq!(caught_up("ab failed=3", "ab"), Some(3));
        assert_eq!(caught_up("ab failed=0", "abc"), None);
        assert_eq!(caught_up("abc failed=0", "ab"), None);
        for bad in [
            "",
            "ab",
            "ab failed=",
            "ab failed=x",
            "ab held",
            "ab failed=-1",
        ] {
            assert_eq!(caught_up(bad, "ab"), None, "{bad:?}");
        }
    }
}
