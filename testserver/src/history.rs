//! The recorder of committed history: for the objects a test asks for, every committed version in
//! commit order, with who wrote it and how. Opt-in: nothing is kept (and nothing is locked beyond one
//! atomic load per commit) until [`History::record`] is called.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex,
};

use kube_shard::token::FenceToken;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{
    accounting::Verb,
    audit::RawFence,
    resources::ResourceInfo,
    server::Inner,
    status::qualified,
    store::{Change, ChangeKind},
};

/// Which objects to record, or to look up in what was recorded. Every field set must match (`None`
/// matches anything).
///
/// ```
/// use kube_shard_testserver::ResourceFilter;
///
/// // The assignment ConfigMap of a group.
/// let assignment = ResourceFilter::resource("configmaps").namespace("ops").name("shards");
/// // Every Lease in a namespace.
/// let leases = ResourceFilter::resource("leases").namespace("ops");
/// // One object by uid, whatever its resource.
/// let one = ResourceFilter::all().uid("6f1c…");
/// assert!(assignment.name.is_some() && leases.name.is_none() && one.resource.is_none());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResourceFilter {
    /// The resource: its plural (`configmaps`), its qualified plural (`widgets.example.com`) or its
    /// kind (`ConfigMap`).
    pub resource: Option<String>,
    /// The namespace (empty for cluster-scoped objects).
    pub namespace: Option<String>,
    /// The object's name.
    pub name: Option<String>,
    /// The object's uid (one incarnation of a name: a delete and re-create is another uid).
    pub uid: Option<String>,
}

impl ResourceFilter {
    /// Every object of every resource.
    #[must_use]
    pub fn all() -> Self {
        ResourceFilter::default()
    }

    /// Every object of one resource: plural (`leases`), qualified plural (`widgets.example.com`) or
    /// kind (`Lease`).
    #[must_use]
    pub fn resource(resource: impl Into<String>) -> Self {
        ResourceFilter {
            resource: Some(resource.into()),
            ..ResourceFilter::default()
        }
    }

    /// Only objects in this namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Only objects with this name.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Only the object with this uid.
    #[must_use]
    pub fn uid(mut self, uid: impl Into<String>) -> Self {
        self.uid = Some(uid.into());
        self
    }

    /// Whether a commit of this resource and object matches.
    fn matches(&self, c: &Commit) -> bool {
        fn field(want: Option<&String>, have: &str) -> bool {
            want.is_none_or(|w| w == have)
        }
        let resource = self.resource.as_deref().is_none_or(|r| {
            r == c.resource || r == c.kind || c.resource.split('.').next() == Some(r)
        });
        resource
            && field(self.namespace.as_ref(), &c.namespace)
            && field(self.name.as_ref(), &c.name)
            && field(self.uid.as_ref(), &c.uid)
    }
}

/// What a commit did to the object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CommitKind {
    /// The object was created.
    Created,
    /// The object was changed (also a DELETE that only set `deletionTimestamp` because of finalizers).
    Updated,
    /// The object is gone (also a write that removed the last finalizer of an object being deleted);
    /// [`Commit::object`] is its last state, stamped with this commit's resourceVersion.
    Deleted,
}

/// One committed version of an object.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Commit {
    /// The resourceVersion it committed at (commits are recorded in this order).
    pub resource_version: u64,
    /// `plural` or `plural.group`.
    pub resource: String,
    /// The kind (`ConfigMap`).
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The object's uid.
    pub uid: String,
    /// The verb of the request that committed it (the system's own writes — CRD instance cleanup,
    /// garbage collection — are by `system:apiserver`).
    pub verb: Verb,
    /// Who wrote.
    pub identity: String,
    /// Created, updated or deleted.
    pub change: CommitKind,
    /// The object as committed (with `apiVersion` and `kind`).
    pub object: Value,
    /// The fence the write carried (header, else annotation), when it parsed.
    pub fence: Option<FenceToken>,
}

impl Commit {
    /// Whether this commit deleted the object.
    #[must_use]
    pub fn deleted(&self) -> bool {
        self.change == CommitKind::Deleted
    }

    /// The object, decoded (`commit.object_as::<ConfigMap>()`).
    ///
    /// # Errors
    /// When the JSON does not decode as `K`.
    pub fn object_as<K: DeserializeOwned>(&self) -> Result<K, serde_json::Error> {
        K::deserialize(&self.object)
    }
}

#[derive(Debug, Default)]
struct State {
    filters: Vec<ResourceFilter>,
    commits: Vec<Commit>,
}

/// The recorder kept by the server.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    /// Whether any filter is set: the one check a commit pays when nothing is recorded.
    on: AtomicBool,
    state: Mutex<State>,
}

/// Who committed a change.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writer<'a> {
    pub(crate) identity: &'a str,
    pub(crate) verb: Verb,
    pub(crate) fence: Option<&'a RawFence>,
}

impl Recorder {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record a committed change if a filter asks for it. Called under the store lock, so the
    /// recorded order is the commit order.
    pub(crate) fn commit(&self, w: Writer<'_>, info: &ResourceInfo, change: &Change) {
        if !self.on.load(Ordering::Acquire) {
            return;
        }
        let obj = &change.obj;
        let mut c = Commit {
            resource_version: change.rv,
            resource: qualified(&info.group, &info.plural),
            kind: info.kind.clone(),
            namespace: obj.namespace.clone(),
            name: obj.name().to_string(),
            uid: obj.uid.clone(),
            verb: w.verb,
            identity: w.identity.to_string(),
            change: match change.kind {
                ChangeKind::Added => CommitKind::Created,
                ChangeKind::Modified => CommitKind::Updated,
                ChangeKind::Deleted => CommitKind::Deleted,
            },
            object: Value::Null,
            fence: None,
        };
        let mut st = self.state();
        if !st.filters.iter().any(|f| f.matches(&c)) {
            return;
        }
        c.object = obj.value.clone();
        c.fence = w.fence.and_then(|f| f.raw.trim().parse().ok());
        st.commits.push(c);
    }
}

/// The committed history of the objects a test asks for
/// ([`TestServer::history`](crate::TestServer::history)).
///
/// Recording is opt-in: [`History::record`] a [`ResourceFilter`] (several may be set), then read every
/// commit of an object since then, in commit order, with [`History::of`]. Nothing is kept for objects
/// no filter covers, and a server with no filter pays one atomic load per commit. Commits are kept
/// until [`History::clear`]; the server's bounded change window
/// ([`Builder::history`](crate::Builder::history)) does not apply here.
#[derive(Clone)]
pub struct History {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("History").finish_non_exhaustive()
    }
}

impl History {
    fn rec(&self) -> &Recorder {
        &self.inner.recorder
    }

    /// Record, from now on, every commit of the objects `filter` covers.
    pub fn record(&self, filter: ResourceFilter) {
        // Under the store lock: a commit is recorded entirely or not at all, never half-way into a
        // filter set while it was being committed.
        let _store = self.inner.lock_store();
        let mut st = self.rec().state();
        if !st.filters.contains(&filter) {
            st.filters.push(filter);
        }
        self.rec().on.store(true, Ordering::Release);
    }

    /// Stop recording (what was recorded is kept).
    pub fn stop(&self) {
        let _store = self.inner.lock_store();
        self.rec().state().filters.clear();
        self.rec().on.store(false, Ordering::Release);
    }

    /// Every recorded commit that `filter` covers, in commit order.
    #[must_use]
    pub fn of(&self, filter: &ResourceFilter) -> Vec<Commit> {
        self.rec()
            .state()
            .commits
            .iter()
            .filter(|c| filter.matches(c))
            .cloned()
            .collect()
    }

    /// Every recorded commit, in commit order.
    #[must_use]
    pub fn commits(&self) -> Vec<Commit> {
        self.rec().state().commits.clone()
    }

    /// Forget what was recorded (the filters stay).
    pub fn clear(&self) {
        self.rec().state().commits.clear();
    }
}
