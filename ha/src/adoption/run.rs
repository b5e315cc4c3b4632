//! [`Adoption`]: the promotion hook. With it, the [`HaHandle`] keeps admission closed at every new
//! epoch until adoption at that epoch finished: stop the mirror and wait for its requests; read the
//! copies and run the plan (restores owners first, then deletes); open admission
//! ([`HaHandle::adopted`]), which re-enqueues through the group's HA gate; relabel the copies as owned
//! in the background. The elector is untouched: it writes the new epoch as before, and adoption starts
//! when the handle shows the term.

use std::sync::{Arc, Mutex};

use kube::Client;
use tokio::task::JoinHandle;
use tracing::{info, info_span, warn, Instrument};

use super::config::AdoptConfig;
use super::io::{execute, relabel, KindApi};
use super::plan::{plan_promotion, CopyView, ObjRef, Problem, Step};
use crate::mirror::error::MirrorError;
use crate::mirror::plan::MIRRORED_FROM;
use crate::mirror::Mirror;
use crate::{FailoverEpoch, HaHandle};

/// What adoption has done, for `kshard ha status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct AdoptStatus {
    /// `standby`, `adopting`, `adopted` (admission open, relabelling), `relabelled`.
    pub state: &'static str,
    /// The epoch adopted or being adopted (wire form).
    pub epoch: Option<u64>,
    /// Copies whose metadata was restored.
    pub restored: usize,
    /// Copies deleted (their source was terminating).
    pub deleted: usize,
    /// Copies relabelled as owned.
    pub relabelled: usize,
    /// What could not be restored.
    pub problems: Vec<Problem>,
    /// The last failure (adoption is retried; admission stays closed meanwhile).
    pub last_error: Option<String>,
}

/// The running promotion hook. Dropping it does not stop it: call [`Adoption::abort`].
#[derive(Debug)]
pub struct Adoption {
    status: Arc<Mutex<AdoptStatus>>,
    task: JoinHandle<()>,
}

pub(crate) type Status = Arc<Mutex<AdoptStatus>>;

fn set(s: &Status, f: impl FnOnce(&mut AdoptStatus)) {
    if let Ok(mut g) = s.lock() {
        f(&mut g);
    }
}

impl Adoption {
    /// Require adoption on `ha` (from now on) and run it at each new epoch: `mirror` (the running
    /// mirror of this Standby, if any) is stopped first; `target` is this cluster.
    #[must_use]
    pub fn spawn(ha: HaHandle, target: Client, cfg: AdoptConfig, mirror: Option<Mirror>) -> Self {
        ha.require_adoption();
        let status: Status = Arc::new(Mutex::new(AdoptStatus {
            state: "standby",
            ..AdoptStatus::default()
        }));
        let task = tokio::spawn(supervise(ha, target, cfg, mirror, status.clone()));
        Adoption { status, task }
    }

    /// What adoption has done.
    #[must_use]
    pub fn status(&self) -> AdoptStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Stop the hook (admission at an epoch not yet adopted stays closed).
    pub fn abort(&self) {
        self.task.abort();
    }
}

async fn supervise(
    ha: HaHandle,
    target: Client,
    cfg: AdoptConfig,
    mut mirror: Option<Mirror>,
    status: Status,
) {
    let mut relabelling: Option<JoinHandle<()>> = None;
    loop {
        let due = ha.leading_epoch().filter(|e| e.wire() > ha.adopted_epoch());
        if let Some(e) = due {
            if let Some(m) = mirror.take() {
                info!(epoch = %e, "adoption: stopping the mirror");
                m.stop().await;
            }
            if planted!(OPEN_BEFORE_ADOPTION) {
                ha.adopted(e);
            }
            set(&status, |s| {
                s.state = "adopting";
                s.epoch = Some(e.wire());
            });
            let span = info_span!("adoption", epoch = %e);
            match adopt(&cfg, &target, &ha, e).instrument(span).await {
                Ok(r) => {
                    info!(epoch = %e, restored = r.restored, deleted = r.deleted, problems = r.problems.len(), "adoption: done; admission opens");
                    set(&status, |s| {
                        s.state = "adopted";
                        s.restored = r.restored;
                        s.deleted = r.deleted;
                        s.problems = r.problems;
                        s.last_error = None;
                    });
                    ha.adopted(e);
                    if let Some(t) = relabelling.take() {
                        t.abort();
                    }
                    let (cfg, target, ha, st) =
                        (cfg.clone(), target.clone(), ha.clone(), status.clone());
                    relabelling = Some(tokio::spawn(
                        relabel_all(cfg, target, ha, st)
                            .instrument(info_span!("relabel", epoch = %e)),
                    ));
                }
                Err(err) => {
                    warn!(epoch = %e, error = %err, "adoption failed; admission stays closed, retrying");
                    set(&status, |s| s.last_error = Some(err.to_string()));
                    tokio::time::sleep(cfg.retry).await;
                    continue;
                }
            }
        }
        ha.await_change().await;
    }
}

pub(crate) struct Report {
    pub(crate) restored: usize,
    pub(crate) deleted: usize,
    pub(crate) problems: Vec<Problem>,
}

/// Adoption at `e`: read every mirrored kind's copies, plan, execute in order. Stops if the term
/// at `e` is lost.
pub(crate) async fn adopt(
    cfg: &AdoptConfig,
    target: &Client,
    ha: &HaHandle,
    e: FailoverEpoch,
) -> Result<Report, MirrorError> {
    let src = &cfg.mirror.source_cluster;
    let selector = format!("{MIRRORED_FROM}={src}");
    let mut apis = std::collections::BTreeMap::new();
    let mut copies = Vec::new();
    let mut problems = Vec::new();
    for k in cfg.mirror.kinds.mirrored() {
        let api = KindApi::resolve(target, k).await?;
        for o in api.list(Some(&selector)).await? {
            match CopyView::read(&k.key(), &o, src) {
                Ok(Some(c)) => copies.push(c),
                Ok(None) => {}
                Err(p) => problems.push(p),
            }
        }
        apis.insert(k.key(), api);
    }
    let plan = plan_promotion(&copies, e.wire(), cfg.shard);
    problems.extend(plan.problems);
    let mut r = Report {
        restored: 0,
        deleted: 0,
        problems,
    };
    for step in &plan.steps {
        if ha.leading_epoch() != Some(e) {
            return Err(MirrorError::Kind(
                "adoption".into(),
                format!("the term at epoch {e} ended during adoption"),
            ));
        }
        let at: &ObjRef = match step {
            Step::Restore(x) => &x.at,
            Step::Delete(x) => &x.at,
        };
        let Some(api) = apis.get(&at.kind) else {
            continue;
        };
        if execute(api, step, &mut r.problems).await? {
            match step {
                Step::Restore(_) => r.restored += 1,
                Step::Delete(_) => r.deleted += 1,
            }
        }
    }
    Ok(r)
}

/// Relabel every copy of the source as owned, in the background, while this cluster is active.
pub(crate) async fn relabel_all(cfg: AdoptConfig, target: Client, ha: HaHandle, status: Status) {
    let src = cfg.mirror.source_cluster.clone();
    let selector = format!("{MIRRORED_FROM}={src}");
    loop {
        let mut failed = false;
        for k in cfg.mirror.kinds.mirrored() {
            let res = async {
                let api = KindApi::resolve(&target, k).await?;
                for o in api.list(Some(&selector)).await? {
                    if !ha.is_active() {
                        return Ok(());
                    }
                    if relabel(&api, &ObjRef::of(&k.key(), &o), &src).await? {
                        set(&status, |s| s.relabelled += 1);
                    }
                }
                Ok::<(), MirrorError>(())
            }
            .await;
            if let Err(e) = res {
                warn!(kind = %k, error = %e, "relabelling failed; retrying");
                failed = true;
            }
        }
        if !ha.is_active() {
            return;
        }
        if !failed {
            set(&status, |s| s.state = "relabelled");
            return;
        }
        tokio::time::sleep(cfg.retry).await;
    }
}
