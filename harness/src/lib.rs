//! The kube-shard workspace's harness (not published): what the demo, the end-to-end suite and the
//! benchmarks share to run the example operator and judge it.
//!
//! - [`checks`]: the replicas' fence log judged by the library's fence oracle, and the per-shard commit
//!   order;
//! - [`group`]: a group read through the library's `GroupView`, with the sets scenarios wait on;
//! - [`process`]: the one way to start a replica process, wait for it and signal it;
//! - [`operator`]: the example operator's command line ([`operator::OperatorFlags`]);
//! - [`server`]: the embedded API server served from a thread of its own, for synchronous tests;
//! - [`demo`]: the `kshard-dev demo` scenarios, returning typed reports ([`DemoReport`],
//!   [`demo::ha::HaDemoReport`]) whose invariants the harness's own tests assert.
#![forbid(unsafe_code)]

pub mod checks;
pub mod demo;
pub mod group;
pub mod operator;
pub mod process;
pub mod server;

pub use demo::{DemoError, DemoOptions, DemoReport};
pub use process::{ProcessError, ReplicaProcess};
