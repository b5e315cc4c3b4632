//! Fenced writes: a wrapper around [`kube::Api`] whose every write carries the fence.
//!
//! Each write checks the [`Fence`] at send time, times out when the fence's validity ends, carries the
//! object's uid and resourceVersion preconditions (so the committed order is the fence order), stamps the
//! token ([`crate::token`]) in [`FENCE_ANNOTATION`] on main-resource writes and sends it in [`FENCE_HEADER`]
//! on every write, and, with a [status fence field](FencedApi::status_fence_field), stamps it in the status
//! on `/status` writes. The fence is held for the duration of the request, so a drain of its shard waits.
//!
//! See `docs/protocol.md#what-a-fenced-write-does`.

use std::{fmt, time::Duration};

use kube::{
    api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions},
    core::{Request, Status},
    Api, Client, Resource,
};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;
use tracing::{debug, info_span, Instrument};

use super::{
    observe::{InFlight, RequestOutcome},
    Fence, FenceError, Permit,
};
use crate::fence_policy::StatusFenceField;
use crate::token::{FENCE_ANNOTATION, FENCE_HEADER};

/// Why a fenced write was not done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A write fenced by [`Current`](super::Current) outside a reconcile's scope (a task the reconciler
    /// spawned, code outside a reconcile): nothing was sent. Pass the [`Permit`] explicitly there.
    #[error("no permit in scope: this write runs outside a reconcile of kube_shard::Controller (a spawned task?); pass the Permit explicitly")]
    NoPermit,
    /// The fence was no longer valid at send time: nothing was sent.
    #[error("fence invalid at send time")]
    Fence(#[source] FenceError),
    /// The fence expired while the request was in flight: the client gave up (the server may still commit;
    /// the preconditions keep that safe).
    #[error("request outlived its fence ({0:?})")]
    Timeout(Duration),
    /// The object lacks a name, uid or resourceVersion: fenced writes always carry both preconditions
    /// (pass the object as read from the API or the store, not one built locally).
    #[error(
        "fenced write of {name:?} needs metadata.{field}: pass the object as read from the API"
    )]
    MissingPrecondition {
        /// The object's name.
        name: String,
        /// `name`, `uid` or `resourceVersion`.
        field: &'static str,
    },
    /// The object or patch could not be encoded, or the patch is not a JSON object.
    #[error("cannot encode the write body")]
    Encode(#[source] serde_json::Error),
    /// The patch (apply, merge or strategic) is not a JSON object, or is of a kind fenced writes do not
    /// know.
    #[error("a fenced patch must be a JSON object (apply, merge or strategic) or a JSON patch")]
    PatchNotObject,
    /// A status write with a status fence field whose path is not an object in the body (a merge patch
    /// that sets `status` to `null`, or a non-object on the way): the fence cannot be stamped.
    #[error("cannot stamp the fence into {0}: a step of its path is not an object in the body")]
    StatusFence(String),
    /// The request was refused or failed (a 409 Conflict means a precondition failed: re-read and retry).
    #[error("fenced write failed")]
    Api(#[source] kube::Error),
}

impl Error {
    /// A precondition failed (409 Conflict: the object changed or was re-created since it was read):
    /// re-read and retry, usually by requeueing the reconcile.
    #[must_use]
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Api(kube::Error::Api(s)) if is_precondition_conflict(s))
    }

    /// A create found the name taken (409 `AlreadyExists`): the object was created before (its watch event
    /// is on its way), or another object has the name.
    #[must_use]
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Error::Api(kube::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists")
    }

    /// Nothing was sent because the fence was no longer valid: this member does not own the shard now.
    #[must_use]
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Fence(_))
    }

    /// The apiserver refused the write through the fence policy ([`crate::fence_policy`]): its fence is older
    /// than the one on the stored object (or names another shard, or removes or malforms it). Like
    /// [`is_fenced`](Self::is_fenced), this member lost the shard: requeue, never report a reconcile error.
    #[must_use]
    pub fn is_fence_refused(&self) -> bool {
        matches!(self, Error::Api(kube::Error::Api(s)) if is_refusal(s))
    }

    /// This member lost the shard: [`is_fenced`](Self::is_fenced), [`is_fence_refused`](Self::is_fence_refused),
    /// or a request that outlived its fence. Requeue; never report a reconcile error.
    #[must_use]
    pub fn is_lost_shard(&self) -> bool {
        matches!(self, Error::Fence(_) | Error::Timeout(_)) || self.is_fence_refused()
    }

    /// The fence policy refused the write for its failover epoch: below the stored object's, or below the
    /// cluster's minimum. Returns the apiserver's message, which names the object. This cluster was
    /// deposed, or its HA pair took an epoch below the ones its objects carry.
    #[must_use]
    pub fn failover_refusal(&self) -> Option<&str> {
        use crate::fence_policy::messages::{FAILOVER_STALE, MIN_EPOCH_STALE};
        match self {
            Error::Api(kube::Error::Api(s))
                if s.message.contains(FAILOVER_STALE) || s.message.contains(MIN_EPOCH_STALE) =>
            {
                Some(&s.message)
            }
            _ => None,
        }
    }
}

/// The fence policy's refusal: a 422 from one of kube-shard's admission policies.
pub(crate) fn is_refusal(s: &Status) -> bool {
    s.code == 422
        && s.message.contains("ValidatingAdmissionPolicy '")
        && s.message.contains(crate::fence_policy::messages::MARK)
}

/// A failed precondition: 409 Conflict for a uid or resourceVersion that no longer matches — not an
/// `AlreadyExists` (also 409) nor a server-side apply field conflict, which retrying does not cure.
pub(crate) fn is_precondition_conflict(s: &Status) -> bool {
    s.code == 409 && s.reason == "Conflict" && !s.message.starts_with("Apply failed")
}

/// The result of a fenced delete.
#[derive(Debug)]
#[non_exhaustive]
pub enum Deleted<K> {
    /// Deletion started; the object still exists (finalizers).
    Pending(K),
    /// The object is gone.
    Gone(Box<Status>),
}

/// What a fenced write takes its fence from: a [`Permit`] (the fence is taken at send time), a [`Fence`]
/// taken earlier (checked again at send time), or [`Current`](super::Current): the permit of the reconcile
/// in progress.
pub trait FenceSource: sealed::Sealed {
    /// A fence valid now.
    ///
    /// # Errors
    /// [`Error::Fence`] when the member no longer holds the shard.
    fn fence_now(&self) -> Result<Fence, Error>;
}

impl FenceSource for Permit {
    fn fence_now(&self) -> Result<Fence, Error> {
        self.fence().map_err(Error::Fence)
    }
}

impl FenceSource for super::Current {
    fn fence_now(&self) -> Result<Fence, Error> {
        super::Current::fence()
            .ok_or(Error::NoPermit)?
            .map_err(Error::Fence)
    }
}

impl FenceSource for Fence {
    fn fence_now(&self) -> Result<Fence, Error> {
        self.check().map_err(Error::Fence)?;
        Ok(self.clone())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Permit {}
    impl Sealed for super::Fence {}
    impl Sealed for super::super::Current {}
}

/// A wrapper around [`Api`] that fences every write.
///
/// ```no_run
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::{Api, Client};
/// use kube_shard::ownership::{fenced_write::FencedApi, Permit};
///
/// # async fn doc(client: Client, permit: Permit, mut cm: ConfigMap) -> Result<(), Box<dyn std::error::Error>> {
/// let api = FencedApi::new(Api::<ConfigMap>::namespaced(client, "default"));
/// cm.data.get_or_insert_with(Default::default).insert("k".into(), "v".into());
/// let cm = api.replace(&permit, &cm).await?; // fence at send time; uid + resourceVersion from cm.metadata
/// # Ok(()) }
/// ```
pub struct FencedApi<K> {
    api: Api<K>,
    client: Client,
    max_timeout: Duration,
    status_field: Option<StatusFenceField>,
}

impl<K> fmt::Debug for FencedApi<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FencedApi")
            .field("max_timeout", &self.max_timeout)
            .field("status_field", &self.status_field)
            .finish()
    }
}

impl<K> Clone for FencedApi<K>
where
    Api<K>: Clone,
{
    fn clone(&self) -> Self {
        FencedApi {
            api: self.api.clone(),
            client: self.client.clone(),
            max_timeout: self.max_timeout,
            status_field: self.status_field.clone(),
        }
    }
}

impl<K> FencedApi<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + fmt::Debug,
{
    /// Wrap `api`. Request timeouts are the fence's remaining validity, capped at 60 s.
    pub fn new(api: Api<K>) -> Self {
        let client = api.clone().into_client();
        FencedApi {
            api,
            client,
            max_timeout: Duration::from_secs(60),
            status_field: None,
        }
    }

    /// Stamp the fence token into `field` (e.g. `.status.kubeShardFence`) on every `/status` write
    /// ([`replace_status`](Self::replace_status), [`patch_status`](Self::patch_status)), for the
    /// apiserver's fence policy to compare ([`crate::fence_policy::FencePolicyConfig::status_field`]).
    ///
    /// **This changes what status writes send**: the field is set to the token
    /// (`"<failover-epoch>:<shard>/<epoch>"`) in the body (a merge patch gains it too). Declare it in the CRD's schema as a string, or the apiserver prunes it
    /// (and the policy then sees no fence). A merge patch that sets `status` to `null` fails with
    /// [`Error::StatusFence`]. Only for custom resources: a built-in kind's status has no such field.
    #[must_use]
    pub fn status_fence_field(mut self, field: StatusFenceField) -> Self {
        self.status_field = Some(field);
        self
    }

    /// Cap request timeouts at `max` (static-mode fences last practically forever).
    #[must_use]
    pub fn max_timeout(mut self, max: Duration) -> Self {
        self.max_timeout = max;
        self
    }

    /// The wrapped [`Api`] (for reads).
    pub fn api(&self) -> &Api<K> {
        &self.api
    }

    fn request(&self) -> Request {
        Request::new(self.api.resource_url())
    }

    /// Replace the object (PUT) with its `metadata.uid` and `metadata.resourceVersion` as preconditions; the
    /// fence annotation is stamped.
    pub async fn replace(&self, via: &impl FenceSource, obj: &K) -> Result<K, Error> {
        let fence = via.fence_now()?;
        let (name, uid, _) = preconditions(obj.meta())?;
        let mut obj = obj.clone();
        stamp_annotation(obj.meta_mut(), &fence);
        let body = serde_json::to_vec(&obj).map_err(Error::Encode)?;
        let req = self
            .request()
            .replace(&name, &PostParams::default(), body)
            .map_err(build_error)?;
        self.send(&fence, req, "replace", Some(&uid)).await
    }

    /// Replace the `/status` subresource, with uid and resourceVersion preconditions in the body; the fence
    /// travels in the header (status writes ignore metadata) and, when configured, in the
    /// [status fence field](Self::status_fence_field).
    pub async fn replace_status(&self, via: &impl FenceSource, obj: &K) -> Result<K, Error> {
        let fence = via.fence_now()?;
        let (name, uid, _) = preconditions(obj.meta())?;
        let mut body = serde_json::to_value(obj).map_err(Error::Encode)?;
        self.stamp_status(&fence, &mut body, true)?;
        let body = serde_json::to_vec(&body).map_err(Error::Encode)?;
        let req = self
            .request()
            .replace_subresource("status", &name, &PostParams::default(), body)
            .map_err(build_error)?;
        self.send(&fence, req, "replace_status", Some(&uid)).await
    }

    /// Patch `obj` like [`Api::patch`] — any [`Patch`]: server-side apply (`Patch::Apply` with
    /// `PatchParams::apply(manager)`), JSON merge, strategic merge, or JSON patch — made conditional on its
    /// uid and resourceVersion (in the patch's `metadata`, or as `test` operations of a JSON patch) and
    /// stamped with the fence annotation. An applied object then also claims the annotation for its field
    /// manager.
    pub async fn patch<P: Serialize + fmt::Debug>(
        &self,
        via: &impl FenceSource,
        obj: &K,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, Error> {
        self.patch_at(None, via, obj, params, patch).await
    }

    /// Patch `obj`'s `/status` like [`Api::patch_status`] (server-side apply is kube-rs's way to write
    /// status), conditional on its uid and resourceVersion; the fence travels in the header and, when
    /// configured, in the [status fence field](Self::status_fence_field) (not with a JSON patch:
    /// [`Error::StatusFence`]).
    pub async fn patch_status<P: Serialize + fmt::Debug>(
        &self,
        via: &impl FenceSource,
        obj: &K,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, Error> {
        self.patch_at(Some("status"), via, obj, params, patch).await
    }

    async fn patch_at<P: Serialize + fmt::Debug>(
        &self,
        status: Option<&str>,
        via: &impl FenceSource,
        obj: &K,
        params: &PatchParams,
        patch: &Patch<P>,
    ) -> Result<K, Error> {
        let fence = via.fence_now()?;
        let (name, uid, rv) = preconditions(obj.meta())?;
        // the annotation on the main resource only: a status write ignores metadata
        let stamp = status.is_none().then_some(&fence);
        if let (Patch::Json(_), Some(_), Some(field)) = (patch, status, &self.status_field) {
            // a JSON patch cannot carry the token into the status fence field
            return Err(Error::StatusFence(field.to_string()));
        }
        let body = match patch {
            Patch::Json(ops) => {
                Patch::Json(conditional_json_patch(ops, obj.meta(), &uid, &rv, stamp)?)
            }
            Patch::Apply(p) => Patch::Apply(self.body(p, &uid, &rv, stamp, status, &fence)?),
            Patch::Merge(p) => Patch::Merge(self.body(p, &uid, &rv, stamp, status, &fence)?),
            Patch::Strategic(p) => {
                Patch::Strategic(self.body(p, &uid, &rv, stamp, status, &fence)?)
            }
            _ => return Err(Error::PatchNotObject),
        };
        let (req, verb) = match status {
            None => (self.request().patch(&name, params, &body), "patch"),
            Some(sub) => (
                self.request().patch_subresource(sub, &name, params, &body),
                "patch_status",
            ),
        };
        let req = req.map_err(build_error)?;
        self.send(&fence, req, verb, Some(&uid)).await
    }

    /// A merge-style patch body (apply, merge, strategic) with the preconditions, the annotation
    /// (`stamp`) and, on a status write, the status fence field.
    fn body<P: Serialize>(
        &self,
        patch: &P,
        uid: &str,
        rv: &str,
        stamp: Option<&Fence>,
        status: Option<&str>,
        fence: &Fence,
    ) -> Result<Value, Error> {
        let patch = serde_json::to_value(patch).map_err(Error::Encode)?;
        let mut body = conditional_patch(&patch, uid, rv, stamp)?;
        if status.is_some() {
            self.stamp_status(fence, &mut body, false)?;
        }
        Ok(body)
    }

    /// Create an object (a child, typically) stamped with the fence annotation. A create has no uid or
    /// resourceVersion to be conditional on: the name makes it exclusive.
    pub async fn create(&self, via: &impl FenceSource, obj: &K) -> Result<K, Error> {
        let fence = via.fence_now()?;
        let mut obj = obj.clone();
        stamp_annotation(obj.meta_mut(), &fence);
        let body = serde_json::to_vec(&obj).map_err(Error::Encode)?;
        let req = self
            .request()
            .create(&PostParams::default(), body)
            .map_err(build_error)?;
        self.send(&fence, req, "create", None).await
    }

    /// Delete `obj` with its uid and resourceVersion as `DeleteOptions.preconditions`.
    pub async fn delete(&self, via: &impl FenceSource, obj: &K) -> Result<Deleted<K>, Error> {
        let fence = via.fence_now()?;
        let (name, uid, rv) = preconditions(obj.meta())?;
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: Some(rv),
            }),
            ..DeleteParams::default()
        };
        let req = self.request().delete(&name, &dp).map_err(build_error)?;
        let text: String = self.send_text(&fence, req, "delete", Some(&uid)).await?;
        let v: Value =
            serde_json::from_str(&text).map_err(|e| Error::Api(kube::Error::SerdeError(e)))?;
        if v["kind"] == "Status" {
            let status =
                serde_json::from_value(v).map_err(|e| Error::Api(kube::Error::SerdeError(e)))?;
            Ok(Deleted::Gone(Box::new(status)))
        } else {
            let obj =
                serde_json::from_value(v).map_err(|e| Error::Api(kube::Error::SerdeError(e)))?;
            Ok(Deleted::Pending(obj))
        }
    }

    /// The token into the status fence field, when one is configured.
    fn stamp_status(&self, fence: &Fence, body: &mut Value, replace: bool) -> Result<(), Error> {
        let Some(field) = &self.status_field else {
            return Ok(());
        };
        field
            .stamp(body, &fence.token().to_string(), replace)
            .map_err(|_| Error::StatusFence(field.to_string()))
    }

    async fn send(
        &self,
        fence: &Fence,
        req: http::Request<Vec<u8>>,
        verb: &'static str,
        uid: Option<&str>,
    ) -> Result<K, Error> {
        let text = self.send_text(fence, req, verb, uid).await?;
        serde_json::from_str(&text).map_err(|e| Error::Api(kube::Error::SerdeError(e)))
    }

    async fn send_text(
        &self,
        fence: &Fence,
        mut req: http::Request<Vec<u8>>,
        verb: &'static str,
        uid: Option<&str>,
    ) -> Result<String, Error> {
        let span = info_span!("fenced_write", verb, fence = %fence.token(), uri = %req.uri());
        async {
            // Held for the whole request: a drain of the shard waits for it (or for the drain deadline).
            let held = fence.clone();
            let left = held.check().map_err(Error::Fence)?;
            let timeout = left.min(self.max_timeout);
            let value = http::HeaderValue::from_str(&held.token().to_string())
                .expect("a fence token is ASCII digits, a colon and a slash");
            req.headers_mut().insert(FENCE_HEADER, value);
            req.extensions_mut().insert(verb);
            debug!(?timeout, "sending fenced write");
            let in_flight = InFlight::start(held.tracked(), uid);
            let (res, outcome) = match tokio::time::timeout(timeout, self.client.request_text(req))
                .await
            {
                Ok(Ok(text)) => (Ok(text), RequestOutcome::Answered),
                Ok(Err(e @ kube::Error::Api(_))) => (Err(Error::Api(e)), RequestOutcome::Answered),
                Ok(Err(e)) => (Err(Error::Api(e)), RequestOutcome::Failed),
                Err(_) => (Err(Error::Timeout(timeout)), RequestOutcome::TimedOut),
            };
            in_flight.end(outcome);
            res
        }
        .instrument(span)
        .await
    }
}

/// The object's name, uid and resourceVersion: a fenced write is always conditional on both.
fn preconditions(meta: &kube::api::ObjectMeta) -> Result<(String, String, String), Error> {
    let name = meta.name.clone().unwrap_or_default();
    let missing = |field| Error::MissingPrecondition {
        name: name.clone(),
        field,
    };
    if name.is_empty() {
        return Err(missing("name"));
    }
    let uid = meta
        .uid
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| missing("uid"))?;
    let rv = meta
        .resource_version
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| missing("resourceVersion"))?;
    Ok((name, uid, rv))
}

fn build_error(e: kube::core::request::Error) -> Error {
    Error::Api(kube::Error::BuildRequest(e))
}

fn stamp_annotation(meta: &mut kube::api::ObjectMeta, fence: &Fence) {
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(FENCE_ANNOTATION.to_owned(), fence.token().to_string());
}

/// `patch` after `test` operations on the uid and resourceVersion, then the fence annotation added (with
/// the annotations map itself when `meta` has none).
fn conditional_json_patch(
    patch: &json_patch::Patch,
    meta: &kube::api::ObjectMeta,
    uid: &str,
    rv: &str,
    stamp: Option<&Fence>,
) -> Result<json_patch::Patch, Error> {
    let mut ops = vec![
        serde_json::json!({"op": "test", "path": "/metadata/uid", "value": uid}),
        serde_json::json!({"op": "test", "path": "/metadata/resourceVersion", "value": rv}),
    ];
    ops.extend(
        patch
            .0
            .iter()
            .map(|op| serde_json::to_value(op).map_err(Error::Encode))
            .collect::<Result<Vec<_>, _>>()?,
    );
    if let Some(fence) = stamp {
        let token = Value::String(fence.token().to_string());
        if meta.annotations.is_some() {
            let key = FENCE_ANNOTATION.replace('~', "~0").replace('/', "~1");
            ops.push(serde_json::json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": token}));
        } else {
            ops.push(serde_json::json!({"op": "add", "path": "/metadata/annotations", "value": {FENCE_ANNOTATION: token}}));
        }
    }
    serde_json::from_value(Value::Array(ops)).map_err(Error::Encode)
}

fn conditional_patch(
    patch: &Value,
    uid: &str,
    resource_version: &str,
    stamp: Option<&Fence>,
) -> Result<Value, Error> {
    let mut body = patch.clone();
    let obj = body.as_object_mut().ok_or(Error::PatchNotObject)?;
    let meta = obj
        .entry("metadata")
        .or_insert_with(|| Value::Object(Default::default()));
    let meta = meta.as_object_mut().ok_or(Error::PatchNotObject)?;
    meta.insert("uid".into(), Value::String(uid.to_owned()));
    meta.insert(
        "resourceVersion".into(),
        Value::String(resource_version.to_owned()),
    );
    if let Some(fence) = stamp {
        let ann = meta
            .entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()));
        let ann = ann.as_object_mut().ok_or(Error::PatchNotObject)?;
        ann.insert(
            FENCE_ANNOTATION.into(),
            Value::String(fence.token().to_string()),
        );
    }
    Ok(body)
}
