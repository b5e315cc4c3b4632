//! The request pipeline shared by the in-memory `tower::Service` and the HTTP server: attribution,
//! faults, routing, dispatch, accounting.

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use bytes::Bytes;
use http::{header, request::Parts, Response};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full, StreamBody};

use crate::{
    accounting::{Delivery, Verb},
    discovery::{self, NonResource},
    faults::RequestFacts,
    labels::FieldSelector,
    list,
    query::Query,
    render::{self, As},
    rest::{self, DeleteOptions, PatchType, Reply, WriteCtx, FENCE_HEADER_NAME},
    router::{self, ResourceRoute, Route},
    server::Inner,
    status::{ApiError, ApiResult},
    watch,
};

/// The response body of both transports: whole bodies, or a watch stream.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// The failure a partitioned or outaged identity gets: no response at all. Over the in-memory service
/// it surfaces in kube as `kube::Error::Service`; over HTTP the connection is closed.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "testserver refused the request: the identity is partitioned or the server is in an outage"
)]
#[non_exhaustive]
pub struct Refused;

/// The in-memory transport: a `tower::Service` for `kube::Client::new`, one identity, one "connection".
#[derive(Clone)]
pub struct ApiService {
    inner: Arc<Inner>,
    identity: Arc<str>,
    conn: u64,
}

impl std::fmt::Debug for ApiService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiService")
            .field("identity", &self.identity)
            .field("connection", &self.conn)
            .finish()
    }
}

impl ApiService {
    pub(crate) fn new(inner: Arc<Inner>, identity: &str) -> Self {
        let conn = inner.next_conn();
        ApiService {
            inner,
            identity: Arc::from(identity),
            conn,
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> tower::Service<http::Request<B>> for ApiService
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody>;
    type Error = Refused;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Refused>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Refused>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let (inner, identity, conn) = (self.inner.clone(), self.identity.clone(), self.conn);
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = match body.collect().await {
                Ok(c) => c.to_bytes(),
                Err(_) => Bytes::new(),
            };
            handle(inner, identity, conn, parts, body).await
        })
    }
}

pub(crate) fn full_body(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into()).boxed_unsync()
}

fn json_response(code: u16, body: Vec<u8>) -> Response<ResponseBody> {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full_body(body))
        .expect("valid response")
}

pub(crate) fn error_response(e: &ApiError) -> Response<ResponseBody> {
    let mut resp = json_response(
        e.code,
        serde_json::to_vec(&e.to_status()).unwrap_or_default(),
    );
    if let Some(secs) = e.retry_after {
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            secs.to_string().parse().expect("digits"),
        );
    }
    resp
}

/// Handle one request from `identity` on connection `conn`.
pub(crate) async fn handle(
    inner: Arc<Inner>,
    identity: Arc<str>,
    conn: u64,
    parts: Parts,
    body: Bytes,
) -> Result<Response<ResponseBody>, Refused> {
    let tapped = tap_arrival(&inner, &identity, &parts, &body);
    let q = Query::parse(parts.uri.query());
    let route = router::route(&inner, parts.uri.path());
    let verb = match &route {
        Ok(Route::NonResource(_)) => Verb::Discovery,
        Ok(Route::Resource(r)) => {
            router::verb_of(&parts.method, r, &q).unwrap_or(router::method_verb(&parts.method))
        }
        Err(_) => router::method_verb(&parts.method),
    };
    inner.ledger.request(&identity, verb);
    if inner.faults.refused(&identity) {
        inner.ledger.refused(&identity);
        return Err(Refused);
    }
    let facts = request_facts(&identity, verb, &route, &q);
    if let Some(after) = inner.faults.detached(&facts) {
        // The handler runs on its own task, so a client giving up (dropping this future) does not
        // cancel the write; the client never gets an answer.
        let arrived = tokio::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep_until(arrived + after).await;
            let _unanswered = dispatch(&inner, facts, conn, parts, q, route, body).await;
        });
        return std::future::pending().await;
    }
    let delay = inner.faults.latency(&facts);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
        if inner.faults.refused(&identity) {
            inner.ledger.refused(&identity);
            return Err(Refused);
        }
    }
    let slow = inner.faults.answer_latency(&facts);
    let resp = dispatch(&inner, facts, conn, parts, q, route, body).await;
    if !slow.is_zero() {
        tokio::time::sleep(slow).await;
    }
    if let (Some(tap), Some(mut t)) = (&inner.config.request_tap, tapped) {
        t.status = Some(resp.status().as_u16());
        (tap.0)(&t);
    }
    Ok(resp)
}

/// Tell the request tap (if any) that this request arrived; what to complete when it is answered.
fn tap_arrival(
    inner: &Inner,
    identity: &str,
    parts: &Parts,
    body: &Bytes,
) -> Option<crate::Tapped> {
    let tap = inner.config.request_tap.as_ref()?;
    let t = crate::Tapped {
        identity: identity.to_owned(),
        method: parts.method.to_string(),
        uri: parts
            .uri
            .path_and_query()
            .map(ToString::to_string)
            .unwrap_or_default(),
        body_digest: kube_shard::fnv1a64(body),
        status: None,
    };
    (tap.0)(&t);
    Some(t)
}

/// Past attribution and the faults that delay or refuse a request: handle it and answer.
async fn dispatch(
    inner: &Arc<Inner>,
    facts: RequestFacts,
    conn: u64,
    parts: Parts,
    q: Query,
    route: ApiResult<Route>,
    body: Bytes,
) -> Response<ResponseBody> {
    let identity = facts.identity.clone();
    let result = match inner.faults.take_failure(&facts) {
        Some(e) => Err(e),
        None => match route {
            Err(e) => Err(e),
            Ok(Route::NonResource(segs)) => non_resource(inner, &identity, &segs),
            Ok(Route::Resource(r)) => resource(inner, facts, conn, &parts, &q, r, body).await,
        },
    };
    match result {
        Ok(resp) => resp,
        Err(e) => {
            inner.ledger.error(&identity);
            let resp = error_response(&e);
            inner.ledger.bytes(&identity, body_len(&resp));
            resp
        }
    }
}

/// The field manager of a write: the `fieldManager` parameter, else the User-Agent up to its first
/// `/` (as kube-apiserver names managers), at most 128 characters.
fn field_manager(q: &Query, headers: &http::HeaderMap) -> String {
    let m = match q.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) => m.to_string(),
        None => headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .unwrap_or_default()
            .to_string(),
    };
    m.chars().take(128).collect()
}

/// What faults are matched against: the path's resource, namespace and name, or for a collection
/// the equalities of its `fieldSelector` (how clients read or watch one object).
fn request_facts(
    identity: &Arc<str>,
    verb: Verb,
    route: &ApiResult<Route>,
    q: &Query,
) -> RequestFacts {
    let mut facts = RequestFacts {
        identity: identity.clone(),
        verb,
        resource: None,
        namespace: None,
        name: None,
    };
    if let Ok(Route::Resource(r)) = route {
        facts.resource = Some(r.info.plural.clone());
        facts.namespace.clone_from(&r.namespace);
        facts.name.clone_from(&r.name);
        if r.name.is_none() {
            let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or_default()).ok();
            if let Some(f) = fields {
                facts.name = f.name().map(str::to_string);
                if facts.namespace.is_none() {
                    facts.namespace = f.namespace().map(str::to_string);
                }
            }
        }
    }
    facts
}

fn body_len(resp: &Response<ResponseBody>) -> usize {
    http_body::Body::size_hint(resp.body())
        .exact()
        .unwrap_or_default() as usize
}

/// Bodies are JSON (or YAML for apply). A protobuf body of a built-in kind on a create or update is decoded
/// into the JSON it stands for (`protobuf`); a protobuf body for a custom resource or another verb, and any
/// CBOR body, gets kube-apiserver's 415.
fn json_body(
    parts: &Parts,
    info: &crate::resources::ResourceInfo,
    sub: Option<&str>,
    verb: Verb,
    body: Bytes,
) -> ApiResult<Bytes> {
    let ct = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let media = ct.split(';').next().unwrap_or_default().trim();
    let writes = matches!(verb, Verb::Create | Verb::Update);
    if media == crate::protobuf::MEDIA_TYPE && info.builtin && writes {
        // `/scale` takes an `autoscaling/v1` Scale, whatever the parent's kind
        let (group, version, kind) = if sub == Some("scale") {
            ("autoscaling", "v1", "Scale")
        } else {
            (
                info.group.as_str(),
                info.version.as_str(),
                info.kind.as_str(),
            )
        };
        return crate::protobuf::body_to_json(group, version, kind, &body).map(Bytes::from);
    }
    if !body.is_empty() && (media == crate::protobuf::MEDIA_TYPE || media == "application/cbor") {
        // kube-apiserver's words (it panics on a protobuf body for a custom resource and never answers:
        // this is the answer a client can act on)
        return Err(ApiError::new(
            415,
            Some("UnsupportedMediaType"),
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf",
        ));
    }
    Ok(body)
}

/// Answers are JSON. A client that accepts only protobuf or CBOR gets kube-apiserver's 406 for an `Accept`
/// it cannot serve; any other `Accept` (JSON, `*/*`, a Table, or a list that includes one) is answered in
/// JSON as before — kubectl sends `application/vnd.kubernetes.protobuf,application/json`.
fn acceptable(headers: &http::HeaderMap) -> ApiResult<()> {
    let Some(accept) = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()) else {
        return Ok(());
    };
    let binary_only = accept.split(',').all(|entry| {
        let media = entry.split(';').next().unwrap_or_default().trim();
        media == crate::protobuf::MEDIA_TYPE || media == "application/cbor"
    });
    if binary_only && !accept.trim().is_empty() {
        return Err(ApiError::new(
            406,
            Some("NotAcceptable"),
            "406: Not Acceptable\n\nAvailable representations: application/json",
        )
        .with_details(serde_json::json!({})));
    }
    Ok(())
}

fn non_resource(
    inner: &Inner,
    identity: &str,
    segs: &[String],
) -> ApiResult<Response<ResponseBody>> {
    let resp = match discovery::serve(inner, segs)? {
        NonResource::Json(v) => json_response(200, serde_json::to_vec(&v).unwrap_or_default()),
        NonResource::JsonBytes(b) => Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "application/json")
            .body(full_body(b))
            .expect("valid response"),
        NonResource::Text(t) => Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(full_body(t))
            .expect("valid response"),
    };
    inner.ledger.bytes(identity, body_len(&resp));
    Ok(resp)
}

async fn resource(
    inner: &Arc<Inner>,
    facts: RequestFacts,
    conn: u64,
    parts: &Parts,
    q: &Query,
    r: ResourceRoute,
    body: Bytes,
) -> ApiResult<Response<ResponseBody>> {
    let verb = router::verb_of(&parts.method, &r, q)?;
    let identity = &facts.identity.clone();
    let body = json_body(parts, &r.info, r.sub.as_deref(), verb, body)?;
    acceptable(&parts.headers)?;
    let as_ = As::from_headers(&parts.headers);
    let ns = r.namespace.as_deref();
    let gate = || inner.faults.effective_gate(inner.gate(), conn);
    let mut ctx = WriteCtx {
        inner,
        identity,
        verb,
        fence_header: parts
            .headers
            .get(FENCE_HEADER_NAME)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
        dry_run: q.get("dryRun").is_some_and(|d| d == "All"),
        apply: parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/apply-patch")),
        manager: field_manager(q, &parts.headers),
        subresource: r.sub.clone(),
        force: q.flag("force"),
    };
    let name = r.name.as_deref().unwrap_or_default();
    let scale = r.sub.as_deref() == Some("scale");
    let reply = match verb {
        Verb::Create if !r.info.stored => {
            let value = crate::builtins::review(&r.info, identity, rest::parse_body(&body)?)?;
            rest::Reply::Json { code: 201, value }
        }
        Verb::Get if scale => crate::scale::get(inner, &r.info, ns, name)?,
        Verb::Update if scale => crate::scale::write(&ctx, &r.info, ns, name, None, &body)?,
        Verb::Patch if scale => {
            let ct = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let ptype = PatchType::from_content_type(ct)?;
            crate::scale::write(&ctx, &r.info, ns, name, Some(ptype), &body)?
        }
        Verb::Watch => {
            let stream = watch::open(
                inner.clone(),
                facts,
                r.info.clone(),
                r.namespace.clone(),
                r.name.clone(),
                q,
                gate(),
                as_,
            )
            .await?;
            let frames = futures::stream::unfold(stream, |mut s| async move {
                s.next_frame()
                    .await
                    .map(|b| (Ok::<_, Infallible>(http_body::Frame::data(b)), s))
            });
            return Ok(Response::builder()
                .status(200)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::TRANSFER_ENCODING, "chunked")
                .body(StreamBody::new(frames).boxed_unsync())
                .expect("valid response"));
        }
        Verb::List => {
            let page = list::list(inner, &r.info, ns, q, gate(), as_).await?;
            let out = page.render(as_, inner.clock.now());
            inner.ledger.delivered(
                identity,
                Delivery::List,
                page.items.iter().map(|o| o.uid.as_str()),
                out.len(),
            );
            return Ok(json_response(200, out));
        }
        Verb::DeleteCollection => {
            let opts = DeleteOptions::parse(&body, q.get("propagationPolicy"))?;
            ctx.dry_run |= opts.dry_run;
            let page = list::delete_collection(&ctx, &r.info, ns, q, gate(), &opts)?;
            let out = page.render(As::Full, inner.clock.now());
            inner.ledger.delivered(
                identity,
                Delivery::List,
                page.items.iter().map(|o| o.uid.as_str()),
                out.len(),
            );
            return Ok(json_response(200, out));
        }
        Verb::Get => rest::get(inner, &r.info, ns, name)?,
        Verb::Create => rest::create(&ctx, &r.info, ns, &body)?,
        Verb::Update => rest::update(&ctx, &r.info, ns, name, r.sub.as_deref(), &body)?,
        Verb::Patch => {
            let ct = parts
                .headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default();
            let ptype = PatchType::from_content_type(ct)?;
            rest::patch(
                &ctx,
                &r.info,
                ns,
                name,
                r.sub.as_deref(),
                ptype,
                q.get("fieldManager"),
                &body,
            )?
        }
        Verb::Delete => {
            let opts = DeleteOptions::parse(&body, q.get("propagationPolicy"))?;
            ctx.dry_run |= opts.dry_run;
            rest::delete(&ctx, &r.info, ns, name, &opts)?
        }
        Verb::Discovery => return Err(ApiError::no_route()),
    };
    Ok(match reply {
        Reply::Object { code, info, obj } => {
            let out = render::object(&info, &obj, as_, inner.clock.now());
            inner
                .ledger
                .delivered(identity, Delivery::Object, [obj.uid.as_str()], out.len());
            json_response(code, out)
        }
        Reply::Json { code, value } => {
            let out = serde_json::to_vec(&value).unwrap_or_default();
            inner.ledger.bytes(identity, out.len());
            json_response(code, out)
        }
    })
}
