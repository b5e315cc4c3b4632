//! `kshard operator` replica processes, started through the harness's one launcher.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use kube_shard::ShardCount;
use kube_shard_harness::operator::{OperatorFlags, ReplicaProgram, Timings};
use kube_shard_harness::process::ReplicaProcess;

/// The runtime the replica processes' output readers run on (the tests themselves are synchronous).
pub(crate) fn processes() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// Member `name` of `group` in `default`: the short timings (settle 1 s), 16 shards.
pub(crate) fn flags(kubeconfig: &Path, name: &str, group: &str) -> OperatorFlags {
    let mut f = OperatorFlags::new(name, kubeconfig.to_owned(), group, "default");
    f.timings = Timings::SHORT;
    f.timings.settle = Duration::from_secs(1);
    f.shards = ShardCount::new(16).unwrap();
    f
}

/// `kshard operator` with `flags`, its log beside `kubeconfig`; killed when dropped.
pub(crate) fn start(flags: &OperatorFlags, kubeconfig: &Path) -> ReplicaProcess {
    let launch = ReplicaProgram::new(env!("CARGO_BIN_EXE_kshard"), &["operator"]).launch(flags);
    let log = kubeconfig.with_file_name(format!("{}.log", flags.identity));
    processes()
        .block_on(ReplicaProcess::start(
            &flags.identity,
            &launch,
            &log,
            Duration::from_secs(30),
        ))
        .unwrap_or_else(|e| panic!("{e}"))
}
