//! The copy planner (HA.md "Writes"): what the Standby's copy of a source object looks like, and which write
//! brings a copy up to a source version. Pure.
//!
//! A copy keeps the source's name, namespace, labels, annotations and body. Server-owned fields are
//! stripped, and so is everything derived from the source uid — owner references, the shard label, the
//! fence — which is kept in `kube-shard.io/source-*` annotations instead (with the finalizers and a
//! terminating source's deletion), for adoption to restore. The copy is labelled
//! `kube-shard.io/mirrored-from=<cluster-id>` (the conflict guard) and fenced `<f>:mirror`. The
//! `kube-shard.io/source-rv` marker is the commit marker, written last ([`marker`](super::rv::marker)).

use std::collections::BTreeMap;

use kube::api::{DynamicObject, ObjectMeta};
use serde_json::Value;

use super::error::MirrorError;
use super::rv::{marker_rv, parse_rv, SourceId};
use kube_shard::token::FENCE_ANNOTATION;

/// The conflict-guard label: the copy was made by the mirror from this cluster id.
pub const MIRRORED_FROM: &str = "kube-shard.io/mirrored-from";
/// The commit marker: the source version the copy holds, with its source identity.
pub const SOURCE_RV: &str = "kube-shard.io/source-rv";
/// The source object's uid.
pub const SOURCE_UID: &str = "kube-shard.io/source-uid";
/// The source's owner references (JSON list; adoption remaps them to the copies' uids).
pub const SOURCE_OWNERS: &str = "kube-shard.io/source-owners";
/// The source's finalizers (JSON list; adoption restores them).
pub const SOURCE_FINALIZERS: &str = "kube-shard.io/source-finalizers";
/// A terminating source's `deletionTimestamp` (adoption deletes the copy).
pub const SOURCE_DELETING: &str = "kube-shard.io/source-deleting";
/// The source's shard label (uid-derived; adoption recomputes it).
pub const SOURCE_SHARD: &str = "kube-shard.io/source-shard";
/// The shard label (uid-derived, never copied).
pub const SHARD_LABEL: &str = "kube-shard.io/shard";
const SOURCE_PREFIX: &str = "kube-shard.io/source-";

/// Where and under which term copies are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyContext {
    /// The source of this kind.
    pub source: SourceId,
    /// The source term's failover epoch (wire form): the copy's fence is `<f>:mirror`.
    pub epoch: u64,
}

impl CopyContext {
    /// The fence value stamped on copies.
    #[must_use]
    pub fn fence(&self) -> String {
        // `kube_shard::token::FenceToken::mirror`'s form, from the wire integer as read
        format!("{}:{}", self.epoch, kube_shard::token::MIRROR)
    }
}

/// The planned copy of one source version.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// The copy's metadata without the marker (name, namespace, labels, annotations).
    pub meta: ObjectMeta,
    /// The body: every top-level field but `metadata`, `status`, `apiVersion` and `kind`.
    pub body: serde_json::Map<String, Value>,
    /// The source's `status`, if any.
    pub status: Option<Value>,
    /// The source uid.
    pub source_uid: String,
    /// The source resourceVersion.
    pub source_rv: u64,
}

/// Plan the copy of `src`.
pub fn plan(src: &DynamicObject, ctx: &CopyContext) -> Result<Planned, MirrorError> {
    let m = &src.metadata;
    let what = format!(
        "{} {}/{}",
        ctx.source.resource,
        m.namespace.as_deref().unwrap_or(""),
        m.name.as_deref().unwrap_or("")
    );
    let source_rv = parse_rv(m.resource_version.as_deref().unwrap_or(""), &what)?;
    let source_uid = m.uid.clone().ok_or_else(|| {
        MirrorError::Kind(ctx.source.resource.clone(), format!("{what} has no uid"))
    })?;
    let mut labels = m.labels.clone().unwrap_or_default();
    let shard = labels.remove(SHARD_LABEL);
    labels.insert(MIRRORED_FROM.into(), ctx.source.cluster.clone());
    let mut ann: BTreeMap<String, String> = m
        .annotations
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| !k.starts_with(SOURCE_PREFIX) && k != FENCE_ANNOTATION)
        .collect();
    ann.insert(FENCE_ANNOTATION.into(), ctx.fence());
    ann.insert(SOURCE_UID.into(), source_uid.clone());
    if let Some(s) = shard {
        ann.insert(SOURCE_SHARD.into(), s);
    }
    if let Some(o) = m.owner_references.as_ref().filter(|o| !o.is_empty()) {
        ann.insert(SOURCE_OWNERS.into(), json_text(o));
    }
    if let Some(f) = m.finalizers.as_ref().filter(|f| !f.is_empty()) {
        ann.insert(SOURCE_FINALIZERS.into(), json_text(f));
    }
    if let Some(d) = &m.deletion_timestamp {
        ann.insert(
            SOURCE_DELETING.into(),
            json_text(d).trim_matches('"').to_string(),
        );
    }
    let mut body = match &src.data {
        Value::Object(o) => o.clone(),
        _ => serde_json::Map::new(),
    };
    for k in ["metadata", "apiVersion", "kind"] {
        body.remove(k);
    }
    let status = body.remove("status");
    Ok(Planned {
        meta: ObjectMeta {
            name: m.name.clone(),
            namespace: m.namespace.clone(),
            labels: Some(labels),
            annotations: Some(ann),
            ..ObjectMeta::default()
        },
        body,
        status,
        source_uid,
        source_rv,
    })
}

fn json_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// What brings a copy up to a source version.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Action {
    /// No copy: create it (main without the marker, `/status`, then the marker).
    Create,
    /// Update it (`/status` first if it changed, then the main resource with the marker).
    Update {
        /// A copy someone else changed, or a corrupt marker: re-applied with an alarm.
        alarm: Option<String>,
    },
    /// The copy's marker is above the version this read of the source returned: another writer (a second
    /// mirror process, as in a rolling update) applied a newer version since. Only a marker above the
    /// source's *current collection* version is corruption ([`ahead`]); the worker reads that version and
    /// decides — never by writing this older version over it.
    Ahead {
        /// The copy's marker.
        held: u64,
    },
    /// The source was re-created (another uid): delete the copy (preconditions), then create.
    Recreate,
    /// The copy holds this version already.
    Skip,
    /// An object of that name not made by the mirror from this source: never touched (a poison object).
    NotOurs,
}

/// The action for copy `copy` (as read) and planned source version `p`. `last_written`: the copy's
/// resourceVersion the mirror's own last write produced, if it remembers one.
pub fn decide(
    p: &Planned,
    copy: Option<&DynamicObject>,
    source: &SourceId,
    last_written: Option<&str>,
) -> Result<Action, MirrorError> {
    let Some(c) = copy else {
        return Ok(Action::Create);
    };
    let cm = &c.metadata;
    let ours = cm
        .labels
        .as_ref()
        .and_then(|l| l.get(MIRRORED_FROM))
        .is_some_and(|v| v == &source.cluster);
    if !ours {
        return Ok(Action::NotOurs);
    }
    let ann = cm.annotations.clone().unwrap_or_default();
    if ann.get(SOURCE_UID) != Some(&p.source_uid) {
        return Ok(Action::Recreate);
    }
    let held = marker_rv(ann.get(SOURCE_RV).map(String::as_str), source)?;
    let changed = last_written.is_some_and(|w| cm.resource_version.as_deref() != Some(w));
    Ok(match held {
        Some(h) if h > p.source_rv => Action::Ahead { held: h },
        Some(h) if h == p.source_rv && changed => Action::Update {
            alarm: Some("the copy was changed by someone else".into()),
        },
        Some(h) if h == p.source_rv => Action::Skip,
        _ => Action::Update { alarm: None },
    })
}

/// A copy whose marker `held` is above the version a read of the source returned: `Skip` unless the marker is
/// also above `collection_rv`, the source collection's current resourceVersion read after it — a version
/// the source has not reached, which no mirror can have copied (a corrupt marker: re-applied, with an alarm).
#[must_use]
pub fn ahead(held: u64, collection_rv: u64) -> Action {
    if held > collection_rv {
        Action::Update {
            alarm: Some(format!(
                "marker {held} above the source's current version {collection_rv}"
            )),
        }
    } else {
        Action::Skip
    }
}

/// The source object as a GET by name returned it, for a delete decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceNow {
    /// 404.
    Missing,
    /// An object with this uid.
    Uid(String),
}

/// Whether the copy may be deleted (`propagationPolicy: Orphan`, uid and resourceVersion
/// preconditions): only a copy the mirror made from this source, only when the GET by name on the
/// source returned 404 or another uid than the one the copy mirrors.
#[must_use]
pub fn may_delete(copy: &DynamicObject, source: &SourceId, now: &SourceNow) -> bool {
    let m = &copy.metadata;
    let ours = m
        .labels
        .as_ref()
        .and_then(|l| l.get(MIRRORED_FROM))
        .is_some_and(|v| v == &source.cluster);
    let Some(uid) = m.annotations.as_ref().and_then(|a| a.get(SOURCE_UID)) else {
        return false;
    };
    ours && match now {
        SourceNow::Missing => true,
        SourceNow::Uid(u) => u != uid,
    }
}

#[cfg(test)]
mod tests {
    use super::super::rv::marker;
    use super::*;
    use serde_json::json;

    fn ctx() -> CopyContext {
        CopyContext {
            source: SourceId {
                cluster: "a".into(),
                uid: "ks-a".into(),
                resource: "widgets.example.com".into(),
            },
            epoch: 2001,
        }
    }

    fn source() -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {
                "name": "w", "namespace": "ns", "uid": "u-src", "resourceVersion": "1000000042",
                "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
                "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 0,
                "managedFields": [{"manager": "x"}], "finalizers": ["example.com/cleanup"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "p", "uid": "u-p"}],
                "labels": {"app": "x", "kube-shard.io/shard": "7"},
                "annotations": {"note": "n", "kube-shard.io/fence": "3/9",
                                "kube-shard.io/source-rv": "v1 src=z/q/widgets.example.com rv=5"}
            },
            "spec": {"size": 2},
            "status": {"ready": true}
        }))
        .unwrap()
    }

    #[test]
    fn the_copy_strips_server_owned_and_uid_derived_fields_into_source_annotations() {
        let p = plan(&source(), &ctx()).unwrap();
        let m = &p.meta;
        assert_eq!(
            (m.name.as_deref(), m.namespace.as_deref()),
            (Some("w"), Some("ns"))
        );
        assert!(m.uid.is_none() && m.resource_version.is_none() && m.generation.is_none());
        assert!(m.creation_timestamp.is_none() && m.deletion_timestamp.is_none());
        assert!(
            m.managed_fields.is_none() && m.finalizers.is_none() && m.owner_references.is_none()
        );
        let l = m.labels.as_ref().unwrap();
        assert_eq!(l.get("app").map(String::as_str), Some("x"));
        assert_eq!(l.get(MIRRORED_FROM).map(String::as_str), Some("a"));
        assert!(!l.contains_key(SHARD_LABEL));
        let a = m.annotations.as_ref().unwrap();
        assert_eq!(a[FENCE_ANNOTATION], "2001:mirror");
        assert_eq!(a[SOURCE_UID], "u-src");
        assert_eq!(a[SOURCE_SHARD], "7");
        assert_eq!(a[SOURCE_FINALIZERS], r#"["example.com/cleanup"]"#);
        assert_eq!(a[SOURCE_DELETING], "2026-01-02T00:00:00Z");
        let owners: Value = serde_json::from_str(&a[SOURCE_OWNERS]).unwrap();
        assert_eq!(owners[0]["uid"], "u-p");
        assert_eq!(a["note"], "n");
        // a marker the source itself carries (from a mirror in the other direction) names another source's
        // versions: it is never carried over
        assert!(!a.contains_key(SOURCE_RV));
        assert_eq!(p.body.get("spec"), Some(&json!({"size": 2})));
        assert!(!p.body.contains_key("status") && !p.body.contains_key("metadata"));
        assert_eq!(p.status, Some(json!({"ready": true})));
        assert_eq!(p.source_rv, 1_000_000_042);
    }

    #[test]
    fn an_unparseable_source_version_is_an_error() {
        let mut s = source();
        s.metadata.resource_version = Some("abc".into());
        assert!(matches!(
            plan(&s, &ctx()),
            Err(MirrorError::BadResourceVersion { .. })
        ));
    }

    fn copy(label: Option<&str>, uid: &str, marker_rv: Option<u64>, rv: &str) -> DynamicObject {
        let c = ctx();
        let mut ann = serde_json::Map::new();
        ann.insert(SOURCE_UID.into(), json!(uid));
        if let Some(m) = marker_rv {
            ann.insert(SOURCE_RV.into(), json!(marker(&c.source, m)));
        }
        let labels = label.map_or(json!({}), |l| json!({ MIRRORED_FROM: l }));
        serde_json::from_value(json!({
            "metadata": {"name": "w", "namespace": "ns", "uid": "u-copy", "resourceVersion": rv,
                         "labels": labels, "annotations": ann}
        }))
        .unwrap()
    }

    #[test]
    fn decisions() {
        let c = ctx();
        let p = plan(&source(), &c).unwrap();
        let d = |copy: Option<&DynamicObject>, last: Option<&str>| {
            decide(&p, copy, &c.source, last).unwrap()
        };
        assert_eq!(d(None, None), Action::Create);
        // the conflict guard: not made by the mirror, or from another cluster
        assert_eq!(
            d(Some(&copy(None, "u-src", None, "5")), None),
            Action::NotOurs
        );
        assert_eq!(
            d(Some(&copy(Some("b"), "u-src", None, "5")), None),
            Action::NotOurs
        );
        assert_eq!(
            d(Some(&copy(Some("a"), "u-old", Some(9), "5")), None),
            Action::Recreate
        );
        assert_eq!(
            d(
                Some(&copy(Some("a"), "u-src", Some(1_000_000_042), "5")),
                None
            ),
            Action::Skip
        );
        assert_eq!(
            d(
                Some(&copy(Some("a"), "u-src", Some(1_000_000_042), "5")),
                Some("5")
            ),
            Action::Skip
        );
        // no marker yet (a create interrupted before it), or an older one
        assert_eq!(
            d(Some(&copy(Some("a"), "u-src", None, "5")), None),
            Action::Update { alarm: None }
        );
        assert_eq!(
            d(
                Some(&copy(Some("a"), "u-src", Some(999_999_999), "5")),
                None
            ),
            Action::Update { alarm: None }
        );
        // a marker above this read of the source: decided against the collection's current version
        assert_eq!(
            d(
                Some(&copy(Some("a"), "u-src", Some(1_000_000_043), "5")),
                None
            ),
            Action::Ahead {
                held: 1_000_000_043
            }
        );
        assert_eq!(ahead(1_000_000_043, 1_000_000_043), Action::Skip);
        assert_eq!(ahead(1_000_000_043, 1_000_000_050), Action::Skip);
        assert!(matches!(
            ahead(1_000_000_043, 1_000_000_042),
            Action::Update { alarm: Some(_) }
        ));
        assert!(matches!(
            d(
                Some(&copy(Some("a"), "u-src", Some(1_000_000_042), "6")),
                Some("5")
            ),
            Action::Update { alarm: Some(_) }
        ));
    }

    #[test]
    fn deletes_only_our_copy_of_a_gone_source() {
        let s = ctx().source;
        let ours = copy(Some("a"), "u-src", Some(5), "5");
        assert!(may_delete(&ours, &s, &SourceNow::Missing));
        assert!(may_delete(&ours, &s, &SourceNow::Uid("u-new".into())));
        assert!(!may_delete(&ours, &s, &SourceNow::Uid("u-src".into())));
        assert!(!may_delete(
            &copy(None, "u-src", Some(5), "5"),
            &s,
            &SourceNow::Missing
        ));
        assert!(!may_delete(
            &copy(Some("b"), "u-src", Some(5), "5"),
            &s,
            &SourceNow::Missing
        ));
    }
}
