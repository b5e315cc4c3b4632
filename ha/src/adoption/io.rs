//! Adoption's requests: listing a kind, and executing the promotion plan and the relabelling.

use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, PostParams, Preconditions,
    PropagationPolicy,
};
use kube::discovery::{ApiCapabilities, Scope};
use kube::{Api, Client};
use tracing::warn;

use super::plan::{apply_restore, Delete, ObjRef, Problem, Propagation, Restore, Step};
use crate::checkpoint::Kind;
use crate::mirror::error::{api_err, MirrorError};
use crate::mirror::plan::{MIRRORED_FROM, SOURCE_RV};

/// One kind on one side.
pub(crate) struct KindApi {
    pub(crate) ar: ApiResource,
    pub(crate) caps: ApiCapabilities,
    pub(crate) client: Client,
}

impl KindApi {
    pub(crate) async fn resolve(c: &Client, k: &Kind) -> Result<Self, MirrorError> {
        let (ar, caps) = crate::mirror::resolve(c, k).await?;
        Ok(KindApi {
            ar,
            caps,
            client: c.clone(),
        })
    }

    pub(crate) fn all(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &self.ar)
    }

    pub(crate) fn at(&self, ns: Option<&str>) -> Api<DynamicObject> {
        match (self.caps.scope == Scope::Namespaced, ns) {
            (true, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &self.ar),
            _ => Api::all_with(self.client.clone(), &self.ar),
        }
    }

    /// Every object (pages of 500), optionally by label selector.
    pub(crate) async fn list(
        &self,
        labels: Option<&str>,
    ) -> Result<Vec<DynamicObject>, MirrorError> {
        let api = self.all();
        let mut out = Vec::new();
        let mut lp = ListParams::default().limit(500);
        if let Some(l) = labels {
            lp = lp.labels(l);
        }
        loop {
            let page = api
                .list(&lp)
                .await
                .map_err(api_err(format!("listing {}", self.ar.plural)))?;
            out.extend(page.items);
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(c) => lp = lp.continue_token(&c),
                None => return Ok(out),
            }
        }
    }
}

/// Attempts per object on 409 (re-read, apply again).
const ATTEMPTS: usize = 5;

/// Execute one step. `Ok(false)`: nothing to do (the copy is gone or is another object now).
pub(crate) async fn execute(
    api: &KindApi,
    step: &Step,
    problems: &mut Vec<Problem>,
) -> Result<bool, MirrorError> {
    match step {
        Step::Restore(r) => restore(api, r, problems).await,
        Step::Delete(d) => delete(api, d).await,
    }
}

async fn restore(
    api: &KindApi,
    r: &Restore,
    problems: &mut Vec<Problem>,
) -> Result<bool, MirrorError> {
    let a = api.at(r.at.namespace.as_deref());
    for _ in 0..ATTEMPTS {
        let cur = a
            .get_opt(&r.at.name)
            .await
            .map_err(api_err(format!("reading {}", r.at)))?;
        let Some(mut o) = cur.filter(|o| o.metadata.uid.as_deref() == Some(r.uid.as_str())) else {
            return Ok(false);
        };
        apply_restore(r, &mut o.metadata);
        match a.replace(&r.at.name, &PostParams::default(), &o).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(kube::Error::Api(e)) if matches!(e.code, 400 | 422) => {
                problems.push(Problem {
                    at: r.at.clone(),
                    what: format!("restore refused: {}", e.message),
                });
                return Ok(false);
            }
            Err(e) => return Err(api_err(format!("restoring {}", r.at))(e)),
        }
    }
    Err(MirrorError::Kind(
        r.at.kind.clone(),
        format!("{}: {ATTEMPTS} conflicts in a row while restoring", r.at),
    ))
}

async fn delete(api: &KindApi, d: &Delete) -> Result<bool, MirrorError> {
    let dp = DeleteParams {
        propagation_policy: Some(match d.propagation {
            Propagation::Orphan => PropagationPolicy::Orphan,
            Propagation::Foreground => PropagationPolicy::Foreground,
            Propagation::Background => PropagationPolicy::Background,
        }),
        preconditions: Some(Preconditions {
            uid: Some(d.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api
        .at(d.at.namespace.as_deref())
        .delete(&d.at.name, &dp)
        .await
    {
        Ok(_) => Ok(true),
        // gone, or another object of that name now (the uid precondition)
        Err(kube::Error::Api(e)) if matches!(e.code, 404 | 409) => Ok(false),
        Err(e) => Err(api_err(format!("deleting {}", d.at))(e)),
    }
}

/// Relabel one copy as owned: drop the conflict guard and the source's commit marker (the recorded
/// source uid stays: failback pairs by it). `Ok(false)`: not a copy from `source` any more.
pub(crate) async fn relabel(api: &KindApi, at: &ObjRef, source: &str) -> Result<bool, MirrorError> {
    let a = api.at(at.namespace.as_deref());
    for _ in 0..ATTEMPTS {
        let Some(mut o) = a
            .get_opt(&at.name)
            .await
            .map_err(api_err(format!("reading {at}")))?
        else {
            return Ok(false);
        };
        let labels = o.metadata.labels.get_or_insert_with(Default::default);
        if labels.get(MIRRORED_FROM).map(String::as_str) != Some(source) {
            return Ok(false);
        }
        labels.remove(MIRRORED_FROM);
        if let Some(ann) = o.metadata.annotations.as_mut() {
            ann.remove(SOURCE_RV);
        }
        match a.replace(&at.name, &PostParams::default(), &o).await {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(false),
            Err(e) => return Err(api_err(format!("relabelling {at}"))(e)),
        }
    }
    warn!(%at, "adoption: relabelling kept conflicting; left for the next pass");
    Ok(false)
}
