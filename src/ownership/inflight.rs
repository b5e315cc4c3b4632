//! The in-flight count of one shard at one holding: one atomic word holding the count (permits *and* live
//! fences) and a closed bit, so a drain that closed the gate and saw zero knows no permit can follow.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex,
};

use tokio::sync::Notify;

const CLOSED: u64 = 1 << 63;

/// The in-flight count and closed bit of one shard at one holding, and the latest `valid_until` (runtime
/// clock) of the fences issued on it.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    word: AtomicU64,
    zero: Notify,
    latest: Mutex<Option<tokio::time::Instant>>,
}

impl Gate {
    /// Enter unless closed.
    pub(crate) fn try_enter(&self) -> bool {
        let prev = self.word.fetch_add(1, Ordering::SeqCst);
        if prev & CLOSED != 0 {
            self.leave();
            return false;
        }
        true
    }

    /// Enter even if closed (a fence taken under a live permit: the count is already above zero).
    pub(crate) fn enter_held(&self) {
        self.word.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn leave(&self) {
        let prev = self.word.fetch_sub(1, Ordering::SeqCst);
        if prev & !CLOSED == 1 {
            self.zero.notify_waiters();
        }
    }

    pub(crate) fn close(&self) {
        self.word.fetch_or(CLOSED, Ordering::SeqCst);
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.word.load(Ordering::SeqCst) & !CLOSED
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.word.load(Ordering::SeqCst) & CLOSED != 0
    }

    /// Record a fence issued on this gate, valid until `until` on the runtime clock.
    pub(crate) fn issued(&self, until: tokio::time::Instant) {
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        *latest = Some(latest.map_or(until, |l| l.max(until)));
    }

    /// The latest `valid_until` of any fence issued on this gate: no request sent with one of them runs
    /// past it (a fenced write's timeout is its fence's remaining validity).
    pub(crate) fn latest_valid_until(&self) -> Option<tokio::time::Instant> {
        *self.latest.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Close and wait until nothing is in flight.
    pub(crate) async fn drained(&self) {
        self.close();
        loop {
            let notified = self.zero.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }
}
