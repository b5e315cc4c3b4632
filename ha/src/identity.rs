//! Each side's published HA identity: the ConfigMap `<name>-ha-identity` in its own HA namespace, written
//! only by that side's operator at start (a Standby writes no HA Lease and, without a mirror, no
//! checkpoint, so its records alone would never show its settings to the Active).
//!
//! It holds what the two sides' safety rests on and what nobody else compares: the cluster id, the
//! cluster's `kube-system` uid, the rank, the witness location and the timings. The running electors
//! read the peer's and hold, alarmed, on one cluster id written from two clusters or on one rank at both
//! sides; `kshard ha check` ([`super::check`]) compares everything, both sides and the witness, in one
//! table. The codec is pure; a malformed object is a [`IdentityError`], never a panic.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use super::config::{HaConfig, Timings};
use super::record::HA_LABEL;

/// The identity format's version (the `version` key).
pub const VERSION: &str = "1";

/// One side's identity as it publishes it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Identity {
    /// `--ha-cluster-id`.
    pub cluster: String,
    /// The uid of the cluster's `kube-system` namespace.
    pub uid: String,
    /// `--ha-rank`.
    pub rank: u16,
    /// The witness Lease's namespace (`None`: no witness; promotion is a command).
    pub witness: Option<String>,
    /// The elector's lease duration, renew deadline and request timeout, in milliseconds.
    pub timings_ms: [u64; 3],
    /// The kinds this side's mirror covers (`<plural>.<group>`; `None`: no mirror here).
    pub kinds: Option<BTreeSet<String>>,
}

/// A malformed identity ConfigMap.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// A key is missing or its value is not what it should be.
    #[error("the HA identity's {key:?} is missing or malformed: {value:?}")]
    Field {
        /// The key.
        key: &'static str,
        /// What it holds.
        value: Option<String>,
    },
    /// Written by a newer build.
    #[error("the HA identity has version {0:?}; this build reads version {VERSION}")]
    Version(String),
}

/// The ConfigMap's name for the HA pair `cfg`: `<name>-ha-identity`.
#[must_use]
pub fn identity_name(cfg: &HaConfig) -> String {
    format!("{}-ha-identity", cfg.name)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Identity {
    /// The identity of this side: `cfg`'s settings and the cluster's `kube-system` `uid`.
    #[must_use]
    pub fn of(cfg: &HaConfig, uid: impl Into<String>) -> Self {
        let t: &Timings = &cfg.timings;
        Identity {
            cluster: cfg.cluster_id.clone(),
            uid: uid.into(),
            rank: cfg.rank,
            witness: cfg.has_witness().then(|| cfg.witness_namespace.clone()),
            timings_ms: [
                ms(t.lease_duration),
                ms(t.renew_deadline),
                ms(t.request_timeout),
            ],
            kinds: cfg
                .mirrored_kinds
                .as_ref()
                .map(|k| k.iter().map(crate::checkpoint::Kind::key).collect()),
        }
    }

    /// The ConfigMap data (pure).
    #[must_use]
    pub fn encode(&self) -> BTreeMap<String, String> {
        let [l, r, t] = self.timings_ms;
        [
            ("version", VERSION.to_string()),
            ("clusterId", self.cluster.clone()),
            ("kubeSystemUid", self.uid.clone()),
            ("rank", self.rank.to_string()),
            (
                "witnessNamespace",
                self.witness.clone().unwrap_or_else(|| "none".into()),
            ),
            ("leaseDurationMs", l.to_string()),
            ("renewDeadlineMs", r.to_string()),
            ("requestTimeoutMs", t.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .chain(self.kinds.as_ref().map(|k| {
            (
                "mirroredKinds".to_string(),
                k.iter().cloned().collect::<Vec<_>>().join(","),
            )
        }))
        .collect()
    }

    /// Parse ConfigMap data (pure).
    pub fn decode(data: &BTreeMap<String, String>) -> Result<Self, IdentityError> {
        let get = |key: &'static str| {
            data.get(key)
                .filter(|v| !v.is_empty() && v.len() <= 253)
                .cloned()
                .ok_or(IdentityError::Field {
                    key,
                    value: data.get(key).cloned(),
                })
        };
        let num = |key: &'static str| {
            let v = get(key)?;
            v.parse::<u64>().map_err(|_| IdentityError::Field {
                key,
                value: Some(v),
            })
        };
        let version = get("version")?;
        if version != VERSION {
            return Err(IdentityError::Version(version));
        }
        let rank = u16::try_from(num("rank")?).map_err(|_| IdentityError::Field {
            key: "rank",
            value: data.get("rank").cloned(),
        })?;
        let witness = get("witnessNamespace")?;
        Ok(Identity {
            cluster: get("clusterId")?,
            uid: get("kubeSystemUid")?,
            rank,
            witness: (witness != "none").then_some(witness),
            timings_ms: [
                num("leaseDurationMs")?,
                num("renewDeadlineMs")?,
                num("requestTimeoutMs")?,
            ],
            kinds: data.get("mirroredKinds").map(|k| {
                k.split(',')
                    .filter(|k| !k.is_empty())
                    .map(String::from)
                    .collect()
            }),
        })
    }
}

/// Write `id` as this side's identity in the cluster `client` reaches (create, or replace when it
/// differs).
pub async fn publish(client: &Client, cfg: &HaConfig, id: &Identity) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cfg.namespace);
    let name = identity_name(cfg);
    let data = id.encode();
    match api.get_opt(&name).await? {
        Some(cm) if cm.data.as_ref() == Some(&data) => Ok(()),
        Some(mut cm) => {
            cm.data = Some(data);
            api.replace(&name, &PostParams::default(), &cm)
                .await
                .map(drop)
        }
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name),
                    labels: Some([(HA_LABEL.to_string(), cfg.name.clone())].into()),
                    ..ObjectMeta::default()
                },
                data: Some(data),
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &cm).await.map(drop)
        }
    }
}

/// Read the identity the side `client` reaches published (`Ok(None)`: none published, an older build
/// or an operator not started yet).
pub async fn read(
    client: &Client,
    cfg: &HaConfig,
) -> Result<Option<Result<Identity, IdentityError>>, kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &cfg.namespace);
    Ok(api
        .get_opt(&identity_name(cfg))
        .await?
        .map(|cm| Identity::decode(&cm.data.unwrap_or_default())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            cluster: "prod-a".into(),
            uid: "u-1".into(),
            rank: 2,
            witness: Some("ha".into()),
            timings_ms: [15_000, 10_000, 5_000],
            kinds: Some(["widgets.example.com".to_string()].into()),
        }
    }

    #[test]
    fn an_identity_survives_its_encoding() {
        let i = id();
        assert_eq!(Identity::decode(&i.encode()), Ok(i.clone()));
        let no_witness = Identity {
            witness: None,
            kinds: None,
            ..i
        };
        assert_eq!(
            Identity::decode(&no_witness.encode()),
            Ok(no_witness.clone())
        );
    }

    #[test]
    fn a_malformed_identity_is_an_error_naming_the_key() {
        let mut d = id().encode();
        d.insert("rank".into(), "70000".into());
        assert!(matches!(
            Identity::decode(&d),
            Err(IdentityError::Field { key: "rank", .. })
        ));
        d = id().encode();
        d.remove("kubeSystemUid");
        assert!(matches!(
            Identity::decode(&d),
            Err(IdentityError::Field {
                key: "kubeSystemUid",
                ..
            })
        ));
        d = id().encode();
        d.insert("version".into(), "2".into());
        assert_eq!(
            Identity::decode(&d),
            Err(IdentityError::Version("2".into()))
        );
        d = id().encode();
        d.insert("leaseDurationMs".into(), "x".repeat(10_000));
        assert!(Identity::decode(&d).is_err());
    }
}
