//! What the mirror duty is doing ([`DutyStatus`]).

use crate::adoption::AdoptStatus;
use crate::failback::FailbackReport;
use crate::mirror::KindStatus;

/// What the duty is doing, for `kshard ha status`, the metrics and the tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DutyStatus {
    /// `starting`, `waiting` (no Active peer to mirror), `failback`, `mirroring`, `adopting`,
    /// `active`.
    pub phase: &'static str,
    /// Why it waits (`waiting`), or what failback still holds (`failback`).
    pub detail: Option<String>,
    /// Adoption at the latest epoch.
    pub adoption: AdoptStatus,
    /// The latest failback pass.
    pub failback: Option<FailbackReport>,
    /// The running mirror's kinds (empty when no mirror runs).
    pub mirror: Vec<KindStatus>,
    /// Mirrors started (the first, and one after each failback).
    pub mirror_starts: u64,
    /// The last failure (everything is retried).
    pub last_error: Option<String>,
}
