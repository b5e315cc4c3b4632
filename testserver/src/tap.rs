//! The request tap: every request the server receives, in the order it receives them, and every answer's
//! status, for a caller that needs an exact account of a run (the fault simulator digests it to prove a
//! replay exact).

use std::sync::Arc;

/// One request as the server received it, or its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tapped {
    /// Who sent it.
    pub identity: String,
    /// `GET`, `PUT`, ...
    pub method: String,
    /// Path and query, as sent.
    pub uri: String,
    /// FNV-1a 64 of the request body (`0xcbf29ce484222325` for an empty body).
    pub body_digest: u64,
    /// `None` when the request arrives; the HTTP status when it is answered. A request never answered
    /// (refused, partitioned, held by a fault) has no second record.
    pub status: Option<u16>,
}

/// What [`Builder::request_tap`](crate::Builder::request_tap) calls for each record, on the task that
/// handles the request.
#[derive(Clone)]
pub(crate) struct RequestTap(pub(crate) Arc<dyn Fn(&Tapped) + Send + Sync>);

impl std::fmt::Debug for RequestTap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RequestTap")
    }
}
