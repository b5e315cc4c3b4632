#![no_main]
//! `cargo +nightly fuzz run protobuf_body`: see `checks/testserver.rs`.

#[path = "../checks/testserver.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::protobuf_body(data));
