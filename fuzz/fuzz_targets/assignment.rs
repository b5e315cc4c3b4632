#![no_main]
//! `cargo +nightly fuzz run assignment`: see `checks/library.rs`.

#[path = "../checks/library.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::assignment(data));
