//! The checkpoint ConfigMap's protocol (pure): the [`Kind`]s a switchover covers, the demotion [`DemotionToken`]
//! and its text form, the keys the mirror, promotion and switchover read and write, and the position
//! entries. The mirror and the switchover both build on it; [`edit`] writes the ConfigMap.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::epoch::FailoverEpoch;

pub mod edit;

/// The checkpoint ConfigMap key listing consumed token ids, one a line.
pub const USED_TOKENS_KEY: &str = "used-tokens";
/// The checkpoint ConfigMap key where `promote --token` asks the mirror (in another process) to catch
/// up to a token: the token's text.
pub const CATCH_UP_KEY: &str = "catch-up";
/// The checkpoint ConfigMap key where a forced promotion asks the mirror (in another process) to hold —
/// write nothing more to this cluster — before its takeover: `e=<source epoch> id=<id>`, acknowledged like
/// a catch-up under [`CAUGHT_UP_KEY`] as `<id> failed=0`. A request from an earlier term of the source is
/// ignored.
pub const HOLD_KEY: &str = "hold";
/// The checkpoint ConfigMap key where the mirror acknowledges a [`CATCH_UP_KEY`] request:
/// `<token id> failed=<n>`, written once the catch-up is applied (every kind's queue worked through, `n`
/// objects on the failed list) and the mirror holds: it writes nothing more to this cluster while the
/// request stays. `promote --token` takes over only after it.
pub const CAUGHT_UP_KEY: &str = "caught-up";
/// The checkpoint ConfigMap key marking a cluster that admitted at an epoch (its wire form): set
/// before admission opens, cleared when failback has made every own object a copy again.
pub const WAS_ACTIVE_KEY: &str = "was-active";
/// The checkpoint ConfigMap key where the [`MirrorDuty`](crate::duty::MirrorDuty) records its phase (for
/// `kshard ha status`, run from another process).
pub const DUTY_KEY: &str = "duty";
/// The checkpoint ConfigMap key marking a cluster taken out of HA (`kshard ha leave`): `<time> <reason>`.
/// Such a cluster is never a promotion target and runs no mirror; its freeze was lifted.
pub const LEFT_HA_KEY: &str = "left-ha";

/// Text that is not a kind or a demotion token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

/// A kind the switchover covers: `<plural>.<group>/<version>`, or `<plural>/<version>` for the core
/// group (`widgets.example.com/v1`, `configmaps/v1`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Kind {
    /// The API group ("" for core).
    pub group: String,
    /// The version.
    pub version: String,
    /// The plural resource name.
    pub plural: String,
}

impl Kind {
    /// `<plural>.<group>` (`<plural>` for core): the key of this kind in tokens and checkpoints.
    #[must_use]
    pub fn key(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.key(), self.version)
    }
}

impl FromStr for Kind {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let bad = || {
            ParseError(format!(
                "kind {s:?} is not <plural>.<group>/<version> (core: <plural>/<version>)"
            ))
        };
        let (rg, version) = s.split_once('/').ok_or_else(bad)?;
        let (plural, group) = rg.split_once('.').unwrap_or((rg, ""));
        let ok = |t: &str| {
            !t.is_empty()
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        };
        if !ok(plural) || !ok(version) || (!group.is_empty() && !ok(group)) || version.contains('.')
        {
            return Err(bad());
        }
        Ok(Kind {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
        })
    }
}

/// The demotion token: `v1;src=<cluster>/<kube-system uid>;e=<epoch>;k=<kind>:<rv>,…;id=<hex>`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DemotionToken {
    /// The source cluster's id.
    pub cluster: String,
    /// The uid of the source cluster's `kube-system` namespace.
    pub uid: String,
    /// The demoted epoch.
    pub epoch: FailoverEpoch,
    /// Per covered kind (its key), the resourceVersion of a consistent LIST taken after the freeze.
    pub kinds: BTreeMap<String, u64>,
    /// A random id (recorded as used by the promotion).
    pub id: String,
}

impl DemotionToken {
    /// `<cluster>/<uid>`: the source identity.
    #[must_use]
    pub fn source(&self) -> String {
        format!("{}/{}", self.cluster, self.uid)
    }
}

impl fmt::Display for DemotionToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kinds: Vec<String> = self
            .kinds
            .iter()
            .map(|(k, rv)| format!("{k}:{rv}"))
            .collect();
        write!(
            f,
            "v1;src={};e={};k={};id={}",
            self.source(),
            self.epoch.wire(),
            kinds.join(","),
            self.id
        )
    }
}

impl FromStr for DemotionToken {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let bad = || ParseError(format!("not a demotion token: {s:?}"));
        let mut parts = s.trim().split(';');
        if parts.next() != Some("v1") {
            return Err(bad());
        }
        let mut field = |name: &str| -> Result<String, ParseError> {
            parts
                .next()
                .and_then(|p| p.strip_prefix(name))
                .and_then(|p| p.strip_prefix('='))
                .map(str::to_string)
                .ok_or_else(bad)
        };
        let src = field("src")?;
        let e = field("e")?;
        let k = field("k")?;
        let id = field("id")?;
        let (cluster, uid) = src.rsplit_once('/').ok_or_else(bad)?;
        let epoch = FailoverEpoch::from_wire(e.parse().map_err(|_| bad())?).map_err(|_| bad())?;
        let mut kinds = BTreeMap::new();
        for kv in k.split(',').filter(|x| !x.is_empty()) {
            let (kind, rv) = kv.split_once(':').ok_or_else(bad)?;
            kinds.insert(kind.to_string(), rv.parse().map_err(|_| bad())?);
        }
        let clean = |t: &str| !t.is_empty() && !t.contains(char::is_whitespace);
        if !clean(cluster) || !clean(uid) || !clean(&id) || kinds.is_empty() {
            return Err(bad());
        }
        Ok(DemotionToken {
            cluster: cluster.into(),
            uid: uid.into(),
            epoch,
            kinds,
            id,
        })
    }
}

/// The failed-object count of a [`CAUGHT_UP_KEY`] acknowledgement of token `id` (`None`: another token,
/// or not an acknowledgement).
pub(crate) fn caught_up(ack: &str, id: &str) -> Option<usize> {
    let (ack_id, rest) = ack.split_once(' ')?;
    (ack_id == id).then_some(())?;
    rest.strip_prefix("failed=")?.parse().ok()
}

/// A hold request's text (`e=<source epoch> id=<id>`) → (source epoch, id).
pub(crate) fn parse_hold(text: &str) -> Option<(u64, String)> {
    let (e, id) = text.split_once(' ')?;
    let e = e.strip_prefix("e=")?.parse().ok()?;
    let id = id.strip_prefix("id=")?;
    (!id.is_empty() && !id.contains(char::is_whitespace)).then(|| (e, id.to_string()))
}

pub(crate) fn position(data: &BTreeMap<String, String>, kind: &str, source: &str) -> Option<u64> {
    let v = data.get(kind)?;
    let rest = v.strip_prefix("v1 source=")?;
    let (src, rv) = rest.split_once(" rv=")?;
    (src == source).then(|| rv.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn kinds_parse() {
        let k: Kind = "widgets.example.com/v1".parse().unwrap();
        assert_eq!(
            (k.group.as_str(), k.version.as_str(), k.plural.as_str()),
            ("example.com", "v1", "widgets")
        );
        assert_eq!(k.key(), "widgets.example.com");
        let c: Kind = "configmaps/v1".parse().unwrap();
        assert_eq!((c.group.as_str(), c.key()), ("", "configmaps".to_string()));
        for bad in [
            "widgets",
            "/v1",
            "widgets.example.com/",
            "a b/v1",
            "w.x/v1.2",
        ] {
            assert!(bad.parse::<Kind>().is_err(), "{bad}");
        }
    }
    #[test]
    fn tokens_round_trip_and_garbage_is_refused() {
        let t = DemotionToken {
            cluster: "a".into(),
            uid: "1234-5678".into(),
            epoch: FailoverEpoch::new(3, 1).unwrap(),
            kinds: BTreeMap::from([
                ("widgets.example.com".into(), 1000),
                ("configmaps".into(), 999),
            ]),
            id: "00ff".into(),
        };
        let s = t.to_string();
        assert_eq!(
            s,
            "v1;src=a/1234-5678;e=3001;k=configmaps:999,widgets.example.com:1000;id=00ff"
        );
        assert_eq!(s.parse::<DemotionToken>().unwrap(), t);
        for bad in [
            "",
            "v2;src=a/u;e=1;k=x:1;id=1",
            "v1;src=a;e=1;k=x:1;id=1",
            "v1;src=a/u;e=x;k=x:1;id=1",
            "v1;src=a/u;e=1;k=;id=1",
            "v1;src=a/u;e=1;k=x:1",
        ] {
            assert!(bad.parse::<DemotionToken>().is_err(), "{bad}");
        }
    }
    #[test]
    fn positions_count_only_from_the_tokens_source() {
        let d = BTreeMap::from([(
            "widgets.example.com".to_string(),
            "v1 source=a/u1 rv=1200".to_string(),
        )]);
        assert_eq!(position(&d, "widgets.example.com", "a/u1"), Some(1200));
        assert_eq!(position(&d, "widgets.example.com", "a/u2"), None);
        assert_eq!(position(&d, "configmaps", "a/u1"), None);
    }
}
