//! The example operator's command line (`kshard operator ...`, `kube-shard-replica ...`), built from
//! one struct so the demo and the end-to-end suite cannot drift apart on a flag.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use kube_shard::{ShardCount, ShardKey};

use crate::process::Launch;

/// Timings of a replica (they must satisfy the operator's own checks: drain ≥ renew deadline − fence
/// margin, renew deadline < lease).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timings {
    pub lease: Duration,
    pub renew_deadline: Duration,
    pub retry: Duration,
    pub takeover_grace: Duration,
    pub drain_timeout: Duration,
    pub fence_margin: Duration,
    pub settle: Duration,
    pub join_debounce: Duration,
}

impl Timings {
    /// The demo's: lease 5 s, renew deadline 3.5 s, retry and takeover grace 0.5 s.
    pub const DEMO: Timings = Timings {
        lease: Duration::from_secs(5),
        renew_deadline: Duration::from_millis(3500),
        retry: Duration::from_millis(500),
        takeover_grace: Duration::from_millis(500),
        // drain ≥ renew deadline − fence margin (3.5 s − 0.5 s)
        drain_timeout: Duration::from_secs(3),
        fence_margin: Duration::from_millis(500),
        settle: Duration::from_secs(2),
        join_debounce: Duration::from_secs(1),
    };

    /// The end-to-end suite's short ones: lease 3 s, renew deadline 2 s.
    pub const SHORT: Timings = Timings {
        lease: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry: Duration::from_millis(500),
        takeover_grace: Duration::from_millis(500),
        // drain ≥ renew deadline − fence margin (2 s − 0.3 s)
        drain_timeout: Duration::from_millis(1700),
        fence_margin: Duration::from_millis(300),
        settle: Duration::from_secs(3),
        join_debounce: Duration::from_millis(500),
    };
}

/// One replica's flags.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct OperatorFlags {
    /// The member identity.
    pub identity: String,
    /// The group's kubeconfig (and the Widgets', unless `widget_kubeconfig`).
    pub kubeconfig: PathBuf,
    /// A second identity for the Widget read path (the embedded server accounts reads per identity).
    pub widget_kubeconfig: Option<PathBuf>,
    pub group: String,
    /// The namespace of the group's Leases and assignment.
    pub namespace: String,
    /// Widgets of this namespace only (all namespaces when `None`).
    pub watch_namespace: Option<String>,
    pub timings: Timings,
    /// Cold start planned once this many members are present.
    pub expected: u32,
    pub key: ShardKey,
    pub shards: ShardCount,
    /// The apiserver's own fence policies (the embedded server only).
    pub install_fence_policy: bool,
    /// One line per committed fenced write (a hidden flag of the operator's).
    pub fence_log: Option<PathBuf>,
    /// Flags this struct does not model (`--shadow`, `--gc-interval 500ms`, the `--ha-*` ones), last.
    pub extra: Vec<OsString>,
}

impl OperatorFlags {
    /// `identity` in `group`/`namespace` with `kubeconfig`, the demo's timings, S = 256, uid keys, three
    /// expected members, no fence policy and no fence log.
    pub fn new(identity: &str, kubeconfig: PathBuf, group: &str, namespace: &str) -> Self {
        OperatorFlags {
            identity: identity.to_owned(),
            kubeconfig,
            widget_kubeconfig: None,
            group: group.to_owned(),
            namespace: namespace.to_owned(),
            watch_namespace: None,
            timings: Timings::DEMO,
            expected: 3,
            key: ShardKey::Uid,
            shards: ShardCount::DEFAULT,
            install_fence_policy: false,
            fence_log: None,
            extra: Vec::new(),
        }
    }

    /// The arguments after the subcommand (metrics on an ephemeral loopback port, CRD installed).
    pub fn args(&self) -> Vec<OsString> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let t = &self.timings;
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |k: &str, v: OsString| {
            a.push(k.into());
            a.push(v);
        };
        push("--kubeconfig", self.kubeconfig.clone().into());
        if let Some(w) = &self.widget_kubeconfig {
            push("--widget-kubeconfig", w.clone().into());
        }
        push("--group", self.group.clone().into());
        push("--namespace", self.namespace.clone().into());
        if let Some(ns) = &self.watch_namespace {
            push("--watch-namespace", ns.into());
        }
        push("--identity", self.identity.clone().into());
        push("--lease-duration", ms(t.lease).into());
        push("--renew-deadline", ms(t.renew_deadline).into());
        push("--retry-period", ms(t.retry).into());
        push("--takeover-grace", ms(t.takeover_grace).into());
        push("--drain-timeout", ms(t.drain_timeout).into());
        push("--fence-margin", ms(t.fence_margin).into());
        push("--settle", ms(t.settle).into());
        push("--join-debounce", ms(t.join_debounce).into());
        push("--expected-replicas", self.expected.to_string().into());
        push("--hash-key", self.key.to_string().into());
        push("--shards", self.shards.get().to_string().into());
        push("--metrics-addr", "127.0.0.1:0".into());
        if let Some(log) = &self.fence_log {
            push("--fence-log", log.clone().into());
        }
        a.push("--install-crd".into());
        if self.install_fence_policy {
            a.push("--install-fence-policy".into());
        }
        a.extend(self.extra.iter().cloned());
        a
    }
}

/// The program that runs a replica: a binary and the arguments before the flags (`kshard operator`,
/// or `kube-shard-replica` with none).
#[derive(Clone, Debug)]
pub struct ReplicaProgram {
    pub program: PathBuf,
    pub prefix: Vec<OsString>,
}

impl ReplicaProgram {
    /// `program prefix...`
    pub fn new(program: impl Into<PathBuf>, prefix: &[&str]) -> Self {
        ReplicaProgram {
            program: program.into(),
            prefix: prefix.iter().map(OsString::from).collect(),
        }
    }

    /// The command line of a replica with `flags`.
    pub fn launch(&self, flags: &OperatorFlags) -> Launch {
        Launch::new(&self.program)
            .args(&self.prefix)
            .args(flags.args())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_is_passed_once_with_its_value() {
        let mut f = OperatorFlags::new("r-0", "/k".into(), "g", "ns");
        f.watch_namespace = Some("w".into());
        f.fence_log = Some("/f".into());
        f.install_fence_policy = true;
        let a: Vec<String> = f
            .args()
            .into_iter()
            .map(|s| s.into_string().unwrap())
            .collect();
        let value = |k: &str| {
            let i = a
                .iter()
                .position(|x| x == k)
                .unwrap_or_else(|| panic!("{k}"));
            a[i + 1].clone()
        };
        assert_eq!(value("--identity"), "r-0");
        assert_eq!(value("--watch-namespace"), "w");
        assert_eq!(value("--lease-duration"), "5000ms");
        assert_eq!(value("--drain-timeout"), "3000ms");
        assert_eq!(value("--fence-log"), "/f");
        assert_eq!(value("--hash-key"), "uid");
        assert!(a.contains(&"--install-fence-policy".to_owned()));
        assert!(!a.contains(&"--widget-kubeconfig".to_owned()));
    }
}
