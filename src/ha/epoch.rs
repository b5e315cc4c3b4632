//! The failover epoch, as HA names it: [`crate::token::FailoverEpoch`] (the fence token's first part).

pub use crate::token::failover::{
    FailoverEpoch as Epoch, FailoverEpochError as EpochError, MAX_N, RANKS,
};
