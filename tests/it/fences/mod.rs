//! Fences: fenced writes, the per-shard fence parameters, and the fence policies the API server enforces.

mod params;
pub(crate) mod policy;
mod write;
