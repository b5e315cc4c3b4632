//! Catch-up to a demotion token (HA.md "Position"): a quiet kind's token version is far above its last event,
//! and bookmarks move it only about once a minute, so the mirror does not wait for events: each kind takes
//! one consistent LIST at the token's version (`NotOlderThan`) and applies it as a diff (`task.rs`). Asked
//! for in-process ([`super::Mirror::catch_up`]) or, from `promote --token` in another process, through the
//! checkpoint ConfigMap's [`CATCH_UP_KEY`] (polled here). A request through the checkpoint is acknowledged
//! under [`CAUGHT_UP_KEY`] only once every kind's catch-up LIST is applied and the mirror holds
//! ([`super::hold`]): `promote --token` takes over after that, so no copy write can land on the new Active.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::{info, warn};

use super::error::MirrorError;
use super::hold::Hold;
use super::rv::SourceId;
use crate::checkpoint::edit::edit_checkpoint;
use crate::checkpoint::{parse_hold, DemotionToken, CATCH_UP_KEY, CAUGHT_UP_KEY, HOLD_KEY};
use crate::config::checkpoint_name;
use crate::HaConfig;

/// Per mirrored kind, the token's version. A token from another source is refused, and so is one
/// whose kinds are not the mirror's: the mirror holds every kind once the token's caught up, so a kind
/// the token lacks would keep taking writes on the old Active that never reach this cluster.
pub(super) fn targets(
    token: &DemotionToken,
    source: &SourceId,
    kinds: impl Iterator<Item = String>,
) -> Result<Vec<(String, u64)>, MirrorError> {
    let kinds: std::collections::BTreeSet<String> = kinds.collect();
    if token.cluster != source.cluster || token.uid != source.uid {
        return Err(MirrorError::Kind(
            "token".into(),
            format!(
                "foreign source {} (the mirror copies from {})",
                token.source(),
                source.cluster_source()
            ),
        ));
    }
    let theirs = token.kinds.keys().cloned().collect();
    if let Some(d) = super::checkpoint::kind_diff(&kinds, &theirs) {
        return Err(MirrorError::Kind(
            "token".into(),
            format!("its kinds are not the mirror's ({d}): refused"),
        ));
    }
    Ok(token.kinds.iter().map(|(k, rv)| (k.clone(), *rv)).collect())
}

/// A catch-up request to one kind's task: the token's version, and (from the poller) where to say that
/// the catch-up LIST was applied, with the number of objects on the kind's failed list.
#[derive(Debug)]
pub(super) struct CatchUp {
    pub(super) rv: u64,
    pub(super) done: Option<oneshot::Sender<usize>>,
}

/// Send the catch-up versions to the kinds' tasks; with `acks`, each kind's task answers on its own
/// channel once its catch-up is applied.
pub(super) async fn send(
    token: &DemotionToken,
    source: &SourceId,
    senders: &BTreeMap<String, mpsc::Sender<CatchUp>>,
    mut acks: Option<&mut Vec<oneshot::Receiver<usize>>>,
) -> Result<usize, MirrorError> {
    let t = targets(token, source, senders.keys().cloned())?;
    for (k, rv) in &t {
        let Some(s) = senders.get(k) else { continue };
        let (tx, rx) = oneshot::channel();
        let req = CatchUp {
            rv: *rv,
            done: acks.as_ref().map(|_| tx),
        };
        if let Some(a) = acks.as_mut() {
            a.push(rx);
        }
        if s.send(req).await.is_err() {
            // the kind's task has stopped (its error is in the kind's status): the promotion's
            // per-kind report shows it behind
            warn!(kind = %k, rv, "HA mirror catch-up: the kind's task has stopped");
        }
    }
    Ok(t.len())
}

/// The catch-up poller's wiring.
pub(super) struct Poller {
    pub(super) target: Client,
    pub(super) ha: HaConfig,
    pub(super) source: SourceId,
    /// The source term's failover epoch (wire form; 0 unknown): an older token is stale.
    pub(super) epoch: u64,
    pub(super) senders: BTreeMap<String, mpsc::Sender<CatchUp>>,
    pub(super) period: Duration,
    pub(super) hold: Hold,
}

/// A request in the checkpoint.
struct Asked {
    id: String,
    /// The source term's epoch it was made in (wire form).
    epoch: u64,
    /// A catch-up's token (`None`: a bare hold).
    token: Option<DemotionToken>,
}

enum Round {
    /// Every kind applied its catch-up; objects on the failed lists.
    Done(usize),
    /// A kind could not (its LIST failed, or its task stopped): asked again next period.
    Again,
    /// The request left the checkpoint (or changed) meanwhile.
    Abandoned,
    /// The token is not from this mirror's source: never acted on.
    Refused,
    /// The mirror is stopping.
    Stopped,
}

impl Poller {
    fn api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.target.clone(), &self.ha.namespace)
    }

    /// The checkpoint's data (`None`: unreadable now).
    async fn read(&self) -> Option<BTreeMap<String, String>> {
        match self.api().get_opt(&checkpoint_name(&self.ha)).await {
            Ok(cm) => Some(cm.and_then(|c| c.data).unwrap_or_default()),
            Err(e) => {
                warn!(error = %e, "mirror: reading the checkpoint for catch-up requests failed");
                None
            }
        }
    }

    /// What the checkpoint asks for now (outer `None`: unreadable): a catch-up to a token, else a bare
    /// hold of a forced promotion.
    async fn asked(&self) -> Option<Option<Asked>> {
        let d = self.read().await?;
        let token = d
            .get(CATCH_UP_KEY)
            .and_then(|t| t.parse::<DemotionToken>().ok());
        Some(match token {
            Some(t) => Some(Asked {
                id: t.id.clone(),
                epoch: t.epoch.wire(),
                token: Some(t),
            }),
            None => d
                .get(HOLD_KEY)
                .and_then(|h| parse_hold(h))
                .map(|(epoch, id)| Asked {
                    id,
                    epoch,
                    token: None,
                }),
        })
    }

    /// Poll the checkpoint for a catch-up request every period until stopped: catch up, hold, acknowledge;
    /// release the hold when the request leaves.
    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut acked = false;
        // objects on the failed lists when the current hold began (repeated if the first ack failed)
        let mut failed_at_hold = 0;
        let mut ignored = String::new();
        loop {
            tokio::select! {
                biased; // the stop first
                _ = stop.changed() => return,
                () = tokio::time::sleep(self.period) => {}
            }
            let Some(asked) = self.asked().await else {
                continue;
            };
            if let Some(id) = self.hold.token().await {
                if asked.as_ref().map(|a| &a.id) != Some(&id) {
                    self.hold.release().await;
                    acked = false;
                    info!(request = %id, "mirror: the request left the checkpoint; hold released");
                }
            }
            let Some(asked) = asked else { continue };
            if self.hold.token().await.as_deref() == Some(asked.id.as_str()) {
                if !acked {
                    acked = self.acknowledge(&asked.id, failed_at_hold).await;
                }
                continue;
            }
            if asked.id == ignored {
                continue;
            }
            if self.epoch > 0 && asked.epoch < self.epoch {
                warn!(request = %asked.id, epoch = asked.epoch, source_epoch = self.epoch,
                    "mirror: ignoring a catch-up or hold request from an earlier term of the source");
                ignored = asked.id.clone();
                continue;
            }
            let Some(token) = asked.token else {
                // a forced promotion: no token, nothing to catch up to; hold now
                self.hold.hold(&asked.id).await;
                info!(request = %asked.id, "mirror: holding for a forced promotion (no more copy writes)");
                failed_at_hold = 0;
                acked = self.acknowledge(&asked.id, 0).await;
                continue;
            };
            match self.round(&token, &mut stop).await {
                Round::Done(failed) => {
                    self.hold.hold(&token.id).await;
                    info!(token = %token.id, failed, "mirror: caught up to the token; holding (no more copy writes)");
                    failed_at_hold = failed;
                    acked = self.acknowledge(&token.id, failed).await;
                }
                Round::Refused => ignored = token.id.clone(),
                Round::Again | Round::Abandoned => {}
                Round::Stopped => return,
            }
        }
    }

    /// One catch-up of every kind of the token, waiting for each kind's acknowledgement.
    async fn round(&self, token: &DemotionToken, stop: &mut watch::Receiver<bool>) -> Round {
        let mut acks = Vec::new();
        match send(token, &self.source, &self.senders, Some(&mut acks)).await {
            Ok(n) => info!(token = %token.id, kinds = n, "mirror: catching up to a token"),
            Err(e) => {
                warn!(error = %e, "mirror: catch-up refused");
                return Round::Refused;
            }
        }
        let all = futures::future::join_all(acks);
        tokio::pin!(all);
        loop {
            tokio::select! {
                biased; // the stop first; the acks resolve once, so they never starve the period's check
                _ = stop.changed() => return Round::Stopped,
                r = &mut all => {
                    return match r.into_iter().collect::<Result<Vec<usize>, _>>() {
                        Ok(v) => Round::Done(v.into_iter().sum()),
                        Err(_) => Round::Again,
                    };
                }
                () = tokio::time::sleep(self.period) => {
                    if let Some(a) = self.asked().await {
                        if a.map(|a| a.id) != Some(token.id.clone()) {
                            return Round::Abandoned;
                        }
                    }
                }
            }
        }
    }

    async fn acknowledge(&self, id: &str, failed: usize) -> bool {
        let text = format!("{id} failed={failed}");
        match edit_checkpoint(&self.target, &self.ha, |d| {
            d.insert(CAUGHT_UP_KEY.to_string(), text.clone());
        })
        .await
        {
            Ok(()) => true,
            Err(e) => {
                warn!(error = %e, "mirror: writing the catch-up acknowledgement failed; next period");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FailoverEpoch;

    fn token(cluster: &str, uid: &str) -> DemotionToken {
        format!("v1;src={cluster}/{uid};e=1001;k=widgets.example.com:500,configmaps:900;id=ab")
            .parse()
            .unwrap()
    }

    #[test]
    fn a_token_lacking_a_mirrored_kind_or_covering_another_is_refused() {
        let s = SourceId {
            cluster: "a".into(),
            uid: "u".into(),
            resource: String::new(),
        };
        let three = ["widgets.example.com", "configmaps", "secrets"].map(String::from);
        let e = targets(&token("a", "u"), &s, three.into_iter()).unwrap_err();
        assert!(e.to_string().contains("missing secrets"), "{e}");
        let one = ["widgets.example.com".to_string()];
        let e = targets(&token("a", "u"), &s, one.into_iter()).unwrap_err();
        assert!(
            e.to_string().contains("not mirrored here: configmaps"),
            "{e}"
        );
    }

    #[test]
    fn targets_only_from_the_mirrors_source() {
        let s = SourceId {
            cluster: "a".into(),
            uid: "u".into(),
            resource: String::new(),
        };
        let kinds = || ["widgets.example.com".to_string(), "configmaps".to_string()].into_iter();
        let t = targets(&token("a", "u"), &s, kinds()).unwrap();
        assert_eq!(
            t,
            vec![
                ("configmaps".to_string(), 900),
                ("widgets.example.com".to_string(), 500)
            ]
        );
        assert!(targets(&token("a", "other"), &s, kinds()).is_err());
        assert!(targets(&token("b", "u"), &s, kinds()).is_err());
        assert_eq!(
            token("a", "u").epoch,
            FailoverEpoch::from_wire(1001).unwrap()
        );
    }
}
