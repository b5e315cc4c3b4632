//! The library's own randomness — [`jitter`], member incarnations, Event names — from one
//! per-thread source that a simulator can seed.
//!
//! Unseeded (the default) every draw comes from the operating system's randomness (`rand::random`). After
//! [`seed_thread`] on a thread, every draw *on that thread* comes from a deterministic generator
//! (SplitMix64): a simulator that runs one seed on a current-thread tokio runtime seeds that thread once and
//! gets the same incarnations, Event names and jitter on every run. Other threads are unaffected.

use std::cell::Cell;
use std::time::Duration;

thread_local! {
    static STATE: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Make every later draw on the calling thread deterministic, starting from `seed`.
///
/// ```
/// use kube_shard::rt;
/// rt::seed_thread(7);
/// let a = (rt::next_u64(), rt::next_u64());
/// rt::seed_thread(7);
/// assert_eq!(a, (rt::next_u64(), rt::next_u64()));
/// rt::unseed_thread();
/// ```
pub fn seed_thread(seed: u64) {
    STATE.with(|s| s.set(Some(seed)));
}

/// Back to the operating system's randomness on the calling thread.
pub fn unseed_thread() {
    STATE.with(|s| s.set(None));
}

/// The next draw: seeded on this thread by [`seed_thread`], else `rand::random`.
#[must_use]
pub fn next_u64() -> u64 {
    STATE.with(|s| match s.get() {
        None => rand::random::<u64>(),
        Some(x) => {
            let x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            s.set(Some(x));
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    })
}

/// `d` jittered by up to ±20 %: spreads requeues and re-enqueues of many objects so they do not arrive as one
/// burst. The read path paces re-enqueue `ObjectRef`s with it.
///
/// ```
/// use std::time::Duration;
/// let d = kube_shard::jitter(Duration::from_secs(10));
/// assert!(d >= Duration::from_secs(8) && d <= Duration::from_secs(12));
/// ```
#[must_use]
pub fn jitter(d: Duration) -> Duration {
    let r = next_u64() % 4001; // 0..=4000 → factor 0.8..=1.2
    d.mul_f64(0.8 + r as f64 / 10_000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_draws_repeat_and_unseeded_ones_differ_from_them() {
        seed_thread(42);
        let a: Vec<u64> = (0..4).map(|_| next_u64()).collect();
        seed_thread(42);
        let b: Vec<u64> = (0..4).map(|_| next_u64()).collect();
        assert_eq!(a, b);
        seed_thread(43);
        let c: Vec<u64> = (0..4).map(|_| next_u64()).collect();
        assert_ne!(a, c);
        unseed_thread();
        let d: Vec<u64> = (0..4).map(|_| next_u64()).collect();
        assert_ne!(a, d);
    }

    #[test]
    fn seeding_is_per_thread() {
        seed_thread(1);
        let here = next_u64();
        let there = std::thread::spawn(|| {
            let _ = next_u64(); // unseeded on this thread
            seed_thread(1);
            next_u64()
        })
        .join()
        .unwrap();
        assert_eq!(here, there);
        unseed_thread();
    }

    #[test]
    fn seeded_jitter_repeats() {
        let d = std::time::Duration::from_secs(10);
        seed_thread(9);
        let a = super::jitter(d);
        seed_thread(9);
        assert_eq!(a, super::jitter(d));
        unseed_thread();
    }
}
