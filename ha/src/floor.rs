//! The epoch floor: the highest failover epoch that survives outside the HA Leases, read once before the
//! elector starts so that every epoch this process takes is above it
//! ([`ElectorConfig::floor`](super::ElectorConfig::floor)).
//!
//! Sources: the minimum-epoch parameter and the checkpoint's `was-active` mark in each cluster, and the
//! fence stamps on up to [`STAMP_SAMPLE`] objects per kind of
//! [`HaConfigBuilder::stamped_kinds`](super::HaConfigBuilder::stamped_kinds) in both clusters. A source
//! that cannot be read is skipped with a warning: a missed stamp costs liveness, never safety.
//!
//! See `docs/ha.md#epochs-never-go-back`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use tracing::{info, warn};

use super::config::HaConfig;
use super::epoch::FailoverEpoch;
use super::min_epoch::min_epoch_name;
use crate::checkpoint::{Kind, WAS_ACTIVE_KEY};
use crate::config::checkpoint_name;
use kube_shard::fence_policy::MIN_EPOCH_KEY;
use kube_shard::token::{FenceToken, FENCE_ANNOTATION};

/// The most objects per kind and cluster whose stamps a start reads.
pub const STAMP_SAMPLE: u32 = 500;

/// The highest epoch found, and where.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Floor {
    /// The highest epoch (default (0, 0): nothing survived).
    pub epoch: FailoverEpoch,
    /// Where it was found (for the log).
    pub source: Option<String>,
}

impl Floor {
    fn raise(&mut self, e: FailoverEpoch, source: impl FnOnce() -> String) {
        if e > self.epoch {
            self.epoch = e;
            self.source = Some(source());
        }
    }
}

/// The epoch of a ConfigMap value holding a wire epoch (pure; a malformed value is none).
fn wire_value(data: &BTreeMap<String, String>, key: &str) -> Option<FailoverEpoch> {
    FailoverEpoch::from_wire(data.get(key)?.trim().parse().ok()?).ok()
}

/// The failover epoch of an object's fence stamp (pure; a malformed or missing stamp is none).
fn stamp(m: &ObjectMeta) -> Option<FailoverEpoch> {
    let t: FenceToken = m
        .annotations
        .as_ref()?
        .get(FENCE_ANNOTATION)?
        .parse()
        .ok()?;
    Some(t.failover())
}

/// Read the floor from the clusters `clients` reach (this cluster first), each request bounded by
/// `limit`.
#[tracing::instrument(skip_all, fields(ha = %cfg.name))]
pub async fn read(cfg: &HaConfig, clients: &[(&str, &Client)], limit: Duration) -> Floor {
    let mut floor = Floor::default();
    for &(which, c) in clients {
        let cms: Api<ConfigMap> = Api::namespaced(c.clone(), &cfg.namespace);
        for (name, key) in [
            (min_epoch_name(cfg), MIN_EPOCH_KEY),
            (checkpoint_name(cfg), WAS_ACTIVE_KEY),
        ] {
            match tokio::time::timeout(limit, cms.get_opt(&name)).await {
                Ok(Ok(cm)) => {
                    let data = cm.and_then(|c| c.data).unwrap_or_default();
                    if let Some(e) = wire_value(&data, key) {
                        floor.raise(e, || format!("{which} cluster: ConfigMap {name} {key}"));
                    }
                }
                Ok(Err(e)) => {
                    warn!(cluster = which, configmap = %name, error = %e, "HA: cannot read a surviving epoch")
                }
                Err(_) => {
                    warn!(cluster = which, configmap = %name, "HA: reading a surviving epoch timed out")
                }
            }
        }
        for k in &cfg.stamped_kinds {
            match tokio::time::timeout(limit, stamps(c, k)).await {
                Ok(Ok(Some((e, obj)))) => {
                    floor.raise(e, || format!("{which} cluster: {k} {obj} fence stamp"));
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    warn!(cluster = which, kind = %k, error = %e, "HA: cannot read the fence stamps of a kind")
                }
                Err(_) => {
                    warn!(cluster = which, kind = %k, "HA: reading the fence stamps of a kind timed out")
                }
            }
        }
    }
    if let Some(s) = &floor.source {
        info!(floor = %floor.epoch, source = %s, "HA: the highest surviving epoch; new epochs start above it");
    }
    floor
}

/// The highest stamp among the first [`STAMP_SAMPLE`] objects of `k`, and the object (`ns/name`).
async fn stamps(c: &Client, k: &Kind) -> Result<Option<(FailoverEpoch, String)>, kube::Error> {
    let ar = kube::api::ApiResource {
        group: k.group.clone(),
        version: k.version.clone(),
        api_version: if k.group.is_empty() {
            k.version.clone()
        } else {
            format!("{}/{}", k.group, k.version)
        },
        kind: String::new(),
        plural: k.plural.clone(),
    };
    let api: Api<DynamicObject> = Api::all_with(c.clone(), &ar);
    let page = api
        .list_metadata(&ListParams::default().limit(STAMP_SAMPLE))
        .await?;
    Ok(page
        .items
        .iter()
        .filter_map(|o| {
            let e = stamp(&o.metadata)?;
            let at = match &o.metadata.namespace {
                Some(ns) => format!("{ns}/{}", o.metadata.name.as_deref().unwrap_or("?")),
                None => o.metadata.name.clone().unwrap_or_default(),
            };
            Some((e, at))
        })
        .max_by_key(|(e, _)| *e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_value_or_stamp_counts_as_none() {
        let d: BTreeMap<String, String> = [
            ("a".to_string(), "2002".to_string()),
            ("b".to_string(), "x".to_string()),
            ("c".to_string(), "99999999999999999999".to_string()),
        ]
        .into();
        assert_eq!(wire_value(&d, "a"), FailoverEpoch::new(2, 2).ok());
        assert_eq!(wire_value(&d, "b"), None);
        assert_eq!(wire_value(&d, "c"), None);
        assert_eq!(wire_value(&d, "missing"), None);
        let mut o = ObjectMeta::default();
        assert_eq!(stamp(&o), None);
        o.annotations = Some([(FENCE_ANNOTATION.to_string(), "7002:3/9".to_string())].into());
        assert_eq!(stamp(&o), FailoverEpoch::new(7, 2).ok());
        o.annotations = Some([(FENCE_ANNOTATION.to_string(), "junk".to_string())].into());
        assert_eq!(stamp(&o), None);
    }

    #[test]
    fn the_floor_only_rises() {
        let mut f = Floor::default();
        f.raise(FailoverEpoch::new(3, 1).unwrap(), || "x".into());
        f.raise(FailoverEpoch::new(2, 2).unwrap(), || "y".into());
        assert_eq!(
            (f.epoch, f.source.as_deref()),
            (FailoverEpoch::new(3, 1).unwrap(), Some("x"))
        );
    }
}
