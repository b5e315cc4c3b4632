//! The coalescing retry queue of one kind (HA.md "Its own list/watch loop", "Poison objects"): one entry
//! per object key holding the **oldest** unapplied change's resourceVersion (what the watermark must not
//! pass) and the latest; a key changing while a worker holds it is queued again when the worker is done;
//! failures back off exponentially; poison objects go to the failed list and stay there (still pending
//! for the watermark) until a newer change of them arrives. Pure: time is passed in.

use std::collections::BTreeMap;
use std::time::Duration;

/// An object key: (namespace, name); the namespace is empty for cluster-scoped objects.
pub type Key = (String, String);

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    Queued { not_before: Duration },
    InFlight { again: Option<u64> },
    Failed { error: String },
}

#[derive(Clone, Debug)]
struct Entry {
    oldest: u64,
    latest: u64,
    attempts: u32,
    state: State,
}

/// Backoff settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first retry's delay.
    pub base: Duration,
    /// The longest delay.
    pub max: Duration,
    /// Retryable failures before an object goes to the failed list.
    pub max_attempts: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(200),
            max: Duration::from_secs(30),
            max_attempts: 10,
        }
    }
}

/// A failed (poison) object: its key, the oldest change it holds back, the last error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failed {
    /// The object's key.
    pub key: Key,
    /// The oldest unapplied change's resourceVersion.
    pub rv: u64,
    /// The last error.
    pub error: String,
}

/// The coalescing retry queue.
#[derive(Clone, Debug, Default)]
pub struct RetryQueue {
    entries: BTreeMap<Key, Entry>,
    backoff: Backoff,
}

impl RetryQueue {
    /// An empty queue.
    #[must_use]
    pub fn new(backoff: Backoff) -> Self {
        RetryQueue {
            entries: BTreeMap::new(),
            backoff,
        }
    }

    /// A change of `key` at `rv` was delivered: queue it (coalesced with a queued one, which keeps its
    /// oldest version; a failed one is queued again).
    pub fn push(&mut self, key: Key, rv: u64, now: Duration) {
        match self.entries.get_mut(&key) {
            None => {
                self.entries.insert(
                    key,
                    Entry {
                        oldest: rv,
                        latest: rv,
                        attempts: 0,
                        state: State::Queued { not_before: now },
                    },
                );
            }
            Some(e) => {
                e.latest = e.latest.max(rv);
                match &mut e.state {
                    State::Queued { .. } => {}
                    State::InFlight { again } => *again = Some(again.map_or(rv, |a| a.min(rv))),
                    State::Failed { .. } => {
                        e.attempts = 0;
                        e.state = State::Queued { not_before: now };
                    }
                }
            }
        }
    }

    /// Whether `key` is queued, in flight or failed.
    #[must_use]
    pub fn contains(&self, key: &Key) -> bool {
        self.entries.contains_key(key)
    }

    /// The next key due at `now` (in key order among those due); it is in flight until
    /// [`done`](Self::done), [`retry`](Self::retry) or [`fail`](Self::fail).
    pub fn pop(&mut self, now: Duration) -> Option<Key> {
        let key = self
            .entries
            .iter()
            .filter(|(_, e)| matches!(e.state, State::Queued { not_before } if not_before <= now))
            .min_by_key(|(_, e)| match e.state {
                State::Queued { not_before } => not_before,
                _ => Duration::MAX,
            })
            .map(|(k, _)| k.clone())?;
        if let Some(e) = self.entries.get_mut(&key) {
            e.state = State::InFlight { again: None };
        }
        Some(key)
    }

    /// When the next queued key is due (`None`: nothing queued).
    #[must_use]
    pub fn next_due(&self) -> Option<Duration> {
        self.entries
            .values()
            .filter_map(|e| match e.state {
                State::Queued { not_before } => Some(not_before),
                _ => None,
            })
            .min()
    }

    /// The worker applied `key`'s latest version: drop it, or queue it again if it changed meanwhile
    /// (its oldest pending change is then the first one seen during the flight).
    pub fn done(&mut self, key: &Key, now: Duration) {
        if let Some(e) = self.entries.get_mut(key) {
            match e.state {
                State::InFlight { again: Some(rv) } => {
                    e.oldest = rv;
                    e.attempts = 0;
                    e.state = State::Queued { not_before: now };
                }
                _ => {
                    self.entries.remove(key);
                }
            }
        }
    }

    /// A retryable failure: back off, or after `max_attempts` put the key on the failed list.
    pub fn retry(&mut self, key: &Key, now: Duration, error: impl Into<String>) {
        let b = self.backoff;
        if let Some(e) = self.entries.get_mut(key) {
            e.attempts += 1;
            if e.attempts >= b.max_attempts {
                e.state = State::Failed {
                    error: error.into(),
                };
                return;
            }
            let factor = 1u32 << (e.attempts - 1).min(16);
            let delay = b.base.saturating_mul(factor).min(b.max);
            e.state = State::Queued {
                not_before: now + delay,
            };
        }
    }

    /// A permanent failure (a poison object): on the failed list until a newer change arrives.
    pub fn fail(&mut self, key: &Key, error: impl Into<String>) {
        if let Some(e) = self.entries.get_mut(key) {
            if let State::InFlight { again: Some(_) } = e.state {
                // a newer change arrived during the flight: try that one
                e.attempts = 0;
                e.state = State::Queued {
                    not_before: Duration::ZERO,
                };
                return;
            }
            e.state = State::Failed {
                error: error.into(),
            };
        }
    }

    /// Whether `key` is on the failed list.
    #[must_use]
    pub fn is_failed(&self, key: &Key) -> bool {
        self.entries
            .get(key)
            .is_some_and(|e| matches!(e.state, State::Failed { .. }))
    }

    /// The oldest unapplied change's resourceVersion over every key: queued, in flight or failed.
    #[must_use]
    pub fn oldest_pending(&self) -> Option<u64> {
        self.entries.values().map(|e| e.oldest).min()
    }

    /// Whether every change at or below `rv` was applied or put on the failed list: `Some(n)` with `n`
    /// of them failed, `None` while one is still queued, in flight or retrying.
    #[must_use]
    pub fn settled_through(&self, rv: u64) -> Option<usize> {
        let mut failed = 0;
        for e in self.entries.values().filter(|e| e.oldest <= rv) {
            match e.state {
                State::Failed { .. } => failed += 1,
                _ => return None,
            }
        }
        Some(failed)
    }

    /// The failed (poison) objects.
    #[must_use]
    pub fn failed(&self) -> Vec<Failed> {
        self.entries
            .iter()
            .filter_map(|(k, e)| match &e.state {
                State::Failed { error } => Some(Failed {
                    key: k.clone(),
                    rv: e.oldest,
                    error: error.clone(),
                }),
                _ => None,
            })
            .collect()
    }

    /// Keys pending (queued, in flight or failed).
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Nothing pending.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: &str) -> Key {
        ("ns".into(), n.into())
    }
    const T0: Duration = Duration::ZERO;

    #[test]
    fn changes_coalesce_and_keep_the_oldest_version() {
        let mut q = RetryQueue::new(Backoff::default());
        q.push(k("y"), 100, T0);
        q.push(k("y"), 120, T0);
        q.push(k("x"), 105, T0);
        assert_eq!(q.len(), 2);
        assert_eq!(q.oldest_pending(), Some(100));
        let first = q.pop(T0).unwrap();
        q.done(&first, T0);
        let second = q.pop(T0).unwrap();
        assert_ne!(first, second);
        q.done(&second, T0);
        assert!(q.is_empty() && q.oldest_pending().is_none());
    }

    #[test]
    fn a_change_during_the_flight_is_queued_again() {
        let mut q = RetryQueue::new(Backoff::default());
        q.push(k("x"), 100, T0);
        let x = q.pop(T0).unwrap();
        q.push(k("x"), 130, T0);
        assert!(q.pop(T0).is_none(), "one worker per key");
        q.done(&x, T0);
        assert_eq!(q.oldest_pending(), Some(130));
        assert_eq!(q.pop(T0), Some(k("x")));
    }

    #[test]
    fn retries_back_off_then_fail_and_failed_keys_hold_the_watermark() {
        let b = Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(4),
            max_attempts: 4,
        };
        let mut q = RetryQueue::new(b);
        q.push(k("y"), 100, T0);
        let mut now = T0;
        for want in [1, 2, 4] {
            let y = q.pop(now).unwrap();
            q.retry(&y, now, "namespace missing");
            assert!(q.pop(now).is_none());
            assert_eq!(q.next_due(), Some(now + Duration::from_secs(want)));
            now += Duration::from_secs(want);
        }
        let y = q.pop(now).unwrap();
        q.retry(&y, now, "namespace missing");
        assert_eq!(q.failed().len(), 1);
        assert_eq!(
            q.oldest_pending(),
            Some(100),
            "a failed key still holds the watermark"
        );
        assert!(q.pop(now + Duration::from_secs(999)).is_none());
        // a newer change of it is tried again
        q.push(k("y"), 150, now);
        assert!(q.failed().is_empty());
        assert_eq!(q.pop(now), Some(k("y")));
        assert_eq!(q.oldest_pending(), Some(100));
    }

    #[test]
    fn a_list_is_settled_once_its_changes_are_applied_or_failed() {
        let t = Duration::ZERO;
        let mut q = RetryQueue::new(Backoff::default());
        assert_eq!(q.settled_through(100), Some(0), "nothing pending");
        for (n, rv) in [("a", 50), ("b", 60), ("c", 120)] {
            q.push(k(n), rv, t);
        }
        assert_eq!(q.settled_through(100), None);
        let a = q.pop(t).unwrap();
        q.push(k("a"), 150, t); // changed during the flight, above the LIST
        q.done(&a, t + Duration::from_secs(1));
        assert_eq!(q.settled_through(100), None, "b is still queued");
        let b = q.pop(t).unwrap();
        assert_eq!(b, k("b"));
        assert_eq!(q.settled_through(100), None, "b is in flight");
        q.fail(&b, "poison");
        assert_eq!(
            q.settled_through(100),
            Some(1),
            "a's pending change and c are above the LIST"
        );
    }

    #[test]
    fn poison_goes_to_the_failed_list_at_once() {
        let mut q = RetryQueue::new(Backoff::default());
        q.push(k("p"), 7, T0);
        let p = q.pop(T0).unwrap();
        q.fail(&p, "422");
        assert_eq!(
            q.failed(),
            vec![Failed {
                key: k("p"),
                rv: 7,
                error: "422".into()
            }]
        );
        assert_eq!(q.next_due(), None);
    }
}
