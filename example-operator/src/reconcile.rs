//! One Widget's reconcile: the child ConfigMap, then the status, each through a fenced write.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, Resource};
use kube_shard::ownership::FenceError;
use kube_shard::{fenced_write, FencedApi};
use kube_shard::{Fence, Ownership, Permit};

use crate::widget::{self, Widget, CHILD_LABEL};
use crate::{Config, Injected, OperatorMetrics, Reconciled};

pub(crate) struct Ctx {
    pub(crate) client: Client,
    /// The member's ownership: its current `name/incarnation` (it changes on a rejoin) for the write hook.
    pub(crate) ownership: Ownership,
    pub(crate) children: Store<ConfigMap>,
    pub(crate) metrics: OperatorMetrics,
    pub(crate) config: Config,
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReconcileError {
    /// No valid fence.
    #[error("fence: {0}")]
    Fence(#[from] FenceError),
    /// A fenced write failed.
    #[error("write: {0}")]
    Write(#[from] fenced_write::Error),
    /// The Widget lacks a metadata field.
    #[error("widget without metadata.{0}")]
    Missing(&'static str),
    /// The fault hook failed the reconcile.
    #[error("injected failure")]
    Injected,
}

fn child_name(widget: &str) -> String {
    format!("{widget}-widget")
}

fn desired_data(w: &Widget) -> BTreeMap<String, String> {
    let mut d = BTreeMap::new();
    if let Some(size) = w.spec.size {
        d.insert("size".to_owned(), size.to_string());
    }
    if let Some(c) = &w.spec.color {
        d.insert("color".to_owned(), c.clone());
    }
    if let Some(m) = &w.spec.message {
        d.insert("message".to_owned(), m.clone());
    }
    d.insert(
        "widgetGeneration".to_owned(),
        w.metadata.generation.unwrap_or(0).to_string(),
    );
    // which Widget (a delete + re-create under one name shares the child's name): lets a checker
    // compare the generations one Widget's reconciles wrote
    if let Some(uid) = &w.metadata.uid {
        d.insert("widgetUid".to_owned(), uid.clone());
    }
    d
}

/// Run one fenced write, counting it and reporting it to the write hook.
async fn fenced<T>(
    ctx: &Ctx,
    fence: &Fence,
    write: impl std::future::Future<Output = Result<T, fenced_write::Error>>,
) -> Result<T, ReconcileError> {
    let sent = (tokio::time::Instant::now(), std::time::SystemTime::now());
    // the incarnation the fence was issued to: a rejoin revokes every fence of the old one, so a write
    // that passes its fence check was sent by this incarnation
    let member = ctx.ownership.member().to_string();
    match write.await {
        Ok(v) => {
            ctx.metrics.writes.inc();
            if let Some(hook) = &ctx.config.on_write {
                hook(&crate::record(member, fence, sent));
            }
            Ok(v)
        }
        Err(e) => {
            if e.is_fenced() {
                ctx.metrics.fence_refused.inc();
            } else if e.is_fence_refused() {
                ctx.metrics.server_refused.inc();
            } else if e.is_conflict() {
                ctx.metrics.write_conflicts.inc();
            }
            Err(e.into())
        }
    }
}

struct Meta<'a> {
    name: &'a str,
    ns: &'a str,
    uid: &'a str,
    generation: i64,
}

fn meta(w: &Widget) -> Result<Meta<'_>, ReconcileError> {
    let m = &w.metadata;
    Ok(Meta {
        name: m.name.as_deref().ok_or(ReconcileError::Missing("name"))?,
        ns: m
            .namespace
            .as_deref()
            .ok_or(ReconcileError::Missing("namespace"))?,
        uid: m.uid.as_deref().ok_or(ReconcileError::Missing("uid"))?,
        generation: m.generation.unwrap_or(0),
    })
}

/// Bring the child ConfigMap in line; `Some(action)` ends the reconcile early.
async fn child(
    w: &Widget,
    m: &Meta<'_>,
    ctx: &Ctx,
    permit: &Permit,
) -> Result<Option<Action>, ReconcileError> {
    let data = desired_data(w);
    let cname = child_name(m.name);
    let child = ctx.children.get(&ObjectRef::new(&cname).within(m.ns));
    let cms: FencedApi<ConfigMap> = FencedApi::new(Api::namespaced(ctx.client.clone(), m.ns));
    match child {
        None => {
            let owner = OwnerReference {
                api_version: Widget::api_version(&()).into_owned(),
                kind: "Widget".to_owned(),
                name: m.name.to_owned(),
                uid: m.uid.to_owned(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            };
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(cname.clone()),
                    namespace: Some(m.ns.to_owned()),
                    labels: Some([(CHILD_LABEL.to_owned(), m.name.to_owned())].into()),
                    owner_references: Some(vec![owner]),
                    ..ObjectMeta::default()
                },
                data: Some(data),
                ..ConfigMap::default()
            };
            let fence = permit.fence()?;
            match fenced(ctx, &fence, cms.create(&fence, &cm)).await {
                Ok(_) => {}
                // created before and not in our cache yet: the cache catches up and triggers us
                Err(ReconcileError::Write(e)) if e.is_already_exists() => {
                    return Ok(Some(Action::requeue(Duration::from_millis(300))));
                }
                Err(e) => return Err(e),
            }
        }
        // another Widget's child: a deleted namesake's (a delete + re-create under one name gives the new
        // Widget another uid, so most likely another shard and owner). Its writes belong to that uid's
        // shard — its owner's fenced writes may still be in flight — so this Widget's owner never writes
        // it: it waits until the orphan collector (or the cluster's garbage collector) deletes it, then
        // creates its own
        Some(c) if controlled_by_another(&c, m.uid) => {
            return Ok(Some(Action::requeue(kube_shard::jitter(
                Duration::from_secs(1),
            ))));
        }
        Some(c) if c.data.as_ref() != Some(&data) => {
            let mut c = (*c).clone();
            c.data = Some(data);
            let fence = permit.fence()?;
            fenced(ctx, &fence, cms.replace(&fence, &c)).await?;
        }
        Some(_) => {}
    }
    Ok(None)
}

/// `child`'s controller is a Widget other than the one with uid `uid`.
fn controlled_by_another(child: &ConfigMap, uid: &str) -> bool {
    child
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.kind == "Widget" && o.uid != uid)
}

/// A write the apiserver's fence policy refused is a lost shard, like a lost fence: requeue (counted in
/// `server_refused` by [`fenced`]), never a reconcile error.
pub(crate) async fn reconcile_widget(
    w: Arc<Widget>,
    ctx: Arc<Ctx>,
    permit: Permit,
) -> Result<Action, ReconcileError> {
    match reconcile_fenced(w, ctx, permit).await {
        Err(ReconcileError::Write(e)) if e.is_fence_refused() => Ok(Action::requeue(
            kube_shard::jitter(Duration::from_millis(500)),
        )),
        other => other,
    }
}

async fn reconcile_fenced(
    w: Arc<Widget>,
    ctx: Arc<Ctx>,
    permit: Permit,
) -> Result<Action, ReconcileError> {
    ctx.metrics.reconciles.inc();
    let m = meta(&w)?;
    if let Some(hook) = &ctx.config.before_write {
        if hook(&format!("{}/{}", m.ns, m.name)).await == Injected::Fail {
            return Err(ReconcileError::Injected);
        }
    }
    if let Some(early) = child(&w, &m, &ctx, &permit).await? {
        return Ok(early);
    }

    // the status
    let fence = permit.fence()?;
    let want = widget::WidgetStatus {
        observed_generation: Some(m.generation),
        reconciled_by: Some(ctx.config.name.clone()),
        epoch: Some(fence.epoch()),
    };
    if w.status.as_ref() != Some(&want) {
        let widgets: FencedApi<Widget> = FencedApi::new(Api::namespaced(ctx.client.clone(), m.ns))
            .status_fence_field(
                widget::STATUS_FENCE_FIELD
                    .parse()
                    .expect("a valid field path"),
            );
        let patch = serde_json::json!({ "status": want });
        fenced(
            &ctx,
            &fence,
            widgets.patch_status(
                &fence,
                w.as_ref(),
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            ),
        )
        .await?;
    }
    if let Some(hook) = &ctx.config.on_reconciled {
        hook(&Reconciled {
            member: ctx.config.name.clone(),
            key: format!("{}/{}", m.ns, m.name),
            uid: m.uid.to_owned(),
            generation: m.generation,
        });
    }
    Ok(Action::await_change())
}

pub(crate) fn error_policy(_w: Arc<Widget>, err: &ReconcileError, ctx: Arc<Ctx>) -> Action {
    ctx.metrics.errors.inc();
    let quick = matches!(err, ReconcileError::Write(e) if e.is_conflict());
    let base = if quick {
        Duration::from_millis(200)
    } else {
        Duration::from_millis(500)
    };
    Action::requeue(kube_shard::jitter(base))
}
