//! WATCH: from a resourceVersion (bounded history, older → in-stream `ERROR` 410), "get state and start"
//! (`resourceVersion` unset or `0`), watch-list (`sendInitialEvents=true` ending with the
//! `k8s.io/initial-events-end` bookmark), periodic bookmarks, `timeoutSeconds`, selectors and KEP-5866
//! filtering, metadata-only events. The body is a stream polled by the client: no task, no real time.

use std::{collections::VecDeque, sync::Arc};

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::{
    sync::{mpsc, watch},
    time::{sleep_until, Duration, Instant},
};

use crate::{
    accounting::Delivery,
    faults::{CloseMark, RequestFacts},
    list::{parse_rv, wait_for_rv},
    query::{Filter, Query},
    render::{self, As},
    resources::ResourceInfo,
    server::Inner,
    status::{ApiError, ApiResult},
    store::{Change, ChangeKind, Obj},
};

#[derive(Debug)]
enum Pending {
    Initial(Arc<Obj>),
    Change(Arc<Change>),
    Bookmark { rv: u64, initial_end: bool },
    Error(ApiError),
}

/// An open watch; [`WatchStream::next_frame`] yields newline-terminated JSON events.
#[derive(Debug)]
pub(crate) struct WatchStream {
    inner: Arc<Inner>,
    /// Who watches, and what faults match this watch against.
    facts: RequestFacts,
    info: Arc<ResourceInfo>,
    filter: Filter,
    name: Option<String>,
    as_: As,
    pending: VecDeque<Pending>,
    rx: Option<mpsc::UnboundedReceiver<Arc<Change>>>,
    bookmarks: bool,
    interval: Duration,
    next_bookmark: Instant,
    deadline: Instant,
    faults: watch::Receiver<u64>,
    close_mark: CloseMark,
}

fn invalid_watch(why: &str) -> ApiError {
    ApiError::new(
        422,
        Some("Invalid"),
        format!("ListOptions.meta.k8s.io \"\" is invalid: {why}"),
    )
}

/// Open a watch (the caller has checked the route and counted the request).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn open(
    inner: Arc<Inner>,
    facts: RequestFacts,
    info: Arc<ResourceInfo>,
    namespace: Option<String>,
    name: Option<String>,
    q: &Query,
    gate: bool,
    as_: As,
) -> ApiResult<WatchStream> {
    let mut filter = Filter::parse(q, gate, &info)?;
    if filter.shard.is_some() && inner.faults.watch_unfiltered(&info.plural) {
        filter.shard = None;
    }
    let rv = q.get("resourceVersion").unwrap_or_default();
    let rvm = q.get("resourceVersionMatch").filter(|s| !s.is_empty());
    let sie = q
        .get("sendInitialEvents")
        .map(|v| matches!(v, "true" | "1" | "True"));
    let bookmarks = q.flag("allowWatchBookmarks");
    match (sie, rvm) {
        (Some(_), Some("NotOlderThan")) => {}
        (Some(_), _) => {
            return Err(invalid_watch(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ))
        }
        (None, Some(_)) => {
            return Err(invalid_watch(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ))
        }
        (None, None) => {}
    }
    if sie == Some(true) && !bookmarks {
        return Err(invalid_watch(
            "allowWatchBookmarks: Forbidden: sendInitialEvents requires allowWatchBookmarks=true",
        ));
    }
    let from = if rv.is_empty() { 0 } else { parse_rv(rv)? };
    // Past parameter validation, failures are in-stream ERROR events, as the cacher sends them.
    let too_large = if from > 0 {
        wait_for_rv(&inner, from).await.err()
    } else {
        None
    };
    let timeout = match q.get("timeoutSeconds").filter(|s| !s.is_empty()) {
        Some(t) => {
            let secs: u64 = t
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t:?}")))?;
            if secs == 0 {
                inner.config.default_watch_timeout
            } else {
                Duration::from_secs(secs)
            }
        }
        None => inner.config.default_watch_timeout,
    };
    let initial_state = match sie {
        Some(send) => send,
        None => from == 0,
    };
    let mut pending = VecDeque::new();
    let rx;
    {
        let mut store = inner.lock_store();
        if let Some(e) = too_large {
            pending.push_back(Pending::Error(e));
            rx = None;
        } else if initial_state {
            for o in store.current(&info.store_key, namespace.as_deref()) {
                pending.push_back(Pending::Initial(o));
            }
            if sie == Some(true) {
                pending.push_back(Pending::Bookmark {
                    rv: store.rv,
                    initial_end: true,
                });
            }
            rx = Some(store.subscribe(info.store_key.clone(), namespace.clone()));
        } else if from == 0 {
            rx = Some(store.subscribe(info.store_key.clone(), namespace.clone()));
        } else if from < store.compacted {
            pending.push_back(Pending::Error(ApiError::expired(format!(
                "too old resource version: {from} ({})",
                store.compacted
            ))));
            rx = None;
        } else {
            for c in store.changes_since(&info.store_key, namespace.as_deref(), from) {
                pending.push_back(Pending::Change(c));
            }
            rx = Some(store.subscribe(info.store_key.clone(), namespace.clone()));
        }
    }
    let now = Instant::now();
    let interval = inner.config.bookmark_interval;
    Ok(WatchStream {
        faults: inner.faults.changes(),
        close_mark: inner.faults.close_mark(),
        inner,
        facts,
        info,
        filter,
        name,
        as_,
        pending,
        rx,
        bookmarks,
        interval,
        next_bookmark: next_bookmark(now, interval, now + timeout),
        deadline: now + timeout,
    })
}

impl WatchStream {
    /// The next frame, or `None` when the watch ends (timeout, closed by a fault, resource gone, 410).
    pub(crate) async fn next_frame(&mut self) -> Option<Bytes> {
        loop {
            if self.inner.faults.should_close(&self.facts, self.close_mark) {
                return None;
            }
            if self.inner.faults.frozen(&self.facts) {
                // Nothing at all is sent while frozen, not even the end at the timeout.
                self.faults.changed().await.ok()?;
                continue;
            }
            if let Some(p) = self.pending.pop_front() {
                if let Some(frame) = self.render(p) {
                    return Some(frame);
                }
                continue;
            }
            let rx = self.rx.as_mut()?;
            if Instant::now() >= self.deadline {
                // Deliver what happened before the deadline (a thawed watch may be past it), then end.
                while let Ok(c) = rx.try_recv() {
                    self.pending.push_back(Pending::Change(c));
                }
                self.rx = None;
                continue;
            }
            tokio::select! {
                biased; // faults first (a closed watch ends it); changes drain into `pending` and empty
                r = self.faults.changed() => { r.ok()?; }
                ev = rx.recv() => match ev {
                    Some(c) => self.pending.push_back(Pending::Change(c)),
                    None => return None,
                },
                _ = sleep_until(self.next_bookmark), if self.bookmarks => {
                    // Read the RV first: every change up to it is already in the channel.
                    let rv = self.inner.lock_store().rv;
                    while let Ok(c) = rx.try_recv() {
                        self.pending.push_back(Pending::Change(c));
                    }
                    self.pending.push_back(Pending::Bookmark { rv, initial_end: false });
                    self.next_bookmark = next_bookmark(Instant::now(), self.interval, self.deadline);
                }
                _ = sleep_until(self.deadline) => {}
            }
        }
    }

    fn passes(&self, obj: &Obj) -> bool {
        self.filter.matches_shard(obj) && self.name.as_deref().is_none_or(|n| n == obj.name())
    }

    fn render(&self, p: Pending) -> Option<Bytes> {
        let (kind, obj): (&str, Arc<Obj>) = match p {
            Pending::Initial(o) => {
                if !(self.passes(&o) && self.filter.matches_labels_fields(&o)) {
                    return None;
                }
                ("ADDED", o)
            }
            Pending::Change(c) => self.event_of(&c)?,
            Pending::Bookmark { rv, initial_end } => {
                let mut meta =
                    json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
                if initial_end {
                    meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
                }
                let object = match self.as_ {
                    As::Metadata => {
                        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta})
                    }
                    _ => {
                        json!({"kind": self.info.kind, "apiVersion": self.info.api_version(), "metadata": meta})
                    }
                };
                let frame = frame_json("BOOKMARK", &object);
                self.inner.ledger.delivered(
                    &self.facts.identity,
                    Delivery::Bookmark,
                    [],
                    frame.len(),
                );
                return Some(frame);
            }
            Pending::Error(e) => {
                let frame = frame_json("ERROR", &e.to_status());
                self.inner.ledger.delivered(
                    &self.facts.identity,
                    Delivery::WatchEvent,
                    [],
                    frame.len(),
                );
                return Some(frame);
            }
        };
        let mut out = Vec::with_capacity(obj.rest.len() + 96);
        out.extend_from_slice(b"{\"type\":\"");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\",\"object\":");
        match self.as_ {
            As::Metadata => render::metadata(&obj, &mut out),
            _ => render::full(&self.info, &obj, &mut out),
        }
        out.extend_from_slice(b"}\n");
        self.inner.ledger.delivered(
            &self.facts.identity,
            Delivery::WatchEvent,
            [obj.uid.as_str()],
            out.len(),
        );
        Some(Bytes::from(out))
    }

    /// The event a change makes for this watch: a label or field selector turns an update into an
    /// ADDED (now matching) or a DELETED of the previous state (no longer matching), as the cacher does.
    fn event_of(&self, c: &Change) -> Option<(&'static str, Arc<Obj>)> {
        if !self.passes(&c.obj) {
            return None;
        }
        let lf = |o: &Obj| self.filter.matches_labels_fields(o);
        match c.kind {
            ChangeKind::Added => lf(&c.obj).then(|| ("ADDED", c.obj.clone())),
            ChangeKind::Deleted => lf(&c.obj).then(|| ("DELETED", c.obj.clone())),
            ChangeKind::Modified => {
                let old = c.prev.as_deref().is_some_and(lf);
                match (lf(&c.obj), old) {
                    (true, true) => Some(("MODIFIED", c.obj.clone())),
                    (true, false) => Some(("ADDED", c.obj.clone())),
                    (false, true) => {
                        let prev = c.prev.as_ref()?;
                        let mut v: Value = prev.value.clone();
                        v["metadata"]["resourceVersion"] = json!(c.rv.to_string());
                        Some(("DELETED", Arc::new(Obj::new(v))))
                    }
                    (false, false) => None,
                }
            }
        }
    }
}

/// Every interval, and once 2 s before the deadline (the cacher's `nextBookmarkTime`), so a client
/// re-watching after the timeout starts from a fresh resourceVersion.
fn next_bookmark(now: Instant, interval: Duration, deadline: Instant) -> Instant {
    let periodic = now + interval;
    match deadline.checked_sub(Duration::from_secs(2)) {
        Some(last) if last > now && last < periodic => last,
        _ => periodic,
    }
}

fn frame_json(kind: &str, object: &Value) -> Bytes {
    let mut out = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    out.push(b'\n');
    Bytes::from(out)
}
