//! [`SwitchError`], why a switchover step failed, and the per-kind report of a mirror behind its token.

use std::time::Duration;

use crate::checkpoint::edit::EditError;
use crate::checkpoint::ParseError;
use crate::epoch::FailoverEpoch;

/// Why a switchover step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SwitchError {
    /// Bad input (a kind, a token, an exempt identity).
    #[error("{0}")]
    Input(String),
    /// This cluster is not the Active (or its Lease cannot be read).
    #[error("not the Active: {0}")]
    NotActive(String),
    /// Members did not acknowledge `ha-drained` in time: no token was issued.
    #[error("members did not acknowledge ha-drained({epoch}) within {waited:?}: {pending:?} — no token was issued; the Active stays demoting (run `kshard ha demote` again, or `demote --cancel`)")]
    NotDrained {
        /// The epoch being demoted.
        epoch: FailoverEpoch,
        /// The members that did not ack.
        pending: Vec<String>,
        /// How long the demoter waited.
        waited: Duration,
    },
    /// The freeze could not be installed or its probe was not refused.
    #[error("freeze: {0}")]
    Freeze(String),
    /// A request failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// The token table refused the token.
    #[error("token refused: {0}")]
    Refused(String),
    /// The mirror did not reach the token in time: nothing was changed on either side.
    #[error("the mirror did not reach the token within {waited:?}; nothing was changed on either side:\n{}", report_text(.report))]
    Behind {
        /// Per kind.
        report: Vec<KindProgress>,
        /// How long it waited.
        waited: Duration,
    },
    /// The mirror reached the token's positions but did not acknowledge the catch-up and its hold in
    /// time ([`CAUGHT_UP_KEY`](crate::checkpoint::CAUGHT_UP_KEY)): nothing was changed on either side.
    #[error("the mirror did not confirm within {waited:?} that it applied the catch-up to the token and holds (writes nothing more to this cluster); nothing was changed on either side. Is this cluster's mirror running?")]
    NotHeld {
        /// How long it waited.
        waited: Duration,
    },
    /// Cancel refused.
    #[error("cancel refused: {0}")]
    Cancel(String),
    /// Leaving HA refused.
    #[error("leaving HA refused: {0}")]
    Leave(String),
    /// The Standby's elector did not take the Leases over.
    #[error("promotion: {0}")]
    Promote(String),
    /// The promotion checks refused this cluster as a target: nothing was written.
    #[error("not promoted: {0}; nothing was changed")]
    Target(#[from] crate::promotion::TargetRefused),
}

pub(super) fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> SwitchError {
    let what = what.into();
    move |source| SwitchError::Api { what, source }
}

/// One kind's position against the token (the timeout report).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct KindProgress {
    /// `<plural>.<group>`.
    pub kind: String,
    /// The token's resourceVersion.
    pub token_rv: u64,
    /// The mirror's position (`None`: no checkpoint for this kind from this source).
    pub position: Option<u64>,
}

pub(super) fn report_text(r: &[KindProgress]) -> String {
    r.iter()
        .map(|k| {
            let pos = k.position.map_or("none".to_string(), |p| p.to_string());
            let state = if k.position.is_some_and(|p| p >= k.token_rv) {
                "reached"
            } else {
                "BEHIND"
            };
            format!(
                "  {}: token rv {}, mirror position {pos} ({state})",
                k.kind, k.token_rv
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl From<ParseError> for SwitchError {
    fn from(e: ParseError) -> Self {
        SwitchError::Input(e.0)
    }
}

impl From<EditError> for SwitchError {
    fn from(e: EditError) -> Self {
        SwitchError::Api {
            what: e.what,
            source: e.source,
        }
    }
}
