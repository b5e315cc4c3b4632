//! One sub-watch: LIST + WATCH of one selector (or of everything, in fallback mode), in its own task with
//! its own backoff, reporting to the manager over a channel.
//!
//! Recovery follows `kube_runtime::watcher`, except that a watch start answered 410 relists. Every LIST page
//! and watch start is answered within [`request_limit`] or fails as a timeout (kube 5's client sets no read
//! timeout). An HTTP 500 `invalid shard selector` is reported as such and never retried with that selector.
//!
//! See `docs/read-path.md#sub-watch-recovery`.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::StreamExt;
use kube::api::WatchEvent;
use kube::runtime::watcher::Config;
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::sync::mpsc;
use tracing::{debug, info_span, warn, Instrument};

use super::request::{ListFrom, Requests};
use crate::selector::ShardSelector;

/// Identifies a sub-watch for the lifetime of the watcher (never reused).
pub(crate) type SubId = u64;

/// How a sub-watch starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Start {
    /// LIST (or streaming list) then WATCH: for ranges not read before.
    List,
    /// WATCH from a resourceVersion: for a narrowed or merged selector whose ranges were all read.
    Watch(String),
}

/// What a sub-watch reports.
#[derive(Debug)]
pub(crate) enum SubMsg<V> {
    /// A complete (re)list of the sub-watch's ranges.
    Listed {
        id: SubId,
        objects: Vec<V>,
        rv: Option<String>,
        /// `metadata.shardInfo.selector` of the LIST, when the server echoed one.
        shard_info: Option<String>,
        /// A consistent LIST (no resourceVersion) issued after the sub-watch started: it may serve as
        /// an activation barrier for the shards the sub-watch was started for.
        consistent: bool,
    },
    /// An added or modified object.
    Applied {
        id: SubId,
        obj: V,
        rv: Option<String>,
    },
    /// A deleted object.
    Deleted {
        id: SubId,
        obj: V,
        rv: Option<String>,
    },
    /// A bookmark: the watch has passed `rv`.
    Progress { id: SubId, rv: String },
    /// A request failed (it is being retried with backoff).
    Failed {
        id: SubId,
        error: Arc<kube::Error>,
        invalid_selector: bool,
    },
}

/// One sub-watch's parameters.
pub(crate) struct SubWatch<V> {
    pub(crate) id: SubId,
    pub(crate) selector: Option<ShardSelector>,
    pub(crate) start: Start,
    /// Make the first LIST a consistent read whatever `list_semantic` says (a shard activating now: the
    /// LIST doubles as its activation barrier).
    pub(crate) consistent_first_list: bool,
    pub(crate) requests: Arc<Requests>,
    pub(crate) client: Client,
    pub(crate) tx: mpsc::Sender<SubMsg<V>>,
    pub(crate) _marker: std::marker::PhantomData<fn() -> V>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawList<V> {
    #[serde(default)]
    metadata: RawListMeta,
    #[serde(default = "Vec::new")]
    items: Vec<V>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawListMeta {
    resource_version: Option<String>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
    shard_info: Option<RawShardInfo>,
}

#[derive(Deserialize)]
struct RawShardInfo {
    selector: Option<String>,
}

enum Next {
    List,
    Watch { rv: String, initial: bool },
}

enum WatchEnd {
    /// Stream ended or went idle: watch again from the last rv.
    Resume(String),
    /// 410: list again.
    Relist,
    /// Some other failure: back off, watch again from the last rv.
    Failed(String, kube::Error),
    /// The manager went away.
    Closed,
}

/// A whole LIST (all pages), with what its first page echoed in `metadata.shardInfo.selector`.
pub(crate) struct Listed<V> {
    pub(crate) items: Vec<V>,
    pub(crate) resource_version: Option<String>,
    pub(crate) shard_info: Option<String>,
}

/// How long a read-path request may wait for its answer: a LIST page (its whole body) or a watch start
/// (the response head; an open watch has its idle limit instead). `min(timeout, 30 s) + 5 s`, with
/// `timeout` the configured watch timeout (`watcher::Config::timeout`; 290 s when unset, and `0` counts
/// as unset): 35 s by default. A healthy apiserver answers a page or a watch start in well under a
/// second, and API priority and fairness queues a request at most 15 s before refusing it, so the limit
/// only cuts off requests that are not coming back; it bounds how long a black-holed LIST keeps a shard
/// from being activated (then a retry, after the backoff).
fn request_limit(config: &Config) -> Duration {
    let timeout = match config.timeout {
        Some(t) if t > 0 => t.min(30),
        _ => 30,
    };
    Duration::from_secs(u64::from(timeout) + 5)
}

/// A read-path request that got no answer within its [`request_limit`].
#[derive(Debug, thiserror::Error)]
#[error("{what} got no answer within {limit:?}")]
pub(crate) struct TimedOut {
    what: &'static str,
    limit: Duration,
}

/// `request` within the [`request_limit`] of `requests`' configuration. On expiry the request is dropped
/// (over HTTP/1.1 its connection goes with it, so the retry does not reuse it), a warning is logged, and the result is a [`TimedOut`] error, which callers
/// retry as any failed request.
async fn time_limited<T>(
    requests: &Requests,
    what: &'static str,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    let limit = request_limit(requests.config());
    match tokio::time::timeout(limit, request).await {
        Ok(answer) => answer,
        Err(_) => {
            warn!(
                what,
                resource = requests.url(),
                ?limit,
                "read request timed out; retrying"
            );
            Err(kube::Error::Service(Box::new(TimedOut { what, limit })))
        }
    }
}

/// LIST everything `selector` selects from `from`, following `continue` (the selector is resent on every
/// page). With `limit` set, only the first page is read. Each page is time-limited ([`request_limit`]); a
/// page that runs out of time fails the whole LIST, so a retry starts over from the first page rather than
/// from a continue token of a LIST that may have gone stale meanwhile.
pub(crate) async fn list_all<V: DeserializeOwned>(
    client: &Client,
    requests: &Requests,
    selector: Option<&ShardSelector>,
    from: &ListFrom,
    limit: Option<u32>,
) -> Result<Listed<V>, kube::Error> {
    let mut items = Vec::new();
    let mut continue_token: Option<String> = None;
    let mut shard_info = None;
    loop {
        let req = requests
            .list(selector, from, limit, continue_token.as_deref())
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        let text = time_limited(requests, "LIST page", client.request_text(req)).await?;
        let page: RawList<V> = serde_json::from_str(&text).map_err(kube::Error::SerdeError)?;
        items.extend(page.items);
        if shard_info.is_none() {
            shard_info = page.metadata.shard_info.and_then(|i| i.selector);
        }
        match page.metadata.continue_token.filter(|t| !t.is_empty()) {
            Some(token) if limit.is_none() => continue_token = Some(token),
            _ => {
                return Ok(Listed {
                    items,
                    resource_version: page.metadata.resource_version,
                    shard_info,
                })
            }
        }
    }
}

const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// kube-runtime's `DefaultBackoff`: exponential 800 ms → 30 s, factor 2, with jitter, never giving up.
pub(crate) fn default_backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(800))
        .with_max_delay(Duration::from_secs(30))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

pub(crate) fn is_invalid_selector(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 500 && s.message.contains("invalid shard selector"))
}

fn is_gone(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 410)
}

impl<V> SubWatch<V>
where
    V: Resource + DeserializeOwned + Clone + Debug + Send + 'static,
{
    /// Run until the manager drops its receiver (or aborts the task).
    pub(crate) async fn run(self) {
        let span = info_span!(
            "subwatch",
            id = self.id,
            selector = self
                .selector
                .as_ref()
                .map(|s| s.to_string())
                .unwrap_or_default()
        );
        self.run_inner().instrument(span).await;
    }

    async fn run_inner(self) {
        let mut backoff = default_backoff();
        let mut consistent = self.consistent_first_list;
        let mut next = match &self.start {
            Start::List if self.requests.streaming_list() => Next::Watch {
                rv: "0".into(),
                initial: true,
            },
            Start::List => Next::List,
            Start::Watch(rv) => Next::Watch {
                rv: rv.clone(),
                initial: false,
            },
        };
        loop {
            if self.tx.is_closed() {
                return;
            }
            next = match next {
                Next::List => match self.list_all(consistent).await {
                    Ok((objects, rv, shard_info)) => {
                        backoff = default_backoff();
                        let Some(rv_s) = rv.clone() else {
                            // kube's NoResourceVersion: relist after a pause
                            self.sleep(&mut backoff).await;
                            continue;
                        };
                        let msg = SubMsg::Listed {
                            id: self.id,
                            objects,
                            rv,
                            shard_info,
                            consistent,
                        };
                        // relists follow `list_semantic`
                        consistent = false;
                        if self.tx.send(msg).await.is_err() {
                            return;
                        }
                        Next::Watch {
                            rv: rv_s,
                            initial: false,
                        }
                    }
                    Err(err) => {
                        let invalid = is_invalid_selector(&err);
                        self.report(err, invalid).await;
                        if invalid {
                            // never hot-loop on a selector the server refuses; the manager replaces us
                            futures::future::pending::<()>().await;
                        }
                        self.sleep(&mut backoff).await;
                        Next::List
                    }
                },
                Next::Watch { rv, initial } => match self.watch(&rv, initial, &mut backoff).await {
                    WatchEnd::Resume(rv) => Next::Watch { rv, initial: false },
                    WatchEnd::Relist => {
                        if self.requests.streaming_list() {
                            Next::Watch {
                                rv: "0".into(),
                                initial: true,
                            }
                        } else {
                            Next::List
                        }
                    }
                    WatchEnd::Failed(rv, err) => {
                        let invalid = is_invalid_selector(&err);
                        self.report(err, invalid).await;
                        if invalid {
                            futures::future::pending::<()>().await;
                        }
                        self.sleep(&mut backoff).await;
                        // a streaming initial sync that failed before its end starts over
                        if initial {
                            Next::Watch {
                                rv: "0".into(),
                                initial: true,
                            }
                        } else {
                            Next::Watch { rv, initial: false }
                        }
                    }
                    WatchEnd::Closed => return,
                },
            };
        }
    }

    async fn sleep(&self, backoff: &mut ExponentialBackoff) {
        let delay = backoff.next().unwrap_or(Duration::from_secs(30));
        tokio::time::sleep(delay).await;
    }

    async fn report(&self, err: kube::Error, invalid_selector: bool) {
        if matches!(&err, kube::Error::Api(s) if s.code == 403) {
            warn!(error = %err, "sub-watch request forbidden");
        } else {
            debug!(error = %err, "sub-watch request failed");
        }
        let _ = self
            .tx
            .send(SubMsg::Failed {
                id: self.id,
                error: Arc::new(err),
                invalid_selector,
            })
            .await;
    }

    async fn list_all(
        &self,
        consistent: bool,
    ) -> Result<(Vec<V>, Option<String>, Option<String>), kube::Error> {
        let from = if consistent {
            ListFrom::Consistent
        } else {
            ListFrom::Configured
        };
        list_all(
            &self.client,
            &self.requests,
            self.selector.as_ref(),
            &from,
            None,
        )
        .await
        .map(|l| (l.items, l.resource_version, l.shard_info))
    }

    async fn watch(&self, rv: &str, initial: bool, backoff: &mut ExponentialBackoff) -> WatchEnd {
        let req = match self.requests.watch(self.selector.as_ref(), rv, initial) {
            Ok(req) => req,
            Err(e) => return WatchEnd::Failed(rv.to_owned(), kube::Error::Service(Box::new(e))),
        };
        let start = time_limited(
            &self.requests,
            "watch start",
            self.client.request_events::<V>(req),
        );
        let stream = match start.await {
            Ok(s) => s,
            Err(err) if is_gone(&err) => return WatchEnd::Relist,
            Err(err) => return WatchEnd::Failed(rv.to_owned(), err),
        };
        let mut stream = std::pin::pin!(stream);
        let idle = match self.requests.config().timeout {
            Some(0) => None,
            t => Some(Duration::from_secs(u64::from(t.unwrap_or(290)) + 5)),
        };
        let mut last_rv = rv.to_owned();
        let mut buffered: Option<Vec<V>> = initial.then(Vec::new);
        loop {
            let item = match idle {
                Some(d) => match tokio::time::timeout(d, stream.next()).await {
                    Ok(item) => item,
                    Err(_) => {
                        debug!("watch idle past its timeout: re-watching");
                        return if buffered.is_some() {
                            WatchEnd::Failed(
                                last_rv,
                                kube::Error::Service("streaming list went idle".into()),
                            )
                        } else {
                            WatchEnd::Resume(last_rv)
                        };
                    }
                },
                None => stream.next().await,
            };
            let event = match item {
                Some(Ok(ev)) => ev,
                None => {
                    return if buffered.is_some() {
                        WatchEnd::Failed(
                            last_rv,
                            kube::Error::Service(
                                "streaming list ended before its last bookmark".into(),
                            ),
                        )
                    } else {
                        WatchEnd::Resume(last_rv)
                    }
                }
                Some(Err(err)) => return WatchEnd::Failed(last_rv, err),
            };
            // any successful event resets the backoff, as kube's StreamBackoff does
            *backoff = default_backoff();
            let sent = match event {
                WatchEvent::Added(obj) | WatchEvent::Modified(obj) => {
                    let obj_rv = resource_version_of(&obj);
                    if let Some(r) = &obj_rv {
                        last_rv.clone_from(r);
                    }
                    if let Some(buf) = buffered.as_mut() {
                        buf.push(obj);
                        Ok(())
                    } else {
                        self.tx
                            .send(SubMsg::Applied {
                                id: self.id,
                                obj,
                                rv: obj_rv,
                            })
                            .await
                    }
                    .map_err(|_| ())
                }
                WatchEvent::Deleted(obj) => {
                    let obj_rv = resource_version_of(&obj);
                    if let Some(r) = &obj_rv {
                        last_rv.clone_from(r);
                    }
                    if let Some(buf) = buffered.as_mut() {
                        // cannot happen before the initial-events-end bookmark; drop it from the buffer
                        buf.retain(|o| !same_object(o, &obj));
                        Ok(())
                    } else {
                        self.tx
                            .send(SubMsg::Deleted {
                                id: self.id,
                                obj,
                                rv: obj_rv,
                            })
                            .await
                            .map_err(|_| ())
                    }
                }
                WatchEvent::Bookmark(bm) => {
                    last_rv.clone_from(&bm.metadata.resource_version);
                    let end = bm
                        .metadata
                        .annotations
                        .get(INITIAL_EVENTS_END)
                        .is_some_and(|v| v == "true");
                    if end && buffered.is_some() {
                        let objects = buffered.take().unwrap_or_default();
                        self.tx
                            .send(SubMsg::Listed {
                                id: self.id,
                                objects,
                                rv: Some(last_rv.clone()),
                                shard_info: None,
                                consistent: false,
                            })
                            .await
                            .map_err(|_| ())
                    } else if buffered.is_none() {
                        self.tx
                            .send(SubMsg::Progress {
                                id: self.id,
                                rv: last_rv.clone(),
                            })
                            .await
                            .map_err(|_| ())
                    } else {
                        Ok(())
                    }
                }
                WatchEvent::Error(status) => {
                    if status.code == 410 {
                        return WatchEnd::Relist;
                    }
                    return WatchEnd::Failed(last_rv, kube::Error::Api(status));
                }
            };
            if sent.is_err() {
                return WatchEnd::Closed;
            }
        }
    }
}

fn resource_version_of<V: Resource>(obj: &V) -> Option<String> {
    obj.meta().resource_version.clone()
}

fn same_object<V: Resource>(a: &V, b: &V) -> bool {
    let (a, b) = (a.meta(), b.meta());
    match (&a.uid, &b.uid) {
        (Some(x), Some(y)) => x == y,
        _ => a.namespace == b.namespace && a.name == b.name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read request's time limit is the watch timeout, at most 30 s, plus 5 s; an unset or zero
    /// timeout (290 s, or no server-side limit) gives 35 s.
    #[test]
    fn request_limit_is_the_watch_timeout_at_most_30s_plus_5s() {
        let limit = |timeout| request_limit(&Config::default().timeout(timeout));
        assert_eq!(request_limit(&Config::default()), Duration::from_secs(35));
        assert_eq!(limit(0), Duration::from_secs(35));
        assert_eq!(limit(10), Duration::from_secs(15));
        assert_eq!(limit(30), Duration::from_secs(35));
        assert_eq!(limit(290), Duration::from_secs(35));
    }
}
