//! `kshard ha check`: both clusters' (and the witness's) HA settings read and compared in one table.
//!
//! Each side publishes its identity ([`super::identity`]); the HA Leases carry their writer's identity
//! ([`super::record::Origin`]). [`compare`] is pure: it takes what [`read_side`] found and lists every
//! mismatch the pair's safety rests on — one cluster id on both sides, one rank on both sides, two
//! kubeconfigs reaching one cluster, an identity copied from another cluster, differing witness settings
//! or timings, differing mirrored kinds, a pending demotion token whose kinds are not the mirror's, and
//! a Lease record written from a cluster that is neither side. An empty list is a consistent pair.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};

use super::config::HaConfig;
use super::identity::{self, Identity};
use super::record::{self, Record};
use super::HaClients;
use crate::checkpoint::DemotionToken;

/// What one cluster shows.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct SideFacts {
    /// `this`, `peer` or `witness`.
    pub side: &'static str,
    /// The uid of its `kube-system` namespace (`Err`: why it could not be read).
    pub uid: Option<Result<String, String>>,
    /// The identity its operator published (`None`: none; `Err`: unreadable or malformed).
    #[serde(skip)]
    pub identity: Option<Result<Identity, String>>,
    /// The HA Lease's record (`None`: missing; `Err`: unreadable or undecodable).
    #[serde(skip)]
    pub record: Option<Result<Record, String>>,
}

/// One mismatch.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Finding {
    /// What is checked (a short stable word).
    pub check: &'static str,
    /// What is wrong, naming both values.
    pub detail: String,
}

fn finding(check: &'static str, detail: impl Into<String>) -> Finding {
    Finding {
        check,
        detail: detail.into(),
    }
}

/// The identities of this side and the peer, when both decode.
fn identities<'a>(a: &'a SideFacts, b: &'a SideFacts) -> Option<(&'a Identity, &'a Identity)> {
    match (&a.identity, &b.identity) {
        (Some(Ok(x)), Some(Ok(y))) => Some((x, y)),
        _ => None,
    }
}

/// Compare what both clusters (and the witness) show (pure). `expected_kinds`: the kinds the caller
/// expects the mirrors to cover (`--kind`), a cross-check.
#[must_use]
pub fn compare(
    this: &SideFacts,
    peer: &SideFacts,
    witness: Option<&SideFacts>,
    expected_kinds: &BTreeSet<String>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in [this, peer].into_iter().chain(witness) {
        if let Some(Err(e)) = &s.uid {
            out.push(finding("reachable", format!("{}: {e}", s.side)));
        }
    }
    for s in [this, peer] {
        match (&s.identity, &s.uid) {
            (None, _) => out.push(finding(
                "identity",
                format!(
                    "{}: no identity published (the operator has not started, or is a build before identities)",
                    s.side
                ),
            )),
            (Some(Err(e)), _) => out.push(finding("identity", format!("{}: {e}", s.side))),
            (Some(Ok(i)), Some(Ok(uid))) if i.uid != *uid => out.push(finding(
                "identity",
                format!(
                    "{}: the published identity names kube-system uid {} but this cluster's is {uid} (copied or restored from another cluster)",
                    s.side, i.uid
                ),
            )),
            _ => {}
        }
    }
    if let (Some(Ok(x)), Some(Ok(y))) = (&this.uid, &peer.uid) {
        if x == y {
            out.push(finding(
                "two clusters",
                format!("both kubeconfigs reach one cluster (kube-system uid {x})"),
            ));
        }
    }
    if let Some((a, b)) = identities(this, peer) {
        out.extend(pair_findings(a, b, witness.is_some(), expected_kinds));
    }
    out.extend(record_findings(this, peer, witness));
    out
}

fn kinds_word(k: &Option<BTreeSet<String>>) -> String {
    match k {
        None => "no mirror".into(),
        Some(k) if k.is_empty() => "no kinds".into(),
        Some(k) => k.iter().cloned().collect::<Vec<_>>().join(","),
    }
}

/// The settings both identities must agree on (pure).
fn pair_findings(
    a: &Identity,
    b: &Identity,
    witness_given: bool,
    expected: &BTreeSet<String>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    if a.cluster == b.cluster {
        out.push(finding(
            "cluster id",
            format!(
                "both sides are --ha-cluster-id {:?}: each takes the other's term for its own",
                a.cluster
            ),
        ));
    }
    if a.rank == b.rank {
        out.push(finding(
            "rank",
            format!(
                "both sides are --ha-rank {}: two promotions would take equal epochs",
                a.rank
            ),
        ));
    }
    if a.witness != b.witness {
        out.push(finding(
            "witness",
            format!(
                "this side's witness namespace is {:?}, the peer's {:?}",
                a.witness, b.witness
            ),
        ));
    }
    if a.witness.is_some() != witness_given {
        out.push(finding(
            "witness",
            format!(
                "the operators {} a witness, this check was {} one (--witness-kubeconfig)",
                if a.witness.is_some() {
                    "use"
                } else {
                    "do not use"
                },
                if witness_given { "given" } else { "not given" }
            ),
        ));
    }
    if a.timings_ms != b.timings_ms {
        out.push(finding(
            "timings",
            format!(
                "lease/renew/request ms: this side {:?}, the peer {:?}",
                a.timings_ms, b.timings_ms
            ),
        ));
    }
    if a.kinds != b.kinds {
        out.push(finding(
            "mirrored kinds",
            format!(
                "this side: {}; the peer: {} (a switchover carries only what both mirror)",
                kinds_word(&a.kinds),
                kinds_word(&b.kinds)
            ),
        ));
    }
    if !expected.is_empty() {
        for i in [a, b] {
            if i.kinds.as_ref() != Some(expected) {
                out.push(finding(
                    "mirrored kinds",
                    format!(
                        "{}: {}; --kind says {}",
                        i.cluster,
                        kinds_word(&i.kinds),
                        kinds_word(&Some(expected.clone()))
                    ),
                ));
            }
        }
    }
    out
}

/// Each Lease record against the identities, and a pending token's kinds against the mirrors' (pure).
fn record_findings(
    this: &SideFacts,
    peer: &SideFacts,
    witness: Option<&SideFacts>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let ids: Vec<&Identity> = [this, peer]
        .iter()
        .filter_map(|s| s.identity.as_ref()?.as_ref().ok())
        .collect();
    for s in [this, peer].into_iter().chain(witness) {
        match &s.record {
            Some(Err(e)) => out.push(finding("lease", format!("{}: {e}", s.side))),
            Some(Ok(r)) => {
                let writer = ids.iter().find(|i| i.cluster == r.cluster);
                match (writer, &r.origin) {
                    (None, _) if ids.len() == 2 => out.push(finding(
                        "lease",
                        format!(
                            "{}: the HA Lease names cluster {:?}, which neither side is",
                            s.side, r.cluster
                        ),
                    )),
                    (Some(i), Some(o)) if o.uid != i.uid => out.push(finding(
                        "lease",
                        format!(
                            "{}: the HA Lease names {:?} but was written from kube-system uid {} (that side's is {})",
                            s.side, r.cluster, o.uid, i.uid
                        ),
                    )),
                    _ => {}
                }
                out.extend(token_findings(s.side, r, &ids));
            }
            None => {}
        }
    }
    out
}

/// A pending demotion token whose kinds differ from a mirror's (pure).
fn token_findings(side: &str, r: &Record, ids: &[&Identity]) -> Vec<Finding> {
    let Some(t) = r
        .state
        .token
        .as_deref()
        .and_then(|t| t.parse::<DemotionToken>().ok())
    else {
        return Vec::new();
    };
    let covered: BTreeSet<String> = t.kinds.keys().cloned().collect();
    ids.iter()
        .filter(|i| i.cluster != t.cluster)
        .filter_map(|i| {
            let k = i.kinds.as_ref()?;
            (*k != covered).then(|| {
                finding(
                    "token kinds",
                    format!(
                        "{side}: the demotion token covers {}, the mirror of {} {}",
                        kinds_word(&Some(covered.clone())),
                        i.cluster,
                        kinds_word(&Some(k.clone()))
                    ),
                )
            })
        })
        .collect()
}

async fn bounded<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {limit:?}")),
    }
}

/// Read what the cluster `client` shows for the pair `cfg` (`lease_ns`: where its HA Lease lives).
pub async fn read_side(
    side: &'static str,
    client: &Client,
    cfg: &HaConfig,
    lease_ns: &str,
    identity_too: bool,
    limit: Duration,
) -> SideFacts {
    let ns: Api<Namespace> = Api::all(client.clone());
    let uid = bounded(limit, ns.get("kube-system")).await.and_then(|n| {
        n.metadata
            .uid
            .ok_or_else(|| "kube-system has no uid".into())
    });
    let identity = if identity_too {
        match bounded(limit, identity::read(client, cfg)).await {
            Ok(None) => None,
            Ok(Some(r)) => Some(r.map_err(|e| e.to_string())),
            Err(e) => Some(Err(e)),
        }
    } else {
        None
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), lease_ns);
    let record = match bounded(limit, leases.get_opt(&cfg.lease_name())).await {
        Ok(None) => None,
        Ok(Some(l)) => Some(record::decode(&l).map_err(|e| e.to_string())),
        Err(e) => Some(Err(e)),
    };
    SideFacts {
        side,
        uid: Some(uid),
        identity,
        record,
    }
}

/// What `kshard ha check` prints.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct CheckReport {
    /// What each cluster showed.
    pub sides: Vec<SideFacts>,
    /// Every mismatch (empty: consistent).
    pub findings: Vec<Finding>,
}

/// Read both clusters (and the witness) and compare them.
#[tracing::instrument(skip_all, fields(ha = %cfg.name))]
pub async fn check(
    cfg: &HaConfig,
    clients: &HaClients,
    expected_kinds: &BTreeSet<String>,
    limit: Duration,
) -> CheckReport {
    let this = read_side("this", &clients.local, cfg, &cfg.namespace, true, limit).await;
    let peer = read_side("peer", &clients.peer, cfg, &cfg.namespace, true, limit).await;
    let witness = match &clients.witness {
        Some(w) => Some(read_side("witness", w, cfg, &cfg.witness_namespace, false, limit).await),
        None => None,
    };
    let findings = compare(&this, &peer, witness.as_ref(), expected_kinds);
    CheckReport {
        sides: [this, peer].into_iter().chain(witness).collect(),
        findings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(cluster: &str, uid: &str, rank: u16) -> Identity {
        let mut i = Identity::decode(
            &[
                ("version", "1"),
                ("clusterId", cluster),
                ("kubeSystemUid", uid),
                ("rank", &rank.to_string()),
                ("witnessNamespace", "none"),
                ("leaseDurationMs", "15000"),
                ("renewDeadlineMs", "10000"),
                ("requestTimeoutMs", "2500"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        )
        .unwrap();
        i.kinds = Some(["widgets.example.com".to_string()].into());
        i
    }

    fn side(s: &'static str, uid: &str, i: Identity) -> SideFacts {
        SideFacts {
            side: s,
            uid: Some(Ok(uid.into())),
            identity: Some(Ok(i)),
            record: None,
        }
    }

    fn checks(f: &[Finding]) -> Vec<&'static str> {
        f.iter().map(|f| f.check).collect()
    }

    #[test]
    fn a_consistent_pair_has_no_finding() {
        let a = side("this", "ua", id("a", "ua", 1));
        let b = side("peer", "ub", id("b", "ub", 2));
        assert_eq!(compare(&a, &b, None, &BTreeSet::new()), vec![]);
    }

    #[test]
    fn each_mismatch_is_named() {
        let none = BTreeSet::new();
        let a = side("this", "ua", id("prod", "ua", 1));
        let b = side("peer", "ub", id("prod", "ub", 1));
        assert_eq!(
            checks(&compare(&a, &b, None, &none)),
            ["cluster id", "rank"]
        );
        let mut bi = id("b", "ub", 2);
        bi.kinds = Some(["widgets.example.com".into(), "gadgets.example.com".into()].into());
        let b = side("peer", "ub", bi);
        let a = side("this", "ua", id("a", "ua", 1));
        assert_eq!(checks(&compare(&a, &b, None, &none)), ["mirrored kinds"]);
        // one cluster behind both kubeconfigs, and an identity restored from elsewhere
        let b = side("peer", "ua", id("b", "ux", 2));
        assert_eq!(
            checks(&compare(&a, &b, None, &none)),
            ["identity", "two clusters"]
        );
        // --kind cross-check
        let b = side("peer", "ub", id("b", "ub", 2));
        let expected = ["gadgets.example.com".to_string()].into();
        assert_eq!(
            checks(&compare(&a, &b, None, &expected)),
            ["mirrored kinds", "mirrored kinds"]
        );
        // no identity published
        let b = SideFacts {
            identity: None,
            ..side("peer", "ub", id("b", "ub", 2))
        };
        assert_eq!(checks(&compare(&a, &b, None, &none)), ["identity"]);
    }
}
