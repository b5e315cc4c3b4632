//! `kshard ha status`'s engine: [`read_pair`] reads both clusters' HA Leases and the witness's directly with
//! GETs, side by side, with the derived verdict ([`judge`], pure): which cluster is active at the highest
//! epoch, and **limbo** — a promotion that started (a record of the highest epoch exists) but did not
//! complete (the cluster it names does not record it in its own Lease, or, with a witness, the witness
//! does not confirm it). A pair in limbo has no cluster that may act; `kshard ha status` alerts on it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde::Serialize;

use crate::config::HaConfig;
use crate::driver::HaClients;
use crate::record;

/// One HA Lease as read by `kshard ha status`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct LeaseRead {
    /// `local`, `peer` or `witness`: whose cluster it lives in.
    pub cluster: &'static str,
    /// `present`, `missing`, `undecodable` or `unreadable`.
    pub state: &'static str,
    /// `<cluster-id>/<epoch>` when present and decodable.
    pub holder: Option<String>,
    /// The holder's cluster id.
    pub holder_cluster: Option<String>,
    /// The epoch on the wire (`n·1000 + rank`).
    pub epoch: Option<u64>,
    /// The epoch number n.
    pub epoch_n: Option<u64>,
    /// The resourceVersion read.
    pub resource_version: Option<String>,
    /// The writer's published renew deadline and request timeout, in ms.
    pub renew_deadline_ms: Option<u64>,
    /// The writer's published request timeout, in ms.
    pub request_timeout_ms: Option<u64>,
    /// Why it could not be read or decoded.
    pub error: Option<String>,
}

/// Both clusters' HA Leases (and the witness's) side by side, with the verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct PairStatus {
    /// The HA Lease name.
    pub lease: String,
    /// The Leases: local, peer, then the witness's if configured.
    pub leases: Vec<LeaseRead>,
    /// The highest epoch any decodable Lease records (wire form).
    pub highest_epoch: Option<u64>,
    /// The cluster whose term the Leases record at the highest epoch (its own Lease names it, and the
    /// witness confirms it when there is one); `None` when none does.
    pub active: Option<String>,
    /// A promotion that started and did not complete: no cluster may act until it completes or a human
    /// promotes again. `None` when the records agree.
    pub limbo: Option<String>,
    /// A Lease does not decode or cannot be read: a human must look.
    pub alarm: Option<String>,
}

async fn read_one(api: &Api<Lease>, name: &str, cluster: &'static str) -> LeaseRead {
    let mut out = LeaseRead {
        cluster,
        state: "missing",
        holder: None,
        holder_cluster: None,
        epoch: None,
        epoch_n: None,
        resource_version: None,
        renew_deadline_ms: None,
        request_timeout_ms: None,
        error: None,
    };
    match api.get_opt(name).await {
        Ok(None) => {}
        Ok(Some(l)) => {
            out.resource_version = l.metadata.resource_version.clone();
            match record::decode(&l) {
                Ok(r) => {
                    out.state = "present";
                    out.holder = Some(r.holder());
                    out.holder_cluster = Some(r.cluster.clone());
                    out.epoch = Some(r.epoch.wire());
                    out.epoch_n = Some(r.epoch.n());
                    out.renew_deadline_ms =
                        u64::try_from(r.timings.renew_deadline.as_millis()).ok();
                    out.request_timeout_ms =
                        u64::try_from(r.timings.request_timeout.as_millis()).ok();
                }
                Err(e) => {
                    out.state = "undecodable";
                    out.error = Some(e.to_string());
                }
            }
        }
        Err(e) => {
            out.state = "unreadable";
            out.error = Some(e.to_string());
        }
    }
    out
}

/// Read the HA Leases `<name>-ha` of both clusters (and the witness's) and judge them.
pub async fn read_pair(
    cfg: &HaConfig,
    clients: &HaClients,
    request_timeout: Duration,
) -> PairStatus {
    let name = cfg.lease_name();
    let get = |c: &kube::Client, ns: &str, who: &'static str| {
        let api: Api<Lease> = Api::namespaced(c.clone(), ns);
        let name = name.clone();
        async move {
            match tokio::time::timeout(request_timeout, read_one(&api, &name, who)).await {
                Ok(r) => r,
                Err(_) => LeaseRead {
                    cluster: who,
                    state: "unreadable",
                    holder: None,
                    holder_cluster: None,
                    epoch: None,
                    epoch_n: None,
                    resource_version: None,
                    renew_deadline_ms: None,
                    request_timeout_ms: None,
                    error: Some(format!("no answer within {request_timeout:?}")),
                },
            }
        }
    };
    let mut leases = vec![
        get(&clients.local, &cfg.namespace, "local").await,
        get(&clients.peer, &cfg.namespace, "peer").await,
    ];
    if let Some(w) = &clients.witness {
        leases.push(get(w, &cfg.witness_namespace, "witness").await);
    }
    judge(&cfg.cluster_id, name, leases)
}

/// The verdict on a set of reads (pure): `local_id` is the cluster id of the `local` Lease's cluster.
#[must_use]
pub fn judge(local_id: &str, lease: String, leases: Vec<LeaseRead>) -> PairStatus {
    let alarm = leases
        .iter()
        .find(|l| matches!(l.state, "undecodable" | "unreadable"))
        .map(|l| {
            format!(
                "the {} cluster's HA Lease is {}: {}",
                l.cluster,
                l.state,
                l.error.as_deref().unwrap_or("")
            )
        });
    let highest = leases.iter().filter_map(|l| l.epoch).max();
    let at = |l: &LeaseRead| highest.is_some() && l.epoch == highest;
    let top = leases
        .iter()
        .find(|l| at(l))
        .and_then(|l| l.holder_cluster.clone());
    let witness = leases.iter().find(|l| l.cluster == "witness");
    // the own Lease of the cluster the highest record names: `local` if that is this cluster, else `peer`
    let own_of = |id: &str| {
        let side = if id == local_id { "local" } else { "peer" };
        leases.iter().find(|l| l.cluster == side)
    };
    let (mut active, mut limbo) = (None, None);
    if let Some(id) = top {
        let own_records =
            own_of(&id).is_some_and(|l| at(l) && l.holder_cluster.as_deref() == Some(&id));
        let witness_confirms =
            witness.is_none_or(|w| at(w) && w.holder_cluster.as_deref() == Some(&id));
        if own_records && witness_confirms {
            active = Some(id);
        } else {
            let e = highest.unwrap_or_default();
            limbo = Some(if own_records {
                format!("{id} recorded epoch {e} in its own Lease but the witness does not confirm it (a candidacy that did not complete)")
            } else {
                format!("epoch {e} of {id} is recorded, but not in {id}'s own Lease (a promotion that did not complete)")
            });
        }
    }
    PairStatus {
        lease,
        leases,
        highest_epoch: highest,
        active,
        limbo,
        alarm,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(cluster: &'static str, holder: Option<(&str, u64)>) -> LeaseRead {
        LeaseRead {
            cluster,
            state: if holder.is_some() {
                "present"
            } else {
                "missing"
            },
            holder: holder.map(|(c, e)| format!("{c}/{e}")),
            holder_cluster: holder.map(|(c, _)| c.to_string()),
            epoch: holder.map(|(_, e)| e),
            epoch_n: holder.map(|(_, e)| e / 1000),
            resource_version: None,
            renew_deadline_ms: None,
            request_timeout_ms: None,
            error: None,
        }
    }

    #[test]
    fn the_active_is_the_cluster_its_own_lease_names_at_the_highest_epoch() {
        let s = judge(
            "b",
            "w-ha".into(),
            vec![
                read("local", Some(("a", 1001))),
                read("peer", Some(("a", 1001))),
            ],
        );
        assert_eq!(s.active.as_deref(), Some("a"));
        assert_eq!(s.limbo, None);
    }

    #[test]
    fn a_promotion_recorded_only_in_the_peer_lease_is_limbo() {
        // b's candidacy wrote a's Lease but not its own: nobody may act
        let s = judge(
            "a",
            "w-ha".into(),
            vec![
                read("local", Some(("b", 2002))),
                read("peer", Some(("a", 1001))),
            ],
        );
        assert_eq!(s.active, None);
        assert!(s.limbo.unwrap().contains("not in b's own Lease"));
    }

    #[test]
    fn with_a_witness_an_unconfirmed_record_is_limbo() {
        let s = judge(
            "a",
            "w-ha".into(),
            vec![
                read("local", Some(("a", 1001))),
                read("peer", Some(("b", 2002))),
                read("witness", Some(("a", 1001))),
            ],
        );
        assert_eq!(s.active, None);
        assert!(s.limbo.unwrap().contains("witness does not confirm"));
    }

    #[test]
    fn nothing_written_is_neither_active_nor_limbo() {
        let s = judge(
            "a",
            "w-ha".into(),
            vec![read("local", None), read("peer", None)],
        );
        assert_eq!((s.active, s.limbo, s.highest_epoch), (None, None, None));
    }
}
