//! Mirror lag as the writer sees it: for every write the source cluster acknowledged, the time until the
//! Standby holds a copy at that source resourceVersion or newer (the copy's `kube-shard.io/source-rv`
//! marker), or until the copy is gone for a delete. A watch on the Standby's Widgets.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::watcher;
use kube::Api;
use tokio::time::Instant;
use tracing::Instrument;

use super::oracle::Op;
use super::writer::Writer;
use kube_shard_example_operator::widget::Widget;

/// The `rv=<n>` of a `kube-shard.io/source-rv` marker.
pub(crate) fn marker_rv(w: &Widget) -> Option<u64> {
    let m = w
        .metadata
        .annotations
        .as_ref()?
        .get("kube-shard.io/source-rv")?;
    m.rsplit_once(" rv=")?.1.trim().parse().ok()
}

#[derive(Debug, Default)]
struct State {
    /// The next entry of the writer's log to look at.
    cursor: usize,
    /// name → (op, source rv, acknowledged at), not yet seen on the Standby.
    pending: BTreeMap<String, Vec<(Op, u64, Instant)>>,
    samples: Vec<Duration>,
}

/// A running lag tracker for one mirror direction.
pub(crate) struct Tracker {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Tracker {
    /// Track writes acknowledged by `source` from now on, as the Standby `standby` receives them.
    pub(crate) fn start(writer: &Writer, source: &'static str, standby: Api<Widget>) -> Self {
        let state = Arc::new(Mutex::new(State {
            cursor: writer.log().acked.len(),
            ..State::default()
        }));
        let (st, w) = (state.clone(), writer.clone());
        let task = tokio::spawn(
            async move {
                let mut s = watcher(standby, watcher::Config::default()).boxed();
                while let Some(ev) = s.next().await {
                    let now = Instant::now();
                    let mut g = st.lock().unwrap_or_else(|e| e.into_inner());
                    ingest(&mut g, &w, source);
                    match ev {
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                            // a Terminating copy (no garbage collector yet) counts as deleted
                            let gone = o.metadata.deletion_timestamp.is_some();
                            seen(&mut g, &o, gone, now);
                        }
                        Ok(watcher::Event::Delete(o)) => seen(&mut g, &o, true, now),
                        _ => {}
                    }
                }
            }
            .instrument(tracing::info_span!("demo_ha_lag", source)),
        );
        Tracker { state, task }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lag samples so far.
    pub(crate) fn samples(&self) -> Vec<Duration> {
        self.lock().samples.clone()
    }

    /// Writes acknowledged by the source and not yet on the Standby, and the age of the oldest.
    pub(crate) fn unmirrored(&self, writer: &Writer, source: &'static str) -> (u64, Duration) {
        let mut g = self.lock();
        ingest(&mut g, writer, source);
        let now = Instant::now();
        let all: Vec<Instant> = g.pending.values().flatten().map(|p| p.2).collect();
        let oldest = all.iter().min().map_or(Duration::ZERO, |t| now - *t);
        (all.len() as u64, oldest)
    }

    pub(crate) fn stop(&self) {
        self.task.abort();
    }
}

fn ingest(g: &mut State, w: &Writer, source: &'static str) {
    let log = w.log();
    for a in &log.acked[g.cursor.min(log.acked.len())..] {
        if a.cluster == source {
            g.pending
                .entry(a.write.name.clone())
                .or_default()
                .push((a.write.op, a.rv, a.at));
        }
    }
    g.cursor = log.acked.len();
}

fn seen(g: &mut State, o: &Widget, deleted: bool, now: Instant) {
    let Some(name) = o.metadata.name.as_deref() else {
        return;
    };
    let held = if deleted { None } else { marker_rv(o) };
    let State {
        pending, samples, ..
    } = g;
    let Some(p) = pending.get_mut(name) else {
        return;
    };
    // the latest delete the copy's deletion stands for: puts before it are superseded, a re-creation
    // after it (a higher source rv) is still to be mirrored
    let del_rv = p
        .iter()
        .filter(|(op, ..)| deleted && *op == Op::Delete)
        .map(|(_, rv, _)| *rv)
        .max();
    p.retain(|(op, rv, at)| {
        let done = match (op, held) {
            (Op::Put, Some(h)) => h >= *rv,
            (Op::Delete, _) => deleted,
            (Op::Put, None) => false,
        };
        if done {
            samples.push(now - *at);
        }
        let superseded = del_rv.is_some_and(|d| *rv <= d);
        !done && !superseded
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_shard_example_operator::widget::WidgetSpec;

    fn copy(name: &str, deleting: bool) -> Widget {
        let mut w = Widget::new(name, "ns", WidgetSpec::default());
        if deleting {
            w.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ));
        }
        w
    }

    /// On a cluster without a garbage collector the deleted copy shows up (Terminating, then gone) while
    /// the source was already created again: the re-creation must stay unmirrored, not vanish with the
    /// delete (it did: the failover then "lost more than was unmirrored").
    #[test]
    fn a_deleted_copy_does_not_swallow_a_later_re_creation() {
        let now = Instant::now();
        let mut g = State::default();
        g.pending.insert(
            "w-1".into(),
            vec![(Op::Put, 5, now), (Op::Delete, 10, now), (Op::Put, 12, now)],
        );
        seen(&mut g, &copy("w-1", true), true, now);
        assert_eq!(g.pending["w-1"].len(), 1, "{:?}", g.pending);
        assert_eq!(g.pending["w-1"][0].1, 12);
        assert_eq!(g.samples.len(), 1, "the delete was mirrored");
        // the Delete event after the Terminating one changes nothing more
        seen(&mut g, &copy("w-1", false), true, now);
        assert_eq!(g.pending["w-1"].len(), 1);
    }
}
