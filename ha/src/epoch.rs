//! The failover epoch: the core's [`kube_shard::token::FailoverEpoch`] (the fence token's first part),
//! which the elector takes and compares.

pub use kube_shard::token::{FailoverEpoch, FailoverEpochError, MAX_N, RANKS};
