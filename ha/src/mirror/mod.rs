//! The mirror: run by the Standby, it copies the Active's mirrored kinds into the Standby's cluster so
//! that a promotion finds the Active's state. [`Mirror::start`] runs it.
//!
//! Pure parts: [`kinds`] (mirrored or derived, [`KindSet`]), [`rv`] (versions compared within one
//! [`SourceId`]), [`plan`] (the copy, and the write that updates it), [`queue`] (the retry queue),
//! [`watermark`] (the position), [`lag`] and [`checkpoint`]. At start, [`schema`] compares the CRDs.
//! The loops: `source` (list/watch per kind), `apply` (one object's copy), `pool` (up to `workers`
//! applies in flight per kind, never two of one object), `rate` (the global rate limit over every
//! kind's copy requests), `task` (queue, watermark, probes, checkpoint, prune backstop), `failures`
//! (a rate-limited Event per failed object), `catchup` and `hold` (catch-up to a demotion token, then no
//! copy writes; the hold waits for the applies in flight).
//!
//! See `docs/ha.md#the-mirror-kube_shard_hamirror`.

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod kinds;
pub mod labels;
pub mod lag;
pub mod plan;
pub mod queue;
pub mod rv;
pub mod schema;
pub mod scope;
pub mod status;
pub mod watermark;

pub(crate) mod apply;
mod catchup;
mod failures;
mod hold;
mod pool;
mod rate;
mod source;
pub(crate) mod task;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ApiResource, DynamicObject};
use kube::discovery::{ApiCapabilities, Scope};
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub use config::MirrorConfig;
pub use error::MirrorError;
pub use kinds::{KindClass, KindSet, KindSetBuilder, OwnObjects};
pub use queue::{Backoff, Failed};
pub use rv::SourceId;
pub use status::KindStatus;

use self::apply::Sides;
use self::error::api_err;
use self::plan::CopyContext;
use self::queue::RetryQueue;
use self::task::{KindTask, Shared};
use self::watermark::Watermark;
use super::{record, HaControl};
use crate::checkpoint::{position, DemotionToken, Kind};
use crate::config::checkpoint_name;
use kube_shard::rt::Clock;

/// A running mirror. Dropping it does not stop it: call [`Mirror::stop`].
#[derive(Debug)]
pub struct Mirror {
    shared: Shared,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    sources: Vec<JoinHandle<()>>,
    catchup: BTreeMap<String, mpsc::Sender<catchup::CatchUp>>,
    source: SourceId,
}

/// How a running mirror reports (optional wiring).
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct MirrorWiring {
    /// The local clock for probe times and lag (default: the tokio clock).
    pub clock: Option<Clock>,
    /// The HA driver to feed [`HaControl::mirror_confirmed`] (the `--max-auto-promote-lag` gate).
    pub control: Option<HaControl>,
}

impl std::fmt::Debug for MirrorWiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorWiring")
            .field("control", &self.control.is_some())
            .finish_non_exhaustive()
    }
}

impl MirrorWiring {
    /// Feed the lag to `control`, timing with `clock`.
    #[must_use]
    pub fn new(clock: Clock, control: Option<HaControl>) -> Self {
        MirrorWiring {
            clock: Some(clock),
            control,
        }
    }
}

pub(crate) async fn resolve(
    c: &Client,
    k: &Kind,
) -> Result<(ApiResource, ApiCapabilities), MirrorError> {
    let gv = kube::core::GroupVersion::gv(&k.group, &k.version);
    let g = kube::discovery::oneshot::pinned_group(c, &gv)
        .await
        .map_err(api_err(format!("discovering {k}")))?;
    g.recommended_resources()
        .into_iter()
        .find(|(r, _)| r.plural == k.plural)
        .ok_or_else(|| MirrorError::Kind(k.key(), "not served".into()))
}

pub(crate) async fn kube_system_uid(c: &Client) -> Result<String, MirrorError> {
    let ns: Api<Namespace> = Api::all(c.clone());
    let n = ns
        .get("kube-system")
        .await
        .map_err(api_err("reading the source's kube-system namespace"))?;
    n.metadata
        .uid
        .ok_or_else(|| MirrorError::Kind("namespaces".into(), "kube-system has no uid".into()))
}

/// The source term's epoch from the source's HA Lease (0 when it cannot be read).
pub(crate) async fn source_epoch(cfg: &MirrorConfig, source: &Client) -> u64 {
    if let Some(e) = cfg.epoch {
        return e;
    }
    let api: Api<Lease> = Api::namespaced(source.clone(), &cfg.ha.namespace);
    match api.get(&cfg.ha.lease_name()).await {
        Ok(l) => record::decode(&l).map(|r| r.epoch.wire()).unwrap_or(0),
        Err(e) => {
            warn!(error = %e, "mirror: the source's HA Lease is unreadable; fencing copies with epoch 0");
            0
        }
    }
}

/// Record the mirror of `cfg` (its source, kinds and scope) in the checkpoint on `target`, where the
/// promotion checks read it, and drop the initial-LIST records of the kinds not in `synced` (another
/// incarnation's, or a run that never finished its LIST): they list again.
async fn record_mirror(
    target: &Client,
    cfg: &MirrorConfig,
    kinds: &[Kind],
    synced: &[String],
) -> Result<(), MirrorError> {
    let text = checkpoint::MirrorRecord::of(cfg).to_string();
    let r = crate::checkpoint::edit::edit_checkpoint(target, &cfg.ha, |d| {
        d.insert(checkpoint::MIRROR_KEY.to_string(), text.clone());
        for k in kinds.iter().map(Kind::key).filter(|k| !synced.contains(k)) {
            checkpoint::drop_synced(d, &k);
        }
    })
    .await;
    r.map_err(|e| MirrorError::Api {
        what: e.what,
        source: e.source,
    })
}

impl Mirror {
    /// Start mirroring every mirrored kind of `cfg` from `source` (the Active) into `target` (this
    /// Standby), resuming each kind from its checkpoint when the checkpoint is from this source.
    pub async fn start(
        cfg: MirrorConfig,
        source: Client,
        target: Client,
        wiring: MirrorWiring,
    ) -> Result<Mirror, MirrorError> {
        scope::check_builtin_selectors(&cfg)?;
        let uid = kube_system_uid(&source).await?;
        let epoch = source_epoch(&cfg, &source).await;
        let cm: Api<ConfigMap> = Api::namespaced(target.clone(), &cfg.ha.namespace);
        let cp = cm
            .get_opt(&checkpoint_name(&cfg.ha))
            .await
            .map_err(api_err("reading the checkpoint"))?
            .and_then(|c| c.data)
            .unwrap_or_default();
        if let Some(mark) = cp.get(crate::checkpoint::LEFT_HA_KEY) {
            return Err(MirrorError::Input(format!(
                "this cluster was taken out of HA ({mark}): no mirror runs here"
            )));
        }
        let clock = wiring.clock.clone().unwrap_or_else(Clock::system);
        let cfg = Arc::new(cfg);
        let kinds: Vec<Kind> = cfg.kinds.mirrored().cloned().collect();
        let mut plan = Vec::new();
        for k in &kinds {
            let (ar, caps) = resolve(&source, k).await?;
            let (tar, tcaps) = resolve(&target, k).await?;
            if ar.api_version != tar.api_version || caps.scope != tcaps.scope {
                return Err(MirrorError::Kind(
                    k.key(),
                    "served differently on the two sides".into(),
                ));
            }
            schema::check(&source, &target, k).await?;
            plan.push((k.clone(), ar, caps));
        }
        let this_source = format!("{}/{uid}", cfg.source_cluster);
        let recorded: Vec<String> = kinds
            .iter()
            .map(Kind::key)
            .filter(|k| {
                position(&cp, k, &this_source).is_some()
                    && checkpoint::synced(&cp, k).is_some_and(|s| s.source == this_source)
            })
            .collect();
        record_mirror(&target, &cfg, &kinds, &recorded).await?;
        let shared: Shared = Arc::new(Mutex::new(BTreeMap::new()));
        let hold = hold::Hold::default();
        // one limit over every kind's copy requests
        let rate = rate::RateLimit::new(cfg.rate_limit);
        let (stop, _) = watch::channel(false);
        let mut m = Mirror {
            shared: shared.clone(),
            stop,
            tasks: Vec::new(),
            sources: Vec::new(),
            catchup: BTreeMap::new(),
            source: SourceId {
                cluster: cfg.source_cluster.clone(),
                uid: uid.clone(),
                resource: String::new(),
            },
        };
        if let Ok(mut s) = shared.lock() {
            for k in &kinds {
                s.insert(
                    k.key(),
                    KindStatus {
                        kind: k.key(),
                        ..KindStatus::default()
                    },
                );
            }
        }
        for (k, ar, caps) in plan {
            let sid = SourceId {
                cluster: cfg.source_cluster.clone(),
                uid: uid.clone(),
                resource: k.key(),
            };
            let from = position(&cp, &k.key(), &sid.cluster_source());
            let synced = recorded.contains(&k.key());
            info!(kind = %k, from = ?from, synced, "mirror: starting");
            let sides = Sides {
                ar: ar.clone(),
                namespaced: caps.scope == Scope::Namespaced,
                has_status: caps.subresources.iter().any(|(s, _)| s.plural == "status"),
                source: source.clone(),
                target: target.clone(),
                marker_last: !planted!(MARKER_FIRST),
            };
            let (tx, rx) = mpsc::channel(1024);
            let api: Api<DynamicObject> = Api::all_with(source.clone(), &ar);
            // a kind without a completed initial LIST recorded lists first (its position, if any,
            // still holds the watermark: it never goes back)
            m.sources.push(tokio::spawn(source::run(
                api,
                k.key(),
                from.filter(|_| synced),
                cfg.watch_timeout_secs,
                tx,
            )));
            let status = KindStatus {
                kind: k.key(),
                position: from,
                checkpointed: from,
                synced: checkpoint::synced(&cp, &k.key()).filter(|_| synced),
                ..KindStatus::default()
            };
            let t = KindTask {
                kind: k,
                sides,
                ctx: CopyContext { source: sid, epoch },
                cfg: cfg.clone(),
                clock: clock.clone(),
                shared: shared.clone(),
                control: wiring.control.clone(),
                queue: RetryQueue::new(cfg.backoff),
                wm: Watermark::resume(from),
                conf: lag::Confirmations::default(),
                last_written: Default::default(),
                status,
                suspects: Default::default(),
                hold: hold.clone(),
                waiting: Vec::new(),
                initial: if synced {
                    task::Initial::Recorded
                } else {
                    task::Initial::Awaited
                },
                pool: pool::Pool::new(cfg.workers),
                rate: rate.clone(),
                failures: failures::FailureEvents::on_lease(&target, &cfg.ha),
            };
            let (ctx, crx) = mpsc::channel(8);
            m.catchup.insert(t.kind.key(), ctx);
            m.tasks
                .push(tokio::spawn(t.run(rx, crx, m.stop.subscribe())));
        }
        let poller = catchup::Poller {
            target: target.clone(),
            ha: cfg.ha.clone(),
            source: m.source.clone(),
            epoch,
            senders: m.catchup.clone(),
            period: cfg.checkpoint_period,
            hold,
        };
        m.tasks.push(tokio::spawn(poller.run(m.stop.subscribe())));
        Ok(m)
    }

    /// Catch up to a demotion token: each kind of the token takes one consistent LIST at the token's
    /// version (`NotOlderThan`) and applies it as a diff; the positions then reach the token without
    /// waiting for events or bookmarks. Returns the number of kinds asked; a token from another source,
    /// or whose kinds are not the mirror's, is refused. (`promote --token` asks a mirror in another process through the checkpoint.)
    pub async fn catch_up(&self, token: &DemotionToken) -> Result<usize, MirrorError> {
        catchup::send(token, &self.source, &self.catchup, None).await
    }

    /// Every mirrored kind's state.
    #[must_use]
    pub fn status(&self) -> Vec<KindStatus> {
        self.shared
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// One kind's state (`<plural>.<group>`).
    #[must_use]
    pub fn kind(&self, key: &str) -> Option<KindStatus> {
        self.shared.lock().ok().and_then(|m| m.get(key).cloned())
    }

    /// Stop, and wait for the workers' requests to end (promotion's first step).
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for s in &self.sources {
            s.abort();
        }
        for t in self.tasks {
            let _ = t.await;
        }
    }
}
