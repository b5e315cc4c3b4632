//! The switchover's reads and writes of the pair's objects that its steps share: the HA Leases (decoded),
//! the epoch this cluster leads, the freeze's name and its lifting, and a covered kind's discovery.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{ApiResource, DeleteParams};
use kube::discovery::ApiCapabilities;
use kube::{Api, Client};

use super::error::{api_err, SwitchError};
use crate::checkpoint::Kind;
use crate::config::HaConfig;
use crate::driver::HaClients;
use crate::epoch::FailoverEpoch;
use crate::record::{self, HaState, Record};

pub(super) fn lease_api(c: &Client, ns: &str) -> Api<Lease> {
    Api::namespaced(c.clone(), ns)
}

/// The decoded Lease `name`, with the Lease itself.
pub(super) async fn read_lease(
    api: &Api<Lease>,
    name: &str,
) -> Result<(Lease, Record), SwitchError> {
    let l = api
        .get(name)
        .await
        .map_err(api_err(format!("reading HA Lease {name}")))?;
    let r = record::decode(&l)
        .map_err(|e| SwitchError::NotActive(format!("HA Lease {name} does not decode: {e}")))?;
    Ok((l, r))
}

/// The epoch this cluster leads (its own Lease names it, nothing higher in the peer's or the witness's).
pub(super) async fn my_epoch(
    cfg: &HaConfig,
    clients: &HaClients,
) -> Result<(FailoverEpoch, HaState), SwitchError> {
    let name = cfg.lease_name();
    let (_, own) = read_lease(&lease_api(&clients.local, &cfg.namespace), &name).await?;
    if own.cluster != cfg.cluster_id {
        return Err(SwitchError::NotActive(format!(
            "this cluster's HA Lease names {}",
            own.holder()
        )));
    }
    let mut others = vec![lease_api(&clients.peer, &cfg.namespace)];
    if let Some(w) = &clients.witness {
        others.push(lease_api(w, &cfg.witness_namespace));
    }
    for api in others {
        if let Ok(Some(l)) = api.get_opt(&name).await {
            if let Ok(r) = record::decode(&l) {
                if r.epoch > own.epoch {
                    return Err(SwitchError::NotActive(format!(
                        "{} holds a higher epoch ({})",
                        r.cluster, r.epoch
                    )));
                }
            }
        }
    }
    Ok((own.epoch, own.state))
}

/// The freeze policy's and binding's name.
#[must_use]
pub fn freeze_name(cfg: &HaConfig) -> String {
    format!("{}-ha-freeze", cfg.name)
}

/// Lift the freeze (idempotent).
pub async fn unfreeze(client: &Client, cfg: &HaConfig) -> Result<(), SwitchError> {
    let name = freeze_name(cfg);
    let b: Api<ValidatingAdmissionPolicyBinding> = Api::all(client.clone());
    let p: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    for r in [
        b.delete(&name, &DeleteParams::default()).await.map(|_| ()),
        p.delete(&name, &DeleteParams::default()).await.map(|_| ()),
    ] {
        match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(api_err(format!("deleting {name}"))(e)),
        }
    }
    Ok(())
}

pub(super) async fn resolve(
    k: &Kind,
    client: &Client,
) -> Result<(ApiResource, ApiCapabilities), SwitchError> {
    let gv = kube::core::GroupVersion::gv(&k.group, &k.version);
    let group = kube::discovery::oneshot::pinned_group(client, &gv)
        .await
        .map_err(api_err(format!("discovering {k}")))?;
    group
        .versioned_resources(&k.version)
        .into_iter()
        .find(|(r, _)| r.plural == k.plural)
        .ok_or_else(|| SwitchError::Input(format!("{k}: not served")))
}
