//! Integration tests of the testserver, through real `kube::Client`s and the stock `kube_runtime`
//! watcher and reflector. One binary; modules by topic.

mod common;
mod crud;
