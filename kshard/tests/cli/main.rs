//! Tests that run the built `kshard` binary (one integration-test binary for the crate).

mod dev_alias;
mod fence_policy;
mod ha;
mod hash_selector;
mod replicas;
mod rolled_back;
mod status;
