//! End-to-end tests of kube-shard against any cluster a `KUBECONFIG` points at: kind with the
//! `ShardedListAndWatch` gate on or off, a bare kube-apiserver, or `kshard testserver`. Nothing in it needs
//! pods, a kubelet or the controller manager, and it never waits for a namespace to be deleted.
//!
//! The tests are `#[ignore]`d: `cargo test --workspace` builds and skips them. Run them with
//! `KUBECONFIG=... cargo test -p kube-shard-e2e -- --ignored --test-threads=1`, or `e2e/run.sh`.
//! Figures go to the file named by `E2E_REPORT`, one JSON object per line.
#![forbid(unsafe_code)]
