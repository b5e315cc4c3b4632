//! The fences of committed writes, from two independent sources:
//!
//! - [`Recorder`] watches the Widgets and their child ConfigMaps and records every write of the operator
//!   in the order the apiserver committed it (resourceVersion): a Widget status write carries the epoch
//!   it was made under (`status.epoch`) and its writer (`status.reconciledBy`) — the operator writes
//!   Widgets only through `/status`, which ignores metadata, so they carry no fence annotation; a child
//!   write carries the fence annotation `kube-shard.io/fence: "<failover-epoch>:<shard>/<epoch>"`. Per object and per
//!   shard, epochs never decrease in commit order, and a (shard, epoch) has one writer.
//! - [`fence_log`] reads the replicas' fence log (one line per committed fenced write:
//!   `member shard epoch start_ns end_ns`, wall clock): per shard, writes of different members never
//!   overlap in time, and a write that starts after another ended never carries a lower epoch.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::DynamicObject;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};
use kube_shard::ownership::MemberId;
use kube_shard::testing::oracles::fences::Violation;
use kube_shard::token::{FenceToken, FENCE_ANNOTATION};
use kube_shard::{fnv1a64, ShardCount, ShardKey};
use kube_shard_harness::checks::{fence_log_violations, parse_fence_log, FenceLogRecord};

use super::{widget_resource, CHILD_LABEL};

/// One committed write of the operator.
#[derive(Clone, Debug)]
struct Write {
    /// The object's resourceVersion (commit order), and the arrival order.
    rv: Option<u64>,
    seq: u64,
    object: String,
    shard: u32,
    epoch: u64,
    by: Option<String>,
}

/// What a Widget's status says: (epoch, reconciledBy, observedGeneration).
type StatusSeen = (Option<u64>, Option<String>, Option<i64>);

#[derive(Default)]
struct Records {
    seq: u64,
    /// Widget uid → the last (epoch, reconciledBy, observedGeneration) seen.
    widget_status: HashMap<String, StatusSeen>,
    /// Child uid → the last resourceVersion seen.
    child_rv: HashMap<String, String>,
    widgets: Vec<Write>,
    children: Vec<Write>,
    /// Children written without a fence annotation, or under another shard than their parent's.
    child_problems: Vec<String>,
    /// Widgets that carry the fence annotation.
    annotated_widgets: BTreeSet<String>,
    /// Widget WATCH events (not re-list items) per shard.
    widget_events: HashMap<u32, u64>,
    restarts: u64,
    errors: u64,
}

/// Watches Widgets and child ConfigMaps (of one namespace, or of the namespaces listed) until dropped.
pub struct Recorder {
    records: Arc<Mutex<Records>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn rv_of(meta: &kube::api::ObjectMeta) -> Option<u64> {
    meta.resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
}

impl Recorder {
    /// Start watching; returns once both watches have listed.
    pub async fn start(
        client: &Client,
        namespaces: &[String],
        key: ShardKey,
        shards: ShardCount,
    ) -> Recorder {
        let records = Arc::new(Mutex::new(Records::default()));
        let scope: Arc<BTreeSet<String>> = Arc::new(namespaces.iter().cloned().collect());
        let (widgets, children) = match namespaces {
            [one] => (
                Api::namespaced_with(client.clone(), one, &widget_resource()),
                Api::namespaced(client.clone(), one),
            ),
            _ => (
                Api::all_with(client.clone(), &widget_resource()),
                Api::all(client.clone()),
            ),
        };
        let (ready_w, wait_w) = tokio::sync::oneshot::channel::<()>();
        let (ready_c, wait_c) = tokio::sync::oneshot::channel::<()>();
        let (r, sc) = (records.clone(), scope.clone());
        let widget_task = tokio::spawn(async move {
            let mut ready = Some(ready_w);
            let stream = watcher::watcher::<DynamicObject>(widgets, watcher::Config::default())
                .default_backoff();
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                let mut rec = r.lock().unwrap();
                match ev {
                    Ok(watcher::Event::Apply(o)) => rec.widget(&o, &sc, key, shards, true),
                    Ok(watcher::Event::InitApply(o)) => rec.widget(&o, &sc, key, shards, false),
                    Ok(watcher::Event::Init) => rec.restarts += 1,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(watcher::Event::Delete(_)) => {}
                    Err(_) => rec.errors += 1,
                }
            }
        });
        let (r, sc) = (records.clone(), scope);
        let child_task = tokio::spawn(async move {
            let mut ready = Some(ready_c);
            let cfg = watcher::Config::default().labels(CHILD_LABEL);
            let stream = watcher::watcher::<ConfigMap>(children, cfg).default_backoff();
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                let mut rec = r.lock().unwrap();
                match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                        rec.child(&o, &sc, key, shards)
                    }
                    Ok(watcher::Event::Init) => rec.restarts += 1,
                    Ok(watcher::Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(watcher::Event::Delete(_)) => {}
                    Err(_) => rec.errors += 1,
                }
            }
        });
        let both = async {
            let _ = wait_w.await;
            let _ = wait_c.await;
        };
        tokio::time::timeout(Duration::from_secs(60), both)
            .await
            .expect("the fence recorder's watches list within 60 s");
        Recorder {
            records,
            tasks: vec![widget_task, child_task],
        }
    }

    /// Widget WATCH events seen so far, per shard.
    pub fn widget_events(&self) -> HashMap<u32, u64> {
        self.records.lock().unwrap().widget_events.clone()
    }

    /// Check everything recorded so far, against every fence the assignment handed out (`fences`:
    /// (shard, epoch) → owner).
    pub fn check(&self, fences: &HashMap<(u32, u64), MemberId>) -> FenceCheck {
        let rec = self.records.lock().unwrap();
        let mut c = FenceCheck {
            widget_writes: rec.widgets.len(),
            child_writes: rec.children.len(),
            child_problems: rec.child_problems.clone(),
            annotated_widgets: rec.annotated_widgets.len(),
            watch_restarts: rec.restarts.saturating_sub(2),
            watch_errors: rec.errors,
            rv_ordered: rec
                .widgets
                .iter()
                .chain(&rec.children)
                .all(|w| w.rv.is_some()),
            ..FenceCheck::default()
        };
        for (what, writes) in [("Widget", &rec.widgets), ("child", &rec.children)] {
            let mut sorted = writes.clone();
            if c.rv_ordered {
                sorted.sort_by_key(|w| (w.rv, w.seq));
            }
            c.object_regressions
                .extend(regressions(what, &sorted, |w| w.object.clone()));
            c.shard_regressions
                .extend(regressions(what, &sorted, |w| w.shard.to_string()));
        }
        // every write under a fence handed out, Widget status writes by that fence's owner
        for w in rec.widgets.iter().chain(&rec.children) {
            match (fences.get(&(w.shard, w.epoch)), &w.by) {
                (None, _) => c.foreign_fences.push(format!(
                    "{} written at shard {} epoch {}, a fence the assignment never handed out",
                    w.object, w.shard, w.epoch
                )),
                (Some(owner), Some(by)) if *owner.name != **by => c.foreign_fences.push(format!(
                    "{} written by {by} under {owner}'s fence {}/{}",
                    w.object, w.shard, w.epoch
                )),
                _ => {}
            }
        }
        let mut writers: BTreeMap<(u32, u64), BTreeSet<&str>> = BTreeMap::new();
        for w in &rec.widgets {
            if let Some(by) = &w.by {
                writers.entry((w.shard, w.epoch)).or_default().insert(by);
            }
        }
        for ((shard, epoch), by) in writers {
            if by.len() > 1 {
                c.shared_epochs
                    .push(format!("shard {shard} epoch {epoch} written by {by:?}"));
            }
        }
        c
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Records {
    fn widget(
        &mut self,
        o: &DynamicObject,
        scope: &BTreeSet<String>,
        key: ShardKey,
        s: ShardCount,
        event: bool,
    ) {
        let ns = o.metadata.namespace.clone().unwrap_or_default();
        if !scope.contains(&ns) {
            return;
        }
        let uid = o.metadata.uid.clone().unwrap_or_default();
        let key_value = if key == ShardKey::Namespace {
            &ns
        } else {
            &uid
        };
        let shard = s.shard_of(fnv1a64(key_value.as_bytes()));
        if event {
            *self.widget_events.entry(shard).or_default() += 1;
        }
        let name = format!("{ns}/{}", o.metadata.name.as_deref().unwrap_or(""));
        if o.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(FENCE_ANNOTATION))
        {
            self.annotated_widgets.insert(name.clone());
        }
        let st = &o.data["status"];
        let now = (
            st["epoch"].as_u64(),
            st["reconciledBy"].as_str().map(str::to_owned),
            st["observedGeneration"].as_i64(),
        );
        // a status write changes the status; the writer's spec changes leave it as it was
        if self.widget_status.get(&uid) == Some(&now) {
            return;
        }
        self.widget_status.insert(uid.clone(), now.clone());
        let Some(epoch) = now.0 else { return };
        self.seq += 1;
        self.widgets.push(Write {
            rv: rv_of(&o.metadata),
            seq: self.seq,
            object: name,
            shard,
            epoch,
            by: now.1,
        });
    }

    fn child(&mut self, cm: &ConfigMap, scope: &BTreeSet<String>, key: ShardKey, s: ShardCount) {
        let ns = cm.metadata.namespace.clone().unwrap_or_default();
        if !scope.contains(&ns) {
            return;
        }
        let uid = cm.metadata.uid.clone().unwrap_or_default();
        let rv = cm.metadata.resource_version.clone().unwrap_or_default();
        if self.child_rv.get(&uid) == Some(&rv) {
            return;
        }
        self.child_rv.insert(uid, rv);
        let name = format!("{ns}/{}", cm.metadata.name.as_deref().unwrap_or(""));
        let token = cm
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(FENCE_ANNOTATION))
            .and_then(|t| t.parse::<FenceToken>().ok());
        let Some((token_shard, token_epoch)) = token.and_then(|t| t.shard().zip(t.shard_epoch()))
        else {
            self.child_problems
                .push(format!("{name}: written without a shard fence annotation"));
            return;
        };
        // the parent's shard: its uid (the controller ownerReference) or the namespace
        let parent_key = match key {
            ShardKey::Namespace => Some(ns.clone()),
            _ => cm
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.controller == Some(true))
                .map(|r| r.uid.clone()),
        };
        let parent_shard = parent_key.map(|k| s.shard_of(fnv1a64(k.as_bytes())));
        if parent_shard != Some(token_shard) {
            self.child_problems.push(format!(
                "{name}: written under shard {token_shard} but its parent is in shard {parent_shard:?}"
            ));
        }
        self.seq += 1;
        self.children.push(Write {
            rv: rv_of(&cm.metadata),
            seq: self.seq,
            object: name,
            shard: token_shard,
            epoch: token_epoch,
            by: None,
        });
    }
}

/// Writes (in commit order) whose epoch is below one already committed for the same group.
fn regressions(what: &str, writes: &[Write], group: impl Fn(&Write) -> String) -> Vec<String> {
    let mut highest: HashMap<String, &Write> = HashMap::new();
    let mut out = Vec::new();
    for w in writes {
        let g = group(w);
        match highest.get(&g) {
            Some(h) if w.epoch < h.epoch => out.push(format!(
                "{what} {} at epoch {} (by {:?}, rv {:?}) committed after {} at epoch {} (by {:?}, rv {:?})",
                w.object, w.epoch, w.by, w.rv, h.object, h.epoch, h.by, h.rv
            )),
            Some(h) if w.epoch == h.epoch => {}
            _ => {
                highest.insert(g, w);
            }
        }
    }
    out
}

/// What the recorder found.
#[derive(Debug, Default)]
pub struct FenceCheck {
    pub widget_writes: usize,
    pub child_writes: usize,
    /// Per object, a lower epoch committed after a higher one.
    pub object_regressions: Vec<String>,
    /// Per shard, a lower epoch committed after a higher one.
    pub shard_regressions: Vec<String>,
    /// A (shard, epoch) written by two members.
    pub shared_epochs: Vec<String>,
    pub child_problems: Vec<String>,
    /// Writes under a fence the assignment never handed out, or a status naming another writer.
    pub foreign_fences: Vec<String>,
    pub annotated_widgets: usize,
    /// The recorder's watches were restarted (a re-list: intermediate writes may be missed).
    pub watch_restarts: u64,
    pub watch_errors: u64,
    /// Commit order from resourceVersions (else arrival order).
    pub rv_ordered: bool,
}

impl FenceCheck {
    pub fn violations(&self) -> usize {
        self.object_regressions.len()
            + self.shard_regressions.len()
            + self.shared_epochs.len()
            + self.child_problems.len()
            + self.foreign_fences.len()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "widget_status_writes": self.widget_writes,
            "child_writes": self.child_writes,
            "object_epoch_regressions": self.object_regressions.len(),
            "shard_epoch_regressions": self.shard_regressions.len(),
            "shared_epochs": self.shared_epochs.len(),
            "child_problems": self.child_problems.len(),
            "foreign_fences": self.foreign_fences.len(),
            "widgets_with_fence_annotation": self.annotated_widgets,
            "watch_restarts": self.watch_restarts,
            "watch_errors": self.watch_errors,
            "rv_ordered": self.rv_ordered,
        })
    }

    /// Panics with examples unless clean, and unless writes were recorded at all.
    pub fn assert_clean(&self) {
        assert!(
            self.widget_writes > 0 && self.child_writes > 0,
            "the fence recorder saw no writes: {self:?}"
        );
        let examples: Vec<&String> = self
            .object_regressions
            .iter()
            .chain(&self.shard_regressions)
            .chain(&self.shared_epochs)
            .chain(&self.child_problems)
            .chain(&self.foreign_fences)
            .take(5)
            .collect();
        assert_eq!(
            self.violations(),
            0,
            "fence violations in commit order: {}; e.g. {examples:#?}",
            self.json()
        );
    }
}

/// The fence log's verdict.
#[derive(Debug, Default)]
pub struct FenceLogCheck {
    pub records: usize,
    /// Writes of two members of one shard overlapping in time.
    pub overlaps: Vec<String>,
    /// A write starting after another started with a lower epoch.
    pub regressions: Vec<String>,
    /// Writes in flight when their process was stopped (their end is taken as the stop).
    pub in_flight_at_stop: usize,
    /// Writes a stopped member (that incarnation) started after its stop: after the SIGCONT, with every
    /// fence of it expired during the stop.
    pub started_after_stop: Vec<String>,
    /// Writes under a fence the assignment never handed out.
    pub unknown_fences: Vec<String>,
    /// Writes the log names another member than the fence's owner (the operator logs the incarnation
    /// its fences were issued to, also after a rejoin): a violation.
    pub logged_as_another_member: usize,
}

impl FenceLogCheck {
    pub fn violations(&self) -> usize {
        self.overlaps.len()
            + self.regressions.len()
            + self.started_after_stop.len()
            + self.unknown_fences.len()
            + self.logged_as_another_member
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "records": self.records,
            "overlaps": self.overlaps.len(),
            "regressions": self.regressions.len(),
            "in_flight_at_stop": self.in_flight_at_stop,
            "started_after_stop": self.started_after_stop.len(),
            "unknown_fences": self.unknown_fences.len(),
            "logged_as_another_member": self.logged_as_another_member,
        })
    }

    pub fn assert_clean(&self) {
        assert!(self.records > 0, "the fence log is empty");
        let examples: Vec<&String> = self
            .overlaps
            .iter()
            .chain(&self.regressions)
            .chain(&self.started_after_stop)
            .chain(&self.unknown_fences)
            .take(5)
            .collect();
        assert_eq!(
            self.violations(),
            0,
            "fence log violations: {}; e.g. {examples:#?}",
            self.json()
        );
    }
}

/// Check the replicas' fence log. Each write is attributed to the member the assignment handed its fence
/// `(shard, epoch)` to (`fences`); a write under a fence never handed out is a violation. `stops`:
/// `(member, SIGSTOP wall-clock ns)` — a stopped process does nothing, so a write of it in flight at the
/// stop was committed then or never (where it landed in commit order is the [`Recorder`]'s check); its
/// end is taken as the stop. That incarnation starts no write after the stop: its fences expired while
/// it was stopped.
pub fn fence_log(
    path: &Path,
    fences: &HashMap<(u32, u64), MemberId>,
    stops: &[(MemberId, u128)],
) -> FenceLogCheck {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut c = FenceLogCheck::default();
    let mut attributed = Vec::new();
    for r in parse_fence_log(&text) {
        let (shard, epoch, start, mut end) = (r.shard, r.epoch, r.start, r.end);
        c.records += 1;
        let Some(owner) = fences.get(&(shard, epoch)) else {
            c.unknown_fences.push(format!(
                "{} wrote shard {shard} at epoch {epoch}, a fence the assignment never handed out",
                r.member
            ));
            continue;
        };
        if owner.to_string() != r.member {
            c.logged_as_another_member += 1;
        }
        for (m, at) in stops {
            if m == owner && start < *at && end > *at {
                end = *at;
                c.in_flight_at_stop += 1;
            }
            if m == owner && start >= *at {
                c.started_after_stop.push(format!(
                    "{owner} wrote shard {shard} at epoch {epoch}, started {} ms after its stop",
                    (start - at) / 1_000_000
                ));
            }
        }
        attributed.push(FenceLogRecord {
            member: owner.to_string(),
            end,
            ..r
        });
    }
    // the library's fence oracle on the attributed writes
    for v in fence_log_violations(&attributed) {
        match v {
            Violation::EpochBack { .. } => c.regressions.push(v.to_string()),
            _ => c.overlaps.push(v.to_string()),
        }
    }
    c
}
