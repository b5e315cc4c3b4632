//! Source resourceVersions (HA.md "Comparisons"): compared only as integers, by `CompareResourceVersion`
//! rules (a positive integer without leading zeros; anything else is an error, never a string comparison),
//! and only within one [`SourceId`]. Pure.

use std::fmt;

use super::error::MirrorError;

/// One source of resourceVersions: the source cluster's id, the uid of its `kube-system` namespace and
/// the resource (`<plural>.<group>`, `<plural>` for core). Versions from different sources are never
/// compared: a marker from another source counts as absent.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceId {
    /// The source cluster's id.
    pub cluster: String,
    /// The uid of the source's `kube-system` namespace.
    pub uid: String,
    /// `<plural>.<group>` (`<plural>` for core).
    pub resource: String,
}

impl SourceId {
    /// `<cluster>/<uid>`: the source identity of tokens and checkpoints (per kind).
    #[must_use]
    pub fn cluster_source(&self) -> String {
        format!("{}/{}", self.cluster, self.uid)
    }
}

impl fmt::Display for SourceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.cluster, self.uid, self.resource)
    }
}

/// Parse a resourceVersion as `CompareResourceVersion` does: a positive decimal integer without leading
/// zeros that fits in 64 bits.
pub fn parse_rv(raw: &str, what: &str) -> Result<u64, MirrorError> {
    let bad = || MirrorError::BadResourceVersion {
        what: what.to_string(),
        raw: raw.chars().take(64).collect(),
    };
    if raw.is_empty() || raw.starts_with('0') || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    raw.parse().map_err(|_| bad())
}

/// The commit marker on a copy (`kube-shard.io/source-rv`): `v1 src=<cluster>/<uid>/<resource> rv=<n>`.
#[must_use]
pub fn marker(source: &SourceId, rv: u64) -> String {
    format!("v1 src={source} rv={rv}")
}

/// The source resourceVersion a marker records **for `source`**: `None` when absent, from another
/// source, or not a v1 marker (all count as absent); an error when it names this source with an
/// unparseable version.
pub fn marker_rv(value: Option<&str>, source: &SourceId) -> Result<Option<u64>, MirrorError> {
    let Some(rest) = value.and_then(|v| v.strip_prefix("v1 src=")) else {
        return Ok(None);
    };
    let Some((src, rv)) = rest.rsplit_once(" rv=") else {
        return Ok(None);
    };
    if src != source.to_string() {
        return Ok(None);
    }
    parse_rv(rv, "the copy's source-rv marker").map(Some)
}

/// A source collection resourceVersion below the checkpoint (an etcd restore without a bump) stops the
/// kind.
pub fn check_regression(kind: &str, checkpoint: Option<u64>, now: u64) -> Result<(), MirrorError> {
    match checkpoint {
        Some(c) if now < c => Err(MirrorError::Regression {
            kind: kind.to_string(),
            checkpoint: c,
            now,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(cluster: &str) -> SourceId {
        SourceId {
            cluster: cluster.into(),
            uid: "u1".into(),
            resource: "widgets.example.com".into(),
        }
    }

    #[test]
    fn versions_compare_as_integers_never_as_strings() {
        // "999" > "1000" as strings: compared that way, a newer version would be skipped
        let (a, b) = (
            parse_rv("999", "t").unwrap(),
            parse_rv("1000", "t").unwrap(),
        );
        assert!(a < b);
        assert!("999" > "1000", "the string order this guards against");
        assert_eq!(parse_rv("18446744073709551615", "t").unwrap(), u64::MAX);
    }

    #[test]
    fn unparseable_versions_are_errors() {
        for bad in [
            "",
            "0",
            "012",
            "-1",
            "+1",
            "1a",
            " 1",
            "1 ",
            "18446744073709551616",
            "a",
        ] {
            assert!(parse_rv(bad, "t").is_err(), "{bad:?} must not parse");
        }
    }

    #[test]
    fn markers_count_only_from_their_own_source() {
        let a = src("a");
        let m = marker(&a, 1200);
        assert_eq!(marker_rv(Some(&m), &a).unwrap(), Some(1200));
        // another cluster, another kube-system uid, another resource: absent, not older
        assert_eq!(marker_rv(Some(&m), &src("b")).unwrap(), None);
        let other_uid = SourceId {
            uid: "u2".into(),
            ..a.clone()
        };
        assert_eq!(marker_rv(Some(&m), &other_uid).unwrap(), None);
        let other_res = SourceId {
            resource: "gadgets.example.com".into(),
            ..a.clone()
        };
        assert_eq!(marker_rv(Some(&m), &other_res).unwrap(), None);
        assert_eq!(marker_rv(None, &a).unwrap(), None);
        assert_eq!(marker_rv(Some("1200"), &a).unwrap(), None);
        // this source, corrupt number: an error, never a string comparison
        let corrupt = format!("v1 src={a} rv=01200");
        assert!(marker_rv(Some(&corrupt), &a).is_err());
    }

    #[test]
    fn a_collection_below_the_checkpoint_is_a_regression() {
        assert!(check_regression("w", Some(1_000_000_500), 1_000_000_500).is_ok());
        assert!(check_regression("w", None, 3).is_ok());
        let e = check_regression("w", Some(1_000_000_500), 3000).unwrap_err();
        assert!(matches!(
            e,
            MirrorError::Regression {
                checkpoint: 1_000_000_500,
                now: 3000,
                ..
            }
        ));
    }
}
