#![no_main]
//! `cargo +nightly fuzz run selector`: see `checks/library.rs`.

#[path = "../checks/library.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::selector(data));
