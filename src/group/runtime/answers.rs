//! The answers of the requests that run beside the task's work (its renewals and the coordinator Lease's
//! writes), with what each needs to be applied ([`beside`](super::beside) runs them).

use k8s_openapi::api::coordination::v1::Lease;
use tokio::time::Instant;

/// One answered renewal, with what it needs to be applied.
pub(super) enum Beside {
    /// Our member Lease.
    Member(MemberRenewal),
    /// The coordinator Lease (an acquisition or a renewal of ours).
    Coordinator(CoordinatorWrite),
}

/// The answer to a renewal of our own Lease.
pub(super) struct MemberRenewal {
    /// The incarnation that wrote it: an answer for an earlier one is dropped.
    pub(super) incarnation: String,
    /// Both clocks, read before the request was sent.
    pub(super) start: crate::rt::Now,
    pub(super) t0: Instant,
    /// The report the write carried.
    pub(super) report: String,
    /// Whether a conflict that is not a takeover may be retried at once.
    pub(super) retry: bool,
    pub(super) answer: MemberAnswer,
}

pub(super) enum MemberAnswer {
    Written(Lease),
    /// Someone else wrote our Lease: what a GET read back.
    Conflict(Result<Option<Lease>, kube::Error>),
    Failed(kube::Error),
}

/// The answer to a write of the coordinator Lease, with what it needs to be applied.
pub(super) struct CoordinatorWrite {
    /// The incarnation that wrote it.
    pub(super) incarnation: String,
    /// `create` or `update`, as RBAC names it.
    pub(super) verb: &'static str,
    pub(super) what: Written,
    pub(super) result: Result<Lease, kube::Error>,
}

pub(super) enum Written {
    /// An acquisition or renewal for `term`, sent at `start` (`now` on our monotonic clock).
    Elect {
        term: u64,
        renewing: bool,
        start: crate::rt::Now,
        now: Instant,
    },
    /// The Lease handed back.
    Release,
}
