//! The promotion target's checks (HA.md "Promotion and adoption"): a Standby holding objects that are not
//! copies of the peer's is refused ([`NotPromotable`]); for an unplanned promotion, a mirrored kind that
//! never completed a full LIST from the peer is refused unless allowed (everything of that kind would be
//! lost), and every kind's checkpointed position is reported.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

use crate::adoption::io::KindApi;
use crate::checkpoint::{DUTY_KEY, WAS_ACTIVE_KEY};
use crate::config::checkpoint_name;
use crate::failback::{divergent_objects, promotable, NotPromotable};
use crate::mirror::checkpoint::{position_entry, synced_from, KindDiff, Synced};
use crate::mirror::error::{api_err, MirrorError};
use crate::mirror::rv::parse_rv;
use crate::mirror::scope::in_scope;
use crate::mirror::MirrorConfig;

/// One mirrored kind as the target's checkpoint records it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct KindPosition {
    /// `<plural>.<group>`.
    pub kind: String,
    /// The position checkpointed from the peer (`None`: none from it).
    pub position: Option<u64>,
    /// The completed initial LIST from the peer, of the position's incarnation (`None`: not synced).
    pub synced: Option<Synced>,
}

impl KindPosition {
    /// What an unplanned promotion loses of this kind, from peer `peer` (one line).
    #[must_use]
    pub fn loss(&self, peer: &str) -> String {
        match (&self.synced, self.position) {
            (Some(s), Some(p)) => format!(
                "{}: mirrored up to resourceVersion {p} of {peer} (full LIST of {} object(s) applied at {}, {} failed); writes after it are lost",
                self.kind, s.objects, s.at, s.failed
            ),
            (None, Some(p)) => format!(
                "{}: NOT SYNCED from {peer} (no completed full LIST recorded; position {p}): objects not copied yet are lost",
                self.kind
            ),
            (_, None) => format!(
                "{}: never mirrored from {peer}: every object of it is lost",
                self.kind
            ),
        }
    }
}

/// Why a cluster is not a valid promotion target.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TargetRefused {
    /// It holds divergent objects.
    #[error(
        "{0} (`--allow-divergent` to promote anyway: they become live objects of the new Active)"
    )]
    Divergent(#[from] NotPromotable),
    /// The cluster was taken out of HA (`kshard ha leave`): never a promotion target again.
    #[error("this cluster was taken out of HA ({0}): it is never a promotion target again (its freeze was lifted, and writes may have been made to it since)")]
    LeftHa(String),
    /// No mirror ever ran here: its checkpoint records none.
    #[error("no mirror ever ran on this cluster: its checkpoint {checkpoint} records no mirrored kinds, so nothing shows what it holds of the peer's objects; run the mirror (the operator's `--ha-mirror`) until it has synced, or `--allow-no-mirror` to promote anyway (every object the peer holds may be lost)")]
    NoMirror {
        /// `<namespace>/<name>` of the checkpoint ConfigMap.
        checkpoint: String,
    },
    /// The checkpoint's mirror record does not decode.
    #[error("{0}: refused (the mirror rewrites it when it starts)")]
    BadRecord(String),
    /// The command or the token names another source than the mirror copies from.
    #[error("this cluster's mirror copies from {recorded}, but {what} names {given}")]
    Source {
        /// What names it (`--peer-cluster-id`, the token).
        what: String,
        /// The source named.
        given: String,
        /// The mirror's source.
        recorded: String,
    },
    /// The token's kinds are not the kinds the mirror copies.
    #[error("the token's kinds are not the kinds this cluster's mirror copies ({0}): a mirrored kind left out of the token is neither frozen nor caught up, and its writes after the token never reach this cluster; cancel the demotion (`kshard ha demote --cancel`) and demote again without `--kind` (the kinds are read from the Standby's checkpoint)")]
    TokenKinds(KindDiff),
    /// `--kind` names other kinds than the mirror copies.
    #[error("--kind is not the set of kinds this cluster's mirror copies, per its checkpoint ({0}) (`--allow-kind-mismatch` to go on with the checkpoint's kinds)")]
    KindMismatch(KindDiff),
    /// `--mirror-namespace` names another scope than the mirror's.
    #[error("--mirror-namespace {given} is not this cluster's mirror's scope, per its checkpoint ({recorded}) (`--allow-kind-mismatch` to go on with the checkpoint's scope)")]
    ScopeMismatch {
        /// The scope named.
        given: String,
        /// The mirror's scope.
        recorded: String,
    },
    /// A mirrored kind never synced from the peer.
    #[error("mirrored kind(s) {kinds:?} have no record of a completed full LIST from {peer} (never mirrored, the initial LIST not applied yet, or a checkpoint written before such records existed: the mirror lists again at its next start): promoting would lose every object not copied yet (`--allow-unsynced` to promote anyway)")]
    Unsynced {
        /// The peer (the mirror's source).
        peer: String,
        /// The kinds.
        kinds: Vec<String>,
    },
    /// The checks could not read this cluster.
    #[error("checking the promotion target: {0}")]
    Read(#[from] MirrorError),
}

/// The position of `kind` in checkpoint `data` from any incarnation of cluster `source_cluster`.
fn position_from(data: &BTreeMap<String, String>, kind: &str, source_cluster: &str) -> Option<u64> {
    let (src, rv) = position_entry(data, kind)?;
    let (cluster, _uid) = src.split_once('/')?;
    (cluster == source_cluster).then_some(rv)
}

/// Every mirrored kind of `cfg` as checkpoint `cp` records it (pure).
pub(crate) fn positions(cfg: &MirrorConfig, cp: &BTreeMap<String, String>) -> Vec<KindPosition> {
    cfg.kinds
        .mirrored()
        .map(|k| KindPosition {
            kind: k.key(),
            position: position_from(cp, &k.key(), &cfg.source_cluster),
            synced: synced_from(cp, &k.key(), &cfg.source_cluster),
        })
        .collect()
}

/// The kinds of `kinds` without a completed initial LIST, refused unless allowed.
pub(crate) fn require_synced(
    cfg: &MirrorConfig,
    kinds: &[KindPosition],
) -> Result<(), TargetRefused> {
    let unsynced: Vec<String> = kinds
        .iter()
        .filter(|k| k.synced.is_none())
        .map(|k| k.kind.clone())
        .collect();
    if unsynced.is_empty() {
        return Ok(());
    }
    Err(TargetRefused::Unsynced {
        peer: cfg.source_cluster.clone(),
        kinds: unsynced,
    })
}

/// Check `local` (the Standby of `cfg`, whose source is the peer) before a promotion: refuse
/// divergent objects; with `require_synced`, refuse a kind whose initial full LIST from the peer is
/// not recorded as applied (a position alone is not enough). Returns every kind's position (to report
/// what an unplanned promotion may lose). The commands run [`super::check_promotion`], which reads
/// `cfg` from the checkpoint.
#[tracing::instrument(skip_all, fields(peer = %cfg.source_cluster))]
pub async fn check_target(
    cfg: &MirrorConfig,
    local: &Client,
    require_synced_kinds: bool,
) -> Result<Vec<KindPosition>, TargetRefused> {
    promotable(&divergent_objects(cfg, local).await?)?;
    let cp = read_checkpoint(cfg, local).await?;
    let kinds = positions(cfg, &cp);
    if require_synced_kinds {
        require_synced(cfg, &kinds)?;
    }
    Ok(kinds)
}

/// One mirrored kind as `kshard ha status --kind` shows it, read from this cluster's checkpoint and
/// the peer.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MirrorKindReport {
    /// `<plural>.<group>`.
    pub kind: String,
    /// The position checkpointed from the peer.
    pub position: Option<u64>,
    /// The peer's collection resourceVersion now (a `limit=1` LIST).
    pub active_rv: Option<u64>,
    /// Objects in scope on the peer above the position (every one if there is no position).
    pub behind: Option<usize>,
    /// Objects here that are not copies of the peer's.
    pub divergent: usize,
    /// What could not be read.
    pub error: Option<String>,
}

/// The mirror as `kshard ha status --kind` shows it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MirrorReport {
    /// The peer (the mirror's source).
    pub source: String,
    /// The duty's phase as it last recorded it (`None`: no duty ran here).
    pub duty: Option<String>,
    /// The `was-active` mark: this cluster admitted at that epoch and has not failed back since.
    pub was_active: Option<String>,
    /// A standing hold request (a token promotion's catch-up, or a forced promotion's hold) and whether
    /// the mirror acknowledged it: an acknowledged one means the mirror copies nothing until the request
    /// leaves the checkpoint.
    pub hold: Option<String>,
    /// Per kind.
    pub kinds: Vec<MirrorKindReport>,
}

/// The standing hold request of checkpoint `cp`, as `kshard ha status --kind` shows it (pure).
#[must_use]
pub fn hold_state(cp: &BTreeMap<String, String>) -> Option<String> {
    use crate::checkpoint::{
        caught_up, parse_hold, DemotionToken, CATCH_UP_KEY, CAUGHT_UP_KEY, HOLD_KEY,
    };
    let (what, id) = match cp
        .get(CATCH_UP_KEY)
        .and_then(|t| t.parse::<DemotionToken>().ok())
    {
        Some(t) => ("catch-up to token", t.id),
        None => {
            let (_, id) = cp.get(HOLD_KEY).and_then(|h| parse_hold(h))?;
            ("hold for a forced promotion", id)
        }
    };
    let acked = cp.get(CAUGHT_UP_KEY).and_then(|a| caught_up(a, &id));
    Some(match acked {
        Some(failed) => format!(
            "{what} {id}: the mirror holds ({failed} failed objects); it copies nothing until the request leaves the checkpoint"
        ),
        None => format!("{what} {id}: asked, not acknowledged yet"),
    })
}

pub(crate) async fn read_checkpoint(
    cfg: &MirrorConfig,
    local: &Client,
) -> Result<BTreeMap<String, String>, MirrorError> {
    let api: Api<ConfigMap> = Api::namespaced(local.clone(), &cfg.ha.namespace);
    Ok(api
        .get_opt(&checkpoint_name(&cfg.ha))
        .await
        .map_err(api_err("reading the checkpoint"))?
        .and_then(|c| c.data)
        .unwrap_or_default())
}

/// What the peer holds of `kind` beyond `position`: its collection version and the objects above.
async fn peer_side(
    cfg: &MirrorConfig,
    peer: &Client,
    kind: &crate::checkpoint::Kind,
    position: Option<u64>,
) -> Result<(u64, usize), MirrorError> {
    let api = KindApi::resolve(peer, kind).await?;
    let page = api
        .all()
        .list(&kube::api::ListParams::default().limit(1))
        .await
        .map_err(api_err(format!("probing {kind}")))?;
    let rv = parse_rv(
        page.metadata
            .resource_version
            .as_deref()
            .unwrap_or_default(),
        &kind.key(),
    )?;
    let mut behind = 0;
    for o in api.list(None).await? {
        if !in_scope(cfg, kind, &o) {
            continue;
        }
        let orv = parse_rv(
            o.metadata.resource_version.as_deref().unwrap_or_default(),
            &kind.key(),
        )?;
        if position.is_none_or(|p| orv > p) {
            behind += 1;
        }
    }
    Ok((rv, behind))
}

/// The mirror of `cfg` on `local` against `peer`, kind by kind; what cannot be read is reported in
/// the row, never an error.
#[tracing::instrument(skip_all, fields(peer = %cfg.source_cluster))]
pub async fn mirror_report(cfg: &MirrorConfig, local: &Client, peer: &Client) -> MirrorReport {
    let (cp, cp_err) = match read_checkpoint(cfg, local).await {
        Ok(cp) => (cp, None),
        Err(e) => (BTreeMap::new(), Some(e.to_string())),
    };
    let (divergent, div_err) = match divergent_objects(cfg, local).await {
        Ok(d) => (d, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let mut kinds = Vec::new();
    for k in cfg.kinds.mirrored() {
        let key = k.key();
        let position = position_from(&cp, &key, &cfg.source_cluster);
        let (active_rv, behind, peer_err) = match peer_side(cfg, peer, k, position).await {
            Ok((rv, b)) => (Some(rv), Some(b), None),
            Err(e) => (None, None, Some(e.to_string())),
        };
        let error = [&cp_err, &div_err, &peer_err]
            .into_iter()
            .flatten()
            .cloned()
            .collect::<Vec<_>>();
        kinds.push(MirrorKindReport {
            divergent: divergent.iter().filter(|d| d.at.kind == key).count(),
            kind: key,
            position,
            active_rv,
            behind,
            error: (!error.is_empty()).then(|| error.join("; ")),
        });
    }
    MirrorReport {
        source: cfg.source_cluster.clone(),
        duty: cp.get(DUTY_KEY).cloned(),
        was_active: cp.get(WAS_ACTIVE_KEY).cloned(),
        hold: hold_state(&cp),
        kinds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_standing_request_shows_whether_the_mirror_holds() {
        let mut cp = BTreeMap::new();
        assert_eq!(hold_state(&cp), None);
        cp.insert("hold".to_string(), "e=1001 id=force-1".to_string());
        assert!(hold_state(&cp)
            .unwrap()
            .contains("forced promotion force-1: asked"));
        cp.insert("caught-up".to_string(), "force-1 failed=0".to_string());
        assert!(hold_state(&cp)
            .unwrap()
            .contains("the mirror holds (0 failed"));
        // a catch-up request wins over a bare hold, and another token's acknowledgement does not count
        cp.insert(
            "catch-up".to_string(),
            "v1;src=a/u;e=1001;k=widgets.example.com:5;id=t7".to_string(),
        );
        assert!(hold_state(&cp).unwrap().contains("token t7: asked"));
        cp.insert("caught-up".to_string(), "t7 failed=2".to_string());
        assert!(hold_state(&cp).unwrap().contains("(2 failed objects)"));
        cp.insert("hold".to_string(), "garbage".to_string());
        cp.remove("catch-up");
        assert_eq!(hold_state(&cp), None, "an unreadable request is none");
    }

    #[test]
    fn positions_count_from_any_incarnation_of_the_peer_only() {
        let d = BTreeMap::from([
            (
                "widgets.example.com".to_string(),
                "v1 source=a/u1 rv=1200".to_string(),
            ),
            ("configmaps".to_string(), "v1 source=c/u9 rv=7".to_string()),
            ("secrets".to_string(), "garbage".to_string()),
        ]);
        assert_eq!(position_from(&d, "widgets.example.com", "a"), Some(1200));
        assert_eq!(position_from(&d, "configmaps", "a"), None);
        assert_eq!(position_from(&d, "secrets", "a"), None);
        assert_eq!(position_from(&d, "jobs.batch", "a"), None);
    }
}
