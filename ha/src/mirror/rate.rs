//! The mirror's global rate limit ([`super::MirrorConfig::rate_limit`]): one token bucket shared by every
//! kind's workers, awaited before each copy request (the reads and writes of one apply, not the watches,
//! probes or checkpoint writes). [`TokenBucket`] is pure (time passed in); [`RateLimit`] is the shared
//! handle the workers await.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

/// A token bucket of `per_second` tokens a second holding at most `burst`; it starts full. A request
/// reserves one token and waits until it is its turn, so over any window of `t` seconds at most
/// `per_second · t + burst` requests are sent, and waiting requests go in the order they reserved.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TokenBucket {
    per_second: f64,
    burst: f64,
    /// Tokens left at `at`; below zero: reserved ahead by requests still waiting.
    tokens: f64,
    at: Duration,
}

impl TokenBucket {
    /// `per_second` requests a second with a burst of a tenth of a second's worth (at least one); `None`
    /// unless `per_second` is finite and above zero.
    pub(crate) fn new(per_second: f64, now: Duration) -> Option<Self> {
        if !per_second.is_finite() || per_second <= 0.0 {
            return None;
        }
        let burst = (per_second / 10.0).max(1.0);
        Some(TokenBucket {
            per_second,
            burst,
            tokens: burst,
            at: now,
        })
    }

    /// Reserve one request at `now`: how long to wait before sending it (zero: at once).
    pub(crate) fn reserve(&mut self, now: Duration) -> Duration {
        let elapsed = now.saturating_sub(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.at = self.at.max(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_second)
        }
    }
}

/// The shared limit every kind's workers await (cheap to clone; no limit: never waits).
#[derive(Clone, Debug, Default)]
pub(crate) struct RateLimit(Option<Arc<(Mutex<TokenBucket>, Instant)>>);

impl RateLimit {
    /// At most `per_second` copy requests a second (`None`, or not a positive number: no limit).
    pub(crate) fn new(per_second: Option<f64>) -> Self {
        let b = per_second.and_then(|r| TokenBucket::new(r, Duration::ZERO));
        RateLimit(b.map(|b| Arc::new((Mutex::new(b), Instant::now()))))
    }

    /// Wait for this request's turn.
    pub(crate) async fn acquire(&self) {
        let Some(shared) = &self.0 else { return };
        let (bucket, origin) = &**shared;
        let wait = match bucket.lock() {
            Ok(mut b) => b.reserve(origin.elapsed()),
            Err(_) => Duration::ZERO, // a poisoned lock: a worker panicked; do not stop the others
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The send times of `requesters` callers each sending one request after another (each waits for
    /// its previous one's turn) for `secs` seconds of simulated time, all reserving from one bucket.
    fn simulate(per_second: f64, requesters: usize, secs: u64) -> Vec<Duration> {
        let mut b = TokenBucket::new(per_second, Duration::ZERO).unwrap();
        let mut next = vec![Duration::ZERO; requesters];
        let mut sent = Vec::new();
        let end = Duration::from_secs(secs);
        // the requester whose next request is earliest reserves next (time only moves forward)
        while let Some((i, &at)) = next.iter().enumerate().min_by_key(|(_, t)| **t) {
            if at >= end {
                break;
            }
            let send = at + b.reserve(at);
            sent.push(send);
            // each request takes 10 ms to answer before its requester asks again
            next[i] = send + Duration::from_millis(10);
        }
        sent.sort();
        sent
    }

    fn most_in_any_second(sent: &[Duration]) -> usize {
        let mut most = 0;
        for (i, start) in sent.iter().enumerate() {
            let n = sent[i..]
                .iter()
                .take_while(|t| **t < *start + Duration::from_secs(1))
                .count();
            most = most.max(n);
        }
        most
    }

    #[test]
    fn the_rate_limit_bounds_requests_per_second_over_every_kind() {
        // three kinds of eight workers each share one limit of 20 requests a second (burst 2)
        let sent = simulate(20.0, 3 * 8, 30);
        let most = most_in_any_second(&sent);
        assert!(most <= 22, "{most} requests in one second");
        let rate = sent.len() as f64 / 30.0;
        assert!((19.0..=21.0).contains(&rate), "{rate} a second on average");
        // without the shared bucket (each requester on its own) the same callers send far more
        let alone: usize = (0..24).map(|_| simulate(20.0, 1, 30).len()).sum();
        assert!(alone > 10 * sent.len(), "{alone}");
    }

    #[test]
    fn a_slow_rate_spaces_requests_and_a_fast_one_allows_a_small_burst() {
        let mut b = TokenBucket::new(0.5, Duration::ZERO).unwrap();
        assert_eq!(b.reserve(Duration::ZERO), Duration::ZERO, "starts full");
        assert_eq!(b.reserve(Duration::ZERO), Duration::from_secs(2));
        assert_eq!(b.reserve(Duration::from_secs(1)), Duration::from_secs(3));
        let mut f = TokenBucket::new(100.0, Duration::ZERO).unwrap();
        let at_once = (0..20)
            .filter(|_| f.reserve(Duration::ZERO).is_zero())
            .count();
        assert_eq!(at_once, 10, "a tenth of a second's worth at once");
        // idle time refills up to the burst, never beyond
        let mut g = TokenBucket::new(10.0, Duration::ZERO).unwrap();
        let later = Duration::from_secs(3600);
        assert!(g.reserve(later).is_zero());
        assert!(!g.reserve(later).is_zero(), "the burst is one request");
    }

    #[test]
    fn no_limit_or_a_bad_rate_never_waits() {
        assert!(TokenBucket::new(0.0, Duration::ZERO).is_none());
        assert!(TokenBucket::new(-1.0, Duration::ZERO).is_none());
        assert!(TokenBucket::new(f64::NAN, Duration::ZERO).is_none());
        assert!(TokenBucket::new(f64::INFINITY, Duration::ZERO).is_none());
        assert!(RateLimit::new(None).0.is_none());
        assert!(RateLimit::new(Some(0.0)).0.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_shared_limit_makes_its_callers_wait_their_turn() {
        let r = RateLimit::new(Some(10.0));
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let r = r.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    r.acquire().await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // 20 requests at 10 a second with one at once: the last goes 1.9 s in
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(1890) && took <= Duration::from_millis(1910),
            "{took:?}"
        );
    }
}
