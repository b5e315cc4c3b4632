//! The list/watch loop of one kind on the source (the Active): its own state machine, because kube-runtime's
//! watcher neither surfaces bookmarks nor resumes from a resourceVersion. It resumes from a given version
//! (the checkpoint), watches with `allowWatchBookmarks`, re-watches from the last version seen when a watch
//! ends, and relists only on 410 Gone (or when it has no version). Every delivery goes to the kind's task
//! over a channel, in order.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{DynamicObject, ListParams, WatchEvent, WatchParams};
use kube::Api;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::error::MirrorError;
use super::rv::parse_rv;

/// What the loop delivers, in the source's order.
#[derive(Debug)]
pub(super) enum Delivery {
    /// A full LIST (start without a version, or after 410): the items and the LIST's version.
    Listed { items: Vec<DynamicObject>, rv: u64 },
    /// An added or modified object.
    Changed(DynamicObject, u64),
    /// A deleted object (its last state).
    Deleted(DynamicObject, u64),
    /// A bookmark: everything up to this version was delivered.
    Bookmark(u64),
    /// A watch was opened from a version (counted as a resume).
    Resumed,
    /// The kind stops (an unparseable version).
    Fatal(MirrorError),
}

/// Run the loop until the receiver is gone, starting from `from` (`None`: LIST first).
pub(super) async fn run(
    api: Api<DynamicObject>,
    kind: String,
    from: Option<u64>,
    timeout_secs: u32,
    tx: mpsc::Sender<Delivery>,
) {
    let mut rv = from;
    loop {
        let at = match rv {
            Some(v) => v,
            None => match list(&api, &kind).await {
                Ok((items, v)) => {
                    if tx.send(Delivery::Listed { items, rv: v }).await.is_err() {
                        return;
                    }
                    v
                }
                Err(Step::Fatal(e)) => {
                    let _ = tx.send(Delivery::Fatal(e)).await;
                    return;
                }
                Err(Step::Again) => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
        };
        if tx.send(Delivery::Resumed).await.is_err() {
            return;
        }
        match watch(&api, &kind, at, timeout_secs, &tx).await {
            Ok(last) => rv = Some(last),
            Err((Step::Again, last)) => {
                rv = Some(last);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err((Step::Fatal(e), _)) => {
                let _ = tx.send(Delivery::Fatal(e)).await;
                return;
            }
        }
        if tx.is_closed() {
            return;
        }
        if rv == Some(0) {
            rv = None; // 410 Gone: relist
        }
    }
}

enum Step {
    Again,
    Fatal(MirrorError),
}

async fn list(api: &Api<DynamicObject>, kind: &str) -> Result<(Vec<DynamicObject>, u64), Step> {
    match api.list(&ListParams::default()).await {
        Ok(l) => {
            let v = parse_rv(
                l.metadata.resource_version.as_deref().unwrap_or(""),
                &format!("the LIST of {kind}"),
            )
            .map_err(Step::Fatal)?;
            debug!(kind, rv = v, items = l.items.len(), "mirror: listed");
            Ok((l.items, v))
        }
        Err(e) => {
            warn!(kind, error = %e, "mirror: LIST failed");
            Err(Step::Again)
        }
    }
}

/// Watch from `from`; returns the last version seen (0: 410 Gone, relist).
async fn watch(
    api: &Api<DynamicObject>,
    kind: &str,
    from: u64,
    timeout_secs: u32,
    tx: &mpsc::Sender<Delivery>,
) -> Result<u64, (Step, u64)> {
    let wp = WatchParams::default().timeout(timeout_secs);
    let stream = match api.watch(&wp, &from.to_string()).await {
        Ok(s) => s,
        Err(kube::Error::Api(s)) if s.code == 410 => return Ok(0),
        Err(e) => {
            warn!(kind, error = %e, "mirror: WATCH failed");
            return Err((Step::Again, from));
        }
    };
    let mut stream = std::pin::pin!(stream.into_stream());
    let mut last = from;
    let obj_rv = |o: &DynamicObject| {
        parse_rv(
            o.metadata.resource_version.as_deref().unwrap_or(""),
            &format!("a {kind} watch event"),
        )
    };
    while let Some(ev) = stream.next().await {
        let d = match ev {
            Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => {
                let v = obj_rv(&o).map_err(|e| (Step::Fatal(e), last))?;
                last = v;
                Delivery::Changed(o, v)
            }
            Ok(WatchEvent::Deleted(o)) => {
                let v = obj_rv(&o).map_err(|e| (Step::Fatal(e), last))?;
                last = v;
                Delivery::Deleted(o, v)
            }
            Ok(WatchEvent::Bookmark(b)) => {
                let v = parse_rv(&b.metadata.resource_version, &format!("a {kind} bookmark"))
                    .map_err(|e| (Step::Fatal(e), last))?;
                last = v;
                Delivery::Bookmark(v)
            }
            Ok(WatchEvent::Error(s)) if s.code == 410 => return Ok(0),
            Ok(WatchEvent::Error(s)) => {
                warn!(kind, code = s.code, message = %s.message, "mirror: watch error");
                return Err((Step::Again, last));
            }
            Err(e) => {
                warn!(kind, error = %e, "mirror: watch stream failed");
                return Err((Step::Again, last));
            }
        };
        if tx.send(d).await.is_err() {
            return Ok(last);
        }
    }
    Ok(last)
}
