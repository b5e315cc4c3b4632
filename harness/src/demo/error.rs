//! What ends a demo scenario early (a violated invariant is not an error: it is in the report).

use kube_shard_example_operator::run::RunError;

use crate::process::ProcessError;

/// Why a demo could not run to its verdict.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The options contradict each other or name something that does not exist.
    #[error("{0}")]
    Options(String),
    /// A local file or socket.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A replica process would not start or stop.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// Loading a kubeconfig or building a client.
    #[error(transparent)]
    Client(#[from] RunError),
    /// The embedded API server would not start.
    #[error("the embedded API server: {0}")]
    Server(String),
    /// A step of the scenario failed (an API call, a wait that timed out, ...).
    #[error("{0}")]
    Failed(String),
}

impl DemoError {
    /// A step of the scenario failed.
    pub fn failed(msg: impl Into<String>) -> Self {
        DemoError::Failed(msg.into())
    }
}
