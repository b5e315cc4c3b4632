//! Bringing one copy up to its source (HA.md "Writes"): the worker re-reads the source by name at dequeue
//! time, reads the copy, decides ([`decide`]), and writes with preconditions (the copy's uid and
//! resourceVersion as read: a 409 means re-read and compare again). The marker is written last: an update
//! writes `/status` first, then the main resource with the marker; a create writes the main resource without
//! it, then `/status`, then the marker. A re-created source is a delete (preconditions) then a create; copies
//! are deleted with `propagationPolicy: Orphan`, only when [`may_delete`] allows. Each request awaits the
//! mirror's global rate limit first ([`RateLimit`]).

use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, ObjectMeta, PostParams, Preconditions,
    PropagationPolicy,
};
use kube::Api;
use serde_json::Value;
use tracing::warn;

use super::plan::{
    ahead, decide, may_delete, plan, Action, CopyContext, Planned, SourceNow, SOURCE_RV,
};
use super::queue::Key;
use super::rate::RateLimit;
use super::rv::marker;
use super::rv::parse_rv;

/// The result of one attempt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The copy holds the source's version (written, or already there); the copy's resourceVersion
    /// after the mirror's last write, when it wrote.
    Applied(Option<String>),
    /// The copy was deleted (or there was none to delete).
    Gone,
    /// A retryable failure (409, a missing namespace, 429, 5xx, transport).
    Retry(Failure),
    /// A permanent failure (an object not made by the mirror, 422, 400): the failed list.
    Poison(Failure),
}

/// One apply's requests: the kind's sides and the global rate limit each request awaits.
#[derive(Clone, Copy)]
struct Req<'a> {
    s: &'a Sides,
    rate: &'a RateLimit,
}

/// What a failed attempt was doing: the `operation` label of `kube_shard_mirror_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Op {
    /// Reading the source object or the source collection's version.
    ReadSource,
    /// Reading the copy.
    ReadCopy,
    /// Planning the copy (an unparseable version, a bad marker).
    Plan,
    /// An object of that name the mirror may not touch (the conflict guard).
    Conflict,
    /// Creating the copy.
    Create,
    /// Writing the copy's main resource.
    Update,
    /// Writing the copy's `/status`.
    UpdateStatus,
    /// Deleting the copy.
    Delete,
    /// The worker running the apply ended without an answer (it panicked).
    Worker,
}

impl Op {
    /// The metric label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Op::ReadSource => "read_source",
            Op::ReadCopy => "read_copy",
            Op::Plan => "plan",
            Op::Conflict => "conflict",
            Op::Create => "create",
            Op::Update => "update",
            Op::UpdateStatus => "update_status",
            Op::Delete => "delete",
            Op::Worker => "worker",
        }
    }
}

/// A failed attempt: what it was doing, and the error as a person reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) op: Op,
    pub(crate) text: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

fn failed(op: Op, text: impl Into<String>) -> Failure {
    Failure {
        op,
        text: text.into(),
    }
}

/// The kind's two sides.
#[derive(Clone)]
pub(crate) struct Sides {
    pub(crate) ar: ApiResource,
    pub(crate) namespaced: bool,
    pub(crate) has_status: bool,
    pub(crate) source: kube::Client,
    pub(crate) target: kube::Client,
    /// The source-version marker written last, after the copy itself; `false` is a planted bug for the
    /// tests.
    pub(crate) marker_last: bool,
}

impl Sides {
    fn api(&self, c: &kube::Client, ns: &str) -> Api<DynamicObject> {
        if self.namespaced {
            Api::namespaced_with(c.clone(), ns, &self.ar)
        } else {
            Api::all_with(c.clone(), &self.ar)
        }
    }
}

fn classify(op: Op, what: &str, e: kube::Error) -> Outcome {
    let f = failed(op, format!("{what}: {e}"));
    match &e {
        kube::Error::Api(s) if matches!(s.code, 400 | 422) => Outcome::Poison(f),
        _ => Outcome::Retry(f),
    }
}

/// A failure of the worker itself (see [`Op::Worker`]): retried.
pub(super) fn worker_ended(why: impl std::fmt::Display) -> Outcome {
    Outcome::Retry(failed(Op::Worker, format!("the worker ended: {why}")))
}

/// One attempt for `key`, each request after its turn under `rate`.
pub(super) async fn apply(
    s: &Sides,
    rate: &RateLimit,
    ctx: &CopyContext,
    key: &Key,
    last_written: Option<&str>,
    in_scope: impl Fn(&DynamicObject) -> bool,
) -> Outcome {
    let r = Req { s, rate };
    let (ns, name) = (key.0.as_str(), key.1.as_str());
    rate.acquire().await;
    let src = match s.api(&s.source, ns).get_opt(name).await {
        Ok(o) => o,
        Err(e) => return classify(Op::ReadSource, "reading the source", e),
    };
    let tgt = s.api(&s.target, ns);
    rate.acquire().await;
    let copy = match tgt.get_opt(name).await {
        Ok(o) => o,
        Err(e) => return classify(Op::ReadCopy, "reading the copy", e),
    };
    let src = match src {
        None => {
            return match copy {
                Some(c) if may_delete(&c, &ctx.source, &SourceNow::Missing) => {
                    delete(r, &tgt, &c).await
                }
                _ => Outcome::Gone,
            }
        }
        // out of scope (or kube-shard's own): copies are reported, never deleted
        Some(o) if !in_scope(&o) => return Outcome::Gone,
        Some(o) => o,
    };
    let p = match plan(&src, ctx) {
        Ok(p) => p,
        Err(e) => return Outcome::Poison(failed(Op::Plan, e.to_string())),
    };
    let action = match decide(&p, copy.as_ref(), &ctx.source, last_written) {
        Ok(a) => a,
        Err(e) => return Outcome::Poison(failed(Op::Plan, e.to_string())),
    };
    let action = match action {
        Action::Ahead { held } => match collection_rv(r).await {
            Ok(now) => ahead(held, now),
            Err(o) => return o,
        },
        a => a,
    };
    match (action, copy) {
        (Action::Skip | Action::Ahead { .. }, _) => Outcome::Applied(None),
        (Action::NotOurs, _) => Outcome::Poison(failed(
            Op::Conflict,
            format!(
            "{ns}/{name} exists on the Standby and was not made by the mirror from {}: not touched",
            ctx.source.cluster
        ),
        )),
        (Action::Create, _) => create(r, &tgt, ctx, &p).await,
        (Action::Update { alarm }, Some(c)) => {
            if let Some(a) = alarm {
                warn!(kind = %ctx.source.resource, ns, name, alarm = %a, "mirror: re-applying a copy");
            }
            update_with(r, &tgt, ctx, &p, &c).await
        }
        (Action::Recreate, Some(c)) => {
            if !may_delete(&c, &ctx.source, &SourceNow::Uid(p.source_uid.clone())) {
                return Outcome::Poison(failed(
                    Op::Conflict,
                    format!("{ns}/{name}: re-created source, copy not deletable"),
                ));
            }
            match delete(r, &tgt, &c).await {
                Outcome::Gone => create(r, &tgt, ctx, &p).await,
                other => other,
            }
        }
        (_, None) => Outcome::Retry(failed(Op::ReadCopy, "the copy vanished")),
    }
}

/// The source collection's current resourceVersion: a `limit=1` LIST, as the lag probe reads it.
async fn collection_rv(r: Req<'_>) -> Result<u64, Outcome> {
    let api: Api<DynamicObject> = Api::all_with(r.s.source.clone(), &r.s.ar);
    r.rate.acquire().await;
    let l = api
        .list(&ListParams::default().limit(1))
        .await
        .map_err(|e| classify(Op::ReadSource, "reading the source's current version", e))?;
    parse_rv(
        l.metadata.resource_version.as_deref().unwrap_or(""),
        "the source's current version",
    )
    .map_err(|e| Outcome::Poison(failed(Op::Plan, e.to_string())))
}

async fn delete(r: Req<'_>, tgt: &Api<DynamicObject>, c: &DynamicObject) -> Outcome {
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        preconditions: Some(Preconditions {
            uid: c.metadata.uid.clone(),
            resource_version: c.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    r.rate.acquire().await;
    match tgt
        .delete(c.metadata.name.as_deref().unwrap_or(""), &dp)
        .await
    {
        Ok(_) => Outcome::Gone,
        Err(kube::Error::Api(e)) if e.code == 404 => Outcome::Gone,
        Err(e) => classify(Op::Delete, "deleting the copy", e),
    }
}

fn object(s: &Sides, meta: ObjectMeta, p: &Planned, with_status: bool) -> DynamicObject {
    let mut data = p.body.clone();
    if with_status {
        if let Some(st) = &p.status {
            data.insert("status".into(), st.clone());
        }
    }
    let mut o = DynamicObject::new(meta.name.as_deref().unwrap_or(""), &s.ar);
    o.metadata = meta;
    o.data = Value::Object(data);
    o
}

fn with_marker(mut meta: ObjectMeta, ctx: &CopyContext, rv: u64) -> ObjectMeta {
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(SOURCE_RV.into(), marker(&ctx.source, rv));
    meta
}

fn preconditioned(mut meta: ObjectMeta, c: &DynamicObject) -> ObjectMeta {
    meta.uid = c.metadata.uid.clone();
    meta.resource_version = c.metadata.resource_version.clone();
    meta
}

async fn create(r: Req<'_>, tgt: &Api<DynamicObject>, ctx: &CopyContext, p: &Planned) -> Outcome {
    let s = r.s;
    let pp = PostParams::default();
    let first = if s.marker_last {
        p.meta.clone()
    } else {
        with_marker(p.meta.clone(), ctx, p.source_rv)
    };
    // without a status subresource the status is part of the main resource
    r.rate.acquire().await;
    let created = match tgt.create(&pp, &object(s, first, p, !s.has_status)).await {
        Ok(c) => c,
        Err(e) => return classify(Op::Create, "creating the copy", e),
    };
    let created = match write_status(r, tgt, p, &created).await {
        Ok(c) => c,
        Err(o) => return o,
    };
    let meta = preconditioned(with_marker(p.meta.clone(), ctx, p.source_rv), &created);
    replace_main(r, tgt, meta, p).await
}

/// Bring copy `c` up to `p` (no rate limit: the failback's writes).
pub(crate) async fn update(
    s: &Sides,
    tgt: &Api<DynamicObject>,
    ctx: &CopyContext,
    p: &Planned,
    c: &DynamicObject,
) -> Outcome {
    let none = RateLimit::default();
    update_with(Req { s, rate: &none }, tgt, ctx, p, c).await
}

async fn update_with(
    r: Req<'_>,
    tgt: &Api<DynamicObject>,
    ctx: &CopyContext,
    p: &Planned,
    c: &DynamicObject,
) -> Outcome {
    let mut cur = c.clone();
    if !r.s.marker_last {
        let meta = preconditioned(with_marker(p.meta.clone(), ctx, p.source_rv), &cur);
        match replace_main(r, tgt, meta, p).await {
            Outcome::Applied(Some(rv)) => cur.metadata.resource_version = Some(rv),
            other => return other,
        }
        return match write_status(r, tgt, p, &cur).await {
            Ok(o) => Outcome::Applied(o.metadata.resource_version),
            Err(o) => o,
        };
    }
    cur = match write_status(r, tgt, p, &cur).await {
        Ok(o) => o,
        Err(o) => return o,
    };
    let meta = preconditioned(with_marker(p.meta.clone(), ctx, p.source_rv), &cur);
    replace_main(r, tgt, meta, p).await
}

/// `/status` when the kind has it and it differs; returns the copy as written (or as it was).
async fn write_status(
    r: Req<'_>,
    tgt: &Api<DynamicObject>,
    p: &Planned,
    c: &DynamicObject,
) -> Result<DynamicObject, Outcome> {
    if !r.s.has_status || c.data.get("status") == p.status.as_ref() {
        return Ok(c.clone());
    }
    let mut o = c.clone();
    match (&mut o.data, &p.status) {
        (Value::Object(m), Some(st)) => {
            m.insert("status".into(), st.clone());
        }
        (Value::Object(m), None) => {
            m.remove("status");
        }
        _ => {}
    }
    let name = c.metadata.name.as_deref().unwrap_or("");
    r.rate.acquire().await;
    tgt.replace_status(name, &PostParams::default(), &o)
        .await
        .map_err(|e| classify(Op::UpdateStatus, "writing the copy's status", e))
}

async fn replace_main(
    r: Req<'_>,
    tgt: &Api<DynamicObject>,
    meta: ObjectMeta,
    p: &Planned,
) -> Outcome {
    let name = meta.name.clone().unwrap_or_default();
    r.rate.acquire().await;
    match tgt
        .replace(
            &name,
            &PostParams::default(),
            &object(r.s, meta, p, !r.s.has_status),
        )
        .await
    {
        Ok(o) => Outcome::Applied(o.metadata.resource_version),
        Err(e) => classify(Op::Update, "writing the copy", e),
    }
}
