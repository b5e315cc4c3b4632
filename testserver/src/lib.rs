//! # kube-shard-testserver
//!
//! An in-process Kubernetes API server for tests (placeholder docs; see below).
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

mod accounting;
mod audit;
mod controllers;
mod discovery;
mod faults;
mod http;
mod kubeconfig;
mod labels;
mod list;
mod query;
mod render;
mod resources;
mod rest;
mod router;
mod server;
mod service;
mod status;
mod store;
mod watch;

pub use accounting::{Accounting, Verb};
pub use audit::{FenceAudit, FenceAuditError, FenceSource, FenceViolation, FencedCommit};
pub use faults::{FailRule, Faults, GateSkew, Scope};
pub use http::{ClientError, HttpServer};
pub use server::{Builder, Config, TestServer};
pub use service::{ApiService, Refused, ResponseBody};
