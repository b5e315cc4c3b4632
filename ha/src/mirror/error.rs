//! [`MirrorError`]: why the mirror, or one of its kinds, stopped or refused to start.

/// Why the mirror (or one kind of it) stopped, or refused to start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MirrorError {
    /// Kinds the operator watches that are neither mirrored nor derived (a build error).
    #[error(
        "kinds neither mirrored nor derived: {0:?} (declare each one with `mirrored` or `derived`)"
    )]
    Unclassified(Vec<String>),
    /// A kind declared twice, or both mirrored and derived.
    #[error("kind {0} is declared more than once")]
    Duplicate(String),
    /// Secrets declared mirrored without `allow_secrets`.
    #[error("secrets are mirrored only when configured (`allow_secrets`)")]
    SecretsNotAllowed,
    /// A resourceVersion that is not a positive integer without leading zeros: the kind stops.
    #[error(
        "{what}: resourceVersion {raw:?} is not a positive integer (compared only as integers)"
    )]
    BadResourceVersion {
        /// Where it was read.
        what: String,
        /// The value (at most 64 characters).
        raw: String,
    },
    /// The source collection's resourceVersion went below the checkpoint (an etcd restore without a
    /// revision bump): the kind stops with an alarm; resynchronising is a command.
    #[error("{kind}: the source's resourceVersion {now} is below the checkpoint {checkpoint} (an etcd restore?): the kind is stopped")]
    Regression {
        /// The kind's key.
        kind: String,
        /// The checkpoint.
        checkpoint: u64,
        /// The source collection's resourceVersion.
        now: u64,
    },
    /// The kind is not served (or served differently) on one side.
    #[error("kind {0}: {1}")]
    Kind(String, String),
    /// A setting that does not parse or is out of range (a label selector, a worker count).
    #[error("{0}")]
    Input(String),
    /// A request failed where no retry applies (start-up, the checkpoint).
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        source: kube::Error,
    },
}

pub(crate) fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> MirrorError {
    let what = what.into();
    move |source| MirrorError::Api { what, source }
}
