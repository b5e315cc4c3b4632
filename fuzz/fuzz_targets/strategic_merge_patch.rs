#![no_main]
//! `cargo +nightly fuzz run strategic_merge_patch`: see `checks/testserver.rs`.

#[path = "../checks/testserver.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::strategic_merge_patch(data));
