//! The fence policy's leaf types: the token pattern and refusal messages the policies and the library share,
//! the default names, [`PolicyResource`], [`ParamsRef`] and [`PolicyError`], and the name checks.

use std::{fmt, str::FromStr};

/// The default name of the per-object policy and of its binding.
pub const DEFAULT_POLICY_NAME: &str = "kube-shard-fence";

/// The token the policy accepts: `"<failover-epoch>:<shard>/<epoch>"`, `"<failover-epoch>:mirror"`, or a
/// legacy `"<shard>/<epoch>"` (failover epoch 0, see [`crate::token`]); failover epoch at most 10 decimal
/// digits, shard at most 9, epoch at most 18 (so that CEL's `int()`, a signed 64-bit integer, never
/// overflows).
pub const TOKEN_PATTERN: &str =
    "^([0-9]{1,10}:([0-9]{1,9}/[0-9]{1,18}|mirror)|[0-9]{1,9}/[0-9]{1,18})$";

/// The refusal messages of the per-object policy (the apiserver prefixes them with
/// `<plural>.<group> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied
/// request: `).
#[cfg_attr(not(feature = "test-util"), allow(unreachable_pub))]
pub(crate) mod messages {
    /// Every refusal message of the fence policy contains this (how
    /// [`is_fence_refused`](crate::ownership::fenced_write::Error::is_fence_refused) recognises them).
    pub const MARK: &str = "kube-shard fence";
    /// The write removes the fence annotation of a fenced object.
    pub const REMOVED: &str =
        "the kube-shard fence annotation may not be removed from a fenced object";
    /// The new token is not `"<failover-epoch>:<shard>/<epoch>"` (or `:mirror`, or legacy) within the limits.
    pub const MALFORMED: &str =
        "the kube-shard fence annotation must be FAILOVER:SHARD/EPOCH or FAILOVER:mirror in decimal, failover epoch at most 10 digits, shard at most 9, epoch at most 18";
    /// The token's failover epoch is lower than the stored one's: a deposed Active wrote.
    pub const FAILOVER_STALE: &str =
        "stale kube-shard fence: its failover epoch is lower than the stored object's (the writer's cluster was deposed)";
    /// The token names another shard than the stored one.
    pub const SHARD: &str =
        "the kube-shard fence names another shard than the stored object's fence";
    /// The token's epoch is lower than the stored one: the writer lost the shard.
    pub const STALE: &str =
        "stale kube-shard fence: its epoch is lower than the stored object's (the writer lost the shard)";
    /// Per shard: the token's epoch is lower than its shard's current epoch in the parameter ConfigMap.
    pub const SHARD_STALE: &str =
        "stale kube-shard fence: its epoch is lower than its shard's current epoch (the writer lost the shard)";
    /// Per shard: the parameter ConfigMap's value for the token's shard is not a decimal epoch.
    pub const PARAM_MALFORMED: &str =
        "the kube-shard fence parameter for this shard is not a decimal epoch of at most 18 digits";
    /// Status field: the `/status` write removes the fence field of a fenced object.
    pub const STATUS_REMOVED: &str =
        "the kube-shard fence status field may not be removed from a fenced object";
    /// Status field: the new token is malformed (as [`MALFORMED`]).
    pub const STATUS_MALFORMED: &str =
        "the kube-shard fence status field must be FAILOVER:SHARD/EPOCH or FAILOVER:mirror in decimal, failover epoch at most 10 digits, shard at most 9, epoch at most 18";
    /// Minimum epoch: the operator identity's write carries a failover epoch below the cluster's minimum.
    pub const MIN_EPOCH_STALE: &str =
        "stale kube-shard fence: the operator's write is below this cluster's minimum failover epoch (a newer Active was promoted)";
    /// Minimum epoch: the operator identity deletes while the cluster is Standby.
    pub const MIN_EPOCH_DELETE: &str =
        "kube-shard fence: the operator may not delete while this cluster is Standby (a newer Active was promoted)";
    /// Minimum epoch: the parameter's `minFailoverEpoch` is not a decimal.
    pub const MIN_EPOCH_MALFORMED: &str =
        "the kube-shard fence minimum-epoch parameter minFailoverEpoch is not a decimal of at most 10 digits";
}

/// A parameter value the per-shard policy accepts: a decimal epoch of at most 18 digits.
pub const EPOCH_PATTERN: &str = "^[0-9]{1,18}$";

/// The suffix of the per-shard policy's and binding's name (`kube-shard-fence-shard` by default).
pub const SHARD_POLICY_SUFFIX: &str = "-shard";

/// The suffix of the status-field policies' and bindings' names (`kube-shard-fence-status` per object,
/// `kube-shard-fence-status-shard` per shard).
pub const STATUS_POLICY_SUFFIX: &str = "-status";

/// A resource the policy covers, `PLURAL.GROUP` (`configmaps` for the core group).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PolicyResource {
    /// The resource's plural name, e.g. `widgets`.
    pub plural: String,
    /// The API group, empty for the core group.
    pub group: String,
}

impl FromStr for PolicyResource {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (plural, group) = s.split_once('.').unwrap_or((s, ""));
        let label = |p: &str| {
            !p.is_empty()
                && p.len() <= 63
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if !label(plural) || (!group.is_empty() && !group.split('.').all(label)) {
            return Err(PolicyError::Resource(s.chars().take(128).collect()));
        }
        Ok(PolicyResource {
            plural: plural.to_owned(),
            group: group.to_owned(),
        })
    }
}

impl fmt::Display for PolicyResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.plural)
        } else {
            write!(f, "{}.{}", self.plural, self.group)
        }
    }
}

/// Bad generator input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Not `PLURAL.GROUP` with lowercase DNS labels.
    #[error("invalid resource {0:?}: expected PLURAL.GROUP (lowercase DNS labels; PLURAL alone for the core group)")]
    Resource(String),
    /// No resource given.
    #[error("a fence policy needs at least one resource")]
    NoResource,
    /// Not a qualified annotation key (`[prefix/]name`).
    #[error("invalid annotation key {0:?}: expected [DNS-subdomain/]name of [A-Za-z0-9._-]")]
    Annotation(String),
    /// Not a valid object name.
    #[error("invalid policy name {0:?}: expected a lowercase DNS subdomain")]
    Name(String),
    /// Not `NAMESPACE/NAME` of a ConfigMap.
    #[error("invalid parameter ConfigMap {0:?}: expected NAMESPACE/NAME (lowercase DNS names)")]
    Params(String),
    /// An operator identity for the minimum-epoch policy that is empty or holds a quote or backslash.
    #[error("invalid operator identity {0:?}: expected a non-empty user name without quotes or backslashes")]
    Identity(String),
    /// Not `.status.NAME[.NAME...]` of CEL identifiers.
    #[error("invalid status fence field {0:?}: expected .status.NAME[.NAME...], NAME a CEL identifier ([A-Za-z_][A-Za-z0-9_]*, no __, not a reserved word), at most 8 names")]
    StatusField(String),
}

/// The parameter ConfigMap of the per-shard level: one key per shard (`"17"`), its value the shard's current
/// epoch in decimal. The coordinator keeps it ([`crate::group::ShardGroupBuilder::fence_params`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ParamsRef {
    /// Its namespace (the shard group's).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl FromStr for ParamsRef {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PolicyError::Params(s.chars().take(128).collect());
        let (namespace, name) = s.split_once('/').ok_or_else(bad)?;
        if !dns_label(namespace) || !dns_subdomain(name) {
            return Err(bad());
        }
        Ok(ParamsRef {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// `[prefix/]name`: prefix a DNS subdomain, name at most 63 of `[A-Za-z0-9._-]` starting and ending
/// alphanumeric (the apiserver's rule for annotation keys).
pub(crate) fn valid_annotation_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && name
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    name_ok && prefix.is_none_or(dns_subdomain)
}

pub(crate) fn dns_label(s: &str) -> bool {
    s.len() <= 63 && !s.contains('.') && dns_subdomain(s)
}

pub(crate) fn dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}
