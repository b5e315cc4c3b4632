#![no_main]
//! `cargo +nightly fuzz run field_selector`: see `checks/testserver.rs`.

#[path = "../checks/testserver.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::field_selector(data));
