#![no_main]
//! `cargo +nightly fuzz run query`: see `checks/testserver.rs`.

#[path = "../checks/testserver.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::query(data));
