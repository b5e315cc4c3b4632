//! What the demo records while it runs: each operator's admission intervals and status writes (by
//! cluster and failover epoch), on one monotonic clock (both clusters run in this process, so the
//! cross-cluster overlap measure is exact).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::oracle::{EpochWrite, Interval};

#[derive(Debug, Default)]
struct Inner {
    /// (cluster, epoch) → (start, end, open requests).
    intervals: BTreeMap<(String, u64), (Duration, Duration, u32)>,
    writes: Vec<EpochWrite>,
}

/// The recorder. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Recorder {
    origin: Instant,
    inner: Arc<Mutex<Inner>>,
}

/// Work in flight under (cluster, epoch); its completion is recorded when dropped.
#[must_use]
pub(crate) struct Admitted {
    rec: Recorder,
    tag: (String, u64),
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let now = self.rec.now();
        let mut g = self.rec.lock();
        if let Some(i) = g.intervals.get_mut(&self.tag) {
            i.1 = i.1.max(now);
            i.2 = i.2.saturating_sub(1);
        }
    }
}

impl Recorder {
    pub(crate) fn new(origin: Instant) -> Self {
        Recorder {
            origin,
            inner: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Time since the demo started.
    pub(crate) fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// An admission under (`cluster`, `epoch`) now.
    pub(crate) fn admit(&self, cluster: &str, epoch: u64) -> Admitted {
        let now = self.now();
        let tag = (cluster.to_owned(), epoch);
        let mut g = self.lock();
        let i = g.intervals.entry(tag.clone()).or_insert((now, now, 0));
        i.1 = i.1.max(now);
        i.2 += 1;
        Admitted {
            rec: self.clone(),
            tag,
        }
    }

    /// An operator write acknowledged under (`cluster`, `epoch`) now.
    pub(crate) fn wrote(&self, cluster: &str, epoch: u64) {
        let at = self.now();
        self.lock().writes.push(EpochWrite {
            cluster: cluster.to_owned(),
            epoch,
            at,
        });
    }

    /// The intervals so far (one with requests in flight extends to now).
    pub(crate) fn intervals(&self) -> Vec<Interval> {
        let now = self.now();
        self.lock()
            .intervals
            .iter()
            .map(|((c, e), (s, t, open))| Interval {
                cluster: c.clone(),
                epoch: *e,
                start: *s,
                end: if *open > 0 { now } else { *t },
            })
            .collect()
    }

    /// The first admission of `cluster` at an epoch above `above`, if any.
    pub(crate) fn first_admission_above(&self, cluster: &str, above: u64) -> Option<Duration> {
        self.lock()
            .intervals
            .iter()
            .filter(|((c, e), _)| c == cluster && *e > above)
            .map(|(_, (s, _, _))| *s)
            .min()
    }

    /// Admissions of `cluster` that started at or after `since`.
    pub(crate) fn admissions_since(&self, cluster: &str, since: Duration) -> u64 {
        self.lock()
            .intervals
            .iter()
            .filter(|((c, _), (_, t, _))| c == cluster && *t >= since)
            .count() as u64
    }

    pub(crate) fn writes(&self) -> Vec<EpochWrite> {
        self.lock().writes.clone()
    }
}
