//! `kshard ha leave`: take a cluster out of HA. The only way to lift a switchover freeze from a cluster that
//! is not promoted again: the cluster is marked in its checkpoint ([`LEFT_HA_KEY`]) — never a promotion
//! target again, no mirror starts there — and only then is the freeze lifted. Refused while the cluster
//! leads the pair (Active, or demoting without a promotion of the peer: `demote --cancel` is for that), and
//! while its mirror duty is recorded mirroring unless a person asserts its operator is stopped: the Standby
//! of a mirrored pair keeps its freeze.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use super::error::{api_err, SwitchError};
use super::io::{my_epoch, unfreeze};
use crate::checkpoint::edit::edit_checkpoint;
use crate::checkpoint::{DUTY_KEY, LEFT_HA_KEY};
use crate::config::checkpoint_name;
use crate::driver::HaClients;
use crate::HaConfig;

/// Settings of [`leave`].
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct LeaveOptions {
    /// A person asserts that this cluster's operator (its elector and mirror duty) is stopped.
    pub operator_stopped: bool,
    /// Why, recorded in the mark.
    pub reason: String,
}

impl LeaveOptions {
    /// Leave for `reason`.
    #[must_use]
    pub fn new(reason: impl Into<String>) -> Self {
        LeaveOptions {
            operator_stopped: false,
            reason: reason.into(),
        }
    }

    /// Assert that this cluster's operator is stopped.
    #[must_use]
    pub fn operator_stopped(mut self, yes: bool) -> Self {
        self.operator_stopped = yes;
        self
    }
}

/// Take this cluster (of `cfg`) out of HA: refuse while it leads the pair or its mirror duty is recorded
/// mirroring (unless `operator_stopped`); mark its checkpoint; lift its freeze.
pub async fn leave(
    cfg: &HaConfig,
    clients: &HaClients,
    opts: &LeaveOptions,
) -> Result<(), SwitchError> {
    match my_epoch(cfg, clients).await {
        Ok((epoch, state)) => {
            let what = if state.demoting { "demoting" } else { "Active" };
            return Err(SwitchError::Leave(format!(
                "this cluster leads the pair at epoch {epoch} ({what}): promote the peer first \
                 (`kshard ha switchover`), or `kshard ha demote --cancel`"
            )));
        }
        Err(SwitchError::NotActive(_)) => {}
        Err(e) => return Err(e),
    }
    let cm: Api<ConfigMap> = Api::namespaced(clients.local.clone(), &cfg.namespace);
    let data = cm
        .get_opt(&checkpoint_name(cfg))
        .await
        .map_err(api_err("reading the checkpoint"))?
        .and_then(|c| c.data)
        .unwrap_or_default();
    if let Some(d) = data.get(DUTY_KEY).filter(|d| d.starts_with("mirroring")) {
        if !opts.operator_stopped {
            return Err(SwitchError::Leave(format!(
                "this cluster's mirror duty is recorded as {d:?}: it is the Standby of a mirrored pair; \
                 stop its operator, then assert it with `--operator-stopped`"
            )));
        }
    }
    let mark = format!(
        "{:.0} {}",
        k8s_openapi::jiff::Timestamp::now(),
        opts.reason.replace(['\n', '\r'], " ")
    );
    edit_checkpoint(&clients.local, cfg, |d| {
        d.insert(LEFT_HA_KEY.to_string(), mark.clone());
    })
    .await?;
    tracing::warn!(mark = %mark, "HA: this cluster left HA; lifting the freeze");
    unfreeze(&clients.local, cfg).await
}
