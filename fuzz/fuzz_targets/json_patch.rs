#![no_main]
//! `cargo +nightly fuzz run json_patch`: see `checks/testserver.rs`.

#[path = "../checks/testserver.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::json_patch(data));
