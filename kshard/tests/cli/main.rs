//! Tests that run the built `kshard` binary (one integration-test binary for the crate).

mod bench;
mod demo;
mod demo_ha;
mod fence_policy;
mod ha;
mod hash_selector;
mod rolled_back;
mod status;
mod testserver;
