//! The adoption plan at promotion (HA.md "Promotion and adoption"): given the copies as read, the ordered
//! writes that restore what the mirror kept aside in `kube-shard.io/source-*` annotations, before admission
//! opens. Pure.
//!
//! Order: one [`Restore`] per copy that needs one, owners before their dependents (so a child's
//! reference and shard label point at an owner copy already adopted); then one [`Delete`] per copy
//! whose source was terminating (after the restores, so the garbage collector cascades to the
//! remapped dependents as it would have on the source). A restore removes the annotations it
//! consumed, so running the plan again (a crash mid-adoption, a restart) writes nothing twice.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DynamicObject, ObjectMeta};

use crate::mirror::plan::{
    MIRRORED_FROM, SHARD_LABEL, SOURCE_DELETING, SOURCE_FINALIZERS, SOURCE_OWNERS, SOURCE_SHARD,
    SOURCE_UID,
};
use kube_shard::hash::ShardKey;
use kube_shard::shard::ShardCount;
use kube_shard::token::FENCE_ANNOTATION;

/// Where an object is: kind key (`<plural>.<group>`), namespace, name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct ObjRef {
    /// `<plural>.<group>`.
    pub kind: String,
    /// The namespace (`None`: cluster-scoped).
    pub namespace: Option<String>,
    /// The name.
    pub name: String,
}

impl ObjRef {
    /// The reference of `o` of kind `kind`.
    #[must_use]
    pub fn of(kind: &str, o: &DynamicObject) -> Self {
        ObjRef {
            kind: kind.to_string(),
            namespace: o.metadata.namespace.clone(),
            name: o.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for ObjRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind, self.name),
            None => write!(f, "{} {}", self.kind, self.name),
        }
    }
}

/// A copy as adoption sees it: what the mirror kept aside, decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct CopyView {
    /// Where it is.
    pub at: ObjRef,
    /// The copy's metadata as read (its own uid and resourceVersion).
    pub meta: ObjectMeta,
    /// The source object's uid.
    pub source_uid: String,
    /// The source's owner references (source uids).
    pub owners: Vec<OwnerReference>,
    /// The source's finalizers.
    pub finalizers: Vec<String>,
    /// The source was terminating.
    pub deleting: bool,
    /// The source carried the shard label.
    pub shard_labelled: bool,
}

/// Something adoption could not restore (reported; admission still opens).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// Where.
    pub at: ObjRef,
    /// What.
    pub what: String,
}

impl CopyView {
    /// Read `o` (of kind `kind`) as a copy made by the mirror from `source_cluster`. `Ok(None)`: not
    /// such a copy (never touched), or being deleted already. An undecodable annotation is a
    /// [`Problem`]: that part is not restored.
    pub fn read(
        kind: &str,
        o: &DynamicObject,
        source_cluster: &str,
    ) -> Result<Option<Self>, Problem> {
        let m = &o.metadata;
        let ours = m
            .labels
            .as_ref()
            .and_then(|l| l.get(MIRRORED_FROM))
            .is_some_and(|v| v == source_cluster);
        if !ours || m.deletion_timestamp.is_some() || m.uid.is_none() {
            return Ok(None);
        }
        let at = ObjRef::of(kind, o);
        let ann = m.annotations.clone().unwrap_or_default();
        let Some(source_uid) = ann.get(SOURCE_UID).cloned() else {
            return Ok(None);
        };
        let bad = |k: &str, e: serde_json::Error| Problem {
            at: at.clone(),
            what: format!("annotation {k} is not valid JSON ({e}): not restored"),
        };
        let owners = match ann.get(SOURCE_OWNERS) {
            Some(t) => serde_json::from_str(t).map_err(|e| bad(SOURCE_OWNERS, e))?,
            None => Vec::new(),
        };
        let finalizers = match ann.get(SOURCE_FINALIZERS) {
            Some(t) => serde_json::from_str(t).map_err(|e| bad(SOURCE_FINALIZERS, e))?,
            None => Vec::new(),
        };
        Ok(Some(CopyView {
            at,
            meta: m.clone(),
            source_uid,
            owners,
            finalizers,
            deleting: ann.contains_key(SOURCE_DELETING),
            shard_labelled: ann.contains_key(SOURCE_SHARD),
        }))
    }

    fn uid(&self) -> String {
        self.meta.uid.clone().unwrap_or_default()
    }
}

/// How children's shard labels are computed (the group's shard key and count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardSpec {
    /// The group's shard key.
    pub key: ShardKey,
    /// The group's shard count.
    pub count: ShardCount,
}

/// The metadata one copy gets back before admission.
#[derive(Clone, Debug, PartialEq)]
pub struct Restore {
    /// Where.
    pub at: ObjRef,
    /// The copy's uid (precondition).
    pub uid: String,
    /// Owner references remapped to the owner copies' uids.
    pub owners: Vec<OwnerReference>,
    /// Finalizers to add (the garbage collector's own excluded: they come with a delete).
    pub finalizers: Vec<String>,
    /// The recomputed shard label.
    pub shard: Option<u32>,
    /// The fence `<E>:mirror` at the new epoch, when the copy's is from an older one.
    pub fence: Option<String>,
}

/// How a copy whose source was terminating is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    /// The source was deleted with `Orphan` (its `orphan` finalizer).
    Orphan,
    /// The source was deleted with `Foreground` (its `foregroundDeletion` finalizer).
    Foreground,
    /// Otherwise.
    Background,
}

/// A copy whose source was terminating: deleted at adoption (its restored finalizers then run the
/// cleanup the old Active had not finished).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delete {
    /// Where.
    pub at: ObjRef,
    /// The copy's uid (precondition).
    pub uid: String,
    /// The source's propagation.
    pub propagation: Propagation,
}

/// One write of the plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// Restore metadata.
    Restore(Restore),
    /// Delete the copy.
    Delete(Delete),
}

/// The adoption plan: the writes in order, and what cannot be restored.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PromotionPlan {
    /// The writes, in order.
    pub steps: Vec<Step>,
    /// Reported, not restored.
    pub problems: Vec<Problem>,
}

const ORPHAN: &str = "orphan";
const FOREGROUND: &str = "foregroundDeletion";

/// The failover epoch of a fence value `<f>:…` (`None`: absent or unparseable).
fn fence_epoch(v: Option<&String>) -> Option<u64> {
    v?.split_once(':')?.0.parse().ok()
}

/// Plan the adoption of `copies` at the new epoch `epoch` (wire form).
#[must_use]
pub fn plan_promotion(copies: &[CopyView], epoch: u64, shard: Option<ShardSpec>) -> PromotionPlan {
    let mut out = PromotionPlan::default();
    let by_source: BTreeMap<&str, &CopyView> =
        copies.iter().map(|c| (c.source_uid.as_str(), c)).collect();
    for i in owners_first(copies, &by_source, &mut out.problems) {
        let c = &copies[i];
        if let Some(r) = restore(c, &by_source, epoch, shard, &mut out.problems) {
            out.steps.push(Step::Restore(r));
        }
    }
    let mut deletes: Vec<&CopyView> = copies.iter().filter(|c| c.deleting).collect();
    deletes.sort_by(|a, b| a.at.cmp(&b.at));
    for c in deletes {
        let has = |f: &str| c.finalizers.iter().any(|x| x == f);
        let propagation = if has(ORPHAN) {
            Propagation::Orphan
        } else if has(FOREGROUND) {
            Propagation::Foreground
        } else {
            Propagation::Background
        };
        out.steps.push(Step::Delete(Delete {
            at: c.at.clone(),
            uid: c.uid(),
            propagation,
        }));
    }
    out
}

fn restore(
    c: &CopyView,
    by_source: &BTreeMap<&str, &CopyView>,
    epoch: u64,
    shard: Option<ShardSpec>,
    problems: &mut Vec<Problem>,
) -> Option<Restore> {
    let mut owners = Vec::new();
    for o in &c.owners {
        match by_source.get(o.uid.as_str()) {
            Some(owner) => owners.push(OwnerReference {
                uid: owner.uid(),
                ..o.clone()
            }),
            None => problems.push(Problem {
                at: c.at.clone(),
                what: format!(
                    "owner {} {} (source uid {}) has no copy: reference dropped",
                    o.kind, o.name, o.uid
                ),
            }),
        }
    }
    let finalizers: Vec<String> = c
        .finalizers
        .iter()
        .filter(|f| *f != ORPHAN && *f != FOREGROUND)
        .cloned()
        .collect();
    let shard = if c.shard_labelled {
        let parent = c
            .owners
            .iter()
            .find(|o| o.controller == Some(true))
            .and_then(|o| by_source.get(o.uid.as_str()))
            .map_or(&c.meta, |p| &p.meta);
        let s = shard.and_then(|s| Some(s.count.shard_of(s.key.hash_meta(parent).ok()?)));
        if s.is_none() {
            problems.push(Problem {
                at: c.at.clone(),
                what: "shard label not recomputed (no shard key configured, or no key field)"
                    .into(),
            });
        }
        s
    } else {
        None
    };
    let ann = c.meta.annotations.clone().unwrap_or_default();
    let consumed = [SOURCE_OWNERS, SOURCE_FINALIZERS, SOURCE_SHARD]
        .iter()
        .any(|k| ann.contains_key(*k));
    if !consumed && !c.deleting {
        return None;
    }
    let fence = (fence_epoch(ann.get(FENCE_ANNOTATION)).unwrap_or(0) < epoch)
        .then(|| format!("{epoch}:mirror"));
    Some(Restore {
        at: c.at.clone(),
        uid: c.uid(),
        owners,
        finalizers,
        shard,
        fence,
    })
}

/// Indices of `copies` with every owner copy before its dependents (Kahn's order, ties by
/// reference); an ownership cycle is reported and broken in reference order.
fn owners_first(
    copies: &[CopyView],
    by_source: &BTreeMap<&str, &CopyView>,
    problems: &mut Vec<Problem>,
) -> Vec<usize> {
    let index: BTreeMap<&str, usize> = copies
        .iter()
        .enumerate()
        .map(|(i, c)| (c.source_uid.as_str(), i))
        .collect();
    let mut pending = vec![0usize; copies.len()];
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); copies.len()];
    for (i, c) in copies.iter().enumerate() {
        let owners: BTreeSet<usize> = c
            .owners
            .iter()
            .filter(|o| by_source.contains_key(o.uid.as_str()))
            .filter_map(|o| index.get(o.uid.as_str()).copied())
            .filter(|&j| j != i)
            .collect();
        pending[i] = owners.len();
        for j in owners {
            children[j].push(i);
        }
    }
    let mut order: Vec<usize> = (0..copies.len()).collect();
    order.sort_by(|&a, &b| copies[a].at.cmp(&copies[b].at));
    let mut ready: VecDeque<usize> = order.iter().copied().filter(|&i| pending[i] == 0).collect();
    let mut done = vec![false; copies.len()];
    let mut out = Vec::with_capacity(copies.len());
    loop {
        while let Some(i) = ready.pop_front() {
            if std::mem::replace(&mut done[i], true) {
                continue;
            }
            out.push(i);
            for &k in &children[i] {
                if done[k] {
                    continue; // an owner of a broken cycle
                }
                pending[k] -= 1;
                if pending[k] == 0 {
                    ready.push_back(k);
                }
            }
        }
        // a cycle: take the first remaining in reference order
        let Some(&i) = order.iter().find(|&&i| !done[i]) else {
            return out;
        };
        problems.push(Problem {
            at: copies[i].at.clone(),
            what: "ownership cycle among copies: broken here".into(),
        });
        pending[i] = 0;
        ready.push_back(i);
    }
}

/// Apply `r` to the copy's metadata as read now: owners and finalizers added (kept if present), the
/// shard label and fence set, the consumed `source-*` annotations removed.
pub fn apply_restore(r: &Restore, meta: &mut ObjectMeta) {
    if !r.owners.is_empty() {
        let refs = meta.owner_references.get_or_insert_with(Vec::new);
        for o in &r.owners {
            if !refs.iter().any(|x| x.uid == o.uid) {
                refs.push(o.clone());
            }
        }
    }
    if !r.finalizers.is_empty() {
        let fins = meta.finalizers.get_or_insert_with(Vec::new);
        for f in &r.finalizers {
            if !fins.contains(f) {
                fins.push(f.clone());
            }
        }
    }
    if let Some(s) = r.shard {
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(SHARD_LABEL.into(), s.to_string());
    }
    let ann = meta.annotations.get_or_insert_with(Default::default);
    if let Some(f) = &r.fence {
        ann.insert(FENCE_ANNOTATION.into(), f.clone());
    }
    for k in [SOURCE_OWNERS, SOURCE_FINALIZERS, SOURCE_SHARD] {
        ann.remove(k);
    }
}
