//! Oracle 1: fence windows, including requests in flight, never overlap across members.
//!
//! A [`FenceRecorder`] is installed on every member of a test
//! ([`observe_fences`](crate::testing::observe_fences)); it records each fence
//! (issued, `valid_until`, dropped) and each fenced request (sent, ended) into a [`FenceHistory`].
//! [`check`] then asserts, per shard and per object uid, that the windows of fences held by different
//! members (`name/incarnation`) never overlap, a window lasting until every request sent with its fence
//! ended; and, per shard, that fence epochs never go back in issue order.
//!
//! See `docs/protocol.md#fence-windows-in-detail`.

use std::{
    collections::BTreeMap,
    fmt,
    sync::{Arc, Mutex},
};

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::testing::{FenceEvent, FenceObserver};

/// "Never ended": a window that stays open.
pub const OPEN: u64 = u64::MAX;

/// One recorded fence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceRecord {
    /// The fence id (unique per process).
    pub id: u64,
    /// `name/incarnation` of the holder.
    pub member: String,
    /// The shard.
    pub shard: u32,
    /// The epoch.
    pub epoch: u64,
    /// Issued at (µs).
    pub issued: u64,
    /// Its `valid_until` on the runtime clock (µs).
    pub valid_until: u64,
    /// When its last clone was dropped (µs; [`OPEN`] if still held).
    pub dropped: u64,
}

/// One recorded fenced request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The request id.
    pub id: u64,
    /// The fence it was sent with.
    pub fence: u64,
    /// The object's uid (`None`: a create).
    pub uid: Option<String>,
    /// Sent at (µs).
    pub sent: u64,
    /// Ended on the client at (µs; [`OPEN`] if still in flight).
    pub ended: u64,
}

/// What a run did with fences: the oracle's input.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceHistory {
    /// Every fence issued.
    pub fences: Vec<FenceRecord>,
    /// Every fenced request sent.
    pub requests: Vec<RequestRecord>,
}

/// The span during which a fence could have acted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// The fence.
    pub fence: u64,
    /// `name/incarnation`.
    pub member: String,
    /// The shard.
    pub shard: u32,
    /// The epoch.
    pub epoch: u64,
    /// Start (µs).
    pub start: u64,
    /// End (µs; [`OPEN`]: never ended).
    pub end: u64,
}

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let end = if self.end == OPEN {
            "open".to_owned()
        } else {
            format!("{:.3}s", self.end as f64 / 1e6)
        };
        write!(
            f,
            "{} fence #{} {}/{} [{:.3}s, {end}]",
            self.member,
            self.fence,
            self.shard,
            self.epoch,
            self.start as f64 / 1e6
        )
    }
}

/// What the oracle found wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// Two members' windows overlap on one shard.
    ShardOverlap {
        /// The shard.
        shard: u32,
        /// The earlier window.
        a: Window,
        /// The later window.
        b: Window,
    },
    /// Two members' windows overlap on one object.
    UidOverlap {
        /// The object's uid.
        uid: String,
        /// The earlier window.
        a: Window,
        /// The later window.
        b: Window,
    },
    /// A fence for a shard was issued at a lower epoch than an earlier one.
    EpochBack {
        /// The shard.
        shard: u32,
        /// The earlier fence.
        a: Window,
        /// The later one, with the lower epoch.
        b: Window,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::ShardOverlap { shard, a, b } => {
                write!(f, "shard {shard}: overlapping fence windows {a} and {b}")
            }
            Violation::UidOverlap { uid, a, b } => {
                write!(f, "uid {uid}: overlapping fence windows {a} and {b}")
            }
            Violation::EpochBack { shard, a, b } => {
                write!(f, "shard {shard}: epoch went back from {a} to {b}")
            }
        }
    }
}

impl FenceHistory {
    /// Every fence's window (see the [module docs](self)), in the order of `fences`.
    #[must_use]
    pub fn windows(&self) -> Vec<Window> {
        let mut request_end: BTreeMap<u64, u64> = BTreeMap::new();
        for r in &self.requests {
            let e = request_end.entry(r.fence).or_insert(0);
            *e = (*e).max(r.ended);
        }
        self.fences
            .iter()
            .map(|f| {
                let usable = f.valid_until.min(f.dropped);
                Window {
                    fence: f.id,
                    member: f.member.clone(),
                    shard: f.shard,
                    epoch: f.epoch,
                    start: f.issued,
                    end: usable.max(request_end.get(&f.id).copied().unwrap_or(0)),
                }
            })
            .collect()
    }
}

/// Check the history; empty when the contract held.
#[must_use]
pub fn check(history: &FenceHistory) -> Vec<Violation> {
    let windows = history.windows();
    let by_id: BTreeMap<u64, &Window> = windows.iter().map(|w| (w.fence, w)).collect();
    let mut out = Vec::new();

    let mut by_shard: BTreeMap<u32, Vec<&Window>> = BTreeMap::new();
    for w in &windows {
        by_shard.entry(w.shard).or_default().push(w);
    }
    for (shard, mut ws) in by_shard {
        ws.sort_by_key(|w| (w.start, w.fence));
        for pair in ws.windows(2) {
            if pair[1].epoch < pair[0].epoch {
                out.push(Violation::EpochBack {
                    shard,
                    a: pair[0].clone(),
                    b: pair[1].clone(),
                });
            }
        }
        for (a, b) in overlaps(&ws) {
            out.push(Violation::ShardOverlap { shard, a, b });
        }
    }

    let mut by_uid: BTreeMap<&str, Vec<&Window>> = BTreeMap::new();
    for r in &history.requests {
        if let (Some(uid), Some(w)) = (r.uid.as_deref(), by_id.get(&r.fence)) {
            let v = by_uid.entry(uid).or_default();
            if !v.iter().any(|x| x.fence == w.fence) {
                v.push(w);
            }
        }
    }
    for (uid, mut ws) in by_uid {
        ws.sort_by_key(|w| (w.start, w.fence));
        for (a, b) in overlaps(&ws) {
            out.push(Violation::UidOverlap {
                uid: uid.to_owned(),
                a,
                b,
            });
        }
    }
    out
}

/// Panic with every violation, one per line, when the history breaks the contract.
///
/// # Panics
/// When [`check`] finds a violation.
pub fn assert_exclusive(history: &FenceHistory) {
    let v = check(history);
    assert!(
        v.is_empty(),
        "fence oracle: {} violation(s):\n{}",
        v.len(),
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// Pairs of windows of different members that overlap; `ws` sorted by start. Windows are half-open: a fence
/// is expired at its `valid_until`, and a request that ended at `t` is not in flight at `t`.
fn overlaps(ws: &[&Window]) -> Vec<(Window, Window)> {
    let mut out = Vec::new();
    for (i, a) in ws.iter().enumerate() {
        for b in &ws[i + 1..] {
            if b.start >= a.end {
                continue;
            }
            if a.member != b.member {
                out.push(((*a).clone(), (*b).clone()));
            }
        }
    }
    out
}

/// Records [`FenceEvent`]s from any number of members into a [`FenceHistory`]. Install one `Arc` on each
/// member's ownership.
#[derive(Debug)]
pub struct FenceRecorder {
    origin: Instant,
    history: Mutex<Recorded>,
}

#[derive(Debug, Default)]
struct Recorded {
    history: FenceHistory,
    fence_at: BTreeMap<u64, usize>,
    request_at: BTreeMap<u64, usize>,
}

impl FenceRecorder {
    /// A recorder whose time 0 is now.
    #[must_use]
    pub fn new() -> Arc<Self> {
        Arc::new(FenceRecorder {
            origin: Instant::now(),
            history: Mutex::default(),
        })
    }

    /// What was recorded so far.
    #[must_use]
    pub fn history(&self) -> FenceHistory {
        self.lock().history.clone()
    }

    /// Shorthand: [`assert_exclusive`] on what was recorded so far.
    ///
    /// # Panics
    /// When the history breaks the contract.
    pub fn assert_exclusive(&self) {
        assert_exclusive(&self.history());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorded> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_micros()).unwrap_or(OPEN - 1)
    }
}

impl FenceObserver for FenceRecorder {
    fn on_event(&self, event: FenceEvent) {
        let mut r = self.lock();
        match event {
            FenceEvent::Issued {
                fence,
                member,
                shard,
                epoch,
                at,
                valid_until,
            } => {
                let rec = FenceRecord {
                    id: fence,
                    member: member.to_string(),
                    shard,
                    epoch,
                    issued: self.micros(at.runtime),
                    valid_until: self.micros(valid_until.runtime),
                    dropped: OPEN,
                };
                let idx = r.history.fences.len();
                r.history.fences.push(rec);
                r.fence_at.insert(fence, idx);
            }
            FenceEvent::Dropped { fence, at } => {
                let t = self.micros(at.runtime);
                if let Some(&i) = r.fence_at.get(&fence) {
                    r.history.fences[i].dropped = t;
                }
            }
            FenceEvent::RequestSent {
                request,
                fence,
                uid,
                at,
            } => {
                let rec = RequestRecord {
                    id: request,
                    fence,
                    uid,
                    sent: self.micros(at.runtime),
                    ended: OPEN,
                };
                let idx = r.history.requests.len();
                r.history.requests.push(rec);
                r.request_at.insert(request, idx);
            }
            FenceEvent::RequestEnded { request, at, .. } => {
                let t = self.micros(at.runtime);
                if let Some(&i) = r.request_at.get(&request) {
                    r.history.requests[i].ended = t;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
