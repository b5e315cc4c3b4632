//! Shard-group settings and their validation.
//!
//! Defaults (`docs/control-plane.md`): S = 256, lease 15 s, renew deadline 10 s, retry 2 s,
//! takeover grace 2 s, drain timeout 10 s — sized so a graceful leave fits Kubernetes' default 30 s
//! termination grace period.

use std::time::Duration;

use crate::hash::ShardKey;
use crate::shard::ShardCount;

/// The settings of one member of a shard group.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupConfig {
    /// The group name: prefixes every Lease and the assignment ConfigMap.
    pub group: String,
    /// The namespace of the group's Leases, ConfigMap and Events.
    pub namespace: String,
    /// This member's stable name (default: `POD_NAME`, else the hostname).
    pub member: String,
    /// The key objects are placed by (immutable for the group).
    pub key: ShardKey,
    /// `S` (immutable for the group; at most 4096).
    pub shards: ShardCount,
    /// A member whose renewals are not seen to change for this long (plus the grace) is taken over.
    pub lease_duration: Duration,
    /// A member whose last successful renewal *started* longer ago than this self-fences.
    pub renew_deadline: Duration,
    /// How often renewals, retries and coordinator passes run.
    pub retry_period: Duration,
    /// Extra wait before a takeover, on top of `lease_duration`.
    pub takeover_grace: Duration,
    /// How long an Outgoing shard waits for in-flight work before it is released anyway.
    pub drain_timeout: Duration,
    /// Fences end this much before the renew deadline.
    pub fence_margin: Duration,
    /// This member's placement weight (1 to 1000).
    pub weight: u32,
    /// Cold start: plan as soon as this many members are present (else after the settle window).
    pub expected_replicas: Option<u32>,
    /// Cold start: plan once membership has not changed for this long.
    pub settle: Duration,
    /// A join is planned only after it has been stable this long.
    pub join_debounce: Duration,
    /// At most this many shards moving at once (a leaver's whole set is exempt).
    pub max_concurrent_moves: u32,
    /// A move whose target has not acked `warm` within this time is cancelled.
    pub move_timeout: Duration,
    /// `/healthz` fails once the member has been self-fenced this long.
    pub unhealthy_after_fenced: Duration,
    /// Shadow mode: compute and report ownership, admit nothing (for migrating from leader election).
    pub shadow: bool,
    /// Admit nothing while this leader-election Lease (`name` in the group namespace, or `namespace/name`)
    /// has a live holder: run beside the old leader-elected deployment, take over when it is gone.
    pub legacy_leader_lease: Option<String>,
    /// The per-shard fence level: the name of the parameter ConfigMap (in the group namespace) in which the
    /// coordinator publishes each shard's current epoch before activating a new owner
    /// ([`crate::fence_policy`], `--params`). `None`: not kept.
    pub fence_params: Option<String>,
    /// This member's Pod (default: `POD_NAMESPACE`, `POD_NAME` and `POD_UID` when all three are set, as the
    /// downward API gives them), published on its Lease: once its Lease has expired, a Pod observed
    /// deleted or replaced confirms the member gone, so a restart of every replica is taken over at once
    /// instead of at the takeover budget's pace. Needs `get` on pods; without it nothing changes.
    pub pod: Option<PodRef>,
}

/// A member's Pod, as the downward API names it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PodRef {
    /// The Pod's namespace.
    pub namespace: String,
    /// The Pod's name.
    pub name: String,
    /// The Pod's uid (`metadata.uid`).
    pub uid: String,
}

impl PodRef {
    /// The Pod `namespace/name` with `uid`.
    #[must_use]
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        uid: impl Into<String>,
    ) -> Self {
        PodRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        }
    }

    /// From `POD_NAMESPACE`, `POD_NAME` and `POD_UID` (all three set and not empty).
    #[must_use]
    pub fn from_env() -> Option<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Some(PodRef::new(
            var("POD_NAMESPACE")?,
            var("POD_NAME")?,
            var("POD_UID")?,
        ))
    }

    /// The Lease annotation's text, `<namespace>/<name>/<uid>`.
    #[must_use]
    pub fn text(&self) -> String {
        format!("{}/{}/{}", self.namespace, self.name, self.uid)
    }

    /// Parse the annotation's text; anything else (hostile, oversized) is `None`.
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() > 400 {
            return None;
        }
        let mut parts = text.splitn(3, '/');
        let (ns, name, uid) = (parts.next()?, parts.next()?, parts.next()?);
        let ok = |s: &str, max: usize| {
            !s.is_empty()
                && s.len() <= max
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        };
        (ok(ns, 63) && ok(name, 253) && ok(uid, 64)).then(|| PodRef::new(ns, name, uid))
    }
}

impl GroupConfig {
    /// How long a move may stay `Draining` without the source's release before the coordinator cancels
    /// it, re-granting the source at a new epoch: `max(move_timeout, 2 × lease_duration +
    /// drain_timeout)` — time for a source whose assignment watch is stuck to be told through its Lease
    /// (a lease period), drain, and publish its release (another lease period at most).
    #[must_use]
    pub fn drain_stall_timeout(&self) -> Duration {
        self.move_timeout
            .max(self.lease_duration * 2 + self.drain_timeout)
    }

    /// Defaults for `group` in `namespace`, member name from `POD_NAME` or the hostname.
    #[must_use]
    pub fn new(group: impl Into<String>, namespace: impl Into<String>) -> Self {
        GroupConfig {
            group: group.into(),
            namespace: namespace.into(),
            member: default_member_name(),
            key: ShardKey::Uid,
            shards: ShardCount::DEFAULT,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            takeover_grace: Duration::from_secs(2),
            drain_timeout: Duration::from_secs(10),
            fence_margin: Duration::from_secs(1),
            weight: 1,
            expected_replicas: None,
            settle: Duration::from_secs(5),
            join_debounce: Duration::from_secs(2),
            max_concurrent_moves: 64,
            move_timeout: Duration::from_secs(60),
            unhealthy_after_fenced: Duration::from_secs(60),
            shadow: false,
            legacy_leader_lease: None,
            fence_params: None,
            pod: PodRef::from_env(),
        }
    }

    /// Check every rule; the error names the first one broken.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_name("group", &self.group, 40)?;
        check_name("namespace", &self.namespace, 63)?;
        check_name("member", &self.member, 63)?;
        // `<group>-<member>` must be a valid object name; `<group>-assignment` too
        if self.group.len() + 1 + self.member.len() > 253 {
            return Err(ConfigError::Invalid(format!(
                "lease name {}-{} is longer than 253 characters",
                self.group, self.member
            )));
        }
        if self.shards.get() > ShardCount::GROUP_MAX {
            return Err(ConfigError::Invalid(format!(
                "shards = {} is above the group limit of 4096",
                self.shards
            )));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(ConfigError::Invalid(format!(
                "renew_deadline ({:?}) must be shorter than lease_duration ({:?}): a member must stop acting before others may take over",
                self.renew_deadline, self.lease_duration
            )));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(ConfigError::Invalid(format!(
                "retry_period ({:?}) must be above zero and shorter than renew_deadline ({:?})",
                self.retry_period, self.renew_deadline
            )));
        }
        if self.fence_margin >= self.renew_deadline {
            return Err(ConfigError::Invalid(format!(
                "fence_margin ({:?}) must be shorter than renew_deadline ({:?})",
                self.fence_margin, self.renew_deadline
            )));
        }
        let fence_life = self.renew_deadline.saturating_sub(self.fence_margin);
        if self.drain_timeout < fence_life {
            return Err(ConfigError::Invalid(format!(
                "drain_timeout ({:?}) must be at least renew_deadline − fence_margin ({fence_life:?}): a fence issued before the drain, and a fenced request sent with it, may last that long, and the shard must not move to its next owner meanwhile",
                self.drain_timeout
            )));
        }
        if self.weight == 0 || self.weight > 1000 {
            return Err(ConfigError::Invalid(format!(
                "weight {} is not from 1 to 1000",
                self.weight
            )));
        }
        if self.max_concurrent_moves == 0 {
            return Err(ConfigError::Invalid(
                "max_concurrent_moves must be at least 1".into(),
            ));
        }
        if let Some(p) = &self.fence_params {
            check_name("fence_params", p, 253)?;
            if *p == self.assignment_name() {
                return Err(ConfigError::Invalid(
                    "fence_params must not name the assignment ConfigMap".into(),
                ));
            }
        }
        Ok(())
    }

    /// The name of this member's Lease.
    #[must_use]
    pub fn member_lease(&self) -> String {
        format!("{}-{}", self.group, self.member)
    }

    /// The name of the coordinator Lease.
    #[must_use]
    pub fn coordinator_lease(&self) -> String {
        format!("{}-coordinator", self.group)
    }

    /// The name of the assignment ConfigMap.
    #[must_use]
    pub fn assignment_name(&self) -> String {
        format!("{}-assignment", self.group)
    }
}

/// `POD_NAME`, else the hostname, else `member`.
#[must_use]
pub fn default_member_name() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|s| !s.is_empty()))
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "member".to_owned())
        .to_lowercase()
}

fn check_name(what: &str, name: &str, max: usize) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "{what} {name:?} must be 1 to {max} lowercase letters, digits, '-' or '.', starting and ending with a letter or digit"
        )))
    }
}

/// A setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A rule is broken.
    #[error("invalid shard group configuration: {0}")]
    Invalid(String),
    /// No namespace given, and none found in a pod (`POD_NAMESPACE`, the service account's namespace).
    #[error("the shard group's namespace is required outside a cluster: set ShardGroupBuilder::namespace (neither POD_NAMESPACE nor the service account's namespace file is present; a kubeconfig's default namespace is never used, since replicas with different kubeconfigs would form two groups)")]
    NamespaceRequired,
    /// The application's client could not be built from the `kube::Config`.
    #[error("cannot build a Kubernetes client from the kube::Config: {0}")]
    Client(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> GroupConfig {
        let mut c = GroupConfig::new("widgets", "default");
        c.member = "pod-0".into();
        c
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(ok().validate(), Ok(()));
        assert_eq!(ok().member_lease(), "widgets-pod-0");
    }

    /// A fence issued while Owned lasts up to `renew_deadline − fence_margin`, and a fenced request
    /// sent with it runs that long; a drain that may release earlier lets the next owner act while it is in
    /// flight. Such configurations are refused; the boundary is accepted.
    #[test]
    fn a_drain_shorter_than_a_fence_is_refused() {
        let mut c = ok();
        c.renew_deadline = Duration::from_secs(2);
        c.lease_duration = Duration::from_secs(3);
        c.retry_period = Duration::from_millis(500);
        c.fence_margin = Duration::from_millis(200);
        c.drain_timeout = Duration::from_secs(1);
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("drain_timeout (1s)") && err.contains("1.8s"),
            "{err}"
        );
        c.drain_timeout = Duration::from_millis(1_800);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn each_rule_has_a_clear_error() {
        type Case = (fn(&mut GroupConfig), &'static str);
        let cases: Vec<Case> = vec![
            (|c| c.group = "".into(), "group"),
            (|c| c.group = "Widgets".into(), "lowercase"),
            (|c| c.group = "-w".into(), "starting"),
            (|c| c.group = "w".repeat(41), "1 to 40"),
            (|c| c.member = "pod_0".into(), "member"),
            (|c| c.namespace = "".into(), "namespace"),
            (
                |c| c.renew_deadline = c.lease_duration,
                "shorter than lease_duration",
            ),
            (|c| c.retry_period = Duration::ZERO, "retry_period"),
            (|c| c.retry_period = c.renew_deadline, "retry_period"),
            (|c| c.fence_margin = c.renew_deadline, "fence_margin"),
            (|c| c.weight = 0, "weight"),
            (|c| c.shards = ShardCount::new(8192).unwrap(), "4096"),
            (|c| c.max_concurrent_moves = 0, "max_concurrent_moves"),
            (
                |c| c.drain_timeout = c.renew_deadline - c.fence_margin - Duration::from_millis(1),
                "drain_timeout",
            ),
        ];
        for (f, needle) in cases {
            let mut c = ok();
            f(&mut c);
            let err = c.validate().unwrap_err();
            assert!(
                err.to_string().contains(needle),
                "{err} should mention {needle}"
            );
        }
    }
}
