//! Catch-up to a demotion token (HA.md "Position"; `review-ha.md` H12): a quiet kind's token version is
//! far above its last event, and bookmarks move it only about once a minute, so the mirror does not wait
//! for events: each kind takes one consistent LIST at the token's version (`NotOlderThan`) and applies
//! it as a diff (`task.rs`). Asked for in-process ([`super::Mirror::catch_up`]) or, from `promote
//! --token` in another process, through the checkpoint ConfigMap's [`CATCH_UP_KEY`] (polled here).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::error::MirrorError;
use super::rv::SourceId;
use crate::ha::switchover::{checkpoint_name, Token, CATCH_UP_KEY};
use crate::ha::HaConfig;

/// Per mirrored kind, the token's version; a token from another source is refused.
pub(super) fn targets(
    token: &Token,
    source: &SourceId,
    kinds: impl Iterator<Item = String>,
) -> Result<Vec<(String, u64)>, MirrorError> {
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
    Ok(kinds
        .filter_map(|k| token.kinds.get(&k).map(|rv| (k, *rv)))
        .collect())
}

/// Send the catch-up versions to the kinds' tasks.
pub(super) async fn send(
    token: &Token,
    source: &SourceId,
    senders: &BTreeMap<String, mpsc::Sender<u64>>,
) -> Result<usize, MirrorError> {
    let t = targets(token, source, senders.keys().cloned())?;
    for (k, rv) in &t {
        if let Some(s) = senders.get(k) {
            if s.send(*rv).await.is_err() {
                // the kind's task has stopped (its error is in the kind's status): the promotion's
                // per-kind report shows it behind
                tracing::warn!(kind = %k, rv, "HA mirror catch-up: the kind's task has stopped");
            }
        }
    }
    Ok(t.len())
}

/// Poll the checkpoint for a catch-up request every `period` until stopped; each token id once.
pub(super) async fn poll(
    target: Client,
    ha: HaConfig,
    source: SourceId,
    senders: BTreeMap<String, mpsc::Sender<u64>>,
    period: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let api: Api<ConfigMap> = Api::namespaced(target, &ha.namespace);
    let name = checkpoint_name(&ha);
    let mut done = String::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(period) => {}
        }
        let text = match api.get_opt(&name).await {
            Ok(cm) => cm
                .and_then(|c| c.data)
                .and_then(|mut d| d.remove(CATCH_UP_KEY)),
            Err(e) => {
                warn!(error = %e, "mirror: reading the checkpoint for catch-up requests failed");
                continue;
            }
        };
        let Some(token) = text.and_then(|t| t.parse::<Token>().ok()) else {
            continue;
        };
        if token.id == done {
            continue;
        }
        match send(&token, &source, &senders).await {
            Ok(n) => info!(token = %token.id, kinds = n, "mirror: catching up to a token"),
            Err(e) => warn!(error = %e, "mirror: catch-up refused"),
        }
        done = token.id.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ha::Epoch;

    fn token(cluster: &str, uid: &str) -> Token {
        format!("v1;src={cluster}/{uid};e=1001;k=widgets.example.com:500,configmaps:900;id=ab")
            .parse()
            .unwrap()
    }

    #[test]
    fn targets_only_from_the_mirrors_source() {
        let s = SourceId {
            cluster: "a".into(),
            uid: "u".into(),
            resource: String::new(),
        };
        let kinds = || ["widgets.example.com".to_string(), "secrets".to_string()].into_iter();
        let t = targets(&token("a", "u"), &s, kinds()).unwrap();
        assert_eq!(t, vec![("widgets.example.com".to_string(), 500)]);
        assert!(targets(&token("a", "other"), &s, kinds()).is_err());
        assert!(targets(&token("b", "u"), &s, kinds()).is_err());
        assert_eq!(token("a", "u").epoch, Epoch::from_wire(1001).unwrap());
    }
}
