//! A hook that fences and fenced writes report to: what the safety oracles (feature `test-util`,
//! `kube_shard::testing::oracles`) check.
//!
//! Off by default: an [`Ownership`](super::Ownership) without an observer pays one atomic load per fence
//! issued and per fenced request. With one installed
//! (`Ownership::observe_fences`, feature `test-util`), every fence
//! reports when it was issued (with its `valid_until`) and when its last clone was dropped, and every
//! [`FencedApi`](super::fenced_write::FencedApi) request reports when it was sent (with the object's uid)
//! and how it ended: answered, failed, timed out, or cancelled (its future dropped).
//!
//! Events are reported synchronously, on the task that issues the fence or sends the request: an observer
//! must be quick and must not block (a mutex around a `Vec` is fine).

use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use super::state::MemberId;
use crate::rt::{Deadline, Now};

/// Receives [`FenceEvent`]s. Installed with [`observe_fences`](crate::testing::observe_fences).
pub trait FenceObserver: Send + Sync + fmt::Debug {
    /// One event, reported as it happens.
    fn on_event(&self, event: FenceEvent);
}

/// What an observer is told.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceEvent {
    /// A fence was issued.
    Issued {
        /// Unique per process; shared by the fence's clones.
        fence: u64,
        /// The member that holds it (name and incarnation at issue time).
        member: MemberId,
        /// The shard.
        shard: u32,
        /// The epoch.
        epoch: u64,
        /// When.
        at: Now,
        /// The deadline it carried when issued.
        valid_until: Deadline,
    },
    /// The last clone of a fence was dropped: it cannot be used any more.
    Dropped {
        /// The fence.
        fence: u64,
        /// When.
        at: Now,
    },
    /// A fenced request was sent.
    RequestSent {
        /// Unique per process.
        request: u64,
        /// The fence it carries.
        fence: u64,
        /// The uid of the object it writes (`None` for a create: the name makes it exclusive).
        uid: Option<String>,
        /// When.
        at: Now,
    },
    /// A fenced request ended on the client.
    RequestEnded {
        /// The request.
        request: u64,
        /// When.
        at: Now,
        /// How.
        outcome: RequestOutcome,
    },
}

/// How a fenced request ended on the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestOutcome {
    /// The server answered (any status).
    Answered,
    /// The request failed without an answer (connection, decoding).
    Failed,
    /// The fence's remaining validity ran out first (the server may still commit).
    TimedOut,
    /// The caller dropped the request future.
    Cancelled,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh id for a fence or a request.
pub(crate) fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Shared by a fence and its clones while an observer is installed: reports [`FenceEvent::Dropped`] when the
/// last clone goes.
#[derive(Debug)]
pub(crate) struct Tracked {
    pub(crate) id: u64,
    pub(crate) observer: Arc<dyn FenceObserver>,
    pub(crate) clock: crate::rt::Clock,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.observer.on_event(FenceEvent::Dropped {
            fence: self.id,
            at: self.clock.now(),
        });
    }
}

/// One fenced request in flight: reports [`FenceEvent::RequestEnded`] exactly once, `Cancelled` if dropped
/// before [`InFlight::end`].
#[derive(Debug)]
pub(crate) struct InFlight {
    id: u64,
    tracked: Option<Arc<Tracked>>,
}

impl InFlight {
    /// Report the request as sent (nothing when no observer is installed).
    pub(crate) fn start(tracked: Option<&Arc<Tracked>>, uid: Option<&str>) -> Self {
        let id = next_id();
        if let Some(t) = tracked {
            t.observer.on_event(FenceEvent::RequestSent {
                request: id,
                fence: t.id,
                uid: uid.map(str::to_owned),
                at: t.clock.now(),
            });
        }
        InFlight {
            id,
            tracked: tracked.cloned(),
        }
    }

    /// Report how it ended.
    pub(crate) fn end(mut self, outcome: RequestOutcome) {
        self.report(outcome);
    }

    fn report(&mut self, outcome: RequestOutcome) {
        if let Some(t) = self.tracked.take() {
            t.observer.on_event(FenceEvent::RequestEnded {
                request: self.id,
                at: t.clock.now(),
                outcome,
            });
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.report(RequestOutcome::Cancelled);
    }
}
