//! `promote --token --accept-failed`: what a promotion accepts losing when the mirror caught up to the
//! token except its failed (poison) objects. The list is not the mirror's word for it: it is read from
//! both clusters, as the objects in the mirror's scope on the frozen source whose copy here is missing
//! or older than the source's version, and the copies whose source is gone.

use std::collections::BTreeMap;

use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};

use super::error::SwitchError;
use crate::checkpoint::{DemotionToken, Kind};
use crate::mirror::plan::{MIRRORED_FROM, SOURCE_RV};
use crate::mirror::rv::{marker_rv, SourceId};
use crate::mirror::scope::in_scope;
use crate::mirror::MirrorConfig;

/// One object a promotion accepts losing.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[non_exhaustive]
pub struct Lost {
    /// The kind's key (`<plural>.<group>`).
    pub kind: String,
    /// `<namespace>/<name>` (`<name>` when cluster-scoped).
    pub object: String,
    /// What is lost: `not copied`, `older copy`, `delete not applied`.
    pub what: &'static str,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({})", self.kind, self.object, self.what)
    }
}

fn key(o: &DynamicObject) -> String {
    match &o.metadata.namespace {
        Some(ns) => format!("{ns}/{}", o.metadata.name.as_deref().unwrap_or("")),
        None => o.metadata.name.clone().unwrap_or_default(),
    }
}

/// The objects of `kind` (pure): `sources` in scope whose copy in `copies` is missing or holds an
/// older source version, and copies of this source whose source is gone.
pub(crate) fn diff(
    cfg: &MirrorConfig,
    kind: &Kind,
    source: &SourceId,
    sources: &[DynamicObject],
    copies: &[DynamicObject],
) -> Vec<Lost> {
    let copies: BTreeMap<String, &DynamicObject> = copies
        .iter()
        .filter(|c| {
            c.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(MIRRORED_FROM))
                .is_some_and(|f| *f == cfg.source_cluster)
        })
        .map(|c| (key(c), c))
        .collect();
    let lost = |o: &DynamicObject, what| Lost {
        kind: kind.key(),
        object: key(o),
        what,
    };
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for o in sources.iter().filter(|o| in_scope(cfg, kind, o)) {
        seen.insert(key(o));
        let src_rv = o
            .metadata
            .resource_version
            .as_deref()
            .and_then(|v| v.parse::<u64>().ok());
        match copies.get(&key(o)) {
            None => out.push(lost(o, "not copied")),
            Some(c) => {
                let held = c
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(SOURCE_RV))
                    .map(String::as_str);
                let held = marker_rv(held, source).ok().flatten();
                if held.zip(src_rv).is_none_or(|(h, s)| h < s) {
                    out.push(lost(o, "older copy"));
                }
            }
        }
    }
    for (k, c) in &copies {
        if !seen.contains(k) && in_scope(cfg, kind, c) {
            out.push(lost(c, "delete not applied"));
        }
    }
    out
}

/// Read both sides and list what a promotion by `token` accepts losing (the source is frozen: its
/// objects are the token's state).
pub(crate) async fn lost_objects(
    local: &Client,
    peer: &Client,
    cfg: &MirrorConfig,
    token: &DemotionToken,
) -> Result<Vec<Lost>, SwitchError> {
    let mut out = Vec::new();
    for kind in cfg.kinds.mirrored() {
        if !token.kinds.contains_key(&kind.key()) {
            continue;
        }
        let (ar, _) = super::io::resolve(kind, local).await?;
        let read = |c: &Client| {
            let api: Api<DynamicObject> = Api::all_with(c.clone(), &ar);
            async move { api.list(&ListParams::default()).await }
        };
        let what = format!("listing {} for --accept-failed", kind.key());
        let sources = read(peer)
            .await
            .map_err(super::error::api_err(what.clone()))?;
        let copies = read(local).await.map_err(super::error::api_err(what))?;
        let source = SourceId {
            cluster: token.cluster.clone(),
            uid: token.uid.clone(),
            resource: kind.key(),
        };
        out.extend(diff(cfg, kind, &source, &sources.items, &copies.items));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::KindSet;
    use serde_json::json;

    fn obj(name: &str, rv: u64, ann: Option<String>, copy: bool) -> DynamicObject {
        let mut labels = serde_json::Map::new();
        if copy {
            labels.insert(MIRRORED_FROM.into(), json!("a"));
        }
        let mut annotations = serde_json::Map::new();
        if let Some(a) = ann {
            annotations.insert(SOURCE_RV.into(), json!(a));
        }
        serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": name, "namespace": "apps", "resourceVersion": rv.to_string(),
                         "labels": labels, "annotations": annotations},
        }))
        .unwrap()
    }

    #[test]
    fn what_a_promotion_accepts_losing_is_every_object_not_copied_at_its_version() {
        let kind: Kind = "widgets.example.com/v1".parse().unwrap();
        let set = KindSet::builder()
            .mirrored(kind.clone())
            .build(std::slice::from_ref(&kind))
            .unwrap();
        let ha = crate::HaConfig::builder("widgets")
            .mode(crate::HaMode::Standby)
            .cluster("b", 2)
            .namespace("ops")
            .kubeconfigs(None, Some("/peer".into()), None)
            .build()
            .unwrap();
        let cfg = MirrorConfig::new(ha, "a", set);
        let src = SourceId {
            cluster: "a".into(),
            uid: "u".into(),
            resource: kind.key(),
        };
        let m = |rv| Some(crate::mirror::rv::marker(&src, rv));
        let sources = [
            obj("same", 10, None, false),
            obj("behind", 20, None, false),
            obj("missing", 30, None, false),
        ];
        let copies = [
            obj("same", 500, m(10), true),
            obj("behind", 501, m(15), true),
            obj("deleted-at-source", 502, m(5), true),
            obj("not-a-copy", 503, None, false),
        ];
        let lost = diff(&cfg, &kind, &src, &sources, &copies);
        let text: Vec<String> = lost.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "widgets.example.com apps/behind (older copy)",
                "widgets.example.com apps/missing (not copied)",
                "widgets.example.com apps/deleted-at-source (delete not applied)",
            ]
        );
    }
}
