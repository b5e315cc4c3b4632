//! The fault simulator's entropy: on Linux with glibc this crate defines the C symbols `getrandom` and
//! `getentropy`, so every caller that reaches them — std's `HashMap` keys (std calls `getrandom` through a
//! weak symbol), ahash's process keys (the `getrandom` crate looks the symbol up with `dlsym`), tokio's
//! runtime seeds — is served from a stream the simulator seeds per OS thread. A thread that never called
//! [`seed_thread`] gets real entropy from the kernel, as before.
//!
//! std draws its hash keys once per thread, on the thread's first `RandomState`, and bumps them on each
//! later one. So a run is exact only on a **fresh thread** seeded before anything on it builds a map:
//! [`seed_thread`] checks that and says when it was too late.
//!
//! Elsewhere (other systems, other C libraries) nothing is overridden: [`interposed`] is `false` and the
//! simulator runs without exact replay, saying so.
//!
//! The only unsafe code of the workspace's simulator lives here, so that the library, the simulator's own
//! crate and everything users build keep `#![forbid(unsafe_code)]`.
#![deny(unsafe_op_in_unsafe_fn)]

use std::fmt;

/// Why a thread's keys could not be seeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SeedError {
    /// This platform has no override (not Linux with glibc): hash order stays the OS's.
    Unsupported,
    /// The override is compiled in but this process's calls do not reach it (a linker, libc or std
    /// change): std drew its keys elsewhere.
    NotInterposed,
    /// std had already drawn this thread's keys before it was seeded: run the seed on a fresh thread.
    NotFresh,
}

impl fmt::Display for SeedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SeedError::Unsupported => {
                "no exact replay on this platform: the getrandom override needs Linux with glibc"
            }
            SeedError::NotInterposed => {
                "the getrandom override is not linked into this process (std drew its hash keys from \
                 the kernel): exact replay is off"
            }
            SeedError::NotFresh => {
                "this thread built a hash map before it was seeded: seed a fresh thread first"
            }
        })
    }
}

impl std::error::Error for SeedError {}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub use imp::{draws, interposed, seed_thread};

/// Without an override: nothing is seeded.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn seed_thread(_seed: u64) -> Result<(), SeedError> {
    Err(SeedError::Unsupported)
}

/// Without an override: never.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
#[must_use]
pub fn interposed() -> bool {
    false
}

/// Without an override: nothing is counted.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
#[must_use]
pub fn draws() -> u64 {
    0
}
