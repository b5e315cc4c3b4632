//! The read path: a drop-in for `kube_runtime::watcher` that reads only the shards a member serves.
//!
//! Built so far: the request builder (`request`) and the uid-keyed index with the owned projection
//! (`index`). The sub-watch tasks and the public `watcher`/`reflector` functions come next.

#![allow(dead_code)] // wired in as the sub-watch tasks land

pub(crate) mod index;
pub(crate) mod mode;
pub(crate) mod plan;
pub(crate) mod registry;
pub(crate) mod request;
pub(crate) mod subwatch;
