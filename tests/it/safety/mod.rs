//! Safety scenarios judged by the oracles: the control plane, the group, the read path, and scripted
//! interleavings.

mod control;
pub(crate) mod group;
mod read;
mod scenarios;
