#![no_main]
//! `cargo +nightly fuzz run label_selector`: see `checks/testserver.rs`.

#[path = "../checks/testserver.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::label_selector(data));
