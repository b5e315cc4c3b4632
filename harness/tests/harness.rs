//! The harness's tests: the demo scenarios run in this process (their replicas as
//! `kube-shard-replica` processes), their invariants asserted on the typed reports.

mod it;
