//! A Warning Event ([`MIRROR_SYNC_FAILED`]) when an object goes to a kind's failed list, rate-limited:
//! at most one per object per minute and [`PER_KIND`] per kind per minute ([`EventLimit`], pure). The
//! Events the limit drops are counted in the next one's message. The failures are also counted by
//! operation in [`super::KindStatus::errors`] (`kube_shard_mirror_errors_total`).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use super::queue::Key;
use kube::Client;

use crate::events::HaEvents;
use crate::HaConfig;

use crate::events::reason::MIRROR_SYNC_FAILED;

/// Events per kind per [`WINDOW`].
pub(super) const PER_KIND: usize = 10;
/// The window of both limits.
pub(super) const WINDOW: Duration = Duration::from_secs(60);

/// Which failed-object Events to emit. Pure: time is passed in.
#[derive(Clone, Debug, Default)]
pub(super) struct EventLimit {
    /// The last Event's time per object (only those within the window).
    by_object: BTreeMap<Key, Duration>,
    /// The kind's Events within the window, oldest first.
    recent: VecDeque<Duration>,
    /// Events dropped since the last one emitted.
    dropped: u64,
}

impl EventLimit {
    /// An object failed at `now`: `Some(n)` to emit its Event (`n` dropped since the last one), `None`
    /// when a limit drops it.
    pub(super) fn allow(&mut self, key: &Key, now: Duration) -> Option<u64> {
        let within = |t: &Duration| now.saturating_sub(*t) < WINDOW;
        self.by_object.retain(|_, t| within(t));
        while self.recent.front().is_some_and(|t| !within(t)) {
            self.recent.pop_front();
        }
        if self.by_object.contains_key(key) || self.recent.len() >= PER_KIND {
            self.dropped += 1;
            return None;
        }
        self.by_object.insert(key.clone(), now);
        self.recent.push_back(now);
        Some(std::mem::take(&mut self.dropped))
    }
}

/// The failed-object Events of one kind: the limit and where they are posted (the Standby's HA Lease).
#[derive(Clone)]
pub(super) struct FailureEvents {
    limit: EventLimit,
    events: HaEvents,
}

impl FailureEvents {
    /// Posted on the HA Lease of `ha` in the cluster of `client` (the Standby's, where the mirror writes).
    pub(super) fn on_lease(client: &Client, ha: &HaConfig) -> Self {
        let events = HaEvents::new(
            client.clone(),
            &ha.namespace,
            &ha.lease_name(),
            &ha.cluster_id,
        );
        FailureEvents {
            limit: EventLimit::default(),
            events,
        }
    }

    /// Object `key` of `kind` went to the failed list at `now`, its `operation` failing with `error`.
    pub(super) fn failed(
        &mut self,
        kind: &str,
        key: &Key,
        operation: &str,
        error: &str,
        now: Duration,
    ) {
        let Some(dropped) = self.limit.allow(key, now) else {
            return;
        };
        let object = if key.0.is_empty() {
            key.1.clone()
        } else {
            format!("{}/{}", key.0, key.1)
        };
        let mut text = format!("mirror of {kind}: {object} failed ({operation}): {error}");
        if dropped > 0 {
            text.push_str(&format!(
                " ({dropped} more failure Event(s) of this kind dropped by the rate limit)"
            ));
        }
        self.events.emit(true, MIRROR_SYNC_FAILED, text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: &str) -> Key {
        ("apps".into(), n.into())
    }
    fn s(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn a_failed_objects_event_is_rate_limited() {
        let mut l = EventLimit::default();
        assert_eq!(l.allow(&k("a"), s(0)), Some(0));
        // the same object again within the minute: dropped, however often it fails
        for t in 1..60 {
            assert_eq!(l.allow(&k("a"), s(t)), None, "at {t} s");
        }
        // a minute later: again, counting what was dropped
        assert_eq!(l.allow(&k("a"), s(60)), Some(59));
        assert_eq!(l.allow(&k("a"), s(61)), None);
    }

    #[test]
    fn at_most_ten_failed_object_events_per_kind_per_minute() {
        let mut l = EventLimit::default();
        let emitted = (0..100)
            .filter(|i| l.allow(&k(&format!("o{i}")), s(i / 10)).is_some())
            .count();
        assert_eq!(emitted, PER_KIND, "100 objects failing within ten seconds");
        // the window slides: the first Event was at 0 s, so one more is allowed at 60 s
        assert_eq!(l.allow(&k("late"), s(59)), None);
        assert_eq!(l.allow(&k("late"), s(60)), Some(91));
        // over ten minutes of one new failed object a second: ten a minute
        let mut l = EventLimit::default();
        let emitted = (0..600)
            .filter(|i| l.allow(&k(&format!("o{i}")), s(*i)).is_some())
            .count();
        assert_eq!(emitted, 100);
    }
}
