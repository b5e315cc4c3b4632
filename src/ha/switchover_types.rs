//! The pure parts of planned switchover (no I/O): the covered [`Kind`]s, the demotion [`Token`] and its
//! text form, the freeze policy's objects, checkpoint positions, and [`SwitchError`].

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use serde_json::json;

use super::epoch::Epoch;
use super::record;

/// Every freeze refusal message contains this.
pub const FREEZE_MARK: &str = "kube-shard HA freeze";
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

/// Why a switchover step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SwitchError {
    /// Bad input (a kind, a token, an exempt identity).
    #[error("{0}")]
    Input(String),
    /// This cluster is not the Active (or its Lease cannot be read).
    #[error("not the Active: {0}")]
    NotActive(String),
    /// Members did not acknowledge `ha-drained` in time: no token was issued.
    #[error("members did not acknowledge ha-drained({epoch}) within {waited:?}: {pending:?} — no token was issued; the Active stays demoting (run `kshard ha demote` again, or `demote --cancel`)")]
    NotDrained {
        /// The epoch being demoted.
        epoch: Epoch,
        /// The members that did not ack.
        pending: Vec<String>,
        /// How long the demoter waited.
        waited: Duration,
    },
    /// The freeze could not be installed or its probe was not refused.
    #[error("freeze: {0}")]
    Freeze(String),
    /// A request failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// The token table refused the token.
    #[error("token refused: {0}")]
    Refused(String),
    /// The mirror did not reach the token in time: nothing was changed on either side.
    #[error("the mirror did not reach the token within {waited:?}; nothing was changed on either side:\n{}", report_text(.report))]
    Behind {
        /// Per kind.
        report: Vec<KindReport>,
        /// How long it waited.
        waited: Duration,
    },
    /// The mirror reached the token's positions but did not acknowledge the catch-up and its hold in
    /// time ([`CAUGHT_UP_KEY`]): nothing was changed on either side.
    #[error("the mirror did not confirm within {waited:?} that it applied the catch-up to the token and holds (writes nothing more to this cluster); nothing was changed on either side. Is this cluster's mirror running?")]
    NotHeld {
        /// How long it waited.
        waited: Duration,
    },
    /// Cancel refused.
    #[error("cancel refused: {0}")]
    Cancel(String),
    /// The Standby's elector did not take the Leases over.
    #[error("promotion: {0}")]
    Promote(String),
    /// The promotion checks refused this cluster as a target: nothing was written.
    #[error("not promoted: {0}; nothing was changed")]
    Target(#[from] crate::ha::mirror::adopt::TargetRefused),
}

pub(super) fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> SwitchError {
    let what = what.into();
    move |source| SwitchError::Api { what, source }
}

/// One kind's position against the token (the timeout report).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct KindReport {
    /// `<plural>.<group>`.
    pub kind: String,
    /// The token's resourceVersion.
    pub token_rv: u64,
    /// The mirror's position (`None`: no checkpoint for this kind from this source).
    pub position: Option<u64>,
}

pub(super) fn report_text(r: &[KindReport]) -> String {
    r.iter()
        .map(|k| {
            let pos = k.position.map_or("none".to_string(), |p| p.to_string());
            let state = if k.position.is_some_and(|p| p >= k.token_rv) {
                "reached"
            } else {
                "BEHIND"
            };
            format!(
                "  {}: token rv {}, mirror position {pos} ({state})",
                k.kind, k.token_rv
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
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
    type Err = SwitchError;

    fn from_str(s: &str) -> Result<Self, SwitchError> {
        let bad = || {
            SwitchError::Input(format!(
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
pub struct Token {
    /// The source cluster's id.
    pub cluster: String,
    /// The uid of the source cluster's `kube-system` namespace.
    pub uid: String,
    /// The demoted epoch.
    pub epoch: Epoch,
    /// Per covered kind (its key), the resourceVersion of a consistent LIST taken after the freeze.
    pub kinds: BTreeMap<String, u64>,
    /// A random id (recorded as used by the promotion).
    pub id: String,
}

impl Token {
    /// `<cluster>/<uid>`: the source identity.
    #[must_use]
    pub fn source(&self) -> String {
        format!("{}/{}", self.cluster, self.uid)
    }
}

impl fmt::Display for Token {
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

impl FromStr for Token {
    type Err = SwitchError;

    fn from_str(s: &str) -> Result<Self, SwitchError> {
        let bad = || SwitchError::Input(format!("not a demotion token: {s:?}"));
        let mut parts = s.trim().split(';');
        if parts.next() != Some("v1") {
            return Err(bad());
        }
        let mut field = |name: &str| -> Result<String, SwitchError> {
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
        let epoch = Epoch::from_wire(e.parse().map_err(|_| bad())?).map_err(|_| bad())?;
        let mut kinds = BTreeMap::new();
        for kv in k.split(',').filter(|x| !x.is_empty()) {
            let (kind, rv) = kv.split_once(':').ok_or_else(bad)?;
            kinds.insert(kind.to_string(), rv.parse().map_err(|_| bad())?);
        }
        let clean = |t: &str| !t.is_empty() && !t.contains(char::is_whitespace);
        if !clean(cluster) || !clean(uid) || !clean(&id) || kinds.is_empty() {
            return Err(bad());
        }
        Ok(Token {
            cluster: cluster.into(),
            uid: uid.into(),
            epoch,
            kinds,
            id,
        })
    }
}

/// The freeze policy and its binding (pure).
pub fn freeze_objects(
    name: &str,
    kinds: &[Kind],
    exempt: &[String],
) -> Result<(ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding), SwitchError> {
    if let Some(bad) = exempt
        .iter()
        .find(|e| e.contains(['\'', '\\']) || e.is_empty())
    {
        return Err(SwitchError::Input(format!(
            "freeze-exempt identity {bad:?}"
        )));
    }
    let list: Vec<String> = exempt.iter().map(|e| format!("'{e}'")).collect();
    let rules: Vec<_> = kinds
        .iter()
        .map(|k| {
            json!({
                "apiGroups": [k.group], "apiVersions": ["*"],
                "resources": [k.plural, format!("{}/status", k.plural)],
                "operations": ["CREATE", "UPDATE", "DELETE"],
            })
        })
        .collect();
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": {record::HA_LABEL: name}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": rules},
            "validations": [{
                "expression": format!("request.userInfo.username in [{}]", list.join(", ")),
                "message": format!("{FREEZE_MARK}: this cluster is being demoted (planned switchover); write to the new Active"),
                "reason": "Forbidden",
            }],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": {record::HA_LABEL: name}},
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    });
    let de = |e: serde_json::Error| SwitchError::Input(e.to_string());
    Ok((
        serde_json::from_value(policy).map_err(de)?,
        serde_json::from_value(binding).map_err(de)?,
    ))
}

pub(super) fn position(data: &BTreeMap<String, String>, kind: &str, source: &str) -> Option<u64> {
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
        let t = Token {
            cluster: "a".into(),
            uid: "1234-5678".into(),
            epoch: Epoch::new(3, 1).unwrap(),
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
        assert_eq!(s.parse::<Token>().unwrap(), t);
        for bad in [
            "",
            "v2;src=a/u;e=1;k=x:1;id=1",
            "v1;src=a;e=1;k=x:1;id=1",
            "v1;src=a/u;e=x;k=x:1;id=1",
            "v1;src=a/u;e=1;k=;id=1",
            "v1;src=a/u;e=1;k=x:1",
        ] {
            assert!(bad.parse::<Token>().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_freeze_refuses_all_but_the_exempt_and_rejects_quotes() {
        let k: Kind = "widgets.example.com/v1".parse().unwrap();
        let (p, b) = freeze_objects(
            "w-ha-freeze",
            std::slice::from_ref(&k),
            &["system:gc".into()],
        )
        .unwrap();
        let v = p.spec.unwrap().validations.unwrap();
        assert_eq!(
            v[0].expression,
            "request.userInfo.username in ['system:gc']"
        );
        assert_eq!(b.spec.policy_name, "w-ha-freeze");
        assert!(freeze_objects("n", &[k], &["x'y".into()]).is_err());
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
