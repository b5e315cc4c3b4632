//! [`MirrorDuty`]: the mirror, adoption and failback as one duty of an HA operator process, following
//! its [`HaHandle`] through every role:
//!
//! - Standby with an Active peer: [`Failback`] first if this cluster holds the `was-active` mark, then
//!   the [`Mirror`] from the peer.
//! - Standby with no Active peer (limbo, an alarm, unreadable): waits; a running mirror keeps going.
//! - Leading at a new epoch: admission stays closed while the mirror is stopped, the mark written and
//!   the copies adopted; then admission opens, and the copies are relabelled in the background.
//!
//! See `docs/ha.md#the-mirror-duty-mirrorduty-kshard-operator---ha-mirror`.

mod metrics;
mod status;

pub use metrics::MirrorMetrics;
pub use status::DutyStatus;

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use tokio::task::JoinHandle;
use tracing::{info, info_span, warn, Instrument};

use crate::adoption::run::{adopt, relabel_all, AdoptStatus};
use crate::adoption::AdoptConfig;
use crate::checkpoint::edit::edit_checkpoint;
use crate::checkpoint::{CATCH_UP_KEY, CAUGHT_UP_KEY, DUTY_KEY, HOLD_KEY, WAS_ACTIVE_KEY};
use crate::config::checkpoint_name;
use crate::events::{reason, HaEvents};
use crate::failback::{Failback, FailbackOptions};
use crate::mirror::error::MirrorError;
use crate::mirror::{Mirror, MirrorWiring};
use crate::{FailoverEpoch, HaClients, HaHandle};
use metrics::CarriedMap;

/// The running duty. Dropping it does not stop it: call [`MirrorDuty::abort`].
#[derive(Debug)]
pub struct MirrorDuty {
    status: Arc<Mutex<DutyStatus>>,
    metrics: MirrorMetrics,
    task: JoinHandle<()>,
}

type Shared = Arc<Mutex<DutyStatus>>;

fn set(s: &Shared, f: impl FnOnce(&mut DutyStatus)) {
    if let Ok(mut g) = s.lock() {
        f(&mut g);
    }
}

impl MirrorDuty {
    /// Require adoption on `ha` and run the duty: `clients.local` is this cluster, `clients.peer`
    /// the other (the mirror's source, `cfg.mirror.source_cluster`); `wiring` is the mirror's (its
    /// lag feeds the automatic promotion gate); `failback` the old Active's options.
    #[must_use]
    pub fn spawn(
        ha: HaHandle,
        clients: HaClients,
        cfg: AdoptConfig,
        wiring: MirrorWiring,
        failback: FailbackOptions,
    ) -> Self {
        ha.require_adoption();
        let status: Shared = Arc::new(Mutex::new(DutyStatus {
            phase: "starting",
            ..DutyStatus::default()
        }));
        let carried = CarriedMap::default();
        let metrics = MirrorMetrics {
            status: status.clone(),
            carried: carried.clone(),
            clock: wiring.clock.clone().unwrap_or_else(|| ha.clock()),
        };
        let h = &cfg.mirror.ha;
        let events = HaEvents::new(
            clients.local.clone(),
            &h.namespace,
            &h.lease_name(),
            &h.cluster_id,
        );
        let duty = Duty {
            carried,
            events,
            stopped_kinds: Default::default(),
            divergent_told: false,
            ha,
            clients,
            cfg,
            wiring,
            opts: failback,
            status: status.clone(),
            adopt: Arc::new(Mutex::new(AdoptStatus {
                state: "standby",
                ..AdoptStatus::default()
            })),
            mirror: None,
            failback: None,
            relabelling: None,
            marked: 0,
            recorded: String::new(),
        };
        let task = tokio::spawn(duty.run().instrument(info_span!("mirror_duty")));
        MirrorDuty {
            status,
            metrics,
            task,
        }
    }

    /// Its Prometheus families (register them in a prometheus-client registry).
    #[must_use]
    pub fn metrics(&self) -> MirrorMetrics {
        self.metrics.clone()
    }

    /// What the duty is doing.
    #[must_use]
    pub fn status(&self) -> DutyStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stop the duty (a running mirror's tasks are aborted with it; admission at an epoch not yet
    /// adopted stays closed).
    pub fn abort(&self) {
        self.task.abort();
    }
}

struct Duty {
    ha: HaHandle,
    clients: HaClients,
    cfg: AdoptConfig,
    wiring: MirrorWiring,
    opts: FailbackOptions,
    status: Shared,
    adopt: Arc<Mutex<AdoptStatus>>,
    mirror: Option<Mirror>,
    failback: Option<Failback>,
    relabelling: Option<JoinHandle<()>>,
    /// The highest epoch the `was-active` mark was written for.
    marked: u64,
    /// The phase last recorded in the checkpoint.
    recorded: String,
    /// Counts of mirrors stopped before the current one.
    carried: CarriedMap,
    events: HaEvents,
    /// Kinds whose stop was told (an Event each).
    stopped_kinds: std::collections::BTreeSet<String>,
    /// Divergent objects of this failback round were told.
    divergent_told: bool,
}

impl Duty {
    async fn run(mut self) {
        loop {
            let due = self
                .ha
                .leading_epoch()
                .filter(|e| e.wire() > self.ha.adopted_epoch());
            if let Some(e) = due {
                self.promoted(e).await;
                continue;
            }
            if let Some(e) = self.ha.leading_epoch() {
                self.phase("active", None);
                self.stop_mirror().await;
                // a term live before the duty started counts as adopted: mark it all the same, so
                // failback runs when this cluster steps down
                if self.marked < e.wire() {
                    match write_mark(&self.clients.local, &self.cfg, Some(e)).await {
                        Ok(()) => self.marked = e.wire(),
                        Err(err) => {
                            warn!(error = %err, "mirror duty: marking this cluster as Active failed; retrying");
                            tokio::time::sleep(self.cfg.retry).await;
                            continue;
                        }
                    }
                }
                self.record().await;
                self.ha.await_change().await;
                continue;
            }
            if self.mirror.is_none() {
                if let Err(err) = self.standby().await {
                    warn!(error = %err, "mirror duty: retrying");
                    set(&self.status, |s| s.last_error = Some(err.to_string()));
                }
            }
            self.publish();
            self.record().await;
            tokio::select! {
                biased; // a term change first; either ends the wait
                () = self.ha.await_change() => {}
                () = tokio::time::sleep(self.cfg.retry) => {}
            }
        }
    }

    fn phase(&self, phase: &'static str, detail: Option<String>) {
        set(&self.status, |s| {
            s.phase = phase;
            s.detail = detail;
        });
    }

    /// Record the phase in the checkpoint when it changed (`kshard ha status` runs elsewhere).
    async fn record(&mut self) {
        let now = {
            let s = self.status.lock().map(|s| s.clone()).unwrap_or_default();
            match s.detail {
                Some(d) => format!("{}: {d}", s.phase),
                None => s.phase.to_string(),
            }
        };
        if now == self.recorded {
            return;
        }
        let text = now.clone();
        match edit_checkpoint(&self.clients.local, &self.cfg.mirror.ha, move |d| {
            d.insert(DUTY_KEY.into(), text.clone());
        })
        .await
        {
            Ok(()) => self.recorded = now,
            Err(e) => warn!(error = %e, "mirror duty: recording the phase failed"),
        }
    }

    fn publish(&mut self) {
        let kinds = self.mirror.as_ref().map(Mirror::status).unwrap_or_default();
        for k in &kinds {
            if let Some(why) = &k.stopped {
                if self.stopped_kinds.insert(k.kind.clone()) {
                    self.events.emit(
                        true,
                        reason::MIRROR_KIND_STOPPED,
                        format!("mirror of {}: {why}", k.kind),
                    );
                }
            }
        }
        let adopt = self.adopt.lock().map(|a| a.clone()).unwrap_or_default();
        set(&self.status, |s| {
            s.mirror = kinds;
            s.adoption = adopt;
        });
    }

    async fn stop_mirror(&mut self) {
        if let Some(m) = self.mirror.take() {
            info!("mirror duty: stopping the mirror");
            let last = m.status();
            m.stop().await;
            if let Ok(mut c) = self.carried.lock() {
                for k in &last {
                    c.entry(k.kind.clone()).or_default().add(k);
                }
            }
            self.stopped_kinds.clear();
        }
        set(&self.status, |s| s.mirror.clear());
    }

    /// Adoption at `e` (admission closed until it is done).
    async fn promoted(&mut self, e: FailoverEpoch) {
        self.phase("adopting", None);
        self.stop_mirror().await;
        self.failback = None;
        let ad = self.adopt.clone();
        let mark = |s: &mut AdoptStatus| {
            s.state = "adopting";
            s.epoch = Some(e.wire());
        };
        if let Ok(mut g) = ad.lock() {
            mark(&mut g);
        }
        let (local, cfg, ha) = (&self.clients.local, &self.cfg, &self.ha);
        let res = async {
            write_mark(local, cfg, Some(e)).await?;
            adopt(cfg, local, ha, e).await
        }
        .instrument(info_span!("adoption", epoch = %e))
        .await;
        if res.is_ok() {
            self.marked = e.wire();
        }
        match res {
            Ok(r) => {
                info!(epoch = %e, restored = r.restored, deleted = r.deleted, problems = r.problems.len(), "adoption: done; admission opens");
                self.events.emit(
                    !r.problems.is_empty(),
                    reason::ADOPTED,
                    format!(
                        "epoch {e}: {} copies restored, {} deleted (terminating sources), {} problem(s); admission opens",
                        r.restored,
                        r.deleted,
                        r.problems.len()
                    ),
                );
                if let Ok(mut g) = ad.lock() {
                    g.state = "adopted";
                    g.restored = r.restored;
                    g.deleted = r.deleted;
                    g.problems = r.problems;
                    g.last_error = None;
                }
                self.ha.adopted(e);
                if let Some(t) = self.relabelling.take() {
                    t.abort();
                }
                self.relabelling = Some(tokio::spawn(
                    relabel_all(
                        self.cfg.clone(),
                        self.clients.local.clone(),
                        self.ha.clone(),
                        ad,
                    )
                    .instrument(info_span!("relabel", epoch = %e)),
                ));
                set(&self.status, |s| s.last_error = None);
            }
            Err(err) => {
                warn!(epoch = %e, error = %err, "adoption failed; admission stays closed, retrying");
                let first = self
                    .adopt
                    .lock()
                    .map(|g| g.last_error.as_deref() != Some(&err.to_string()))
                    .unwrap_or(true);
                if first {
                    self.events.emit(
                        true,
                        reason::ADOPTION_FAILED,
                        format!("epoch {e}: {err} (retried; admission stays closed)"),
                    );
                }
                if let Ok(mut g) = ad.lock() {
                    g.last_error = Some(err.to_string());
                }
                set(&self.status, |s| s.last_error = Some(err.to_string()));
                tokio::time::sleep(self.cfg.retry).await;
            }
        }
        self.publish();
    }

    /// One standby step: wait for an Active peer, fail back if this cluster was Active, then start
    /// the mirror.
    async fn standby(&mut self) -> Result<(), MirrorError> {
        let peer = self.cfg.mirror.source_cluster.clone();
        let timeout = self.cfg.mirror.ha.timings.request_timeout;
        let pair = crate::status::read_pair(&self.cfg.mirror.ha, &self.clients, timeout).await;
        if pair.active.as_deref() != Some(peer.as_str()) {
            let why = match (&pair.limbo, &pair.alarm, &pair.active) {
                (Some(l), _, _) => format!("limbo: {l}"),
                (_, Some(a), _) => a.clone(),
                (_, _, Some(c)) => format!("{c} is Active, not the peer {peer}"),
                _ => format!("the peer {peer} is not Active"),
            };
            self.phase("waiting", Some(why));
            return Ok(());
        }
        if read_mark(&self.clients.local, &self.cfg).await?.is_some() {
            self.phase("failback", None);
            let (cfg, local, new) = (
                self.cfg.mirror.clone(),
                self.clients.local.clone(),
                self.clients.peer.clone(),
            );
            let opts = self.opts;
            let fb = self
                .failback
                .get_or_insert_with(|| Failback::new(cfg, local, new, opts));
            let rep = fb.run_once().await?;
            let left = rep.divergent.len() - rep.deleted.len();
            let done = rep.failed.is_empty() && (left == 0 || self.opts.keep_divergent);
            let detail = (!done).then(|| {
                format!(
                    "{left} divergent object(s) ({} never written by kube-shard: a person resolves \
                     them; the rest within the prune grace), {} failed write(s)",
                    rep.never_written.len(),
                    rep.failed.len()
                )
            });
            let held = rep.divergent.len() - rep.deleted.len();
            if held > 0 && !self.divergent_told {
                self.divergent_told = true;
                self.events.emit(
                    true,
                    reason::FAILBACK_DIVERGENT,
                    format!(
                        "{held} object(s) only on this cluster (the old Active), e.g. {}{}",
                        rep.divergent[0].at,
                        if self.opts.keep_divergent {
                            ": kept (keep_divergent)".to_string()
                        } else {
                            format!(
                                ": deleted after the prune grace ({:?})",
                                self.opts.prune_grace
                            )
                        }
                    ),
                );
            }
            let (labelled, updated, deleted) =
                (rep.labelled.len(), rep.updated.len(), rep.deleted.len());
            set(&self.status, |s| {
                s.failback = Some(rep);
                s.detail = detail;
            });
            if !done {
                return Ok(());
            }
            write_mark(&self.clients.local, &self.cfg, None).await?;
            self.divergent_told = false;
            self.events.emit(
                false,
                reason::FAILBACK_DONE,
                format!("failback to {peer}: this pass labelled {labelled}, updated {updated}, deleted {deleted}; mirroring next"),
            );
            info!("failback: done; starting the mirror");
        }
        let m = Mirror::start(
            self.cfg.mirror.clone(),
            self.clients.peer.clone(),
            self.clients.local.clone(),
            self.wiring.clone(),
        )
        .await?;
        self.mirror = Some(m);
        set(&self.status, |s| {
            s.mirror_starts += 1;
            s.last_error = None;
        });
        self.phase("mirroring", None);
        self.events.emit(
            false,
            reason::MIRROR_STARTED,
            format!("mirroring {peer}'s kinds into this cluster"),
        );
        Ok(())
    }
}

async fn read_mark(local: &Client, cfg: &AdoptConfig) -> Result<Option<String>, MirrorError> {
    let api: Api<ConfigMap> = Api::namespaced(local.clone(), &cfg.mirror.ha.namespace);
    let cm = api
        .get_opt(&checkpoint_name(&cfg.mirror.ha))
        .await
        .map_err(crate::mirror::error::api_err("reading the checkpoint"))?;
    Ok(cm
        .and_then(|c| c.data)
        .and_then(|mut d| d.remove(WAS_ACTIVE_KEY)))
}

/// Set (`Some`) or clear the `was-active` mark.
async fn write_mark(
    local: &Client,
    cfg: &AdoptConfig,
    e: Option<FailoverEpoch>,
) -> Result<(), MirrorError> {
    edit_checkpoint(local, &cfg.mirror.ha, |d| match e {
        Some(e) => {
            d.insert(WAS_ACTIVE_KEY.into(), e.wire().to_string());
            // the mirror is stopped: a token promotion's catch-up request (and the hold it asked for)
            // is spent, and must not hold the next mirror of this cluster
            d.remove(CATCH_UP_KEY);
            d.remove(HOLD_KEY);
            d.remove(CAUGHT_UP_KEY);
        }
        None => {
            d.remove(WAS_ACTIVE_KEY);
        }
    })
    .await
    .map_err(|err| MirrorError::Kind("checkpoint".into(), err.to_string()))
}
