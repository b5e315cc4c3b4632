//! The uid-keyed index of what the sub-watches read, and the owned projection the consumer sees.
//!
//! Entries are keyed by **uid** and keep the newest resourceVersion seen; a deleted uid leaves a tombstone,
//! so a replayed older event cannot resurrect it. The **projection** is the entries of projected shards,
//! keyed like kube's store by `ObjectRef`; per name it never deletes an old uid while a newer uid of that
//! name is live. Output: one `Init … InitDone` for the first sync, then `Apply`/`Delete`.
//!
//! Pure: no I/O, no async. See `docs/read-path.md#event-semantics`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use kube::runtime::watcher::Event;
use kube::Resource;

use super::handover::{self, Handover};
use super::types::{parse_rv, release_idle, Out, RefKey, SharedKey};
use crate::hash::ShardKey;
use crate::range::RangeSet;
use crate::shard::ShardCount;

/// What the index knows of one name: the uids held under it and what the consumer holds. Kept while
/// either is there.
#[derive(Default)]
struct Name {
    /// The uids held under this name (nearly always one).
    uids: Vec<Arc<str>>,
    /// The uid and resourceVersion last emitted for this name, while the consumer holds it.
    emitted: Option<(Arc<str>, Option<u64>)>,
}

struct Entry<K> {
    /// `None` once this very version was handed to a reflecting consumer (moved into its handover slot,
    /// or seen in its store after the initial sync): it is taken back from the slot or the store when
    /// needed, so a projected object is not held twice. Boxed: an entry handed over keeps
    /// only a pointer's width, not the object's inline size, in the index's B-tree nodes.
    obj: Option<Box<K>>,
    rv: Option<u64>,
    /// The first placement hash (what ranges are matched against).
    hash: u64,
    /// The shards the object belongs to, sorted: one under the group key; none, one or several under a
    /// dependency placement (a secondary placed nowhere is held, not projected).
    shards: Vec<u32>,
    key: SharedKey,
}

impl<K> Entry<K> {
    fn in_shard(&self, shard: u32) -> bool {
        self.shards.binary_search(&shard).is_ok()
    }

    /// Whether a read of `ranges` covers this entry (an entry placed nowhere only by a full read).
    fn covered_by(&self, ranges: &RangeSet) -> bool {
        if self.shards.is_empty() {
            ranges.is_full()
        } else {
            ranges.contains(self.hash)
        }
    }
}

/// Places an object by hashes other than its own key (secondaries: the dependency-key map). An empty
/// result holds the object without projecting it.
pub(crate) type Placement<K> = Arc<dyn Fn(&K) -> Vec<u64> + Send + Sync>;

/// What an [`Observer`] is told: every object the index holds (projected or not) and every one it drops.
pub(crate) enum Observed<'a, K> {
    Upsert {
        uid: &'a str,
        obj: &'a K,
        shards: &'a [u32],
    },
    Remove {
        uid: &'a str,
    },
}

impl<K> Clone for Observed<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Observed<'_, K> {}

/// Told of every change to the index (feeds the dependency-key map from a primary watcher).
pub(crate) type Observer<K> = Arc<dyn Fn(Observed<'_, K>) + Send + Sync>;

/// What a sub-watch relist delivered for its ranges.
pub(crate) struct Relist<K> {
    pub(crate) ranges: RangeSet,
    pub(crate) objects: Vec<K>,
    pub(crate) rv: Option<u64>,
}

/// Reads the consumer's store (reflector mode): the store's own shared copy, so that checking what it
/// holds (uid and version, once per emitted object) copies nothing.
pub(crate) type Lookup<K> = Box<dyn Fn(&RefKey) -> Option<Arc<K>> + Send + Sync>;

/// The index and its projection.
pub(crate) struct Index<K: Resource> {
    lookup: Option<Lookup<K>>,
    /// Where an `Apply` for a reflecting consumer waits, moved out of the index (with `lookup`).
    handover: Option<Arc<Handover<K>>>,
    /// The number of the last emission into `handover`.
    handed_seq: u64,
    placement: Option<Placement<K>>,
    observer: Option<Observer<K>>,
    /// `(uid, rv)`s of the initial sync whose copy may be dropped once the store is seen holding them (it
    /// shows them only once the sync is complete), in emission order. Later emissions move the object.
    pending_drop: VecDeque<(Arc<str>, Option<u64>)>,
    /// Entries whose only copy is in the store.
    handed: usize,
    key: ShardKey,
    count: ShardCount,
    entries: BTreeMap<Arc<str>, Entry<K>>,
    /// Per name: its uids and what the consumer holds (one map, so a name's key is stored once).
    names: BTreeMap<SharedKey, Name>,
    by_shard: BTreeMap<u32, BTreeSet<Arc<str>>>,
    tombstones: BTreeMap<Arc<str>, Option<u64>>,
    /// Relist floors: `ranges` were listed at `rv`, so an object of those ranges that is not held and whose
    /// version is not newer was deleted by then — a replayed create of it is ignored.
    floors: Vec<(RangeSet, u64)>,
    projected: Vec<bool>,
    /// Names the consumer holds (those with `emitted` set).
    emitted_len: usize,
    initialized: bool,
    out: VecDeque<Out<K>>,
    /// Objects dropped because their key could not be computed (no uid under the uid key).
    pub(crate) unplaceable: u64,
}

impl<K: Resource + Clone> Index<K> {
    pub(crate) fn new(key: ShardKey, count: ShardCount) -> Self {
        Index {
            lookup: None,
            handover: None,
            handed_seq: 0,
            placement: None,
            observer: None,
            pending_drop: VecDeque::new(),
            handed: 0,
            key,
            count,
            entries: BTreeMap::new(),
            names: BTreeMap::new(),
            by_shard: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            floors: Vec::new(),
            projected: vec![false; count.get() as usize],
            emitted_len: 0,
            initialized: false,
            out: VecDeque::new(),
            unplaceable: 0,
        }
    }

    /// An index that hands projected objects over to the consumer's store, read through `lookup`: an
    /// `Apply` moves the object into `handover`, where the consumer takes it (see `handover.rs`).
    pub(crate) fn with_store(
        key: ShardKey,
        count: ShardCount,
        lookup: Lookup<K>,
        handover: Arc<Handover<K>>,
    ) -> Self {
        let mut index = Self::new(key, count);
        index.lookup = Some(lookup);
        index.handover = Some(handover);
        index
    }

    /// Place objects with `placement` instead of the group key.
    pub(crate) fn set_placement(&mut self, placement: Placement<K>) {
        self.placement = Some(placement);
    }

    /// Tell `observer` of every change.
    pub(crate) fn set_observer(&mut self, observer: Observer<K>) {
        self.observer = Some(observer);
    }

    /// Number of objects whose only copy is in the consumer's store.
    pub(crate) fn handed_over(&self) -> usize {
        self.handed
    }

    /// Whether copies wait for the consumer to apply them.
    pub(crate) fn has_pending_handover(&self) -> bool {
        !self.pending_drop.is_empty()
    }

    /// How many copies wait for the consumer to apply them.
    pub(crate) fn pending_handover(&self) -> usize {
        self.pending_drop.len()
    }

    /// Drop the index's copy of every object of the initial sync the consumer's store now holds at the same
    /// version.
    pub(crate) fn confirm_handover(&mut self) {
        let Some(lookup) = self.lookup.as_ref() else {
            return;
        };
        while let Some((uid, rv)) = self.pending_drop.front().cloned() {
            let Some(entry) = self.entries.get_mut(&uid) else {
                self.pending_drop.pop_front();
                continue;
            };
            let emitted = self.names.get(&entry.key).and_then(|n| n.emitted.as_ref());
            if emitted != Some(&(uid.clone(), rv)) || entry.rv != rv {
                // superseded before the consumer applied it
                self.pending_drop.pop_front();
                continue;
            }
            match lookup(&entry.key) {
                Some(held) if handover::is(&*held, &uid, rv) => {
                    if entry.obj.take().is_some() {
                        self.handed += 1;
                    }
                    self.pending_drop.pop_front();
                }
                // not applied yet: neither is anything emitted after it
                _ => break,
            }
        }
        release_idle(&mut self.pending_drop);
    }

    /// A copy of the object of `uid`: the index's own, or the one handed over (waiting in its handover
    /// slot, else in the store — looked up in that order, see `handover.rs`).
    fn object_of(&self, uid: &Arc<str>) -> Option<K> {
        let e = self.entries.get(uid)?;
        if let Some(obj) = &e.obj {
            return Some(K::clone(obj));
        }
        self.handed_copy(&e.key, uid, e.rv)
    }

    /// A copy of the handed-over object of `uid` at `rv`: from its handover slot, else from the store
    /// (in that order: the consumer moves it from one to the other under the slot's lock).
    fn handed_copy(&self, key: &RefKey, uid: &str, rv: Option<u64>) -> Option<K> {
        match self.handover.as_ref().and_then(|h| h.copy_of(key, uid, rv)) {
            Some(obj) => Some(obj),
            None => self.store_copy(key, uid, rv),
        }
    }

    /// The handed-over object of `uid` at `rv`, taken back: out of its slot if the consumer has not taken
    /// it yet (no copy), else a copy of the store's.
    fn take_back(&self, key: &RefKey, uid: &str, rv: Option<u64>) -> Option<Box<K>> {
        match self
            .handover
            .as_ref()
            .and_then(|h| h.take_back(key, uid, rv))
        {
            Some(obj) => Some(obj),
            None => self.store_copy(key, uid, rv).map(Box::new),
        }
    }

    /// A copy of the consumer's store's object of `uid` at `rv`.
    fn store_copy(&self, key: &RefKey, uid: &str, rv: Option<u64>) -> Option<K> {
        self.lookup
            .as_ref()
            .and_then(|l| l(key))
            .filter(|held| handover::is(&**held, uid, rv))
            .map(|held| K::clone(&held))
    }

    /// Take the object of `uid` back from the consumer before the consumer stops holding it.
    fn restore(&mut self, uid: &Arc<str>) {
        if let Some(e) = self.entries.get(uid).filter(|e| e.obj.is_none()) {
            let obj = self.take_back(&e.key, uid, e.rv);
            if let Some(e) = self.entries.get_mut(uid) {
                if obj.is_some() {
                    self.handed -= 1;
                }
                e.obj = obj;
            }
        }
    }

    /// Number of uids held (what the member read, projected or not).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Number of objects in the consumer's view.
    pub(crate) fn projected_len(&self) -> usize {
        self.emitted_len
    }

    /// What the consumer holds for `key`: the uid and the resourceVersion last emitted.
    fn emitted(&self, key: &RefKey) -> Option<&(Arc<str>, Option<u64>)> {
        self.names.get(key)?.emitted.as_ref()
    }

    /// Record what the consumer holds for `key` (`None`: nothing); a name with neither uids nor an
    /// emitted object is dropped.
    fn set_emitted(&mut self, key: &SharedKey, emitted: Option<(Arc<str>, Option<u64>)>) {
        let name = self.names.entry(key.clone()).or_default();
        match (&name.emitted, &emitted) {
            (None, Some(_)) => self.emitted_len += 1,
            (Some(_), None) => self.emitted_len -= 1,
            _ => {}
        }
        name.emitted = emitted;
        if name.uids.is_empty() && name.emitted.is_none() {
            self.names.remove(&**key);
        }
    }

    /// The hash of an object under the group key (or its first placement hash), or `None` if it cannot
    /// be placed.
    pub(crate) fn hash_of(&self, obj: &K) -> Option<u64> {
        match &self.placement {
            Some(p) => p(obj).first().copied(),
            None => self.key.hash_object(obj).ok(),
        }
    }

    /// Whether `obj` is placed in `range` (by any of its placement hashes).
    pub(crate) fn placed_in(&self, obj: &K, range: &crate::range::HashRange) -> bool {
        match &self.placement {
            Some(p) => p(obj).into_iter().any(|h| range.contains(h)),
            None => self.key.hash_object(obj).is_ok_and(|h| range.contains(h)),
        }
    }

    /// `(first hash, sorted shards)`; `None` when the group key cannot be computed.
    fn place(&self, obj: &K) -> Option<(u64, Vec<u32>)> {
        match &self.placement {
            Some(p) => {
                let hashes = p(obj);
                let mut shards: Vec<u32> = hashes.iter().map(|h| self.count.shard_of(*h)).collect();
                shards.sort_unstable();
                shards.dedup();
                Some((hashes.first().copied().unwrap_or(0), shards))
            }
            None => {
                let h = self.key.hash_object(obj).ok()?;
                Some((h, vec![self.count.shard_of(h)]))
            }
        }
    }

    /// Re-evaluate the placement of every held object (the dependency-key map changed), moving and
    /// re-projecting those whose shards changed. O(held objects).
    pub(crate) fn replace_all(&mut self) {
        if self.placement.is_none() {
            return;
        }
        let uids: Vec<Arc<str>> = self.entries.keys().cloned().collect();
        for uid in uids {
            self.replace(&uid);
        }
    }

    /// Re-evaluate the placement of the objects named `keys` only. O(named objects).
    pub(crate) fn replace_keys(&mut self, keys: &[RefKey]) {
        if self.placement.is_none() {
            return;
        }
        let uids: Vec<Arc<str>> = keys
            .iter()
            .filter_map(|k| self.names.get(k))
            .flat_map(|n| &n.uids)
            .cloned()
            .collect();
        for uid in uids {
            self.replace(&uid);
        }
    }

    fn replace(&mut self, uid: &Arc<str>) {
        let Some(obj) = self.object_of(uid) else {
            return;
        };
        let Some((hash, shards)) = self.place(&obj) else {
            return;
        };
        let Some(e) = self.entries.get_mut(uid) else {
            return;
        };
        if e.shards == shards {
            return;
        }
        let old = std::mem::replace(&mut e.shards, shards.clone());
        e.hash = hash;
        let key = e.key.clone();
        self.rehome(uid, &old, &shards);
        if let Some(observer) = &self.observer {
            observer(Observed::Upsert {
                uid,
                obj: &obj,
                shards: &shards,
            });
        }
        self.reproject(&key, None);
    }

    fn rehome(&mut self, uid: &Arc<str>, old: &[u32], new: &[u32]) {
        for s in old {
            if let Some(set) = self.by_shard.get_mut(s) {
                set.remove(uid);
                if set.is_empty() {
                    self.by_shard.remove(s);
                }
            }
        }
        for s in new {
            self.by_shard.entry(*s).or_default().insert(uid.clone());
        }
    }

    /// The names (`ObjectRef` keys) the consumer holds for `shard`.
    pub(crate) fn projected_refs_of(&self, shard: u32) -> Vec<RefKey> {
        let Some(uids) = self.by_shard.get(&shard) else {
            return Vec::new();
        };
        uids.iter()
            .filter_map(|u| self.entries.get(u))
            .filter(|e| {
                self.emitted(&e.key).is_some_and(|(uid, _)| {
                    self.entries.get(uid).is_some_and(|w| w.in_shard(shard))
                })
            })
            .map(|e| RefKey::clone(&e.key))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    fn uid_of(obj: &K) -> Option<Arc<str>> {
        let meta = obj.meta();
        match meta.uid.as_deref() {
            Some(uid) if !uid.is_empty() => Some(Arc::from(uid)),
            _ => None,
        }
    }

    /// The key of `obj`: the held entry's (shared) when it names the same object, a new one otherwise.
    fn shared_key(held: Option<&Entry<K>>, obj: &K) -> SharedKey {
        let key = Self::ref_of(obj);
        match held {
            Some(e) if *e.key == key => e.key.clone(),
            _ => Arc::new(key),
        }
    }

    fn ref_of(obj: &K) -> RefKey {
        let meta = obj.meta();
        (
            meta.namespace.clone(),
            meta.name.clone().unwrap_or_default(),
        )
    }

    /// Apply an added or modified object. Older than what is held (or than its tombstone): ignored.
    pub(crate) fn upsert(&mut self, obj: K) {
        let Some(uid) = Self::uid_of(&obj) else {
            self.unplaceable += 1;
            return;
        };
        let Some((hash, shards)) = self.place(&obj) else {
            self.unplaceable += 1;
            return;
        };
        let rv = parse_rv(obj.meta().resource_version.as_deref());
        if let Some(dead) = self.tombstones.get(&uid) {
            if newer_or_equal(*dead, rv) {
                return;
            }
            self.tombstones.remove(&uid);
        }
        if let Some(held) = self.entries.get(&uid) {
            if newer(held.rv, rv) || (rv.is_some() && held.rv == rv) {
                // older, or this very version again (a relist): nothing changes
                return;
            }
        }
        let key = Self::shared_key(self.entries.get(&uid), &obj);
        let fresh = !self.entries.contains_key(&uid);
        if self.entries.get(&uid).is_some_and(|e| e.obj.is_none()) {
            self.handed -= 1;
        }
        if let Some(observer) = &self.observer {
            observer(Observed::Upsert {
                uid: &uid,
                obj: &obj,
                shards: &shards,
            });
        }
        let old = self
            .entries
            .insert(
                uid.clone(),
                Entry {
                    obj: Some(Box::new(obj)),
                    rv,
                    hash,
                    shards: shards.clone(),
                    key: key.clone(),
                },
            )
            .map(|e| e.shards)
            .unwrap_or_default();
        if fresh {
            let uids = &mut self.names.entry(key.clone()).or_default().uids;
            // nearly always one uid per name: no room for four
            uids.reserve_exact(1);
            uids.push(uid.clone());
        }
        if old != shards {
            // a dependency placement can change with the object (a new owner, a new reference)
            self.rehome(&uid, &old, &shards);
        }
        self.reproject(&key, None);
    }

    /// Apply an added or modified object read by a watch: like [`Index::upsert`], but an object that is not
    /// held and not newer than a relist of its range is a replay of one deleted since, and is ignored.
    pub(crate) fn upsert_event(&mut self, obj: K) {
        if self.below_floor(&obj) {
            return;
        }
        self.upsert(obj);
    }

    fn below_floor(&self, obj: &K) -> bool {
        let Some(rv) = parse_rv(obj.meta().resource_version.as_deref()) else {
            return false;
        };
        if self.floors.is_empty()
            || Self::uid_of(obj).is_some_and(|u| self.entries.contains_key(&u))
        {
            return false;
        }
        // under a placement, an object's hashes can change with the map: only a full relist is a floor
        let hash = match &self.placement {
            None => self.key.hash_object(obj).ok(),
            Some(_) => None,
        };
        self.floors.iter().any(|(ranges, floor)| {
            rv <= *floor && (ranges.is_full() || hash.is_some_and(|h| ranges.contains(h)))
        })
    }

    fn add_floor(&mut self, ranges: &RangeSet, rv: u64) {
        // a newer floor over a superset makes an older one redundant
        self.floors
            .retain(|(r, f)| !(*f <= rv && r.is_subset(ranges)));
        self.floors.push((ranges.clone(), rv));
    }

    /// Apply a deletion observed by a watch (leaves a tombstone).
    pub(crate) fn delete(&mut self, obj: K) {
        let Some(uid) = Self::uid_of(&obj) else {
            self.unplaceable += 1;
            return;
        };
        let rv = parse_rv(obj.meta().resource_version.as_deref());
        if let Some(held) = self.entries.get(&uid) {
            if newer(held.rv, rv) {
                return;
            }
        }
        self.tombstones.insert(uid.clone(), rv);
        self.forget(&uid, Some(obj));
    }

    /// Remove a uid without a tombstone (its range is no longer read), emitting what the projection needs.
    fn forget(&mut self, uid: &Arc<str>, last: Option<K>) {
        let Some(entry) = self.entries.remove(uid) else {
            return;
        };
        if entry.obj.is_none() {
            self.handed -= 1;
        }
        if let Some(name) = self.names.get_mut(&entry.key) {
            name.uids.retain(|u| u != uid);
            if name.uids.is_empty() && name.emitted.is_none() {
                self.names.remove(&entry.key);
            }
        }
        self.rehome(uid, &entry.shards, &[]);
        if let Some(observer) = &self.observer {
            observer(Observed::Remove { uid });
        }
        let key = entry.key.clone();
        let last = last
            .or(entry.obj.map(|b| *b))
            .or_else(|| self.take_back(&key, uid, entry.rv).map(|b| *b));
        self.reproject(&key, last);
    }

    /// A sub-watch relisted `ranges`: apply what is present, delete what vanished (unless it is newer than
    /// the relist, i.e. was seen after the snapshot was taken).
    pub(crate) fn relist(&mut self, relist: Relist<K>) {
        let mut present: BTreeSet<Arc<str>> = BTreeSet::new();
        for obj in relist.objects {
            if let Some(uid) = Self::uid_of(&obj) {
                present.insert(uid);
            }
            self.upsert(obj);
        }
        let vanished: Vec<Arc<str>> = self
            .entries
            .iter()
            .filter(|(uid, e)| {
                e.covered_by(&relist.ranges) && !present.contains(*uid) && !newer(e.rv, relist.rv)
            })
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in vanished {
            let rv = relist.rv;
            self.tombstones.insert(uid.clone(), rv);
            self.forget(&uid, None);
        }
        if let Some(rv) = relist.rv {
            self.add_floor(&relist.ranges, rv);
        }
    }

    /// Stop holding everything in `ranges` (no sub-watch reads them any more). Not a deletion: no
    /// tombstones; projected objects among them are deleted from the consumer's view.
    pub(crate) fn drop_ranges(&mut self, ranges: &RangeSet) {
        let gone: Vec<Arc<str>> = self
            .entries
            .iter()
            .filter(|(_, e)| e.covered_by(ranges))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in gone {
            self.forget(&uid, None);
        }
        // what is read again later is listed again: its old floor must not hide objects
        for (r, _) in &mut self.floors {
            *r = r.difference(ranges);
        }
        self.floors.retain(|(r, _)| !r.is_empty());
    }

    /// Forget tombstones and relist floors no older than `passed`: every reader has passed them, so no
    /// replay can bring them back.
    pub(crate) fn prune_tombstones(&mut self, passed: Option<u64>) {
        if let Some(passed) = passed {
            self.tombstones
                .retain(|_, rv| rv.is_none_or(|rv| rv > passed));
            self.floors.retain(|(_, rv)| *rv > passed);
        }
    }

    /// Change which shards are projected; emits `Apply` for gained objects and `Delete` for lost ones.
    pub(crate) fn set_projected(&mut self, shards: impl IntoIterator<Item = u32>) {
        let mut next = vec![false; self.projected.len()];
        for s in shards {
            if let Some(slot) = next.get_mut(s as usize) {
                *slot = true;
            }
        }
        let changed: Vec<u32> = (0..next.len() as u32)
            .filter(|s| next[*s as usize] != self.projected[*s as usize])
            .collect();
        self.projected = next;
        let mut keys: Vec<SharedKey> = Vec::new();
        for s in changed {
            if let Some(uids) = self.by_shard.get(&s) {
                keys.extend(
                    uids.iter()
                        .filter_map(|u| self.entries.get(u))
                        .map(|e| e.key.clone()),
                );
            }
        }
        keys.sort();
        keys.dedup();
        for k in keys {
            self.reproject(&k, None);
        }
    }

    /// Whether `shard` is projected.
    pub(crate) fn is_projected(&self, shard: u32) -> bool {
        self.projected.get(shard as usize).copied().unwrap_or(false)
    }

    /// Emit the initial sync: `Init`, one `InitApply` per projected name, `InitDone`. Only once.
    pub(crate) fn initialize(&mut self) {
        if self.initialized {
            return;
        }
        self.initialized = true;
        self.out.clear();
        // nothing was emitted before (reproject waits for the initial sync); start from none anyway
        for name in self.names.values_mut() {
            name.emitted = None;
        }
        self.names.retain(|_, n| !n.uids.is_empty());
        self.emitted_len = 0;
        self.out.push_back(Out::Event(Event::Init));
        let keys: Vec<SharedKey> = self.names.keys().cloned().collect();
        for key in keys {
            if let Some(uid) = self.winner(&key) {
                let rv = self.entries[&uid].rv;
                if let Some(obj) = self.object_of(&uid) {
                    self.set_emitted(&key, Some((uid.clone(), rv)));
                    // the consumer's store shows an initial sync only once it is done: until then the index
                    // keeps its copy (`confirm_handover` drops it)
                    self.out.push_back(Out::Event(Event::InitApply(obj)));
                    if self.lookup.is_some() {
                        self.pending_drop.push_back((uid, rv));
                    }
                }
            }
        }
        self.out.push_back(Out::Event(Event::InitDone));
    }

    /// Whether the initial sync was emitted.
    pub(crate) fn is_initialized(&self) -> bool {
        self.initialized
    }

    /// The next output item: an event, or the name of an object waiting in its handover slot.
    pub(crate) fn pop(&mut self) -> Option<Out<K>> {
        let ev = self.out.pop_front();
        release_idle(&mut self.out);
        ev
    }

    /// The live, projected uid of `key` with the newest resourceVersion.
    fn winner(&self, key: &RefKey) -> Option<Arc<str>> {
        self.names
            .get(key)?
            .uids
            .iter()
            .filter_map(|u| self.entries.get(u).map(|e| (u, e)))
            .filter(|(_, e)| e.shards.iter().any(|s| self.is_projected(*s)))
            .max_by(|(ua, a), (ub, b)| a.rv.cmp(&b.rv).then_with(|| ua.cmp(ub)))
            .map(|(u, _)| u.clone())
    }

    /// Bring the consumer's view of `key` in line with the index. `last` is the object to name in a
    /// `Delete` when the index no longer holds it.
    fn reproject(&mut self, key: &SharedKey, last: Option<K>) {
        if !self.initialized {
            return;
        }
        let want = self.winner(key);
        let have = self.emitted(key).cloned();
        match (want, have) {
            (Some(uid), have) => {
                let rv = self.entries[&uid].rv;
                if have.as_ref() != Some(&(uid.clone(), rv)) {
                    // another uid of this name leaves the store: keep its object
                    if let Some((old, _)) = &have {
                        if *old != uid {
                            self.restore(old);
                        }
                    }
                    self.emit_apply(key, uid, rv);
                }
            }
            (None, Some((uid, _))) => {
                self.restore(&uid);
                self.set_emitted(key, None);
                if let Some(h) = &self.handover {
                    // an older object of this name may still wait: the consumer is to hold none
                    h.discard(key);
                }
                let obj = self
                    .entries
                    .get(&uid)
                    .and_then(|e| e.obj.as_deref().cloned())
                    .or(last);
                if let Some(obj) = obj {
                    self.out.push_back(Out::Event(Event::Delete(obj)));
                }
            }
            (None, None) => {}
        }
    }

    /// Emit `uid` at `rv` as what the consumer holds for `key`. To a reflecting consumer the index's own
    /// copy is moved into the handover slot (the index keeps none: it reads the object back from the slot
    /// or the store); otherwise the consumer gets a copy.
    fn emit_apply(&mut self, key: &SharedKey, uid: Arc<str>, rv: Option<u64>) {
        let Some(handover) = self.handover.clone() else {
            if let Some(obj) = self.object_of(&uid) {
                self.set_emitted(key, Some((uid, rv)));
                self.out.push_back(Out::Event(Event::Apply(obj)));
            }
            return;
        };
        let own = self.entries.get_mut(&uid).and_then(|e| e.obj.take());
        let obj = match own {
            Some(obj) => {
                self.handed += 1;
                Some(obj)
            }
            None => self.object_of(&uid).map(Box::new),
        };
        if let Some(obj) = obj {
            self.handed_seq += 1;
            handover.put(key, self.handed_seq, obj);
            self.set_emitted(key, Some((uid, rv)));
            self.out
                .push_back(Out::Handed(key.clone(), self.handed_seq));
        }
    }
}

/// `held` is strictly newer than `incoming` (unknown versions never win).
fn newer(held: Option<u64>, incoming: Option<u64>) -> bool {
    matches!((held, incoming), (Some(h), Some(i)) if h > i)
}

fn newer_or_equal(held: Option<u64>, incoming: Option<u64>) -> bool {
    match (held, incoming) {
        (Some(h), Some(i)) => h >= i,
        // a tombstone of unknown version blocks only unknown-version replays
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn cm(name: &str, uid: &str, rv: u64) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                resource_version: Some(rv.to_string()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        }
    }

    fn shard_of(uid: &str, s: ShardCount) -> u32 {
        s.shard_of(crate::fnv1a64(uid.as_bytes()))
    }

    fn drain(ix: &mut Index<ConfigMap>) -> Vec<String> {
        std::iter::from_fn(|| ix.pop())
            .map(|item| match item {
                Out::Event(e) => show(e),
                Out::Handed(key, _) => format!("handed {}", key.1),
                Out::Reenqueue(_) | Out::Error(_) => unreachable!("the index emits neither"),
            })
            .collect()
    }

    fn show(e: Event<ConfigMap>) -> String {
        match e {
            Event::Init => "init".to_owned(),
            Event::InitApply(o) => format!(
                "initapply {}@{}",
                o.metadata.uid.unwrap(),
                o.metadata.resource_version.unwrap()
            ),
            Event::InitDone => "initdone".to_owned(),
            Event::Apply(o) => format!(
                "apply {}@{}",
                o.metadata.uid.unwrap(),
                o.metadata.resource_version.unwrap()
            ),
            Event::Delete(o) => format!("delete {}", o.metadata.uid.unwrap()),
        }
    }

    /// A reflecting consumer as the event stream is one: a real store's writer and the handover slots,
    /// and an index reading both.
    struct Reflecting {
        writer: kube::runtime::reflector::store::Writer<ConfigMap>,
        handover: Arc<Handover<ConfigMap>>,
    }

    impl Reflecting {
        fn new(s: ShardCount) -> (Self, Index<ConfigMap>) {
            use kube::runtime::reflector::ObjectRef;
            let writer = kube::runtime::reflector::store::Writer::default();
            let store = writer.as_reader();
            let handover = Arc::new(Handover::default());
            let ix = Index::with_store(
                ShardKey::Uid,
                s,
                Box::new(move |(ns, name): &RefKey| {
                    let mut r = ObjectRef::new(name);
                    r.namespace = ns.clone();
                    store.get(&r)
                }),
                handover.clone(),
            );
            (Reflecting { writer, handover }, ix)
        }

        /// Take every item as the event stream does: apply, then yield (what is yielded is returned).
        fn consume(&mut self, ix: &mut Index<ConfigMap>) -> Vec<Event<ConfigMap>> {
            std::iter::from_fn(|| ix.pop())
                .filter_map(|item| self.take(item))
                .collect()
        }

        /// Take one item as the event stream does.
        fn take(&mut self, item: Out<ConfigMap>) -> Option<Event<ConfigMap>> {
            match item {
                Out::Event(ev) => {
                    self.writer.apply_watcher_event(&ev);
                    Some(ev)
                }
                Out::Handed(key, seq) => self.handover.deliver(&key, seq, &mut self.writer),
                Out::Reenqueue(_) | Out::Error(_) => unreachable!("the index emits neither"),
            }
        }

        fn store(&self) -> Vec<ConfigMap> {
            let mut objs: Vec<ConfigMap> = self
                .writer
                .as_reader()
                .state()
                .iter()
                .map(|o| ConfigMap::clone(o))
                .collect();
            objs.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            objs
        }
    }

    fn all(s: ShardCount) -> Vec<u32> {
        (0..s.get()).collect()
    }

    /// After the initial sync is drained and handed over, the index keeps no slot per object in its
    /// queues, and one copy of each name, shared by its maps.
    #[test]
    fn after_the_initial_sync_queues_are_released_and_names_shared() {
        use crate::watcher::types::IDLE_CAPACITY;
        let s = ShardCount::new(4).unwrap();
        let (mut consumer, mut ix) = Reflecting::new(s);
        ix.set_projected(all(s));
        for i in 0..2_000 {
            ix.upsert(cm(&format!("o{i}"), &format!("u{i}"), i + 1));
        }
        ix.initialize();
        assert!(ix.out.capacity() > 2_000 && ix.pending_drop.capacity() >= 2_000);
        consumer.consume(&mut ix);
        ix.confirm_handover();
        assert_eq!(ix.handed_over(), 2_000);
        assert!(
            ix.out.capacity() <= IDLE_CAPACITY && ix.pending_drop.capacity() <= IDLE_CAPACITY,
            "slots kept: out {}, pending_drop {}",
            ix.out.capacity(),
            ix.pending_drop.capacity()
        );
        // an update keeps the entry's key; every map holds that one copy
        ix.upsert(cm("o7", "u7", 5_000));
        let e = &ix.entries[&Arc::<str>::from("u7")];
        let (shared, name) = ix.names.get_key_value(&*e.key).unwrap();
        assert!(Arc::ptr_eq(shared, &e.key));
        assert_eq!(name.emitted, Some((Arc::from("u7"), Some(5_000))));
        assert_eq!(name.uids.capacity(), 1);
    }

    #[test]
    fn initial_sync_then_incremental() {
        let s = ShardCount::new(1).unwrap();
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.set_projected(all(s));
        ix.upsert(cm("a", "u1", 5));
        ix.upsert(cm("b", "u2", 6));
        assert!(drain(&mut ix).is_empty(), "nothing before the initial sync");
        ix.initialize();
        let mut ev = drain(&mut ix);
        ev[1..3].sort();
        assert_eq!(ev, ["init", "initapply u1@5", "initapply u2@6", "initdone"]);
        ix.upsert(cm("a", "u1", 7));
        ix.upsert(cm("a", "u1", 6)); // older: ignored
        ix.delete(cm("b", "u2", 8));
        ix.upsert(cm("b", "u2", 6)); // replay of an older event: no resurrection
        assert_eq!(drain(&mut ix), ["apply u1@7", "delete u2"]);
    }

    #[test]
    fn empty_initial_sync_still_emits_init_and_done() {
        let mut ix: Index<ConfigMap> = Index::new(ShardKey::Uid, ShardCount::DEFAULT);
        ix.initialize();
        assert_eq!(drain(&mut ix), ["init", "initdone"]);
        ix.initialize();
        assert!(drain(&mut ix).is_empty(), "only once");
    }

    #[test]
    fn projection_follows_shards() {
        let s = ShardCount::new(2).unwrap();
        // find two uids in different shards
        let uids: Vec<String> = (0..64).map(|i| format!("{i}-uid")).collect();
        let u0 = uids.iter().find(|u| shard_of(u, s) == 0).unwrap().clone();
        let u1 = uids.iter().find(|u| shard_of(u, s) == 1).unwrap().clone();
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.set_projected([0]);
        ix.upsert(cm("a", &u0, 1));
        ix.upsert(cm("b", &u1, 2));
        ix.initialize();
        assert_eq!(
            drain(&mut ix),
            [
                "init".to_owned(),
                format!("initapply {u0}@1"),
                "initdone".into()
            ]
        );
        ix.set_projected([1]);
        assert_eq!(
            drain(&mut ix),
            [format!("delete {u0}"), format!("apply {u1}@2")]
        );
        assert_eq!(ix.projected_len(), 1);
        assert_eq!(ix.len(), 2);
    }

    #[test]
    fn recreate_under_one_name_never_deletes_the_live_object() {
        let s = ShardCount::new(2).unwrap();
        let uids: Vec<String> = (0..64).map(|i| format!("{i}-uid")).collect();
        let old = uids.iter().find(|u| shard_of(u, s) == 0).unwrap().clone();
        let new = uids.iter().find(|u| shard_of(u, s) == 1).unwrap().clone();
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.set_projected([0, 1]);
        ix.upsert(cm("x", &old, 1));
        ix.initialize();
        drain(&mut ix);
        // the new object is read (by another sub-watch) before the old one's deletion arrives
        ix.upsert(cm("x", &new, 10));
        ix.delete(cm("x", &old, 9));
        assert_eq!(
            drain(&mut ix),
            [format!("apply {new}@10")],
            "no Delete(x) while the new uid lives"
        );
        // the other order: the old deletion first
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.set_projected([0, 1]);
        ix.upsert(cm("x", &old, 1));
        ix.initialize();
        drain(&mut ix);
        ix.delete(cm("x", &old, 9));
        ix.upsert(cm("x", &new, 10));
        assert_eq!(
            drain(&mut ix),
            [format!("delete {old}"), format!("apply {new}@10")]
        );
        // the store ends with the live object
    }

    #[test]
    fn relist_applies_present_and_deletes_vanished() {
        let s = ShardCount::new(1).unwrap();
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.set_projected([0]);
        ix.upsert(cm("a", "u1", 1));
        ix.upsert(cm("b", "u2", 2));
        ix.upsert(cm("c", "u3", 30));
        ix.initialize();
        drain(&mut ix);
        ix.relist(Relist {
            ranges: RangeSet::full(),
            objects: vec![cm("a", "u1", 3)],
            rv: Some(20),
        });
        let mut ev = drain(&mut ix);
        ev.sort();
        // u3 was read at rv 30, after the snapshot at 20: kept
        assert_eq!(ev, ["apply u1@3", "delete u2"]);
        assert_eq!(ix.len(), 2);
    }

    #[test]
    fn dropping_ranges_is_not_a_deletion() {
        let s = ShardCount::new(1).unwrap();
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.upsert(cm("a", "u1", 1));
        ix.initialize();
        drain(&mut ix);
        ix.drop_ranges(&RangeSet::full());
        assert_eq!(ix.len(), 0);
        assert!(
            drain(&mut ix).is_empty(),
            "not projected: nothing to tell the consumer"
        );
        ix.upsert(cm("a", "u1", 1));
        assert_eq!(ix.len(), 1, "no tombstone: it can be read again");
    }

    #[test]
    fn tombstones_are_pruned_once_passed() {
        let s = ShardCount::new(1).unwrap();
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.upsert(cm("a", "u1", 1));
        ix.delete(cm("a", "u1", 5));
        ix.upsert(cm("a", "u1", 4));
        assert_eq!(ix.len(), 0);
        ix.prune_tombstones(Some(5));
        ix.upsert(cm("a", "u1", 4));
        assert_eq!(ix.len(), 1);
    }

    /// A relist at rv 20 means a not-held object of its ranges at rv ≤ 20 was deleted by then: a
    /// sub-watch still behind that relist replays its create, which must not be applied.
    #[test]
    fn replayed_creates_below_a_relist_floor_are_ignored() {
        let s = ShardCount::new(1).unwrap();
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.set_projected([0]);
        ix.initialize();
        drain(&mut ix);
        ix.relist(Relist {
            ranges: RangeSet::full(),
            objects: vec![cm("a", "u1", 3)],
            rv: Some(20),
        });
        assert_eq!(drain(&mut ix), ["apply u1@3"]);
        ix.upsert_event(cm("y", "u9", 12)); // created at 12, deleted at 15: not in the relist
        ix.delete(cm("y", "u9", 15));
        ix.upsert_event(cm("a", "u1", 21)); // held: updates go on
        ix.upsert_event(cm("z", "u8", 25)); // created after the relist
        assert_eq!(drain(&mut ix), ["apply u1@21", "apply u8@25"]);
        // dropped and read again: the floor goes with the range
        ix.drop_ranges(&RangeSet::full());
        ix.upsert_event(cm("b", "u7", 5));
        assert_eq!(ix.len(), 1);
        // once every reader passed it, the floor is pruned
        ix.relist(Relist {
            ranges: RangeSet::full(),
            objects: vec![],
            rv: Some(30),
        });
        ix.prune_tombstones(Some(30));
        ix.upsert_event(cm("c", "u6", 29));
        assert_eq!(ix.len(), 1);
    }

    #[test]
    fn objects_without_uid_are_counted_not_indexed() {
        let mut ix = Index::new(ShardKey::Uid, ShardCount::DEFAULT);
        let mut o = cm("a", "", 1);
        o.metadata.uid = None;
        ix.upsert(o);
        assert_eq!((ix.len(), ix.unplaceable), (0, 1));
    }

    /// A placement from a mutable table (a stand-in for the dependency-key map): object name -> shards.
    fn table_placement(
        s: ShardCount,
        table: &Arc<std::sync::Mutex<BTreeMap<String, Vec<u32>>>>,
    ) -> Placement<ConfigMap> {
        let table = table.clone();
        Arc::new(move |o: &ConfigMap| {
            table
                .lock()
                .unwrap()
                .get(o.metadata.name.as_deref().unwrap_or_default())
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(|shard| s.range_of(shard).unwrap().start())
                .collect()
        })
    }

    #[test]
    fn placement_in_several_shards_and_nowhere() {
        let s = ShardCount::new(4).unwrap();
        let table = Arc::new(std::sync::Mutex::new(BTreeMap::from([
            ("both".to_owned(), vec![1, 3]),
            ("one".to_owned(), vec![2]),
        ])));
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.set_placement(table_placement(s, &table));
        ix.set_projected([3]);
        ix.upsert(cm("both", "u1", 1));
        ix.upsert(cm("one", "u2", 2));
        ix.upsert(cm("nowhere", "u3", 3));
        ix.initialize();
        assert_eq!(drain(&mut ix), ["init", "initapply u1@1", "initdone"]);
        assert_eq!(
            ix.len(),
            3,
            "an object placed nowhere is held, not projected"
        );
        assert_eq!(
            ix.projected_refs_of(3),
            [(Some("ns".into()), "both".into())]
        );
        ix.set_projected([1]);
        assert!(drain(&mut ix).is_empty(), "still projected through shard 1");
        ix.set_projected([2]);
        assert_eq!(drain(&mut ix), ["delete u1", "apply u2@2"]);
        // a relist of one shard's range never deletes what is placed nowhere or elsewhere
        ix.relist(Relist {
            ranges: s.ranges_of([2]).unwrap(),
            objects: vec![cm("one", "u2", 2)],
            rv: Some(10),
        });
        assert_eq!(ix.len(), 3);
        // a full relist does
        ix.relist(Relist {
            ranges: RangeSet::full(),
            objects: vec![cm("one", "u2", 2)],
            rv: Some(10),
        });
        assert_eq!(ix.len(), 1);
    }

    #[test]
    fn replacing_follows_the_map_and_object_updates() {
        let s = ShardCount::new(4).unwrap();
        let table = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.set_placement(table_placement(s, &table));
        ix.set_projected([0]);
        ix.upsert(cm("child", "u1", 1));
        ix.initialize();
        assert_eq!(drain(&mut ix), ["init", "initdone"]);
        // its primary appears in shard 0: the map changes, the index re-places
        table.lock().unwrap().insert("child".into(), vec![0]);
        ix.replace_all();
        assert_eq!(drain(&mut ix), ["apply u1@1"]);
        assert_eq!(ix.projected_refs_of(0).len(), 1);
        ix.replace_all();
        assert!(drain(&mut ix).is_empty(), "nothing changed");
        // the primary moves to shard 1 (not projected)
        table.lock().unwrap().insert("child".into(), vec![1]);
        ix.replace_all();
        assert_eq!(drain(&mut ix), ["delete u1"]);
        assert!(ix.projected_refs_of(0).is_empty());
        // an update of the object itself re-places it too
        table.lock().unwrap().insert("child".into(), vec![0]);
        ix.upsert(cm("child", "u1", 2));
        assert_eq!(drain(&mut ix), ["apply u1@2"]);
        assert_eq!(ix.by_shard.get(&1), None, "moved out of its old shard");
    }

    #[test]
    fn the_observer_sees_every_held_object() {
        let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
        let log = seen.clone();
        let s = ShardCount::new(1).unwrap();
        let mut ix = Index::new(ShardKey::Uid, s);
        ix.set_observer(Arc::new(move |c: Observed<'_, ConfigMap>| {
            log.lock().unwrap().push(match c {
                Observed::Upsert { uid, shards, .. } => format!("+{uid}{shards:?}"),
                Observed::Remove { uid } => format!("-{uid}"),
            });
        }));
        ix.upsert(cm("a", "u1", 1));
        ix.upsert(cm("b", "u2", 2));
        ix.delete(cm("a", "u1", 3));
        ix.drop_ranges(&RangeSet::full());
        assert_eq!(*seen.lock().unwrap(), ["+u1[0]", "+u2[0]", "-u1", "-u2"]);
    }

    fn with_data(name: &str, uid: &str, rv: u64) -> ConfigMap {
        let mut c = cm(name, uid, rv);
        c.data = Some([("k".to_owned(), format!("{uid}@{rv}"))].into());
        c
    }

    /// `uid` and what its object says of itself, for a store's content or an event.
    fn label(o: &ConfigMap) -> String {
        format!(
            "{} {}",
            o.metadata.name.as_deref().unwrap_or_default(),
            o.data
                .as_ref()
                .map(|d| d["k"].as_str())
                .unwrap_or("no data")
        )
    }

    fn names(evs: &[Event<ConfigMap>]) -> Vec<String> {
        evs.iter()
            .map(|e| match e {
                Event::InitApply(o) | Event::Apply(o) => format!("apply {}", label(o)),
                Event::Delete(o) => format!("delete {}", label(o)),
                Event::Init => "init".into(),
                Event::InitDone => "initdone".into(),
            })
            .collect()
    }

    fn uids_in(s: ShardCount) -> (String, String) {
        let uids: Vec<String> = (0..64).map(|i| format!("{i}-uid")).collect();
        let in0 = uids.iter().find(|u| shard_of(u, s) == 0).unwrap().clone();
        let in1 = uids.iter().find(|u| shard_of(u, s) == 1).unwrap().clone();
        (in0, in1)
    }

    /// A reflecting consumer holding object `a` (in shard 0 of 2) after the initial sync: its uid, the
    /// consumer and the index.
    fn one_object_synced() -> (String, Reflecting, Index<ConfigMap>) {
        let s = ShardCount::new(2).unwrap();
        let (in0, _) = uids_in(s);
        let (mut consumer, mut ix) = Reflecting::new(s);
        ix.set_projected([0, 1]);
        ix.upsert(with_data("a", &in0, 1));
        ix.initialize();
        consumer.consume(&mut ix);
        (in0, consumer, ix)
    }

    fn stored(consumer: &Reflecting) -> Vec<String> {
        consumer.store().iter().map(label).collect()
    }

    #[test]
    fn reflector_mode_hands_objects_over_and_takes_them_back() {
        let s = ShardCount::new(2).unwrap();
        let (in0, in1) = uids_in(s);
        let (mut consumer, mut ix) = Reflecting::new(s);
        ix.set_projected([0, 1]);
        ix.upsert(with_data("a", &in0, 1));
        ix.initialize();
        assert!(ix.has_pending_handover());
        ix.confirm_handover();
        assert_eq!(ix.handed_over(), 0, "not applied yet: the copy stays");
        consumer.consume(&mut ix);
        ix.confirm_handover();
        assert_eq!(ix.handed_over(), 1, "the store holds it: one copy only");
        // unprojecting it (fallback keeps the cache) takes the object back and deletes it whole
        ix.set_projected([1]);
        assert_eq!(
            names(&consumer.consume(&mut ix)),
            [format!("delete a {in0}@1")]
        );
        assert_eq!(ix.handed_over(), 0);
        assert_eq!(ix.len(), 1);
        // name reuse: the old uid is handed over, a newer uid replaces it, then the newer one is deleted
        ix.set_projected([0, 1]);
        consumer.consume(&mut ix);
        assert_eq!(ix.handed_over(), 1);
        ix.upsert(with_data("a", &in1, 5));
        assert_eq!(
            names(&consumer.consume(&mut ix)),
            [format!("apply a {in1}@5")]
        );
        ix.delete(with_data("a", &in1, 6));
        assert_eq!(
            names(&consumer.consume(&mut ix)),
            [format!("apply a {in0}@1")],
            "the old uid comes back whole"
        );
        assert_eq!(stored(&consumer), [format!("a {in0}@1")]);
        assert_eq!(
            ix.handed_over(),
            ix.entries.values().filter(|e| e.obj.is_none()).count(),
            "the counter follows the entries"
        );
    }

    /// An object changed after the initial sync reaches a reflecting consumer without being copied: the
    /// event it yields carries the very allocations the index was given, and while the object waits the
    /// index holds no copy of it.
    #[test]
    fn an_apply_to_a_reflecting_consumer_moves_the_object_without_a_copy() {
        let s = ShardCount::new(2).unwrap();
        let (in0, _) = uids_in(s);
        let (mut consumer, mut ix) = Reflecting::new(s);
        ix.set_projected([0, 1]);
        ix.initialize();
        consumer.consume(&mut ix);
        let obj = with_data("a", &in0, 2);
        let given = obj.data.as_ref().unwrap()["k"].as_ptr();
        ix.upsert(obj);
        assert_eq!(ix.handed_over(), 1, "waiting: the index holds no copy");
        assert!(!ix.has_pending_handover(), "nothing to confirm later");
        let seen = consumer.consume(&mut ix);
        let [Event::Apply(got)] = &seen[..] else {
            panic!("{:?}", names(&seen))
        };
        assert_eq!(
            got.data.as_ref().unwrap()["k"].as_ptr(),
            given,
            "moved, not copied"
        );
        assert_eq!(consumer.handover.len(), 0);
        assert_eq!(stored(&consumer), [format!("a {in0}@2")]);
    }

    /// A shard released while its object still waits for the consumer: the index takes the object back
    /// whole (it is served again on regain), and the consumer ends without it.
    #[test]
    fn an_object_released_before_the_consumer_took_it_is_taken_back_whole() {
        let (in0, mut consumer, mut ix) = one_object_synced();
        ix.upsert(with_data("a", &in0, 2));
        ix.set_projected([1]);
        assert_eq!(ix.handed_over(), 0, "taken back");
        assert_eq!(consumer.handover.len(), 0, "nothing waits any more");
        assert_eq!(
            names(&consumer.consume(&mut ix)),
            [format!("delete a {in0}@2")]
        );
        assert!(consumer.store().is_empty());
        ix.set_projected([0, 1]);
        assert_eq!(
            names(&consumer.consume(&mut ix)),
            [format!("apply a {in0}@2")]
        );
        assert_eq!(stored(&consumer), [format!("a {in0}@2")]);
    }

    /// Deleted while a newer version still waits: the consumer ends without the object and nothing is
    /// left waiting.
    #[test]
    fn a_deletion_leaves_nothing_waiting() {
        let (in0, mut consumer, mut ix) = one_object_synced();
        ix.upsert(with_data("a", &in0, 2));
        ix.upsert(with_data("a", &in0, 3));
        ix.delete(with_data("a", &in0, 4));
        assert_eq!(consumer.handover.len(), 0);
        let seen = names(&consumer.consume(&mut ix));
        assert_eq!(seen.last(), Some(&format!("delete a {in0}@4")), "{seen:?}");
        assert!(consumer.store().is_empty());
        assert_eq!(ix.handed_over(), 0);
    }

    /// Random updates, deletions, name reuse and shard changes, with the consumer taking only part of
    /// the output between steps: once it has taken everything, its store holds exactly the index's
    /// projection — every object whole, at its newest version — nothing waits in a slot, and the handed
    /// counter follows the entries.
    #[test]
    fn a_reflecting_consumer_always_ends_with_the_projection() {
        let s = ShardCount::new(4).unwrap();
        for seed in 0..300u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut next = |n: u64| {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                rng % n
            };
            let (mut consumer, mut ix) = Reflecting::new(s);
            let mut outq = crate::watcher::outq::OutQueue::default();
            let mut channel = VecDeque::new();
            ix.set_projected(all(s));
            let mut rv = 1;
            // (name, uid generation): a deletion makes the next write of the name a new uid
            let mut generation = [0u64; 6];
            for step in 0..120 {
                rv += 1;
                let name = next(6) as usize;
                let uid = format!("n{name}-g{}", generation[name]);
                match next(10) {
                    0..=4 => ix.upsert(with_data(&format!("o{name}"), &uid, rv)),
                    5 => {
                        ix.delete(with_data(&format!("o{name}"), &uid, rv));
                        generation[name] += 1;
                    }
                    6 => {
                        // a recreate seen before the deletion of the old uid
                        generation[name] += 1;
                        let new = format!("n{name}-g{}", generation[name]);
                        ix.upsert(with_data(&format!("o{name}"), &new, rv));
                    }
                    7 | 8 => ix.set_projected((0..4).filter(|_| next(3) > 0)),
                    _ if step > 10 => ix.initialize(),
                    _ => {}
                }
                // as the manager and the event stream: the index's output into the coalescing queue,
                // some of that into the channel, and some of the channel taken by the consumer
                while let Some(item) = ix.pop() {
                    outq.push(item);
                }
                for _ in 0..next(4) {
                    match outq.pop() {
                        Some(item) => channel.push_back(item),
                        None => break,
                    }
                }
                for _ in 0..next(4) {
                    match channel.pop_front() {
                        Some(item) => drop(consumer.take(item)),
                        None => break,
                    }
                }
                ix.confirm_handover();
            }
            ix.initialize();
            while let Some(item) = ix.pop() {
                outq.push(item);
            }
            for item in channel.drain(..).chain(std::iter::from_fn(|| outq.pop())) {
                consumer.take(item);
            }
            let want: Vec<String> = ix
                .names
                .keys()
                .filter_map(|k| ix.winner(k))
                .map(|u| {
                    let e = &ix.entries[&u];
                    label(&ix.object_of(&u).unwrap_or_else(|| {
                        panic!(
                            "seed {seed}: the index cannot read {u}@{:?} (own {}), store {:?}, slots {}",
                            e.rv,
                            e.obj.is_some(),
                            stored(&consumer),
                            consumer.handover.len()
                        )
                    }))
                })
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let have: Vec<String> = consumer.store().iter().map(label).collect();
            assert_eq!(have, want, "seed {seed}");
            assert_eq!(consumer.handover.len(), 0, "seed {seed}: left waiting");
            assert_eq!(
                ix.handed_over(),
                ix.entries.values().filter(|e| e.obj.is_none()).count(),
                "seed {seed}"
            );
            for (uid, e) in &ix.entries {
                if let Some(o) = &e.obj {
                    assert_eq!(
                        label(o),
                        format!("{} {uid}@{}", e.key.1, e.rv.unwrap()),
                        "seed {seed}"
                    );
                }
            }
        }
    }
}
