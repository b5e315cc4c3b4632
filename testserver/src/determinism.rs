//! What makes a run reproducible: the random source of uids and `generateName` suffixes (seeded or
//! not), and the wall clock the server stamps its timestamps with (driven by tokio time, with an offset
//! and a rate, so paused time drives it and two servers can disagree).

use std::{sync::Mutex, time::Duration};

use jiff::{SignedDuration, Timestamp};

/// The server's random source: uids and `generateName` suffixes.
#[derive(Debug)]
pub(crate) struct Entropy {
    rng: Mutex<fastrand::Rng>,
}

/// The characters of a `generateName` suffix (kube-apiserver's `utilrand.String` alphabet).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

impl Entropy {
    /// Seeded: the same seed draws the same sequence. Unseeded: a random seed.
    pub(crate) fn new(seed: Option<u64>) -> Self {
        let rng = match seed {
            Some(s) => fastrand::Rng::with_seed(s),
            None => fastrand::Rng::new(),
        };
        Entropy {
            rng: Mutex::new(rng),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut fastrand::Rng) -> R) -> R {
        f(&mut self.rng.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// A UUID v4, as the real server's uids are.
    pub(crate) fn uid(&self) -> String {
        let mut bytes = [0u8; 16];
        self.with(|r| r.fill(&mut bytes));
        uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .to_string()
    }

    /// Five characters of the `generateName` alphabet.
    pub(crate) fn suffix(&self) -> String {
        self.with(|r| {
            (0..5)
                .map(|_| SUFFIX_ALPHABET[r.usize(..SUFFIX_ALPHABET.len())] as char)
                .collect()
        })
    }
}

/// The server's wall clock: `start_wall + offset + rate × (tokio time elapsed since the server was built)`.
#[derive(Debug, Clone)]
pub(crate) struct WallClock {
    start_wall: Timestamp,
    start: tokio::time::Instant,
    offset: SignedDuration,
    rate: f64,
}

impl WallClock {
    /// From `start` (the host's clock when `None`, or when `start` is out of range).
    pub(crate) fn new(
        start: Option<std::time::SystemTime>,
        offset: SignedDuration,
        rate: f64,
    ) -> Self {
        WallClock {
            start_wall: start
                .and_then(|t| Timestamp::try_from(t).ok())
                .unwrap_or_else(Timestamp::now),
            start: tokio::time::Instant::now(),
            offset,
            rate,
        }
    }

    /// The server's "now".
    pub(crate) fn now(&self) -> Timestamp {
        let elapsed = tokio::time::Instant::now().saturating_duration_since(self.start);
        let scaled = scale(elapsed, self.rate);
        self.start_wall
            .checked_add(self.offset)
            .and_then(|t| t.checked_add(scaled))
            .unwrap_or(self.start_wall)
    }

    /// `2026-11-30T02:00:28Z`, as Kubernetes writes timestamps.
    pub(crate) fn rfc3339(&self) -> String {
        self.now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
    }
}

/// `elapsed × rate` as a signed duration (a negative or non-finite rate stops the clock at its start).
fn scale(elapsed: Duration, rate: f64) -> SignedDuration {
    let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
    SignedDuration::try_from_secs_f64(elapsed.as_secs_f64() * rate).unwrap_or(SignedDuration::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_entropy_repeats_and_unseeded_differs() {
        let (a, b) = (Entropy::new(Some(7)), Entropy::new(Some(7)));
        let draws = |e: &Entropy| (e.uid(), e.suffix(), e.uid());
        assert_eq!(draws(&a), draws(&b));
        let (c, d) = (Entropy::new(None), Entropy::new(None));
        assert_ne!(c.uid(), d.uid());
        let uid = Entropy::new(Some(1)).uid();
        assert_eq!(uuid::Uuid::parse_str(&uid).unwrap().get_version_num(), 4);
    }

    #[test]
    fn suffix_uses_the_alphabet() {
        let s = Entropy::new(Some(3)).suffix();
        assert_eq!(s.len(), 5);
        assert!(s.bytes().all(|b| SUFFIX_ALPHABET.contains(&b)), "{s}");
    }

    #[test]
    fn scale_clamps_bad_rates() {
        let ten = Duration::from_secs(10);
        assert_eq!(scale(ten, 2.0), SignedDuration::from_secs(20));
        assert_eq!(scale(ten, -1.0), SignedDuration::ZERO);
        assert_eq!(scale(ten, f64::NAN), SignedDuration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_start_makes_the_clock_repeat() {
        let at = std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
        let a = WallClock::new(Some(at), SignedDuration::ZERO, 1.0);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(a.rfc3339(), "2026-01-01T00:00:05Z");
    }

    #[tokio::test(start_paused = true)]
    async fn paused_time_drives_the_clock_at_its_rate_from_its_offset() {
        let clock = WallClock::new(None, SignedDuration::from_hours(-1), 0.5);
        let t0 = clock.now();
        assert!(
            t0 < Timestamp::now()
                .checked_sub(SignedDuration::from_mins(59))
                .unwrap()
        );
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(
            clock.now().duration_since(t0),
            SignedDuration::from_secs(50)
        );
    }
}
