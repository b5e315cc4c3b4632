//! The override (Linux, glibc).

use std::cell::Cell;
use std::ffi::{c_int, c_uint, c_void};

use crate::SeedError;

thread_local! {
    /// The armed stream of this thread (SplitMix64 state), `None`: real entropy.
    static STREAM: Cell<Option<u64>> = const { Cell::new(None) };
    /// Calls served from the stream on this thread.
    static DRAWS: Cell<u64> = const { Cell::new(0) };
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Write `len` bytes at `buf` from this thread's stream; `false` (nothing written) when the thread is not
/// armed or is being torn down. Writes through the raw pointer: the caller's bytes may be uninitialised.
fn fill_from_stream(buf: *mut u8, len: usize) -> bool {
    let armed = STREAM
        .try_with(|s| {
            let Some(mut state) = s.get() else {
                return false;
            };
            let mut done = 0;
            while done < len {
                let bytes = splitmix(&mut state).to_le_bytes();
                let n = (len - done).min(8);
                // SAFETY: `buf .. buf + len` is the caller's writable buffer (getrandom(3)'s contract,
                // checked non-null by the caller); `done + n <= len`.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.add(done), n) };
                done += n;
            }
            s.set(Some(state));
            true
        })
        .unwrap_or(false);
    if armed {
        let _ = DRAWS.try_with(|d| d.set(d.get() + 1));
    }
    armed
}

/// glibc's `getrandom(3)`: served from the thread's stream when armed, else the kernel's.
///
/// # Safety
/// As the C function: `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn getrandom(buf: *mut c_void, len: usize, flags: c_uint) -> isize {
    if len == 0 {
        // getrandom 0.3's availability probe: nothing to fill either way
        return 0;
    }
    if !buf.is_null() && isize::try_from(len).is_ok() && fill_from_stream(buf.cast::<u8>(), len) {
        return isize::try_from(len).unwrap_or(isize::MAX);
    }
    // unarmed, or arguments for the kernel to judge (a null buffer is its EFAULT)
    // SAFETY: the raw system call with the caller's own arguments, as glibc's wrapper makes it.
    unsafe { libc::syscall(libc::SYS_getrandom, buf, len, flags) as isize }
}

/// glibc's `getentropy(3)`: at most 256 bytes, through [`getrandom`].
///
/// # Safety
/// As the C function: `buf` points to `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn getentropy(buf: *mut c_void, len: usize) -> c_int {
    if len > 256 {
        // SAFETY: errno is this thread's.
        unsafe { *libc::__errno_location() = libc::EIO };
        return -1;
    }
    let mut done = 0;
    while done < len {
        // SAFETY: `buf + done .. buf + len` lies inside the caller's buffer.
        let n = unsafe { getrandom(buf.cast::<u8>().add(done).cast(), len - done, 0) };
        if n < 0 {
            // SAFETY: errno is this thread's.
            if unsafe { *libc::__errno_location() } == libc::EINTR {
                continue;
            }
            return -1;
        }
        done += n.unsigned_abs();
    }
    0
}

/// Arm this thread with a stream from `seed`, and have std draw this thread's hash keys from it now.
/// The thread stays armed: every later `getrandom` on it (tokio's runtime seed, ahash, `rand`) follows the
/// seed too.
///
/// # Errors
/// [`SeedError::NotInterposed`] when std's draw did not reach the override; [`SeedError::NotFresh`] when
/// std had drawn this thread's keys before (nothing reached the override although it is linked).
pub fn seed_thread(seed: u64) -> Result<(), SeedError> {
    STREAM.with(|s| s.set(Some(seed ^ 0x6A09_E667_F3BC_C908)));
    let before = draws();
    let _ = std::collections::hash_map::RandomState::new();
    if draws() > before {
        return Ok(());
    }
    STREAM.with(|s| s.set(None)); // not seeded: real entropy again
    Err(if interposed() {
        SeedError::NotFresh
    } else {
        SeedError::NotInterposed
    })
}

/// Calls served from this thread's stream so far.
#[must_use]
pub fn draws() -> u64 {
    DRAWS.with(Cell::get)
}

/// Whether this process's `getrandom` calls reach the override: on a fresh thread, armed, std's first
/// `RandomState` must draw from it, and the dynamic symbol (what the `getrandom` crate calls) must be
/// this one.
#[must_use]
pub fn interposed() -> bool {
    let std_reaches = std::thread::spawn(|| {
        STREAM.with(|s| s.set(Some(1)));
        let _ = std::collections::hash_map::RandomState::new();
        draws() > 0
    })
    .join()
    .unwrap_or(false);
    // SAFETY: dlsym with a NUL-terminated name; the pointer is only compared, never called.
    let dynamic = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"getrandom".as_ptr()) };
    std_reaches && dynamic == getrandom as *mut c_void
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_override_is_linked_and_a_seeded_thread_repeats_its_hash_order() {
        assert!(interposed(), "std and dlsym reach the override");
        let order = |seed: u64| {
            std::thread::spawn(move || {
                seed_thread(seed).expect("a fresh thread");
                let set: std::collections::HashSet<u32> = (0..32).collect();
                set.into_iter().collect::<Vec<_>>()
            })
            .join()
            .unwrap()
        };
        assert_eq!(order(7), order(7));
        assert_ne!(order(7), order(8), "the keys follow the seed");
    }

    #[test]
    fn a_thread_that_built_a_map_first_is_refused() {
        let r = std::thread::spawn(|| {
            drop(std::collections::HashSet::<u8>::new());
            seed_thread(3)
        })
        .join()
        .unwrap();
        assert_eq!(r, Err(SeedError::NotFresh));
    }

    #[test]
    fn unarmed_threads_get_real_entropy_and_oversized_getentropy_fails() {
        let mut a = [0u8; 32];
        let mut b = [0u8; 32];
        // SAFETY: valid buffers of the stated lengths.
        unsafe {
            assert_eq!(getrandom(a.as_mut_ptr().cast(), 32, 0), 32);
            assert_eq!(getrandom(b.as_mut_ptr().cast(), 32, 0), 32);
            assert_ne!(a, b);
            let mut big = [0u8; 257];
            assert_eq!(getentropy(big.as_mut_ptr().cast(), 257), -1);
            assert_eq!(getentropy(a.as_mut_ptr().cast(), 32), 0);
        }
    }
}
