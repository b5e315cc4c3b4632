//! The log of writes a ValidatingAdmissionPolicy refused: what a test (or `kshard-dev demo`) needs to tell a
//! refused write of a member that had lost its shard from one of the current owner's. Always on (refusals
//! are rare and small); read with [`TestServer::admission_refusals`](crate::TestServer::admission_refusals).

use std::sync::Mutex;

use kube_shard::token::FenceToken;

use crate::{admission::Attempt, status::qualified};

/// One write refused by admission.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdmissionRefusal {
    /// The resourceVersion the store was at: every commit up to it came before the refusal, none after.
    pub resource_version: u64,
    /// Who wrote.
    pub identity: String,
    /// `plural` or `plural.group`.
    pub resource: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// `status` for a `/status` write.
    pub subresource: Option<String>,
    /// `CREATE` or `UPDATE`.
    pub operation: String,
    /// A dry run.
    pub dry_run: bool,
    /// The fence the write carried in the `x-kube-shard-fence` header, when it parsed.
    pub fence: Option<FenceToken>,
    /// The refusal's message, as answered.
    pub message: String,
}

#[derive(Debug, Default)]
pub(crate) struct RefusalLog(Mutex<Vec<AdmissionRefusal>>);

impl RefusalLog {
    pub(crate) fn record(&self, rv: u64, attempt: &Attempt<'_>, message: &str) {
        let r = AdmissionRefusal {
            resource_version: rv,
            identity: attempt.identity.to_owned(),
            resource: qualified(&attempt.info.group, &attempt.info.plural),
            namespace: attempt.namespace.unwrap_or_default().to_owned(),
            name: attempt.name.to_owned(),
            subresource: attempt.subresource.map(str::to_owned),
            operation: attempt.operation.to_owned(),
            dry_run: attempt.dry_run,
            fence: attempt.fence_header.and_then(|h| h.parse().ok()),
            message: message.to_owned(),
        };
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }

    pub(crate) fn all(&self) -> Vec<AdmissionRefusal> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
