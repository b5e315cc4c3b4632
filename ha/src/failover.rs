//! Forced promotion, the engine of `kshard ha promote --force --old-active-stopped` (the CLI only parses
//! flags and prints): [`force_promote`]. It runs the promotion checks ([`check_promotion`]: the mirror
//! read from this cluster's checkpoint), then this cluster's elector in-process as one more process of the
//! Standby cluster, with every rule of the running ones: it is refused until it is *armed* (the peer's
//! Lease stale or unreadable for the full takeover wait, counted from this command's start), and each
//! Lease takeover waits its own wait. It returns once this cluster's own Lease records the new epoch (the
//! durable record); the cluster's running operator processes then follow that term (they date it from
//! their own renewals), and mark the old Active's Lease when it is reachable.

use std::time::Duration;

use crate::config::HaConfig;
use crate::driver::{spawn, HaClients, PromoteError};
use crate::elector::ForceError;
use crate::epoch::FailoverEpoch;
use crate::metrics::HaMetrics;
use crate::promotion::{check_promotion, PromotionChecks, PromotionPath, TargetRefused};
use crate::record::Record;
use kube_shard::rt::Clock;

/// Why `promote --force` did not promote.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ForceFailed {
    /// Not armed within the time allowed: the peer's Lease kept changing (or was read fresh).
    #[error("not armed after {0:?}: the old Active's HA Lease was renewed or read fresh within the takeover wait — is it really stopped?")]
    NotArmed(Duration),
    /// The elector refused for another reason.
    #[error("refused: {0}")]
    Refused(ForceError),
    /// The own Lease did not record the new epoch in time (the candidacy may still complete: run
    /// `kshard ha status`).
    #[error("epoch {0} was not recorded in this cluster's HA Lease within {1:?} (see `kshard ha status`: the promotion may be in limbo)")]
    NotRecorded(FailoverEpoch, Duration),
    /// The elector stopped.
    #[error("the elector stopped")]
    Stopped,
    /// The mirror's hold could not be requested (the checkpoint could not be written): nothing was
    /// promoted.
    #[error("asking the mirror to hold: {0}; nothing was promoted")]
    Hold(String),
    /// The promotion checks refused this cluster as a target: nothing was written.
    #[error("not promoted: {0}; nothing was written")]
    Target(TargetRefused),
}

/// `kshard ha promote --force --old-active-stopped` for the cluster of `cfg` (mode is ignored: this is
/// one more process of that cluster). Waits until armed (at most `timeout`), promotes, and returns the
/// new epoch once this cluster's own HA Lease records it (at most `timeout` more). `progress` is called
/// with a line to show now and then.
pub async fn force_promote(
    cfg: &HaConfig,
    clients: HaClients,
    clock: Clock,
    timeout: Duration,
    progress: impl FnMut(&str),
) -> Result<FailoverEpoch, ForceFailed> {
    force_promote_with(cfg, clients, clock, &ForceOptions::new(timeout), progress).await
}

/// Settings of [`force_promote_with`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ForceOptions {
    /// How long to wait until armed, and then for the takeover.
    pub timeout: Duration,
    /// How long to wait for this cluster's mirror to acknowledge the hold (asked whenever the
    /// checkpoint records a mirror).
    pub hold_wait: Duration,
    /// The promotion checks' cross-checks and overrides (the checks always run).
    pub checks: PromotionChecks,
}

impl ForceOptions {
    /// Wait at most `timeout`; 10 s for the mirror's hold; no cross-check, no override.
    #[must_use]
    pub fn new(timeout: Duration) -> Self {
        ForceOptions {
            timeout,
            hold_wait: Duration::from_secs(10),
            checks: PromotionChecks::default(),
        }
    }

    /// Wait at most `wait` for the mirror's hold acknowledgement.
    #[must_use]
    pub fn hold_mirror(mut self, wait: Duration) -> Self {
        self.hold_wait = wait;
        self
    }

    /// The checks' cross-checks and overrides.
    #[must_use]
    pub fn checks(mut self, checks: PromotionChecks) -> Self {
        self.checks = checks;
        self
    }
}

/// Run the promotion checks of a forced promotion and report what it loses, kind by kind: the wait
/// for the mirror's hold acknowledgement (`None`: no mirror to hold).
async fn forced_checks(
    cfg: &HaConfig,
    local: &kube::Client,
    opts: &ForceOptions,
    progress: &mut impl FnMut(&str),
) -> Result<Option<Duration>, ForceFailed> {
    let checked = check_promotion(cfg, local, &opts.checks, PromotionPath::Forced)
        .await
        .map_err(ForceFailed::Target)?;
    for o in &checked.overridden {
        progress(&format!("override {o}"));
    }
    let Some(m) = &checked.mirror else {
        return Ok(None);
    };
    for k in &checked.kinds {
        progress(&k.loss(&m.source_cluster));
    }
    Ok((!planted!(NO_MIRROR_HOLD)).then_some(opts.hold_wait))
}

/// [`force_promote`] with [`ForceOptions`]. First the promotion checks ([`check_promotion`]: the mirror
/// read from this cluster's checkpoint; no mirror, divergent objects, a kind without a completed
/// initial LIST → refused unless overridden; nothing written). Then, with a mirror, once armed and
/// before the candidacy it asks the mirror (through the checkpoint) to hold, as a token promotion does
/// after its catch-up: a mirror still copying from the old Active after the takeover would put objects
/// the new Active's users changed back to the old Active's versions until the mirror duty stops it.
/// Unanswered (the mirror is not running), it promotes anyway and says so. A promotion that fails
/// withdraws its request.
pub async fn force_promote_with(
    cfg: &HaConfig,
    clients: HaClients,
    clock: Clock,
    opts: &ForceOptions,
    mut progress: impl FnMut(&str),
) -> Result<FailoverEpoch, ForceFailed> {
    let (local, peer) = (clients.local.clone(), clients.peer.clone());
    let hold_wait = forced_checks(cfg, &local, opts, &mut progress).await?;
    let (_handle, control, task) = spawn(cfg, clients, clock, HaMetrics::default());
    let _abort = Abort(task);
    let mut hold = HoldGuard {
        local: local.clone(),
        cfg: cfg.clone(),
        id: None,
    };
    let r = candidacy(&control, opts.timeout, hold_wait, &mut hold, &mut progress).await;
    let epoch = match r {
        Ok(e) => e,
        Err(e) => {
            hold.withdraw().await;
            return Err(e);
        }
    };
    let r = recorded(
        cfg,
        &control,
        epoch,
        opts.timeout,
        &local,
        &peer,
        &mut progress,
    )
    .await;
    if r.is_err() {
        hold.withdraw().await;
    }
    r
}

/// A forced promotion's hold request, withdrawn when the promotion fails.
struct HoldGuard {
    local: kube::Client,
    cfg: HaConfig,
    id: Option<String>,
}

impl HoldGuard {
    async fn withdraw(&mut self) {
        if let Some(id) = self.id.take() {
            super::switchover::withdraw_hold(&self.local, &self.cfg, &id).await;
        }
    }
}

/// Wait until armed (holding the mirror then, waiting at most `hold_wait`), and start the candidacy.
async fn candidacy(
    control: &super::HaControl,
    timeout: Duration,
    hold_wait: Option<Duration>,
    hold: &mut HoldGuard,
    progress: &mut impl FnMut(&str),
) -> Result<FailoverEpoch, ForceFailed> {
    let start = tokio::time::Instant::now();
    loop {
        if let (Some(wait), None) = (hold_wait, &hold.id) {
            let st = control.status().await.map_err(|_| ForceFailed::Stopped)?;
            if st.armed {
                let source_epoch = st.epoch; // standby: the highest epoch seen, the old Active's
                let (id, acked) =
                    super::switchover::request_hold(&hold.local, &hold.cfg, source_epoch, wait)
                        .await
                        .map_err(|e| ForceFailed::Hold(e.to_string()))?;
                hold.id = Some(id);
                progress(if acked {
                    "the mirror holds: it writes nothing more to this cluster"
                } else {
                    "the mirror did not acknowledge the hold request (is it stopped?): promoting anyway"
                });
            }
        }
        let ready = hold_wait.is_none() || hold.id.is_some();
        if ready {
            match control.force_promote().await {
                Ok(e) => return Ok(e),
                Err(PromoteError::Refused(ForceError::NotArmed)) => {}
                Err(PromoteError::Refused(e)) => return Err(ForceFailed::Refused(e)),
                Err(_) => return Err(ForceFailed::Stopped),
            }
        }
        if start.elapsed() >= timeout {
            return Err(ForceFailed::NotArmed(timeout));
        }
        progress("waiting until armed: the peer's HA Lease must stay unchanged (or unreadable) for the full takeover wait");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Wait until this cluster's own Lease records `epoch`, then lift the freeze and set the minimum epoch.
async fn recorded(
    cfg: &HaConfig,
    control: &super::HaControl,
    epoch: FailoverEpoch,
    timeout: Duration,
    local: &kube::Client,
    peer: &kube::Client,
    progress: &mut impl FnMut(&str),
) -> Result<FailoverEpoch, ForceFailed> {
    progress(&format!(
        "candidacy at epoch {epoch}: taking this cluster's HA Lease over (it waits its full takeover wait)"
    ));
    let me = Record::holder_of(&cfg.cluster_id, epoch);
    let since = tokio::time::Instant::now();
    loop {
        let st = control.status().await.map_err(|_| ForceFailed::Stopped)?;
        let own = st.leases.first().and_then(|l| l.holder.clone());
        if own.as_deref() == Some(me.as_str()) && st.role != "standby" {
            // give the peer's Lease (the old Active's mark) one retry period to be written too
            tokio::time::sleep(cfg.timings.retry_period).await;
            // a cluster demoted earlier (a planned switchover) is still frozen: the new Active must write
            if let Err(e) = super::switchover::unfreeze(local, cfg).await {
                progress(&format!(
                    "could not lift this cluster's switchover freeze: {e}"
                ));
            }
            // HA.md "Fenced by the server": the old Active's cluster refuses its operator's writes below
            // the new epoch (when reachable and installed)
            super::min_epoch::after_promotion(
                local,
                peer,
                cfg,
                epoch,
                super::min_epoch::PROMOTION_TIMEOUT.min(timeout),
                progress,
            )
            .await;
            return Ok(epoch);
        }
        if st.role == "standby" || since.elapsed() >= timeout {
            return Err(ForceFailed::NotRecorded(epoch, timeout));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

struct Abort(Option<tokio::task::JoinHandle<()>>);

impl Drop for Abort {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}
