//! Failback (HA.md "Promotion and adoption"): the old Active, now a Standby, turns its own objects into
//! copies of the new Active's ([`Failback`]), and a Standby holding objects that are not copies is refused as
//! a promotion target ([`divergent_objects`], [`promotable`]).

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{DeleteParams, DynamicObject, PostParams, Preconditions, PropagationPolicy};
use kube::Client;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::adoption::io::KindApi;
use crate::adoption::pairing::{pair, pairs, Divergent, Pairing};
use crate::adoption::plan::{ObjRef, Problem};
use crate::mirror::apply::{update, Outcome, Sides};
use crate::mirror::error::{api_err, MirrorError};
use crate::mirror::plan::{CopyContext, Planned};
use crate::mirror::rv::SourceId;
use crate::mirror::scope::in_scope;
use crate::mirror::MirrorConfig;

/// Failback's options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailbackOptions {
    /// `--keep-divergent`: report divergent objects, never delete them.
    pub keep_divergent: bool,
    /// A divergent object is deleted only once it has been seen divergent (same uid) for this long.
    pub prune_grace: Duration,
    /// A person's decision that this cluster's divergent objects kube-shard never wrote (no fence stamp,
    /// no mirror marker) may be deleted too, after the grace: off by default, when they are reported in
    /// [`FailbackReport::never_written`] and left alone.
    pub delete_unstamped: bool,
}

impl Default for FailbackOptions {
    fn default() -> Self {
        FailbackOptions {
            keep_divergent: false,
            prune_grace: Duration::from_secs(300),
            delete_unstamped: false,
        }
    }
}

impl FailbackOptions {
    /// Never delete divergent objects.
    #[must_use]
    pub fn keep_divergent(mut self, keep: bool) -> Self {
        self.keep_divergent = keep;
        self
    }

    /// Delete divergent objects kube-shard never wrote as well (see [`FailbackOptions::delete_unstamped`]).
    #[must_use]
    pub fn delete_unstamped(mut self, yes: bool) -> Self {
        self.delete_unstamped = yes;
        self
    }

    /// The prune grace.
    #[must_use]
    pub fn prune_grace(mut self, d: Duration) -> Self {
        self.prune_grace = d;
        self
    }
}

/// One failback pass.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct FailbackReport {
    /// Equal objects labelled as copies.
    pub labelled: Vec<ObjRef>,
    /// Different objects updated in place.
    pub updated: Vec<ObjRef>,
    /// Objects only on this (the old Active's) cluster.
    pub divergent: Vec<Divergent>,
    /// Divergent objects deleted in this pass (after the prune grace).
    pub deleted: Vec<ObjRef>,
    /// Divergent objects kube-shard never wrote (no fence stamp, no mirror marker or label): never
    /// deleted; they stay divergent (the cluster is no promotion target) until a person resolves them.
    pub never_written: Vec<ObjRef>,
    /// Writes that failed (retried at the next pass).
    pub failed: Vec<Problem>,
}

/// The old Active's failback. `cfg` is this cluster's mirror configuration (its source is the new
/// Active); `local` is this cluster, `new_active` the new Active's.
pub struct Failback {
    cfg: MirrorConfig,
    local: Client,
    new_active: Client,
    opts: FailbackOptions,
    /// Divergent objects by (where, uid): when first seen.
    seen: BTreeMap<(ObjRef, String), Instant>,
}

impl std::fmt::Debug for Failback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Failback")
            .field("source", &self.cfg.source_cluster)
            .field("opts", &self.opts)
            .field("divergent_seen", &self.seen.len())
            .finish_non_exhaustive()
    }
}

impl Failback {
    /// Failback of `local` against `new_active`.
    #[must_use]
    pub fn new(
        cfg: MirrorConfig,
        local: Client,
        new_active: Client,
        opts: FailbackOptions,
    ) -> Self {
        Failback {
            cfg,
            local,
            new_active,
            opts,
            seen: BTreeMap::new(),
        }
    }

    /// One pass over every mirrored kind: pair, label or update, report divergent objects and delete
    /// those past the prune grace (unless `keep_divergent`). Run it until its report has no divergent
    /// objects and no failures; then start the mirror.
    #[tracing::instrument(skip(self), fields(source = %self.cfg.source_cluster))]
    pub async fn run_once(&mut self) -> Result<FailbackReport, MirrorError> {
        let uid = crate::mirror::kube_system_uid(&self.new_active).await?;
        let epoch = crate::mirror::source_epoch(&self.cfg, &self.new_active).await;
        let mut rep = FailbackReport::default();
        let mut still = BTreeMap::new();
        for k in self.cfg.kinds.mirrored() {
            let local = KindApi::resolve(&self.local, k).await?;
            let remote = KindApi::resolve(&self.new_active, k).await?;
            let ctx = CopyContext {
                source: SourceId {
                    cluster: self.cfg.source_cluster.clone(),
                    uid: uid.clone(),
                    resource: k.key(),
                },
                epoch,
            };
            let sides = Sides {
                ar: local.ar.clone(),
                namespaced: local.caps.scope == kube::discovery::Scope::Namespaced,
                has_status: local
                    .caps
                    .subresources
                    .iter()
                    .any(|(s, _)| s.plural == "status"),
                source: self.new_active.clone(),
                target: self.local.clone(),
                marker_last: true,
            };
            for old in local.list(None).await? {
                if !in_scope(&self.cfg, k, &old) || !pairs(&old, &self.cfg.source_cluster) {
                    continue;
                }
                let at = ObjRef::of(&k.key(), &old);
                let new = remote
                    .at(at.namespace.as_deref())
                    .get_opt(&at.name)
                    .await
                    .map_err(api_err(format!("reading {at} on the new Active")))?;
                let fail = |what: String| Problem {
                    at: at.clone(),
                    what,
                };
                match pair(&k.key(), &old, new.as_ref(), &ctx) {
                    Err(e) => rep.failed.push(fail(e.to_string())),
                    Ok(Pairing::Label(p)) => match to_copy(&sides, &local, &ctx, &p, &old).await {
                        Ok(()) => rep.labelled.push(at),
                        Err(w) => rep.failed.push(fail(w)),
                    },
                    Ok(Pairing::Update(p)) => match to_copy(&sides, &local, &ctx, &p, &old).await {
                        Ok(()) => rep.updated.push(at),
                        Err(w) => rep.failed.push(fail(w)),
                    },
                    Ok(Pairing::Divergent(d)) => {
                        let key = (d.at.clone(), d.uid.clone());
                        let first = self.seen.get(&key).copied().unwrap_or_else(Instant::now);
                        still.insert(key, first);
                        let ours = written_by_kube_shard(&old);
                        if !ours {
                            rep.never_written.push(d.at.clone());
                        }
                        if (ours || self.opts.delete_unstamped)
                            && !self.opts.keep_divergent
                            && first.elapsed() >= self.opts.prune_grace
                        {
                            match delete_divergent(&local, &old).await {
                                Ok(()) => {
                                    info!(at = %d.at, fence = ?d.fence, "failback: divergent object deleted");
                                    rep.deleted.push(d.at.clone());
                                }
                                Err(e) => rep.failed.push(fail(e.to_string())),
                            }
                        }
                        rep.divergent.push(d);
                    }
                }
            }
        }
        self.seen = still;
        if !rep.divergent.is_empty() {
            warn!(
                count = rep.divergent.len(),
                "failback: divergent objects on the old Active"
            );
        }
        Ok(rep)
    }
}

/// Whether kube-shard wrote `o`: it carries a fence stamp (every fenced write stamps one) or a mirror
/// marker or label. Only such objects may failback delete; an object without them was written by
/// someone else (a person, another controller) and is left for a person.
fn written_by_kube_shard(o: &DynamicObject) -> bool {
    let m = &o.metadata;
    m.annotations.as_ref().is_some_and(|a| {
        a.contains_key(kube_shard::token::FENCE_ANNOTATION)
            || a.contains_key(crate::mirror::plan::SOURCE_RV)
    }) || m
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(crate::mirror::plan::MIRRORED_FROM))
}

/// Make `old` the copy `p` of the new Active's object: the mirror's update (`/status` first if it
/// differs, then the main resource with the marker; uid and resourceVersion preconditions; finalizers
/// and owner references stripped into `source-*` annotations; the fence `<f>:mirror`).
async fn to_copy(
    sides: &Sides,
    local: &KindApi,
    ctx: &CopyContext,
    p: &Planned,
    old: &DynamicObject,
) -> Result<(), String> {
    let tgt = local.at(old.metadata.namespace.as_deref());
    match update(sides, &tgt, ctx, p, old).await {
        Outcome::Applied(_) | Outcome::Gone => Ok(()),
        Outcome::Retry(w) | Outcome::Poison(w) => Err(w.text),
    }
}

/// Delete a divergent object: its finalizers first (a Standby runs no finalizer logic, so the delete
/// would never finish), then the object (uid precondition, `Orphan`).
async fn delete_divergent(api: &KindApi, o: &DynamicObject) -> Result<(), MirrorError> {
    let at = ObjRef::of("", o);
    let a = api.at(at.namespace.as_deref());
    if o.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| !f.is_empty())
    {
        let mut stripped = o.clone();
        stripped.metadata.finalizers = None;
        a.replace(&at.name, &PostParams::default(), &stripped)
            .await
            .map_err(api_err(format!("stripping finalizers of {at}")))?;
    }
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        preconditions: Some(Preconditions {
            uid: o.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match a.delete(&at.name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(api_err(format!("deleting {at}"))(e)),
    }
}

/// Objects of the mirrored kinds in scope on this Standby (`local`) that are not copies made by the
/// mirror from `cfg.source_cluster` (and not kube-shard's own): at a promotion they would become live
/// primaries the peer never had.
pub async fn divergent_objects(
    cfg: &MirrorConfig,
    local: &Client,
) -> Result<Vec<Divergent>, MirrorError> {
    let mut out = Vec::new();
    for k in cfg.kinds.mirrored() {
        let api = KindApi::resolve(local, k).await?;
        for o in api.list(None).await? {
            if in_scope(cfg, k, &o) && pairs(&o, &cfg.source_cluster) {
                let m = &o.metadata;
                out.push(Divergent {
                    at: ObjRef::of(&k.key(), &o),
                    uid: m.uid.clone().unwrap_or_default(),
                    resource_version: m.resource_version.clone(),
                    fence: m
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(kube_shard::token::FENCE_ANNOTATION).cloned()),
                });
            }
        }
    }
    Ok(out)
}

/// A Standby with divergent objects is not a valid promotion target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("this Standby holds {} object(s) that are not copies of the Active's (divergent), e.g. {}: not a valid promotion target; run failback first", .0.len(), .0.first().map(|d| d.at.to_string()).unwrap_or_default())]
#[non_exhaustive]
pub struct NotPromotable(pub Vec<Divergent>);

/// Refuse a promotion target holding divergent objects (see [`divergent_objects`]).
pub fn promotable(divergent: &[Divergent]) -> Result<(), NotPromotable> {
    if divergent.is_empty() {
        Ok(())
    } else {
        Err(NotPromotable(divergent.to_vec()))
    }
}
