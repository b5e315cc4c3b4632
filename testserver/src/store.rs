//! The object store: every object as JSON, one global resourceVersion counter, a bounded history of
//! changes (for watches from a resourceVersion, consistent pages and snapshot reads) and the open watches.
//!
//! Everything here runs under one mutex and never awaits.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    ops::Bound,
    sync::Arc,
};

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::resources::{Registry, ResourceInfo};

/// An object as committed: its JSON and its JSON rendered without `apiVersion` and `kind` (list items of
/// built-in resources are written like that; whole objects get the two prepended).
#[derive(Debug)]
pub(crate) struct Obj {
    pub(crate) value: Value,
    /// `{...}` without `apiVersion`/`kind`.
    pub(crate) rest: Bytes,
    pub(crate) uid: String,
    pub(crate) namespace: String,
    pub(crate) rv: u64,
}

impl Obj {
    pub(crate) fn new(mut value: Value) -> Self {
        let meta = &value["metadata"];
        let uid = meta["uid"].as_str().unwrap_or_default().to_string();
        let namespace = meta["namespace"].as_str().unwrap_or_default().to_string();
        let rv = meta["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_default();
        let (api_version, kind) = match value.as_object_mut() {
            Some(m) => (m.remove("apiVersion"), m.remove("kind")),
            None => (None, None),
        };
        let rest = Bytes::from(serde_json::to_vec(&value).unwrap_or_default());
        if let Some(m) = value.as_object_mut() {
            if let Some(v) = api_version {
                m.insert("apiVersion".into(), v);
            }
            if let Some(k) = kind {
                m.insert("kind".into(), k);
            }
        }
        Obj {
            value,
            rest,
            uid,
            namespace,
            rv,
        }
    }

    pub(crate) fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }
}

/// The watch event type of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

/// One committed change.
#[derive(Debug)]
pub(crate) struct Change {
    pub(crate) rv: u64,
    pub(crate) store_key: Arc<str>,
    pub(crate) key: String,
    pub(crate) kind: ChangeKind,
    /// The object before the change (`None` for a create).
    pub(crate) prev: Option<Arc<Obj>>,
    /// The object after the change; for a delete, the last state stamped with the delete's RV.
    pub(crate) obj: Arc<Obj>,
}

/// An open watch: gets every change of its resource (and namespace) pushed under the store lock, so a
/// watch registered together with its history replay sees every change exactly once.
#[derive(Debug)]
struct Sub {
    store_key: Arc<str>,
    namespace: Option<String>,
    tx: mpsc::UnboundedSender<Arc<Change>>,
}

/// The storage key of an object: `namespace/name`, or `name` when cluster-scoped (etcd key order).
pub(crate) fn obj_key(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

/// The key range of one namespace's objects (`ns/` up to `ns0`; `'0'` follows `'/'`).
pub(crate) fn ns_range(ns: &str) -> (Bound<String>, Bound<String>) {
    (
        Bound::Included(format!("{ns}/")),
        Bound::Excluded(format!("{ns}0")),
    )
}

#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) rv: u64,
    pub(crate) registry: Registry,
    objects: HashMap<Arc<str>, BTreeMap<String, Arc<Obj>>>,
    history: VecDeque<Arc<Change>>,
    history_cap: usize,
    /// Every change at or below this RV has left the history: watching or paging from below it is a 410.
    pub(crate) compacted: u64,
    subs: Vec<Sub>,
}

impl Store {
    pub(crate) fn new(history_cap: usize, rv_start: u64) -> Self {
        let rv_start = rv_start.max(1);
        Store {
            rv: rv_start,
            registry: Registry::with_builtins(),
            objects: HashMap::new(),
            history: VecDeque::new(),
            history_cap: history_cap.max(1),
            compacted: rv_start,
            subs: Vec::new(),
        }
    }

    pub(crate) fn get(&self, store_key: &str, key: &str) -> Option<Arc<Obj>> {
        self.objects.get(store_key)?.get(key).cloned()
    }

    /// Commit a change: assign the next RV (stamped into `metadata.resourceVersion`), store, record in the
    /// history and push to matching watches. `new == None` deletes; `value` is then the final state.
    pub(crate) fn commit(
        &mut self,
        info: &ResourceInfo,
        key: String,
        mut value: Value,
        delete: bool,
    ) -> Arc<Change> {
        self.rv += 1;
        let rv = self.rv;
        value["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let obj = Arc::new(Obj::new(value));
        let map = self.objects.entry(info.store_key.clone()).or_default();
        let prev = if delete {
            map.remove(&key)
        } else {
            map.insert(key.clone(), obj.clone())
        };
        let kind = match (&prev, delete) {
            (_, true) => ChangeKind::Deleted,
            (None, false) => ChangeKind::Added,
            (Some(_), false) => ChangeKind::Modified,
        };
        let change = Arc::new(Change {
            rv,
            store_key: info.store_key.clone(),
            key,
            kind,
            prev,
            obj,
        });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_cap {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        self.subs.retain(|s| {
            if s.store_key != change.store_key {
                return true;
            }
            if let Some(ns) = &s.namespace {
                if *ns != change.obj.namespace {
                    return true;
                }
            }
            s.tx.send(change.clone()).is_ok()
        });
        change
    }

    /// Drop the whole history (what an etcd compaction at the current revision does to watches).
    pub(crate) fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Changes of one resource (and namespace) after `rv`, oldest first. The caller checks `compacted`.
    pub(crate) fn changes_since(
        &self,
        store_key: &str,
        namespace: Option<&str>,
        rv: u64,
    ) -> Vec<Arc<Change>> {
        let start = self.history.partition_point(|c| c.rv <= rv);
        self.history
            .range(start..)
            .filter(|c| &*c.store_key == store_key)
            .filter(|c| namespace.is_none_or(|ns| c.obj.namespace == ns))
            .cloned()
            .collect()
    }

    /// Objects of a resource as of `at` (≤ current, ≥ `compacted`), in key order from `after` (exclusive),
    /// within `namespace`; `visit` returns false to stop.
    pub(crate) fn scan_at(
        &self,
        store_key: &str,
        namespace: Option<&str>,
        at: u64,
        after: Option<&str>,
        mut visit: impl FnMut(&str, &Arc<Obj>) -> bool,
    ) {
        let (lo, hi) = match namespace {
            Some(ns) => ns_range(ns),
            None => (Bound::Unbounded, Bound::Unbounded),
        };
        let lo = match after {
            Some(a) => match &lo {
                Bound::Included(l) if l.as_str() > a => lo,
                _ => Bound::Excluded(a.to_string()),
            },
            None => lo,
        };
        // The state at `at` differs from the current one only in keys changed after `at`: for each, the
        // state before its first later change.
        let mut overlay: BTreeMap<&str, Option<&Arc<Obj>>> = BTreeMap::new();
        if at < self.rv {
            let start = self.history.partition_point(|c| c.rv <= at);
            for c in self.history.range(start..) {
                if &*c.store_key == store_key {
                    overlay.entry(c.key.as_str()).or_insert(c.prev.as_ref());
                }
            }
        }
        let empty = BTreeMap::new();
        let current = self.objects.get(store_key).unwrap_or(&empty);
        let range = (
            lo.as_ref().map(String::as_str),
            hi.as_ref().map(String::as_str),
        );
        let mut cur = current.range::<str, _>(range).peekable();
        let mut ovl = overlay.range::<str, _>(range).peekable();
        loop {
            let next = match (cur.peek(), ovl.peek()) {
                (None, None) => break,
                (Some((ck, _)), Some((ok, _))) => {
                    if ck.as_str() < **ok {
                        cur.next().map(|(k, v)| (k.as_str(), Some(v)))
                    } else {
                        if ck.as_str() == **ok {
                            cur.next();
                        }
                        ovl.next().map(|(k, v)| (*k, *v))
                    }
                }
                (Some(_), None) => cur.next().map(|(k, v)| (k.as_str(), Some(v))),
                (None, Some(_)) => ovl.next().map(|(k, v)| (*k, *v)),
            };
            let Some((k, v)) = next else { break };
            if let Some(obj) = v {
                if !visit(k, obj) {
                    break;
                }
            }
        }
    }

    /// All current objects of a resource in a namespace (or all), in key order.
    pub(crate) fn current(&self, store_key: &str, namespace: Option<&str>) -> Vec<Arc<Obj>> {
        let mut out = Vec::new();
        self.scan_at(store_key, namespace, self.rv, None, |_, o| {
            out.push(o.clone());
            true
        });
        out
    }

    /// Every object of every resource: (store key, key, object).
    pub(crate) fn all_objects(&self) -> Vec<(Arc<str>, String, Arc<Obj>)> {
        self.objects
            .iter()
            .flat_map(|(sk, m)| {
                m.iter()
                    .map(move |(k, o)| (sk.clone(), k.clone(), o.clone()))
            })
            .collect()
    }

    pub(crate) fn subscribe(
        &mut self,
        store_key: Arc<str>,
        namespace: Option<String>,
    ) -> mpsc::UnboundedReceiver<Arc<Change>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.subs.push(Sub {
            store_key,
            namespace,
            tx,
        });
        rx
    }

    /// Close every watch of a resource (its CRD went away).
    pub(crate) fn drop_subs(&mut self, store_key: &str) {
        self.subs.retain(|s| &*s.store_key != store_key);
    }

    pub(crate) fn open_watches(&self) -> usize {
        self.subs.iter().filter(|s| !s.tx.is_closed()).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn info() -> Arc<ResourceInfo> {
        Registry::with_builtins()
            .get("", "v1", "configmaps")
            .unwrap()
    }

    /// Reading at any retained resourceVersion gives exactly the state committed then.
    #[test]
    fn snapshots_at_every_resource_version() {
        let info = info();
        let mut store = Store::new(100_000, 1);
        let mut snapshots: Vec<(u64, Vec<(String, u64)>)> = Vec::new();
        let mut state: BTreeMap<String, u64> = BTreeMap::new();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let ns = ["a", "a-b", "b"][(seed % 3) as usize];
            let key = obj_key(Some(ns), &format!("o{}", (seed >> 8) % 40));
            let delete = state.contains_key(&key) && (seed >> 20).is_multiple_of(3);
            let (nsn, name) = key.split_once('/').unwrap();
            let value = json!({"metadata": {"name": name, "namespace": nsn, "uid": key.clone()}});
            let c = store.commit(&info, key.clone(), value, delete);
            if delete {
                state.remove(&key);
            } else {
                state.insert(key, c.rv);
            }
            snapshots.push((c.rv, state.iter().map(|(k, v)| (k.clone(), *v)).collect()));
        }
        for (rv, want) in snapshots.iter().step_by(37) {
            let mut got = Vec::new();
            store.scan_at(&info.store_key, None, *rv, None, |k, o| {
                got.push((k.to_string(), o.rv));
                true
            });
            assert_eq!(&got, want, "at {rv}");
            // One namespace, resumed after a key.
            let want_a: Vec<_> = want
                .iter()
                .filter(|(k, _)| k.starts_with("a/"))
                .skip(3)
                .cloned()
                .collect();
            let after = want
                .iter()
                .filter(|(k, _)| k.starts_with("a/"))
                .nth(2)
                .map(|(k, _)| k.clone());
            let mut got_a = Vec::new();
            store.scan_at(&info.store_key, Some("a"), *rv, after.as_deref(), |k, o| {
                got_a.push((k.to_string(), o.rv));
                true
            });
            if after.is_some() {
                assert_eq!(got_a, want_a, "ns a at {rv}");
            }
        }
    }

    #[test]
    fn history_is_bounded_and_compaction_is_recorded() {
        let info = info();
        let mut store = Store::new(10, 1);
        for i in 0..25 {
            let v = json!({"metadata": {"name": format!("o{i}"), "namespace": "a"}});
            store.commit(&info, format!("a/o{i}"), v, false);
        }
        assert_eq!(store.changes_since(&info.store_key, None, 0).len(), 10);
        assert_eq!(store.compacted, store.rv - 10);
        store.compact();
        assert_eq!(store.compacted, store.rv);
        assert!(store.changes_since(&info.store_key, None, 0).is_empty());
    }
}
