//! The HA Lease codec. What every version can read lives in fields of its own: `spec.holderIdentity` =
//! `<cluster-id>/<epoch>` and `spec.leaseTransitions` = the epoch's wire form; the writer's `renew_deadline`
//! and request timeout are published in a versioned annotation next to `spec.leaseDurationSeconds`. A Lease
//! that does not decode is never overwritten: the elector treats it as "a higher epoch may exist".

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::ObjectMeta;

use super::epoch::FailoverEpoch;

/// The annotation holding the writer's published timings (format version 1).
pub const TIMINGS_ANNOTATION: &str = "kube-shard.io/ha-timings";
/// The label every HA Lease carries (value: the HA name), so tools can list them.
pub const HA_LABEL: &str = "kube-shard.io/ha";
/// The annotation holding the holder's switchover state (format version 1); absent means "active, seq 0".
pub const STATE_ANNOTATION: &str = "kube-shard.io/ha-state";
/// The annotation holding the writer's identity (format version 1): the uid of its cluster's `kube-system`
/// namespace and its configured rank. Absent on records of older builds.
pub const IDENTITY_ANNOTATION: &str = "kube-shard.io/ha-identity";

/// Who wrote a record, beyond its cluster id: two clusters given one id (shared Helm values) differ here, and
/// two sides given one rank are seen before their epochs tie.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Origin {
    /// The uid of the writer's `kube-system` namespace (its cluster, whatever id it was given).
    pub uid: String,
    /// The writer's configured rank (`--ha-rank`) when it wrote.
    pub rank: u16,
}

impl Origin {
    fn text(&self) -> String {
        format!("v1 uid={} rank={}", self.uid, self.rank)
    }

    fn parse(s: &str) -> Option<Origin> {
        let rest = s.strip_prefix("v1 ")?;
        let (mut uid, mut rank) = (None, None);
        for part in rest.split_whitespace() {
            let (k, v) = part.split_once('=')?;
            match k {
                "uid" if !v.is_empty() && v.len() <= 64 => uid = Some(v.to_string()),
                "rank" => rank = Some(v.parse().ok()?),
                "uid" => return None,
                _ => {} // later versions may add keys
            }
        }
        Some(Origin {
            uid: uid?,
            rank: rank?,
        })
    }
}

/// The holder's planned-switchover state at its epoch (HA.md contract 2). `seq` only rises within an
/// epoch: every command that changes the state (`demote`, the token, `demote --cancel`) writes `seq + 1`,
/// and a process adopts the record with the highest `seq` it reads, so an older copy of the state in
/// another Lease never undoes a newer one.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct HaState {
    /// Rises with every change of the state within one epoch.
    pub seq: u64,
    /// `demoting`: the holder admits nothing and its members drain (`ha-drained` acks).
    pub demoting: bool,
    /// The demotion token, once taken (only while demoting).
    pub token: Option<String>,
}

impl HaState {
    pub(crate) fn text(&self) -> Option<String> {
        if *self == HaState::default() {
            return None;
        }
        let mut s = format!(
            "v1 seq={} {}",
            self.seq,
            if self.demoting { "demoting" } else { "active" }
        );
        if let Some(t) = &self.token {
            s.push_str(" token=");
            s.push_str(t);
        }
        Some(s)
    }

    fn parse(s: &str) -> Option<HaState> {
        let mut parts = s.strip_prefix("v1 ")?.split_whitespace();
        let seq = parts.next()?.strip_prefix("seq=")?.parse().ok()?;
        let demoting = match parts.next()? {
            "demoting" => true,
            "active" => false,
            _ => return None,
        };
        let token = match parts.next() {
            None => None,
            Some(t) => Some(t.strip_prefix("token=")?.to_string()),
        };
        if parts.next().is_some() || (token.is_some() && !demoting) {
            return None;
        }
        Some(HaState {
            seq,
            demoting,
            token,
        })
    }
}

/// The timings a writer publishes: a taker waits `max(own lease_duration, renew_deadline + request_timeout)
/// + grace` from its observation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Published {
    /// The writer's `lease_duration` (`spec.leaseDurationSeconds`, whole seconds, rounded up).
    pub lease_duration: Duration,
    /// The writer's `renew_deadline`.
    pub renew_deadline: Duration,
    /// The writer's request timeout.
    pub request_timeout: Duration,
}

/// What an HA Lease says: cluster `cluster` holds epoch `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    /// The holder's cluster id.
    pub cluster: String,
    /// The failover epoch.
    pub epoch: FailoverEpoch,
    /// The writer's timings.
    pub timings: Published,
    /// The planned-switchover state.
    pub state: HaState,
    /// The writer's identity (`None`: written by an older build, which publishes none).
    pub origin: Option<Origin>,
}

/// Why a Lease does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// No `spec`, or no `spec.holderIdentity`.
    #[error("no holderIdentity")]
    NoHolder,
    /// `holderIdentity` is not `<cluster-id>/<epoch>`.
    #[error("holderIdentity {0:?} is not <cluster-id>/<epoch>")]
    Holder(String),
    /// `spec.leaseTransitions` differs from the holder's epoch.
    #[error("leaseTransitions {got:?} differs from the holder's epoch {want}")]
    Transitions {
        /// What the Lease says.
        got: Option<i32>,
        /// The holder's epoch (wire form).
        want: u64,
    },
    /// The timings annotation is missing or not version 1.
    #[error("timings annotation {0:?} missing or of an unknown format")]
    Timings(Option<String>),
    /// The state annotation is not version 1.
    #[error("state annotation {0:?} of an unknown format")]
    State(String),
    /// The identity annotation is not version 1 with a uid and a rank.
    #[error("identity annotation {0:?} of an unknown format")]
    Identity(String),
}

impl Record {
    /// `<cluster-id>/<epoch>`.
    #[must_use]
    pub fn holder(&self) -> String {
        Record::holder_of(&self.cluster, self.epoch)
    }

    /// `<cluster-id>/<epoch>` of any cluster and epoch.
    #[must_use]
    pub fn holder_of(cluster: &str, epoch: FailoverEpoch) -> String {
        format!("{cluster}/{epoch}")
    }
}

fn timings_text(t: &Published) -> String {
    format!(
        "v1 renewDeadlineMs={} requestTimeoutMs={}",
        t.renew_deadline.as_millis(),
        t.request_timeout.as_millis()
    )
}

fn parse_timings(s: &str) -> Option<(Duration, Duration)> {
    let rest = s.strip_prefix("v1 ")?;
    let mut rd = None;
    let mut to = None;
    for part in rest.split_whitespace() {
        let (k, v) = part.split_once('=')?;
        let ms = Duration::from_millis(v.parse().ok()?);
        match k {
            "renewDeadlineMs" => rd = Some(ms),
            "requestTimeoutMs" => to = Some(ms),
            _ => {} // later versions may add keys
        }
    }
    Some((rd?, to?))
}

/// The Lease `name` in `namespace` holding `record` (no resourceVersion: the caller sets its precondition).
#[must_use]
pub fn encode(record: &Record, name: &str, namespace: &str, ha_name: &str) -> Lease {
    let secs = record.timings.lease_duration.as_secs_f64().ceil() as i32;
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                HA_LABEL.to_string(),
                ha_name.to_string(),
            )])),
            annotations: Some(
                [(
                    TIMINGS_ANNOTATION.to_string(),
                    timings_text(&record.timings),
                )]
                .into_iter()
                .chain(
                    record
                        .state
                        .text()
                        .map(|t| (STATE_ANNOTATION.to_string(), t)),
                )
                .chain(
                    record
                        .origin
                        .as_ref()
                        .map(|o| (IDENTITY_ANNOTATION.to_string(), o.text())),
                )
                .collect(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(record.holder()),
            lease_duration_seconds: Some(secs.max(1)),
            lease_transitions: i32::try_from(record.epoch.wire()).ok(),
            ..LeaseSpec::default()
        }),
    }
}

/// What `lease` says, or why it cannot be read.
pub fn decode(lease: &Lease) -> Result<Record, DecodeError> {
    let spec = lease.spec.as_ref().ok_or(DecodeError::NoHolder)?;
    let holder = spec
        .holder_identity
        .as_deref()
        .ok_or(DecodeError::NoHolder)?;
    let bad = || DecodeError::Holder(holder.to_string());
    let (cluster, wire) = holder.rsplit_once('/').ok_or_else(bad)?;
    if cluster.is_empty() || wire.starts_with('+') || (wire.len() > 1 && wire.starts_with('0')) {
        return Err(bad());
    }
    let epoch = FailoverEpoch::from_wire(wire.parse().map_err(|_| bad())?).map_err(|_| bad())?;
    if spec.lease_transitions.and_then(|t| u64::try_from(t).ok()) != Some(epoch.wire()) {
        return Err(DecodeError::Transitions {
            got: spec.lease_transitions,
            want: epoch.wire(),
        });
    }
    let ann = lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(TIMINGS_ANNOTATION));
    let (rd, to) = ann
        .and_then(|s| parse_timings(s))
        .ok_or_else(|| DecodeError::Timings(ann.cloned()))?;
    let ld = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .ok_or(DecodeError::Timings(ann.cloned()))?;
    let state = match lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(STATE_ANNOTATION))
    {
        None => HaState::default(),
        Some(s) => HaState::parse(s).ok_or_else(|| DecodeError::State(s.clone()))?,
    };
    let origin = match lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(IDENTITY_ANNOTATION))
    {
        None => None,
        Some(s) => Some(Origin::parse(s).ok_or_else(|| DecodeError::Identity(s.clone()))?),
    };
    Ok(Record {
        cluster: cluster.to_string(),
        epoch,
        timings: Published {
            lease_duration: Duration::from_secs(ld),
            renew_deadline: rd,
            request_timeout: to,
        },
        state,
        origin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Record {
        Record {
            cluster: "east".into(),
            epoch: FailoverEpoch::new(3, 2).unwrap(),
            timings: Published {
                lease_duration: Duration::from_secs(15),
                renew_deadline: Duration::from_secs(10),
                request_timeout: Duration::from_millis(2500),
            },
            state: HaState::default(),
            origin: None,
        }
    }

    #[test]
    fn the_identity_round_trips_a_record_without_one_decodes_and_a_bad_one_is_undecodable() {
        let mut r = rec();
        assert_eq!(decode(&encode(&r, "n", "ns", "op")).unwrap().origin, None);
        r.origin = Some(Origin {
            uid: "0b6c2d1e-5b4f-4b7e-9a43-2f0d5d6c1a77".into(),
            rank: 2,
        });
        assert_eq!(decode(&encode(&r, "n", "ns", "op")).unwrap(), r);
        for bad in [
            "v2 uid=x rank=1",
            "v1 uid=x",
            "v1 rank=1",
            "v1 uid= rank=1",
            "v1 uid=x rank=-1",
        ] {
            let mut l = encode(&r, "n", "ns", "op");
            l.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(IDENTITY_ANNOTATION.into(), bad.into());
            assert!(matches!(decode(&l), Err(DecodeError::Identity(_))), "{bad}");
        }
    }

    #[test]
    fn the_state_round_trips_and_a_bad_one_is_undecodable() {
        let mut r = rec();
        for st in [
            HaState {
                seq: 1,
                demoting: true,
                token: None,
            },
            HaState {
                seq: 2,
                demoting: true,
                token: Some("v1;e=3002".into()),
            },
            HaState {
                seq: 3,
                demoting: false,
                token: None,
            },
        ] {
            r.state = st;
            assert_eq!(decode(&encode(&r, "n", "ns", "op")).unwrap(), r);
        }
        for bad in [
            "v2 seq=1 demoting",
            "v1 seq=x active",
            "v1 seq=1 active token=t",
            "v1 seq=1 demoting x",
        ] {
            let mut l = encode(&rec(), "n", "ns", "op");
            l.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(STATE_ANNOTATION.into(), bad.into());
            assert!(matches!(decode(&l), Err(DecodeError::State(_))), "{bad}");
        }
    }

    #[test]
    fn round_trips() {
        let l = encode(&rec(), "op-ha", "ops", "op");
        assert_eq!(
            l.spec.as_ref().unwrap().holder_identity.as_deref(),
            Some("east/3002")
        );
        assert_eq!(l.spec.as_ref().unwrap().lease_transitions, Some(3002));
        assert_eq!(decode(&l).unwrap(), rec());
    }

    #[test]
    fn every_malformed_field_is_undecodable() {
        let good = encode(&rec(), "op-ha", "ops", "op");
        let with = |f: &dyn Fn(&mut Lease)| {
            let mut l = good.clone();
            f(&mut l);
            decode(&l)
        };
        assert_eq!(with(&|l| l.spec = None), Err(DecodeError::NoHolder));
        for h in [
            "east",
            "/3002",
            "east/x",
            "east/03002",
            "east/+3002",
            "east/-1",
        ] {
            assert!(
                matches!(
                    with(&|l| l.spec.as_mut().unwrap().holder_identity = Some(h.into())),
                    Err(DecodeError::Holder(_))
                ),
                "{h}"
            );
        }
        assert!(matches!(
            with(&|l| l.spec.as_mut().unwrap().lease_transitions = Some(4002)),
            Err(DecodeError::Transitions { .. })
        ));
        assert!(matches!(
            with(&|l| l.metadata.annotations = None),
            Err(DecodeError::Timings(None))
        ));
        assert!(matches!(
            with(&|l| {
                l.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .insert(TIMINGS_ANNOTATION.into(), "v2 anything".into());
            }),
            Err(DecodeError::Timings(Some(_)))
        ));
    }

    #[test]
    fn cluster_ids_may_contain_slashes_only_before_the_epoch() {
        let mut r = rec();
        r.cluster = "eu/west".into();
        assert_eq!(
            decode(&encode(&r, "n", "ns", "op")).unwrap().cluster,
            "eu/west"
        );
    }
}
