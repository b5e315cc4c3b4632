//! The minimum-failover-epoch policy (HA.md "Fenced by the server"): when a promoter reaches the old
//! Active's cluster it sets a parameter object holding the minimum failover epoch and the role, and this
//! policy refuses the operator identities' creates and updates below it, and all their deletes while the
//! role is `standby` (deletes carry no stamp). Pure: JSON only.

use super::types::{ParamsRef, PolicyError};

/// The suffix of the minimum-epoch policy's and binding's name (`kube-shard-fence-min-epoch` by default).
pub const MIN_EPOCH_SUFFIX: &str = "-min-epoch";

/// The ConfigMap name of the probe write: a dry-run create of it (in any namespace) carrying a token is
/// judged by the minimum-epoch policy whoever sends it, so a promoter can see when a new minimum is in
/// effect (the apiserver loads parameters through an informer, with a lag).
pub const MIN_EPOCH_PROBE: &str = "kube-shard-min-epoch-probe";

/// The parameter key holding the minimum failover epoch (wire form, decimal).
pub const MIN_EPOCH_KEY: &str = "minFailoverEpoch";

/// The parameter key holding the cluster's role: `active` or `standby`.
pub const ROLE_KEY: &str = "role";

/// What the minimum-epoch policy needs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MinEpoch {
    /// The parameter ConfigMap (by convention `<ha-name>-ha-min-epoch` in the HA namespace: what
    /// `kube_shard_ha::min_epoch` writes).
    pub params: ParamsRef,
    /// The operator's identities (`request.userInfo.username`) whose writes are judged.
    pub identities: Vec<String>,
}

impl MinEpoch {
    /// The policy for `identities`, bound to `params`.
    #[must_use]
    pub fn new(params: ParamsRef, identities: Vec<String>) -> Self {
        MinEpoch { params, identities }
    }

    /// Whether an API server's refusal `message` is this policy's: a write below the cluster's minimum
    /// failover epoch (what a promotion checks with a dry-run write before it opens admission).
    #[must_use]
    pub fn refused_below_minimum(message: &str) -> bool {
        message.contains(super::messages::MIN_EPOCH_STALE)
    }

    pub(super) fn validate(&self) -> Result<(), PolicyError> {
        if self.identities.is_empty() {
            return Err(PolicyError::Identity(String::new()));
        }
        match self
            .identities
            .iter()
            .find(|i| i.is_empty() || i.contains(['\'', '\\']) || i.len() > 253)
        {
            Some(bad) => Err(PolicyError::Identity(bad.chars().take(128).collect())),
            None => Ok(()),
        }
    }
}
