#![no_main]
//! `cargo +nightly fuzz run shard_set`: see `checks/library.rs`.

#[path = "../checks/library.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::shard_set(data));
