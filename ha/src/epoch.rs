//! The failover epoch, as HA names it: [`kube_shard::token::FailoverEpoch`] (the fence token's first part).

pub use kube_shard::token::failover::{
    FailoverEpoch as Epoch, FailoverEpochError as EpochError, MAX_N, RANKS,
};
