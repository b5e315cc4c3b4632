//! Integration tests of the testserver, through real `kube::Client`s and the stock `kube_runtime`
//! watcher and reflector. One binary; modules by topic.

mod admission;
mod admission_failover;
mod admission_selectors;
mod admission_status;
mod audit;
mod builtins;
mod common;
mod crd;
mod crud;
mod determinism;
mod faults;
mod history;
mod http;
mod list;
mod load;
mod protobuf;
mod scoped;
mod shard;
mod ssa;
mod unanswered;
mod watcher;
