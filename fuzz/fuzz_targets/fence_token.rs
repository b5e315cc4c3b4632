#![no_main]
//! `cargo +nightly fuzz run fence_token`: see `checks/library.rs`.

#[path = "../checks/library.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::fence_token(data));
