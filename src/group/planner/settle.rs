//! Cold-start settle and join debounce, as a pure helper (see the parent module).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::ownership::MemberId;

/// Cold-start settle and join debounce settings.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SettleConfig {
    /// Before the first plan: how long membership must stay unchanged (default 10 s).
    pub settle_window: Duration,
    /// After the first plan: how long a new member must stay before its join is planned (default 5 s).
    pub join_debounce: Duration,
    /// Before the first plan: plan at once when this many members are present (default none).
    pub expected_members: Option<usize>,
}

impl Default for SettleConfig {
    fn default() -> Self {
        SettleConfig {
            settle_window: Duration::from_secs(10),
            join_debounce: Duration::from_secs(5),
            expected_members: None,
        }
    }
}

impl SettleConfig {
    /// The defaults.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the settle window.
    #[must_use]
    pub fn with_settle_window(mut self, window: Duration) -> Self {
        self.settle_window = window;
        self
    }

    /// Set the join debounce.
    #[must_use]
    pub fn with_join_debounce(mut self, debounce: Duration) -> Self {
        self.join_debounce = debounce;
        self
    }

    /// Set the expected replica count.
    #[must_use]
    pub fn with_expected_members(mut self, expected: Option<usize>) -> Self {
        self.expected_members = expected;
        self
    }
}

#[derive(Clone, Debug)]
struct Seen {
    since: Instant,
    stable: bool,
}

/// When the first plan may be made, and which joins may be planned — from observation times the caller
/// passes in (no clock is read here).
///
/// The coordinator calls [`observe`](Self::observe) with the live members every time it looks at
/// membership, plans only when [`ready_to_plan`](Self::ready_to_plan), sets [`Member::joining`](super::Member::joining) from
/// [`is_joining`](Self::is_joining), calls [`mark_planned`](Self::mark_planned) after its first plan (or at
/// once when it found an existing assignment), and wakes up again at [`next_deadline`](Self::next_deadline).
///
/// ```
/// use std::time::{Duration, Instant};
/// use kube_shard::testing::planner::{Settle, SettleConfig};
/// use kube_shard::ownership::MemberId;
///
/// let t0 = Instant::now();
/// let s = |secs| t0 + Duration::from_secs(secs);
/// let (a, b, c) = (MemberId::new("a", "1"), MemberId::new("b", "1"), MemberId::new("c", "1"));
/// let mut settle = Settle::new(SettleConfig::new().with_settle_window(Duration::from_secs(10)));
/// settle.observe(s(0), [&a]);
/// settle.observe(s(4), [&a, &b]);
/// assert!(!settle.ready_to_plan(s(13)));
/// assert!(settle.ready_to_plan(s(14)));
/// settle.mark_planned();
/// settle.observe(s(20), [&a, &b, &c]);
/// assert!(settle.is_joining(&c, s(24)) && !settle.is_joining(&a, s(24)));
/// assert!(!settle.is_joining(&c, s(25)));
/// ```
#[derive(Clone, Debug)]
pub struct Settle {
    config: SettleConfig,
    last_change: Option<Instant>,
    seen: BTreeMap<MemberId, Seen>,
    planned: bool,
}

impl Settle {
    /// Nothing observed, not planned.
    #[must_use]
    pub fn new(config: SettleConfig) -> Self {
        Settle {
            config,
            last_change: None,
            seen: BTreeMap::new(),
            planned: false,
        }
    }

    /// Record the live members seen at `now`; returns whether membership changed.
    pub fn observe<'a, I>(&mut self, now: Instant, members: I) -> bool
    where
        I: IntoIterator<Item = &'a MemberId>,
    {
        let live: BTreeSet<&MemberId> = members.into_iter().collect();
        let before = self.seen.len();
        self.seen.retain(|id, _| live.contains(id));
        let mut changed = self.seen.len() != before || self.last_change.is_none();
        for id in live {
            if !self.seen.contains_key(id) {
                self.seen.insert(
                    id.clone(),
                    Seen {
                        since: now,
                        stable: false,
                    },
                );
                changed = true;
            }
        }
        if changed {
            self.last_change = Some(now);
        }
        changed
    }

    /// Whether a plan may be made at `now`: always after the first plan; before it, once members are present
    /// and either the expected count is reached or membership has not changed for the settle window.
    #[must_use]
    pub fn ready_to_plan(&self, now: Instant) -> bool {
        if self.planned {
            return true;
        }
        if self.seen.is_empty() {
            return false;
        }
        if self
            .config
            .expected_members
            .is_some_and(|e| self.seen.len() >= e)
        {
            return true;
        }
        self.last_change
            .is_some_and(|t| now.saturating_duration_since(t) >= self.config.settle_window)
    }

    /// Record that the first plan was made: every member present now is planned from here on.
    pub fn mark_planned(&mut self) {
        self.planned = true;
        for seen in self.seen.values_mut() {
            seen.stable = true;
        }
    }

    /// Whether the first plan was made.
    #[must_use]
    pub fn is_planned(&self) -> bool {
        self.planned
    }

    /// Whether `member`'s join is still being debounced at `now` (set [`Member::joining`](super::Member::joining) from this).
    /// Before the first plan nobody is joining (the first plan takes everyone); a member never observed
    /// counts as joining.
    #[must_use]
    pub fn is_joining(&self, member: &MemberId, now: Instant) -> bool {
        if !self.planned {
            return false;
        }
        match self.seen.get(member) {
            None => true,
            Some(seen) => {
                !seen.stable
                    && now.saturating_duration_since(seen.since) < self.config.join_debounce
            }
        }
    }

    /// The next time an answer of [`ready_to_plan`](Self::ready_to_plan) or
    /// [`is_joining`](Self::is_joining) changes on its own, if any.
    #[must_use]
    pub fn next_deadline(&self, now: Instant) -> Option<Instant> {
        if !self.planned {
            return self
                .last_change
                .filter(|_| !self.seen.is_empty() && !self.ready_to_plan(now))
                .map(|t| t + self.config.settle_window);
        }
        self.seen
            .values()
            .filter(|seen| !seen.stable)
            .map(|seen| seen.since + self.config.join_debounce)
            .filter(|&t| t > now)
            .min()
    }
}
