//! LIST and DELETECOLLECTION: selectors, `limit`/`continue` over consistent snapshots,
//! `resourceVersion`/`resourceVersionMatch`, KEP-5866 filtering and the `shardInfo` echo.

use std::sync::Arc;

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine};
use serde_json::{json, Value};

use crate::{
    query::{Filter, Query},
    render::{self, As},
    resources::ResourceInfo,
    rest::{delete_locked, publish_rv, DeleteOptions, WriteCtx},
    server::Inner,
    status::{ApiError, ApiResult},
    store::{obj_key, Obj},
};

/// One page of a list, ready to render.
#[derive(Debug)]
pub(crate) struct Page {
    pub(crate) info: Arc<ResourceInfo>,
    pub(crate) items: Vec<Arc<Obj>>,
    pub(crate) rv: u64,
    pub(crate) cont: Option<String>,
    pub(crate) remaining: Option<u64>,
    pub(crate) shard_info: Option<String>,
}

fn encode_continue(rv: u64, last_key: &str) -> String {
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{last_key}\u{0}")});
    URL_SAFE_NO_PAD.encode(token.to_string())
}

pub(crate) fn decode_continue(token: &str) -> ApiResult<(u64, String)> {
    let bad = |why: &str| ApiError::bad_request(format!("continue key is not valid: {why}"));
    let raw = URL_SAFE_NO_PAD
        .decode(token.trim_end_matches('='))
        .map_err(|e| bad(&e.to_string()))?;
    let v: Value = serde_json::from_slice(&raw).map_err(|e| bad(&e.to_string()))?;
    if v["v"] != "meta.k8s.io/v1" {
        return Err(bad(
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ));
    }
    let rv = v["rv"]
        .as_u64()
        .filter(|r| *r > 0)
        .ok_or_else(|| bad("incorrect encoded start resourceVersion (version meta.k8s.io/v1)"))?;
    let start = v["start"].as_str().ok_or_else(|| bad("no start key"))?;
    let last = start.strip_suffix('\u{0}').unwrap_or(start);
    Ok((rv, last.to_string()))
}

pub(crate) fn parse_rv(s: &str) -> ApiResult<u64> {
    s.parse::<u64>()
        .map_err(|_| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

fn invalid_list_option(why: &str) -> ApiError {
    ApiError::new(
        422,
        Some("Invalid"),
        format!("ListOptions.meta.k8s.io \"\" is invalid: {why}"),
    )
}

/// Wait until the store reaches `rv` (up to the configured wait), else "Too large resource version".
pub(crate) async fn wait_for_rv(inner: &Inner, rv: u64) -> ApiResult<()> {
    let mut rx = inner.rv_tx.subscribe();
    if *rx.borrow() >= rv {
        return Ok(());
    }
    let wait = inner.config.future_rv_wait;
    let reached = matches!(
        tokio::time::timeout(wait, rx.wait_for(|cur| *cur >= rv)).await,
        Ok(Ok(_))
    );
    if reached {
        Ok(())
    } else {
        let current = *rx.borrow();
        Err(ApiError::too_large_rv(rv, current))
    }
}

/// The snapshot a list reads, from `resourceVersion`, `resourceVersionMatch` and `continue`.
enum At {
    Current,
    /// `resourceVersion=0`: any, possibly stale.
    Any,
    Exact(u64),
    Continue(u64, String),
}

async fn resolve_at(inner: &Inner, q: &Query) -> ApiResult<At> {
    let rv = q.get("resourceVersion").filter(|s| !s.is_empty());
    let rvm = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
    if let Some(token) = q.get("continue").filter(|s| !s.is_empty()) {
        if rv.is_some_and(|r| r != "0") || rvm.is_some() {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let (rv, last) = decode_continue(token)?;
        return Ok(At::Continue(rv, last));
    }
    match (rv, rvm) {
        (None, Some(_)) => Err(invalid_list_option(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
        )),
        (None, None) => Ok(At::Current),
        (Some(r), m) => {
            let n = parse_rv(r)?;
            match m {
                None | Some("NotOlderThan") => {
                    if n == 0 {
                        Ok(At::Any)
                    } else {
                        wait_for_rv(inner, n).await?;
                        Ok(At::Current)
                    }
                }
                Some("Exact") => {
                    if n == 0 {
                        return Err(invalid_list_option(
                            "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                        ));
                    }
                    wait_for_rv(inner, n).await?;
                    Ok(At::Exact(n))
                }
                Some(other) => Err(invalid_list_option(&format!(
                    "resourceVersionMatch: Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
                ))),
            }
        }
    }
}

pub(crate) fn parse_limit(q: &Query) -> ApiResult<Option<usize>> {
    match q.get("limit").filter(|s| !s.is_empty()) {
        None => Ok(None),
        Some(l) => {
            let n: i64 = l
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid limit: {l:?}")))?;
            Ok((n > 0).then_some(n as usize))
        }
    }
}

/// Read one page.
pub(crate) async fn list(
    inner: &Inner,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    q: &Query,
    gate: bool,
    as_: As,
) -> ApiResult<Page> {
    let filter = Filter::parse(q, gate, info)?;
    let limit = parse_limit(q)?;
    let at = resolve_at(inner, q).await?;
    let store = inner.lock_store();
    let (rv, after) = match at {
        At::Current => (store.rv, None),
        At::Any => (
            inner
                .faults
                .lagging_rv()
                .map_or(store.rv, |r| r.max(store.compacted).min(store.rv)),
            None,
        ),
        At::Exact(n) => {
            if n < store.compacted {
                return Err(ApiError::expired(format!(
                    "too old resource version: {n} ({})",
                    store.compacted
                )));
            }
            (n, None)
        }
        At::Continue(n, last) => {
            if n < store.compacted {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue value from the response to get a consistent list starting from a later resource version.",
                ));
            }
            (n, Some(last))
        }
    };
    let mut items = Vec::new();
    let mut last_key = None;
    let mut more = false;
    let mut remaining = 0u64;
    store.scan_at(&info.store_key, namespace, rv, after.as_deref(), |k, o| {
        if limit.is_some_and(|l| items.len() >= l) {
            more = true;
            remaining += 1;
            return filter.no_predicates();
        }
        if filter.matches(o) {
            items.push(o.clone());
            last_key = Some(k.to_string());
        } else if limit.is_some() {
            last_key = Some(k.to_string());
        }
        true
    });
    drop(store);
    let cont = match (more, &last_key) {
        (true, Some(k)) => Some(encode_continue(rv, k)),
        _ => None,
    };
    let shard_info = match (&filter.shard, as_) {
        (Some(s), As::Full) if info.builtin => Some(s.to_string()),
        _ => None,
    };
    Ok(Page {
        info: info.clone(),
        items,
        rv,
        remaining: (more && filter.no_predicates()).then_some(remaining),
        cont,
        shard_info,
    })
}

impl Page {
    /// `now` is the server's wall clock (for a Table's ages).
    pub(crate) fn render(&self, as_: As, now: jiff::Timestamp) -> Vec<u8> {
        let rv = self.rv.to_string();
        if as_ == As::Table {
            return serde_json::to_vec(&render::table(
                &self.info,
                &self.items,
                &rv,
                self.cont.as_deref(),
                now,
            ))
            .unwrap_or_default();
        }
        let mut meta = json!({"resourceVersion": rv});
        if let Some(c) = &self.cont {
            meta["continue"] = json!(c);
        }
        if let Some(r) = self.remaining {
            meta["remainingItemCount"] = json!(r);
        }
        if let Some(s) = &self.shard_info {
            meta["shardInfo"] = json!({"selector": s});
        }
        let (kind, api_version) = match as_ {
            As::Metadata => (
                "PartialObjectMetadataList".to_string(),
                "meta.k8s.io/v1".to_string(),
            ),
            _ => (self.info.list_kind.clone(), self.info.api_version()),
        };
        let size: usize = self.items.iter().map(|o| o.rest.len() + 64).sum();
        let mut out = Vec::with_capacity(size + 256);
        out.extend_from_slice(b"{\"kind\":");
        serde_json::to_writer(&mut out, &kind).ok();
        out.extend_from_slice(b",\"apiVersion\":");
        serde_json::to_writer(&mut out, &api_version).ok();
        out.extend_from_slice(b",\"metadata\":");
        serde_json::to_writer(&mut out, &meta).ok();
        out.extend_from_slice(b",\"items\":[");
        for (i, o) in self.items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            match as_ {
                As::Metadata => render::metadata(o, &mut out),
                _ => render::item(&self.info, o, &mut out),
            }
        }
        out.extend_from_slice(b"]}");
        out
    }
}

/// DELETECOLLECTION: delete every current object the selectors (including `shardSelector` when the
/// gate is on) match, each as a DELETE would, and answer the list of what was deleted.
pub(crate) fn delete_collection(
    ctx: &WriteCtx<'_>,
    info: &Arc<ResourceInfo>,
    namespace: Option<&str>,
    q: &Query,
    gate: bool,
    opts: &DeleteOptions,
) -> ApiResult<Page> {
    let filter = Filter::parse(q, gate, info)?;
    let fence = ctx.fence_header.clone().map(|raw| crate::audit::RawFence {
        raw,
        source: crate::audit::FenceSource::Header,
    });
    let mut store = ctx.inner.lock_store();
    let targets: Vec<Arc<Obj>> = store
        .current(&info.store_key, namespace)
        .into_iter()
        .filter(|o| filter.matches(o))
        .collect();
    let mut deleted = Vec::new();
    for o in targets {
        let key = obj_key(info.namespaced.then_some(o.namespace.as_str()), o.name());
        if let Ok(crate::rest::Reply::Object { obj, .. }) =
            delete_locked(&mut store, ctx, info, key, &o, opts, fence.as_ref())
        {
            deleted.push(obj);
        } else {
            deleted.push(o);
        }
    }
    let rv = store.rv;
    drop(store);
    publish_rv(ctx.inner);
    Ok(Page {
        info: info.clone(),
        items: deleted,
        rv,
        cont: None,
        remaining: None,
        shard_info: None,
    })
}
