//! The hold at a token: once the catch-up to a demotion token is applied, the mirror writes nothing more
//! to the Standby until the token's promotion is over (the mirror is stopped) or abandoned (the request
//! leaves the checkpoint). The source is frozen from the token on, so there is nothing left to copy, and a
//! copy written after the takeover would overwrite what the new Active's users wrote: the catch-up queues
//! every object of the kind, and the worker puts a copy someone else changed back to its source
//! ([`super::plan::decide`]), which on a Standby is the point and on a new Active is a lost write.
//!
//! Every apply (its reads and copy writes) runs under a read guard ([`Hold::try_writing`], held by the
//! worker until the apply ends); [`Hold::hold`] takes the write side, so it returns only once the applies
//! in flight have ended: the acknowledgement written after it is true. While a hold is in place or being
//! put in place no guard is given, so no new apply starts.

use std::sync::Arc;

use tokio::sync::{OwnedRwLockReadGuard, RwLock};

/// What an apply runs under: while any is alive, a hold waits.
pub(super) type Writing = OwnedRwLockReadGuard<Option<String>>;

/// Shared by the kind tasks (which write) and the catch-up poller (which holds and releases).
#[derive(Clone, Debug, Default)]
pub(super) struct Hold(Arc<RwLock<Option<String>>>);

impl Hold {
    /// Whether a hold is in place (or being put in place): the kind tasks do not start work.
    pub(super) fn held(&self) -> bool {
        self.0.try_read().map_or(true, |g| g.is_some())
    }

    /// A guard to run one apply under, at once: `None` while held or while a hold waits for the applies
    /// in flight (never waits itself, so a kind's task keeps serving its other work).
    pub(super) fn try_writing(&self) -> Option<Writing> {
        let g = self.0.clone().try_read_owned().ok()?;
        g.is_none().then_some(g)
    }

    /// Hold at token `id`, once the writes in flight have ended.
    pub(super) async fn hold(&self, id: &str) {
        *self.0.write().await = Some(id.to_string());
    }

    /// Release; returns the token id held at.
    pub(super) async fn release(&self) -> Option<String> {
        self.0.write().await.take()
    }

    /// The token id held at.
    pub(super) async fn token(&self) -> Option<String> {
        self.0.read().await.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_hold_waits_for_the_write_in_flight_and_stops_new_ones() {
        let h = Hold::default();
        let w = h.try_writing().expect("free");
        let h2 = h.clone();
        let holding = tokio::spawn(async move { h2.hold("t1").await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!holding.is_finished(), "held while a write was in flight");
        assert!(h.held(), "a hold being put in place counts");
        assert!(
            h.try_writing().is_none(),
            "no new write while the hold waits"
        );
        drop(w);
        holding.await.unwrap();
        assert!(h.held());
        assert!(h.try_writing().is_none());
        assert_eq!(h.token().await.as_deref(), Some("t1"));
        assert_eq!(h.release().await.as_deref(), Some("t1"));
        assert!(!h.held());
        assert!(h.try_writing().is_some());
    }
}
