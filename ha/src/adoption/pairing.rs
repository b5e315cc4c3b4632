//! Failback pairing (pure): the old Active, now a Standby, pairs each of its own objects with the new
//! Active's by name and recorded source uid.
//!
//! - equal: labelled as the new Active's copy ([`Pairing::Label`]);
//! - different: updated in place to that copy ([`Pairing::Update`]);
//! - only on the old Active: [`Pairing::Divergent`], reported, and deleted after the prune grace unless
//!   `keep_divergent`.
//!
//! See `docs/ha.md#adoption-and-failback-kube_shard_haadoption-failback-duty` ("At failback").

use std::collections::BTreeMap;

use kube::api::DynamicObject;
use serde_json::Value;

use super::plan::ObjRef;
use crate::mirror::error::MirrorError;
use crate::mirror::plan::{plan, CopyContext, Planned, MIRRORED_FROM, SOURCE_UID};

/// An object only on the old Active, as `kshard ha status` reports it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Divergent {
    /// Where.
    pub at: ObjRef,
    /// Its uid.
    pub uid: String,
    /// Its resourceVersion.
    pub resource_version: Option<String>,
    /// Its fence stamp (`<f>:…`): a stamp from the old epoch written after the new one began means
    /// lost writes.
    pub fence: Option<String>,
}

/// What failback does with one of the old Active's objects.
#[derive(Clone, Debug, PartialEq)]
pub enum Pairing {
    /// Equal to the new Active's: made its copy without changing body or status.
    Label(Box<Planned>),
    /// Different: updated in place to the new Active's version.
    Update(Box<Planned>),
    /// Only on the old Active.
    Divergent(Divergent),
}

const KS_PREFIX: &str = "kube-shard.io/";

fn user_keys(m: Option<&BTreeMap<String, String>>) -> BTreeMap<&str, &str> {
    m.into_iter()
        .flatten()
        .filter(|(k, _)| !k.starts_with(KS_PREFIX))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

fn body(o: &DynamicObject) -> (serde_json::Map<String, Value>, Option<Value>) {
    let mut b = match &o.data {
        Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    for k in ["metadata", "apiVersion", "kind"] {
        b.remove(k);
    }
    let status = b.remove("status");
    (b, status)
}

/// Whether `old` (an object of the old Active, kind `kind`) is an own object that failback pairs:
/// not already a copy made by the mirror from `new_cluster`, and not being deleted.
#[must_use]
pub fn pairs(old: &DynamicObject, new_cluster: &str) -> bool {
    let copy = old
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MIRRORED_FROM))
        .is_some_and(|v| v == new_cluster);
    !copy && old.metadata.deletion_timestamp.is_none()
}

/// Pair `old` (kind `kind`, on the old Active) with `new` (the object of the same name on the new
/// Active, if any). `ctx`: the new Active as the source (its cluster id, identity, and term epoch).
pub fn pair(
    kind: &str,
    old: &DynamicObject,
    new: Option<&DynamicObject>,
    ctx: &CopyContext,
) -> Result<Pairing, MirrorError> {
    let counterpart = new.filter(|n| {
        let recorded = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SOURCE_UID));
        recorded.is_some() && recorded == old.metadata.uid.as_ref()
    });
    let Some(n) = counterpart else {
        let m = &old.metadata;
        return Ok(Pairing::Divergent(Divergent {
            at: ObjRef::of(kind, old),
            uid: m.uid.clone().unwrap_or_default(),
            resource_version: m.resource_version.clone(),
            fence: m
                .annotations
                .as_ref()
                .and_then(|a| a.get(kube_shard::token::FENCE_ANNOTATION).cloned()),
        }));
    };
    let p = plan(n, ctx)?;
    let (b, status) = body(old);
    let equal = b == p.body
        && status == p.status
        && user_keys(old.metadata.labels.as_ref()) == user_keys(p.meta.labels.as_ref())
        && user_keys(old.metadata.annotations.as_ref()) == user_keys(p.meta.annotations.as_ref());
    Ok(if equal {
        Pairing::Label(Box::new(p))
    } else {
        Pairing::Update(Box::new(p))
    })
}
