//! End-to-end tests of kube-shard against any cluster a `KUBECONFIG` points at: kind with the
//! `ShardedListAndWatch` gate on or off, a bare kube-apiserver, or `kshard-dev testserver`. Nothing in it needs
//! pods, a kubelet or the controller manager (replicas of the example operator, `kshard operator`, run as
//! local processes), and it never waits for a namespace to be deleted.
//!
//! The tests are `#[ignore]`d: `cargo test --workspace` builds and skips them. Run them with
//! `KUBECONFIG=... cargo test -p kube-shard-e2e -- --ignored --test-threads=1`, or `e2e/run.sh`.
//! Figures go to the file named by `E2E_REPORT`, one JSON object per line. The `kshard` binary is
//! `KSHARD_BIN`, or built into `target/e2e`.
//!
//! The scenarios are in `tests/e2e.rs`; `tests/support/` holds the replica-process harness (every
//! process is killed when the harness is dropped, on a panic too; logs and the fence log are kept in
//! `$TMPDIR/kshard-e2e-<namespace>` when a scenario fails) and the fence recorder, which watches the
//! Widgets and their child ConfigMaps and checks the fence of every committed write in commit order.
#![forbid(unsafe_code)]
