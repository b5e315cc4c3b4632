//! Secondary caches: children and referenced objects placed by the **dependency-key map**, so they move
//! with their parents.
//!
//! A secondary watcher is a sharded watcher with [`StreamRole::Secondary`](super::StreamRole::Secondary)
//! whose objects are placed by a [`Dependency`] instead of their own uid: the namespace key, the controller
//! ownerReference, the `kube-shard.io/shard` label, or the primaries that reference them through a
//! [`DependencyMap`] the primary watcher feeds. It projects Incoming and Activating shards too, so a child
//! is in its store before its parent's activation.
//!
//! See `docs/secondary-caches.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Debug};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::ObjectRef;
use kube::Resource;
use tokio::sync::watch;

use super::depkey::{self, LABEL_MAX_SHARDS};
use super::index::{Observed, Observer, Placement};
use super::types::RefKey;
use crate::hash::{fnv1a64, ShardKey};
use crate::ownership::OwnershipConfig;
use crate::shard::ShardCount;

fn ref_key<K: Resource>(obj: &K) -> RefKey {
    let m = obj.meta();
    (m.namespace.clone(), m.name.clone().unwrap_or_default())
}

fn object_ref_key<P: Resource>(r: &ObjectRef<P>) -> RefKey {
    (r.namespace.clone(), r.name.clone())
}

#[derive(Default)]
struct Primary {
    key: RefKey,
    shards: Vec<u32>,
    refs: Vec<RefKey>,
}

#[derive(Default)]
struct MapState {
    primaries: BTreeMap<Arc<str>, Primary>,
    /// primary name → uid → shards (a name may have two uids while it is re-created)
    by_name: BTreeMap<RefKey, BTreeMap<Arc<str>, Vec<u32>>>,
    /// referenced secondary name → the uids of the primaries that reference it
    referrers: BTreeMap<RefKey, BTreeSet<Arc<str>>>,
    warm: BTreeMap<(u32, u64), u64>,
    activated: BTreeMap<(u32, u64), u64>,
    /// Names whose placement inputs changed, by map version (bounded; complete above `log_floor`).
    log: std::collections::VecDeque<(u64, Changed)>,
    log_floor: u64,
}

/// A name whose placement input changed.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Changed {
    /// A referenced (secondary) name whose referrers changed.
    Referenced(RefKey),
    /// A primary name whose uid or shards changed.
    Primary(RefKey),
}

/// At most this many name changes are remembered for targeted re-placement; a secondary
/// watcher further behind re-places everything.
const LOG_CAP: usize = 8192;

/// The references of a primary (type-erased: the primary type is `P` of the owning [`DependencyMap`]).
type ErasedRefs = Arc<dyn Fn(&dyn std::any::Any) -> Vec<RefKey> + Send + Sync>;

/// The type-erased shared state of a [`DependencyMap`].
pub(crate) struct MapShared {
    state: Mutex<MapState>,
    version: watch::Sender<u64>,
    refs: Option<ErasedRefs>,
}

impl MapShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, MapState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bump(&self) -> u64 {
        let mut v = 0;
        self.version.send_modify(|x| {
            *x += 1;
            v = *x;
        });
        v
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// The map version at which the primaries of `shard` were read for move `move_id`.
    pub(crate) fn warm_at(&self, shard: u32, move_id: u64) -> Option<u64> {
        self.lock().warm.get(&(shard, move_id)).copied()
    }

    /// The map version at which the primaries of `shard` passed the activation barrier of `epoch`.
    pub(crate) fn activated_at(&self, shard: u32, epoch: u64) -> Option<u64> {
        self.lock().activated.get(&(shard, epoch)).copied()
    }

    pub(crate) fn primary_warm(&self, shard: u32, move_id: u64) {
        let mut st = self.lock();
        let v = self.bump();
        st.warm.retain(|(s, _), _| *s != shard);
        st.warm.insert((shard, move_id), v);
    }

    pub(crate) fn primary_activated(&self, shard: u32, epoch: u64) {
        let mut st = self.lock();
        let v = self.bump();
        st.activated.retain(|(s, _), _| *s != shard);
        st.activated.insert((shard, epoch), v);
    }

    /// The referenced names whose referrers changed after version `seen` (up to the current version), or
    /// `None` when the log no longer reaches back that far.
    pub(crate) fn changed_since(&self, seen: u64) -> Option<Vec<RefKey>> {
        self.changes(seen, false)
    }

    /// The primary names whose uid or shards changed after version `seen`, or `None` (too far behind).
    pub(crate) fn primaries_changed_since(&self, seen: u64) -> Option<Vec<RefKey>> {
        self.changes(seen, true)
    }

    fn changes(&self, seen: u64, primaries: bool) -> Option<Vec<RefKey>> {
        let st = self.lock();
        if seen < st.log_floor {
            return None;
        }
        let mut keys: Vec<RefKey> = st
            .log
            .iter()
            .filter(|(v, _)| *v > seen)
            .filter_map(|(_, c)| match (c, primaries) {
                (Changed::Referenced(k), false) | (Changed::Primary(k), true) => Some(k.clone()),
                _ => None,
            })
            .collect();
        keys.sort();
        keys.dedup();
        Some(keys)
    }

    fn log_locked(&self, st: &mut MapState, affected: Vec<Changed>) {
        let v = self.bump();
        for k in affected {
            st.log.push_back((v, k));
        }
        while st.log.len() > LOG_CAP {
            if let Some((v, _)) = st.log.pop_front() {
                st.log_floor = st.log_floor.max(v);
            }
        }
    }

    fn upsert(&self, uid: &str, key: RefKey, shards: &[u32], refs: Vec<RefKey>) {
        {
            let mut st = self.lock();
            let uid: Arc<str> = Arc::from(uid);
            let same = st
                .primaries
                .get(&uid)
                .is_some_and(|p| p.key == key && p.shards == shards && p.refs == refs);
            if !same {
                let old = st.primaries.get(&uid);
                let placed_same = old.is_some_and(|p| p.key == key && p.shards == shards);
                let mut affected: Vec<Changed> = old
                    .map(|p| p.refs.iter().cloned().map(Changed::Referenced).collect())
                    .unwrap_or_default();
                if !placed_same {
                    if let Some(p) = old {
                        affected.push(Changed::Primary(p.key.clone()));
                    }
                    affected.push(Changed::Primary(key.clone()));
                }
                affected.extend(refs.iter().cloned().map(Changed::Referenced));
                Self::remove_locked(&mut st, &uid);
                st.by_name
                    .entry(key.clone())
                    .or_default()
                    .insert(uid.clone(), shards.to_vec());
                for r in &refs {
                    st.referrers
                        .entry(r.clone())
                        .or_default()
                        .insert(uid.clone());
                }
                st.primaries.insert(
                    uid,
                    Primary {
                        key,
                        shards: shards.to_vec(),
                        refs,
                    },
                );
                self.log_locked(&mut st, affected);
            }
        }
    }

    /// Forget every primary (the feeding watcher stopped).
    pub(crate) fn clear(&self) {
        let mut st = self.lock();
        let uids: Vec<Arc<str>> = st.primaries.keys().cloned().collect();
        let mut affected = Vec::new();
        for uid in uids {
            if let Some(p) = st.primaries.get(&uid) {
                affected.extend(p.refs.iter().cloned().map(Changed::Referenced));
                affected.push(Changed::Primary(p.key.clone()));
            }
            Self::remove_locked(&mut st, &uid);
        }
        if !affected.is_empty() {
            self.log_locked(&mut st, affected);
        }
    }

    fn remove(&self, uid: &str) {
        let mut st = self.lock();
        let uid: Arc<str> = Arc::from(uid);
        let affected = st.primaries.get(&uid).map(|p| {
            let mut a: Vec<Changed> = p.refs.iter().cloned().map(Changed::Referenced).collect();
            a.push(Changed::Primary(p.key.clone()));
            a
        });
        if let Some(affected) = affected {
            Self::remove_locked(&mut st, &uid);
            self.log_locked(&mut st, affected);
        }
    }

    fn remove_locked(st: &mut MapState, uid: &Arc<str>) -> bool {
        let Some(p) = st.primaries.remove(uid) else {
            return false;
        };
        if let Some(m) = st.by_name.get_mut(&p.key) {
            m.remove(uid);
            if m.is_empty() {
                st.by_name.remove(&p.key);
            }
        }
        for r in &p.refs {
            if let Some(set) = st.referrers.get_mut(r) {
                set.remove(uid);
                if set.is_empty() {
                    st.referrers.remove(r);
                }
            }
        }
        true
    }

    fn shards_of_names(&self, names: &[RefKey]) -> Vec<u32> {
        let st = self.lock();
        let mut out: Vec<u32> = names
            .iter()
            .filter_map(|n| st.by_name.get(n))
            .flat_map(|m| m.values().flatten().copied())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn shards_of_referenced(&self, name: &RefKey) -> Vec<u32> {
        let st = self.lock();
        let mut out: Vec<u32> = st
            .referrers
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|u| st.primaries.get(u))
            .flat_map(|p| p.shards.iter().copied())
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn referrers_of(&self, name: &RefKey) -> Vec<RefKey> {
        let st = self.lock();
        let mut out: Vec<RefKey> = st
            .referrers
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|u| st.primaries.get(u))
            .map(|p| p.key.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// The dependency-key map of one primary type `P`: every primary the member reads (name, uid, shard, and
/// the secondaries it references), fed by the primary watcher
/// ([`ShardedWatcher::feeds`](super::ShardedWatcher::feeds)) and read by secondary watchers placed with
/// [`Dependency::mapped`] or [`Dependency::referenced_by`]. Cheap to clone.
///
/// Memory: per primary read, its uid, name, shard and referenced names (≈ 150 bytes plus the names).
/// CPU: a primary change that moves a name, a shard or a reference re-places only the secondaries it
/// concerns (the referenced names; for a mapper, the secondaries whose last answer named that primary —
/// a reverse index of one entry per held secondary); a watcher more than 8192 changes behind re-places
/// everything once. Status-only primary updates cost one hash lookup and re-place nothing.
pub struct DependencyMap<P> {
    shared: Arc<MapShared>,
    _p: PhantomData<fn(&P)>,
}

impl<P> Clone for DependencyMap<P> {
    fn clone(&self) -> Self {
        DependencyMap {
            shared: self.shared.clone(),
            _p: PhantomData,
        }
    }
}

impl<P> Debug for DependencyMap<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.shared.lock();
        f.debug_struct("DependencyMap")
            .field("primaries", &st.primaries.len())
            .field("referenced", &st.referrers.len())
            .finish()
    }
}

impl<P: Resource + 'static> Default for DependencyMap<P> {
    fn default() -> Self {
        Self::new()
    }
}

impl<P: Resource + 'static> DependencyMap<P> {
    /// A map of primary names to their shards (for [`Dependency::mapped`]: secondary → primary refs).
    #[must_use]
    pub fn new() -> Self {
        DependencyMap {
            shared: Arc::new(MapShared {
                state: Mutex::default(),
                version: watch::Sender::new(0),
                refs: None,
            }),
            _p: PhantomData,
        }
    }

    /// A map that also records which secondaries each primary references (for
    /// [`Dependency::referenced_by`]: a primary naming the object it depends on, such as a session that
    /// points at its deployment). `refs` runs on every primary the member reads.
    #[must_use]
    pub fn with_references<S: Resource>(
        refs: impl Fn(&P) -> Vec<ObjectRef<S>> + Send + Sync + 'static,
    ) -> Self {
        let erased = move |any: &dyn std::any::Any| -> Vec<RefKey> {
            any.downcast_ref::<P>()
                .map(|p| {
                    let mut v: Vec<RefKey> = refs(p).iter().map(object_ref_key).collect();
                    v.sort();
                    v.dedup();
                    v
                })
                .unwrap_or_default()
        };
        DependencyMap {
            shared: Arc::new(MapShared {
                state: Mutex::default(),
                version: watch::Sender::new(0),
                refs: Some(Arc::new(erased)),
            }),
            _p: PhantomData,
        }
    }

    /// Number of primaries in the map.
    #[must_use]
    pub fn len(&self) -> usize {
        self.shared.lock().primaries.len()
    }

    /// Whether the map holds no primary.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The primaries that reference `secondary` (the re-enqueue rule of `Controller::watches_stream`: a
    /// referenced object's event reconciles its referrers).
    pub fn referrers<S: Resource>(&self, secondary: &S) -> Vec<ObjectRef<P>>
    where
        P::DynamicType: Default,
    {
        self.shared
            .referrers_of(&ref_key(secondary))
            .into_iter()
            .map(|(ns, name)| {
                let r = ObjectRef::new(&name);
                match ns {
                    Some(ns) => r.within(&ns),
                    None => r,
                }
            })
            .collect()
    }

    /// The observer the primary watcher's index calls.
    pub(crate) fn observer(&self) -> (Arc<MapShared>, Observer<P>) {
        let shared = self.shared.clone();
        let observer: Observer<P> = Arc::new(move |change: Observed<'_, P>| match change {
            Observed::Upsert { uid, obj, shards } => {
                let refs = shared
                    .refs
                    .as_ref()
                    .map(|f| f(obj as &dyn std::any::Any))
                    .unwrap_or_default();
                shared.upsert(uid, ref_key(obj), shards, refs);
            }
            Observed::Remove { uid } => shared.remove(uid),
        });
        (self.shared.clone(), observer)
    }
}

type Mapper<K> = Arc<dyn Fn(&K) -> Vec<RefKey> + Send + Sync>;

/// What a secondary watcher re-places when its map changed after a version: `None` = everything.
pub(crate) type ChangedFn = Arc<dyn Fn(u64) -> Option<Vec<RefKey>> + Send + Sync>;

/// The mapper's last answers, reversed: which held secondaries name a primary (so a primary change
/// re-places only them). Edges are replaced at every placement and dropped when the index forgets a uid.
#[derive(Default)]
struct Reverse {
    /// secondary uid → (its name, the primary names it maps to)
    by_secondary: BTreeMap<Arc<str>, (RefKey, Vec<RefKey>)>,
    /// primary name → secondary uids naming it
    by_primary: BTreeMap<RefKey, BTreeSet<Arc<str>>>,
}

impl Reverse {
    fn set(&mut self, uid: &str, own: RefKey, names: &[RefKey]) {
        if self
            .by_secondary
            .get(uid)
            .is_some_and(|(k, n)| *k == own && n == names)
        {
            return;
        }
        self.remove(uid);
        let uid: Arc<str> = Arc::from(uid);
        for n in names {
            self.by_primary
                .entry(n.clone())
                .or_default()
                .insert(uid.clone());
        }
        self.by_secondary.insert(uid, (own, names.to_vec()));
    }

    fn remove(&mut self, uid: &str) {
        if let Some((_, names)) = self.by_secondary.remove(uid) {
            for n in names {
                if let Some(set) = self.by_primary.get_mut(&n) {
                    set.remove(uid);
                    if set.is_empty() {
                        self.by_primary.remove(&n);
                    }
                }
            }
        }
    }

    /// The names of the held secondaries that map to any of `primaries`.
    fn secondaries_of(&self, primaries: &[RefKey]) -> Vec<RefKey> {
        let mut out: Vec<RefKey> = primaries
            .iter()
            .filter_map(|p| self.by_primary.get(p))
            .flatten()
            .filter_map(|u| self.by_secondary.get(u))
            .map(|(k, _)| k.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

enum Kind<K> {
    SameKey,
    ControllerOwner,
    ShardLabel,
    ShardLabelOrOwner,
    Mapped(Arc<MapShared>, Mapper<K>),
    Referenced(Arc<MapShared>),
}

/// Where a secondary object belongs: the dependency-key map strategy of a secondary watcher
/// ([`ShardedWatcher::dependent`](super::ShardedWatcher::dependent)).
pub struct Dependency<K> {
    kind: Kind<K>,
}

impl<K> Debug for Dependency<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match &self.kind {
            Kind::SameKey => "same_key",
            Kind::ControllerOwner => "controller_owner",
            Kind::ShardLabel => "shard_label",
            Kind::ShardLabelOrOwner => "shard_label_or_owner",
            Kind::Mapped(..) => "mapped",
            Kind::Referenced(..) => "referenced_by",
        };
        f.debug_tuple("Dependency").field(&name).finish()
    }
}

impl<K: Resource + 'static> Dependency<K> {
    /// The group key itself (`namespace`): children share their parent's namespace, so the server filters
    /// them with the same `shardSelector` as the parents. Read amplification ≈ 1.
    #[must_use]
    pub fn same_key() -> Self {
        Dependency {
            kind: Kind::SameKey,
        }
    }

    /// The controller ownerReference: a child belongs to its owner's shard (FNV-1a of the owner's uid).
    /// The server cannot filter by it: every member reads the whole collection (narrow it with a label
    /// selector in the `watcher::Config`) and filters locally. Under the `namespace` key this is
    /// [`same_key`](Self::same_key) (an owner and its namespaced children share a namespace).
    #[must_use]
    pub fn controller_owner() -> Self {
        Dependency {
            kind: Kind::ControllerOwner,
        }
    }

    /// The shard label `kube-shard.io/shard=<n>` (stamped with
    /// [`stamp_shard_label`](super::depkey::stamp_shard_label) on the children the operator creates),
    /// read with the set-based label selector `kube-shard.io/shard in (...)` of the shards read: filtered by
    /// every apiserver. Unlabelled children are not read: migrate with
    /// [`shard_label_or_owner`](Self::shard_label_or_owner) first. At most
    /// [`LABEL_MAX_SHARDS`] shards.
    #[must_use]
    pub fn shard_label() -> Self {
        Dependency {
            kind: Kind::ShardLabel,
        }
    }

    /// The labelling migration: the shard label where present, else the controller ownerReference (full
    /// watch, local filter). Switch to [`shard_label`](Self::shard_label) once every child is labelled.
    #[must_use]
    pub fn shard_label_or_owner() -> Self {
        Dependency {
            kind: Kind::ShardLabelOrOwner,
        }
    }

    /// A user mapper: the primaries a secondary belongs to (like `Controller::watches`' mapper), resolved to
    /// their shards through `map`, which the primary watcher feeds; re-evaluated as primaries change.
    pub fn mapped<P: Resource + 'static>(
        map: &DependencyMap<P>,
        mapper: impl Fn(&K) -> Vec<ObjectRef<P>> + Send + Sync + 'static,
    ) -> Self {
        let mapper: Mapper<K> =
            Arc::new(move |k: &K| mapper(k).iter().map(object_ref_key).collect());
        Dependency {
            kind: Kind::Mapped(map.shared.clone(), mapper),
        }
    }

    /// The primaries that reference this secondary by name (recorded by
    /// [`DependencyMap::with_references`]): a referenced object belongs to every shard of a referrer.
    #[must_use]
    pub fn referenced_by<P: Resource + 'static>(map: &DependencyMap<P>) -> Self {
        Dependency {
            kind: Kind::Referenced(map.shared.clone()),
        }
    }
}

/// A secondary watcher cannot be built as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DependentError {
    /// `same_key` needs the `namespace` group key: a child's own uid is not its parent's.
    #[error("Dependency::same_key needs the namespace shard key (the group shards by uid): use controller_owner, shard_label or a mapper")]
    SameKeyNeedsNamespace,
    /// The shard label strategy is limited to [`LABEL_MAX_SHARDS`] shards (label selector length).
    #[error("the shard label strategy supports at most {max} shards (the group has {shards}): the label selector would exceed common URL limits")]
    TooManyShardsForLabel {
        /// The group's shard count.
        shards: u32,
        /// The limit.
        max: u32,
    },
}

/// What the builder sets for a dependency.
pub(crate) struct DependentSettings<K> {
    pub(crate) placement: Option<Placement<K>>,
    pub(crate) local_only: bool,
    pub(crate) shard_label: bool,
    pub(crate) depends: Option<Arc<MapShared>>,
    /// What to re-place after a map change (`None`: everything).
    pub(crate) changed: Option<ChangedFn>,
    /// Told of the index's changes (the mapper's reverse edges).
    pub(crate) observer: Option<Observer<K>>,
}

fn hashes_of(count: ShardCount, shards: &[u32]) -> Vec<u64> {
    shards
        .iter()
        .filter_map(|s| depkey::shard_hash(count, *s))
        .collect()
}

impl<K: Resource + Send + Sync + 'static> Dependency<K> {
    pub(crate) fn settings(
        self,
        config: &OwnershipConfig,
    ) -> Result<DependentSettings<K>, DependentError> {
        let (key, count) = (config.key, config.shards);
        let none = |placement: Option<Placement<K>>| DependentSettings {
            placement,
            local_only: true,
            shard_label: false,
            depends: None,
            changed: None,
            observer: None,
        };
        Ok(match self.kind {
            Kind::SameKey if key == ShardKey::Namespace => DependentSettings {
                placement: None,
                local_only: false,
                shard_label: false,
                depends: None,
                changed: None,
                observer: None,
            },
            Kind::SameKey => return Err(DependentError::SameKeyNeedsNamespace),
            Kind::ControllerOwner if key == ShardKey::Namespace => {
                return Dependency::<K>::same_key().settings(config)
            }
            Kind::ControllerOwner => none(Some(Arc::new(|k: &K| {
                depkey::owner_hash(k.meta()).into_iter().collect()
            }))),
            Kind::ShardLabel => {
                if count.get() > LABEL_MAX_SHARDS {
                    return Err(DependentError::TooManyShardsForLabel {
                        shards: count.get(),
                        max: LABEL_MAX_SHARDS,
                    });
                }
                DependentSettings {
                    placement: Some(Arc::new(move |k: &K| {
                        depkey::labelled_shard(k.meta(), count)
                            .and_then(|s| depkey::shard_hash(count, s))
                            .into_iter()
                            .collect()
                    })),
                    local_only: false,
                    shard_label: true,
                    depends: None,
                    changed: None,
                    observer: None,
                }
            }
            Kind::ShardLabelOrOwner => {
                none(Some(Arc::new(move |k: &K| {
                    match depkey::labelled_shard(k.meta(), count) {
                        Some(s) => depkey::shard_hash(count, s).into_iter().collect(),
                        None => depkey::owner_hash(k.meta()).into_iter().collect(),
                    }
                })))
            }
            Kind::Mapped(map, mapper) => {
                let reverse: Arc<Mutex<Reverse>> = Arc::default();
                let (m, r) = (map.clone(), reverse.clone());
                let mut s = none(Some(Arc::new(move |k: &K| {
                    let names = mapper(k);
                    if let Some(uid) = k.meta().uid.as_deref() {
                        r.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .set(uid, ref_key(k), &names);
                    }
                    hashes_of(count, &m.shards_of_names(&names))
                })));
                let (m, r) = (map.clone(), reverse.clone());
                s.changed = Some(Arc::new(move |seen| {
                    let primaries = m.primaries_changed_since(seen)?;
                    Some(
                        r.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .secondaries_of(&primaries),
                    )
                }));
                s.observer = Some(Arc::new(move |c: Observed<'_, K>| {
                    if let Observed::Remove { uid } = c {
                        reverse
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(uid);
                    }
                }));
                s.depends = Some(map);
                s
            }
            Kind::Referenced(map) => {
                let m = map.clone();
                let mut s = none(Some(Arc::new(move |k: &K| {
                    hashes_of(count, &m.shards_of_referenced(&ref_key(k)))
                })));
                let m = map.clone();
                s.changed = Some(Arc::new(move |seen| m.changed_since(seen)));
                s.depends = Some(map);
                s
            }
        })
    }
}

/// The shard of a child's controller owner, for `Controller::owns_stream` users who want to check it.
#[must_use]
pub fn owner_shard<K: Resource>(child: &K, count: ShardCount) -> Option<u32> {
    depkey::controller_owner_uid(child.meta()).map(|u| count.shard_of(fnv1a64(u.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;

    fn job(name: &str, dep: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            data: Some([("deployment".to_owned(), dep.to_owned())].into()),
            ..ConfigMap::default()
        }
    }

    fn key(name: &str) -> RefKey {
        (Some("ns".into()), name.into())
    }

    fn map() -> (DependencyMap<ConfigMap>, Observer<ConfigMap>) {
        let map = DependencyMap::<ConfigMap>::with_references(|j: &ConfigMap| {
            vec![ObjectRef::<ConfigMap>::new(&j.data.as_ref().unwrap()["deployment"]).within("ns")]
        });
        let (_, obs) = map.observer();
        (map, obs)
    }

    #[test]
    fn references_place_a_secondary_in_every_referrers_shard() {
        let (map, obs) = map();
        let v0 = *map.shared.subscribe().borrow();
        obs(Observed::Upsert {
            uid: "u1",
            obj: &job("j1", "d"),
            shards: &[3],
        });
        obs(Observed::Upsert {
            uid: "u2",
            obj: &job("j2", "d"),
            shards: &[7],
        });
        obs(Observed::Upsert {
            uid: "u3",
            obj: &job("j3", "e"),
            shards: &[7],
        });
        assert_eq!(map.shared.shards_of_referenced(&key("d")), [3, 7]);
        assert_eq!(map.shared.shards_of_referenced(&key("e")), [7]);
        assert_eq!(
            map.shared.shards_of_referenced(&key("x")),
            Vec::<u32>::new()
        );
        let referrers: Vec<String> = map
            .referrers(&job("d", ""))
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(referrers, ["j1", "j2"]);
        let v1 = *map.shared.subscribe().borrow();
        assert!(v1 > v0);
        // a status-only update changes nothing: no new version
        obs(Observed::Upsert {
            uid: "u1",
            obj: &job("j1", "d"),
            shards: &[3],
        });
        assert_eq!(*map.shared.subscribe().borrow(), v1);
        // the reference changes; a referrer goes away
        obs(Observed::Upsert {
            uid: "u1",
            obj: &job("j1", "e"),
            shards: &[3],
        });
        obs(Observed::Remove { uid: "u2" });
        assert_eq!(
            map.shared.shards_of_referenced(&key("d")),
            Vec::<u32>::new()
        );
        assert_eq!(map.shared.shards_of_referenced(&key("e")), [3, 7]);
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn the_change_log_names_what_to_re_place() {
        let (map, obs) = map();
        obs(Observed::Upsert {
            uid: "u1",
            obj: &job("j1", "d"),
            shards: &[3],
        });
        let v = *map.shared.subscribe().borrow();
        assert_eq!(map.shared.changed_since(0), Some(vec![key("d")]));
        assert_eq!(map.shared.changed_since(v), Some(vec![]));
        obs(Observed::Upsert {
            uid: "u1",
            obj: &job("j1", "e"),
            shards: &[3],
        });
        assert_eq!(
            map.shared.changed_since(v),
            Some(vec![key("d"), key("e")]),
            "old and new reference"
        );
        let v = *map.shared.subscribe().borrow();
        obs(Observed::Upsert {
            uid: "u1",
            obj: &job("j1", "e"),
            shards: &[4],
        });
        assert_eq!(
            map.shared.changed_since(v),
            Some(vec![key("e")]),
            "the referrer moved"
        );
        // far behind: everything
        for i in 0..LOG_CAP + 1 {
            obs(Observed::Upsert {
                uid: "u1",
                obj: &job("j1", &format!("x{i}")),
                shards: &[4],
            });
        }
        assert_eq!(map.shared.changed_since(v), None);
    }

    #[test]
    fn a_mapper_re_places_only_the_secondaries_naming_a_changed_primary() {
        let (map, obs) = map();
        let cfg = OwnershipConfig::new(ShardCount::new(16).unwrap(), ShardKey::Uid);
        let d = Dependency::<ConfigMap>::mapped(&map, |n: &ConfigMap| {
            vec![ObjectRef::new(&n.data.as_ref().unwrap()["for"]).within("ns")]
        })
        .settings(&cfg)
        .unwrap();
        let (place, changed, observer) = (
            d.placement.unwrap(),
            d.changed.unwrap(),
            d.observer.unwrap(),
        );
        let note = |name: &str, uid: &str, primary: &str| {
            let mut n = job(name, "");
            n.metadata.uid = Some(uid.into());
            n.data = Some([("for".to_owned(), primary.to_owned())].into());
            n
        };
        let version = || *map.shared.subscribe().borrow();
        obs(Observed::Upsert {
            uid: "u1",
            obj: &job("j1", "d"),
            shards: &[3],
        });
        let s16 = ShardCount::new(16).unwrap();
        let shards = |h: Vec<u64>| h.into_iter().map(|h| s16.shard_of(h)).collect::<Vec<_>>();
        assert_eq!(shards(place(&note("n1", "s1", "j1"))), [3]);
        assert_eq!(
            shards(place(&note("n2", "s2", "j2"))),
            Vec::<u32>::new(),
            "no such primary yet"
        );
        let v = version();
        obs(Observed::Upsert {
            uid: "u2",
            obj: &job("j2", "d"),
            shards: &[5],
        });
        assert_eq!(changed(v), Some(vec![key("n2")]), "only the note naming j2");
        let v = version();
        obs(Observed::Upsert {
            uid: "u2",
            obj: &job("j2", "e"),
            shards: &[5],
        });
        assert_eq!(
            changed(v),
            Some(vec![]),
            "a reference change does not move j2"
        );
        observer(Observed::Remove { uid: "s2" });
        let v = version();
        obs(Observed::Upsert {
            uid: "u2",
            obj: &job("j2", "e"),
            shards: &[6],
        });
        assert_eq!(changed(v), Some(vec![]), "the note is gone");
        obs(Observed::Remove { uid: "u1" });
        assert_eq!(changed(v), Some(vec![key("n1")]));
    }

    #[test]
    fn clearing_forgets_every_primary() {
        let (map, obs) = map();
        obs(Observed::Upsert {
            uid: "u1",
            obj: &job("j1", "d"),
            shards: &[3],
        });
        let v = *map.shared.subscribe().borrow();
        map.shared.clear();
        assert!(map.is_empty());
        assert_eq!(
            map.shared.shards_of_referenced(&key("d")),
            Vec::<u32>::new()
        );
        assert_eq!(map.shared.changed_since(v), Some(vec![key("d")]));
        assert_eq!(map.shared.primaries_changed_since(v), Some(vec![key("j1")]));
    }

    #[test]
    fn names_resolve_to_every_live_uid() {
        let (map, obs) = map();
        // a delete-and-recreate under one name: both uids while both are held
        obs(Observed::Upsert {
            uid: "old",
            obj: &job("j", "d"),
            shards: &[1],
        });
        obs(Observed::Upsert {
            uid: "new",
            obj: &job("j", "d"),
            shards: &[9],
        });
        assert_eq!(map.shared.shards_of_names(&[key("j")]), [1, 9]);
        obs(Observed::Remove { uid: "old" });
        assert_eq!(map.shared.shards_of_names(&[key("j"), key("missing")]), [9]);
    }

    #[test]
    fn primary_reports_are_versioned_per_shard() {
        let (map, _) = map();
        assert_eq!(map.shared.warm_at(4, 7), None);
        map.shared.primary_warm(4, 7);
        let v = map.shared.warm_at(4, 7).unwrap();
        map.shared.primary_warm(4, 8);
        assert_eq!(
            map.shared.warm_at(4, 7),
            None,
            "one move per shard is remembered"
        );
        assert!(map.shared.warm_at(4, 8).unwrap() > v);
        map.shared.primary_activated(4, 3);
        assert!(map.shared.activated_at(4, 3).is_some());
    }

    #[test]
    fn strategies_the_group_cannot_use_are_refused() {
        let uid = OwnershipConfig::new(ShardCount::new(16).unwrap(), ShardKey::Uid);
        let ns = OwnershipConfig::new(ShardCount::new(16).unwrap(), ShardKey::Namespace);
        assert_eq!(
            Dependency::<ConfigMap>::same_key().settings(&uid).err(),
            Some(DependentError::SameKeyNeedsNamespace)
        );
        let s = Dependency::<ConfigMap>::controller_owner()
            .settings(&ns)
            .unwrap();
        assert!(
            !s.local_only && s.placement.is_none(),
            "owner under the namespace key = same key"
        );
        let s = Dependency::<ConfigMap>::controller_owner()
            .settings(&uid)
            .unwrap();
        assert!(s.local_only && s.placement.is_some());
        let big = OwnershipConfig::new(ShardCount::new(512).unwrap(), ShardKey::Uid);
        assert!(Dependency::<ConfigMap>::shard_label()
            .settings(&big)
            .is_err());
        assert!(Dependency::<ConfigMap>::shard_label_or_owner()
            .settings(&big)
            .is_ok());
    }
}
