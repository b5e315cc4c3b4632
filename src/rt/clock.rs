//! The two clocks fences are checked against.
//!
//! - The **runtime clock**: [`tokio::time::Instant`], which tests can pause and advance.
//! - The **boot clock**: a monotonic clock that keeps counting while the machine is suspended
//!   (`CLOCK_BOOTTIME` on Linux and Android). Elsewhere it falls back to [`std::time::Instant`], which on some
//!   platforms stops during suspend: fencing there rests on the runtime clock and bounded suspends.
//!
//! A fence is valid only while *both* clocks are before its deadline, so a VM pause or laptop suspend that
//! the runtime clock does not see still expires it.

use std::{
    fmt,
    sync::Arc,
    time::{Duration, SystemTime},
};

/// A reading of both clocks at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// The runtime clock.
    pub runtime: tokio::time::Instant,
    /// The boot clock, as time since an arbitrary fixed origin.
    pub boot: Duration,
}

/// A deadline on both clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    /// On the runtime clock.
    pub runtime: tokio::time::Instant,
    /// On the boot clock.
    pub boot: Duration,
}

impl Now {
    /// This moment plus `d` on both clocks.
    #[must_use]
    pub fn plus(self, d: Duration) -> Deadline {
        Deadline {
            runtime: self.runtime + d,
            boot: self.boot.saturating_add(d),
        }
    }
}

impl Deadline {
    /// The time left until the deadline: the smaller of both clocks' remainders, zero if either passed.
    #[must_use]
    pub fn remaining(self, now: Now) -> Duration {
        let rt = self.runtime.saturating_duration_since(now.runtime);
        let boot = self.boot.saturating_sub(now.boot);
        rt.min(boot)
    }

    /// The earlier of two deadlines, clock by clock.
    #[must_use]
    pub fn min(self, other: Deadline) -> Deadline {
        Deadline {
            runtime: self.runtime.min(other.runtime),
            boot: self.boot.min(other.boot),
        }
    }
}

type BootFn = dyn Fn() -> Duration + Send + Sync;
type WallFn = dyn Fn() -> SystemTime + Send + Sync;
type ElapsedFn = dyn Fn() -> Duration + Send + Sync;

/// Reads both clocks (and the wall clock, for stamps). Cheap to clone; clones share their origin.
#[derive(Clone)]
pub struct Clock {
    boot: Arc<BootFn>,
    wall: Arc<WallFn>,
    elapsed: Arc<ElapsedFn>,
}

/// The runtime clock as time since now.
fn runtime_since_now() -> Arc<ElapsedFn> {
    let origin = tokio::time::Instant::now();
    Arc::new(move || origin.elapsed())
}

impl fmt::Debug for Clock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Clock").finish_non_exhaustive()
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::system()
    }
}

impl Clock {
    /// The tokio runtime clock and the system boot clock.
    #[must_use]
    pub fn system() -> Self {
        Clock {
            boot: Arc::new(boot_now),
            wall: Arc::new(SystemTime::now),
            elapsed: runtime_since_now(),
        }
    }

    /// The tokio runtime clock and a boot clock read from `boot` (tests: simulate a suspend that the
    /// runtime clock does not see).
    ///
    /// ```
    /// use std::{sync::{Arc, atomic::{AtomicU64, Ordering}}, time::Duration};
    /// use kube_shard::rt::Clock;
    /// let ms = Arc::new(AtomicU64::new(0));
    /// let m = ms.clone();
    /// let clock = Clock::with_boot(move || Duration::from_millis(m.load(Ordering::SeqCst)));
    /// ms.store(5_000, Ordering::SeqCst); // "suspended" for 5 s: a member on this clock sees its fences expire
    /// # let _ = clock;
    /// ```
    pub fn with_boot(boot: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        Clock {
            boot: Arc::new(boot),
            wall: Arc::new(SystemTime::now),
            elapsed: runtime_since_now(),
        }
    }

    /// This clock with the wall clock read from `wall` (simulators: wall-clock jumps, and stamps that follow
    /// simulated time). The wall clock only stamps: `renewTime` (compared for change, never for duration),
    /// assignment generations and singleton terms (`max(previous + 1, now)`), Event timestamps.
    ///
    /// ```
    /// use std::time::{Duration, UNIX_EPOCH};
    /// use kube_shard::rt::Clock;
    /// let clock = Clock::system().with_wall(|| UNIX_EPOCH + Duration::from_secs(1_000));
    /// assert_eq!(clock.wall(), UNIX_EPOCH + Duration::from_secs(1_000));
    /// ```
    #[must_use]
    pub fn with_wall(mut self, wall: impl Fn() -> SystemTime + Send + Sync + 'static) -> Self {
        self.wall = Arc::new(wall);
        self
    }

    /// This clock with [`elapsed`](Clock::elapsed) read from `elapsed` (tests: a process clock running at
    /// another rate, or offset, than the runtime clock).
    ///
    /// ```
    /// use std::time::Duration;
    /// use kube_shard::rt::Clock;
    /// let clock = Clock::system().with_elapsed(|| Duration::from_secs(42));
    /// assert_eq!(clock.elapsed(), Duration::from_secs(42));
    /// ```
    #[must_use]
    pub fn with_elapsed(mut self, elapsed: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        self.elapsed = Arc::new(elapsed);
        self
    }

    /// The runtime clock as time since this clock was made (monotonic; pausable in tests): what the HA
    /// crate dates its terms on.
    #[must_use]
    pub fn elapsed(&self) -> Duration {
        (self.elapsed)()
    }

    /// Read the wall clock.
    #[must_use]
    pub fn wall(&self) -> SystemTime {
        (self.wall)()
    }

    /// The wall clock in milliseconds since the Unix epoch (0 before it).
    #[must_use]
    pub fn wall_ms(&self) -> u64 {
        self.wall()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }

    /// The wall clock as a `jiff` timestamp (what `Time`/`MicroTime` carry).
    #[must_use]
    pub fn wall_timestamp(&self) -> k8s_openapi::jiff::Timestamp {
        k8s_openapi::jiff::Timestamp::try_from(self.wall())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    /// Read both clocks.
    #[must_use]
    pub(crate) fn now(&self) -> Now {
        Now {
            runtime: tokio::time::Instant::now(),
            boot: (self.boot)(),
        }
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn boot_now() -> Duration {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    Duration::new(
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u32::try_from(ts.tv_nsec).unwrap_or(0),
    )
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn boot_now() -> Duration {
    use std::sync::OnceLock;
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_is_monotonic() {
        let a = boot_now();
        let b = boot_now();
        assert!(b >= a);
        assert!(a > Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn remaining_is_the_smaller_of_both_clocks() {
        let boot = Arc::new(std::sync::atomic::AtomicU64::new(1_000));
        let b = boot.clone();
        let clock = Clock::with_boot(move || {
            Duration::from_millis(b.load(std::sync::atomic::Ordering::SeqCst))
        });
        let d = clock.now().plus(Duration::from_secs(10));
        assert_eq!(d.remaining(clock.now()), Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(3)).await;
        assert_eq!(d.remaining(clock.now()), Duration::from_secs(7));
        // a suspend of 8 s the runtime clock did not see
        boot.store(9_000, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(d.remaining(clock.now()), Duration::from_secs(2));
        boot.store(20_000, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(d.remaining(clock.now()), Duration::ZERO);
    }
}
