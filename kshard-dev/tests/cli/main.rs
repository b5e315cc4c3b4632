//! Tests that run the built `kshard-dev` binary (one integration-test binary for the crate).

mod bench;
mod demo;
mod demo_ha;
mod testserver;
