//! Faults, switchable at run time, globally or per identity, optionally narrowed to a verb, a resource,
//! a namespace or one object.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{sync::watch, time::Instant};

use crate::{accounting::Verb, server::Inner, status::ApiError};

/// Whom a fault applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scope {
    /// Every identity.
    All,
    /// One identity (the name given to [`TestServer::client`](crate::TestServer::client)).
    Identity(String),
}

impl Scope {
    /// One identity.
    pub fn identity(name: impl Into<String>) -> Self {
        Scope::Identity(name.into())
    }

    fn covers(&self, identity: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Identity(i) => i == identity,
        }
    }

    /// Only this scope's requests with this verb (see [`Target`]).
    #[must_use]
    pub fn verb(self, verb: Verb) -> Target {
        Target::from(self).verb(verb)
    }

    /// Only this scope's requests for this resource (see [`Target`]).
    #[must_use]
    pub fn resource(self, plural: impl Into<String>) -> Target {
        Target::from(self).resource(plural)
    }

    /// Only this scope's requests in this namespace (see [`Target`]).
    #[must_use]
    pub fn namespace(self, namespace: impl Into<String>) -> Target {
        Target::from(self).namespace(namespace)
    }

    /// Only this scope's requests that name this object (see [`Target`]).
    #[must_use]
    pub fn name(self, name: impl Into<String>) -> Target {
        Target::from(self).name(name)
    }
}

/// Which requests a fault applies to, beside whose: every field set must match (`None` matches
/// anything).
///
/// A request's namespace and name are those of its path (`.../namespaces/NS/RESOURCE/NAME`); a LIST or
/// WATCH that has none in its path takes them from the equalities of its `fieldSelector`
/// (`metadata.name=NAME`, `metadata.namespace=NS`), which is how clients read or watch one object
/// (`kube::runtime::watcher::watch_object`). So a fault narrowed to a namespace or a name covers no
/// request across namespaces or over a whole collection, and a fault narrowed to a resource, namespace
/// or name covers no discovery request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct RequestMatch {
    /// Only requests with this verb.
    pub verb: Option<Verb>,
    /// Only requests for this resource: its plural (`leases`), as the URL names it.
    pub resource: Option<String>,
    /// Only requests in this namespace.
    pub namespace: Option<String>,
    /// Only requests that name this object.
    pub name: Option<String>,
}

impl RequestMatch {
    fn matches(&self, r: &RequestFacts) -> bool {
        fn field(want: Option<&String>, have: Option<&str>) -> bool {
            want.is_none_or(|w| have == Some(w.as_str()))
        }
        self.verb.is_none_or(|v| v == r.verb)
            && field(self.resource.as_ref(), r.resource.as_deref())
            && field(self.namespace.as_ref(), r.namespace.as_deref())
            && field(self.name.as_ref(), r.name.as_deref())
    }
}

/// Whose requests ([`Scope`]) and which ones ([`RequestMatch`]) a fault applies to. Every fault that
/// takes one also takes a plain [`Scope`]; narrow it with the builder methods, on the scope or here:
///
/// ```
/// use kube_shard_testserver::{Scope, Target, Verb};
///
/// // GETs of one Lease by one member.
/// let t: Target = Scope::identity("m0")
///     .verb(Verb::Get)
///     .resource("leases")
///     .namespace("legacy")
///     .name("old");
/// assert_eq!(t.only.name.as_deref(), Some("old"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Target {
    /// Whose requests.
    pub scope: Scope,
    /// Which of them.
    pub only: RequestMatch,
}

impl From<Scope> for Target {
    fn from(scope: Scope) -> Self {
        Target {
            scope,
            only: RequestMatch::default(),
        }
    }
}

impl Target {
    /// Only requests with this verb.
    #[must_use]
    pub fn verb(mut self, verb: Verb) -> Self {
        self.only.verb = Some(verb);
        self
    }

    /// Only requests for this resource (plural, like `leases`).
    #[must_use]
    pub fn resource(mut self, plural: impl Into<String>) -> Self {
        self.only.resource = Some(plural.into());
        self
    }

    /// Only requests in this namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.only.namespace = Some(namespace.into());
        self
    }

    /// Only requests that name this object.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.only.name = Some(name.into());
        self
    }

    fn covers(&self, r: &RequestFacts) -> bool {
        self.scope.covers(&r.identity) && self.only.matches(r)
    }
}

/// What a fault is matched against: who sent a request, and what it asks.
#[derive(Clone, Debug)]
pub(crate) struct RequestFacts {
    pub(crate) identity: Arc<str>,
    pub(crate) verb: Verb,
    /// The plural, for resource requests.
    pub(crate) resource: Option<String>,
    pub(crate) namespace: Option<String>,
    pub(crate) name: Option<String>,
}

/// "Fail the next N requests with this status", optionally only for one verb, resource, namespace or
/// object (as [`RequestMatch`] matches them).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailRule {
    /// The HTTP status: 403, 429 (sent with `Retry-After`), 500, 503 and 504 have kube-apiserver's reasons.
    pub code: u16,
    /// How many matching requests fail.
    pub times: u32,
    /// Which requests (AND-ed with the [`Target`] given to [`Faults::fail_next`]).
    pub only: RequestMatch,
    /// `Retry-After` seconds for a 429 (default 1).
    pub retry_after: u64,
}

impl FailRule {
    /// Fail the next matching request with `code`.
    #[must_use]
    pub fn status(code: u16) -> Self {
        FailRule {
            code,
            times: 1,
            only: RequestMatch::default(),
            retry_after: 1,
        }
    }

    /// Fail `n` matching requests.
    #[must_use]
    pub fn times(mut self, n: u32) -> Self {
        self.times = n;
        self
    }

    /// Only requests with this verb.
    #[must_use]
    pub fn verb(mut self, verb: Verb) -> Self {
        self.only.verb = Some(verb);
        self
    }

    /// Only requests for this resource (plural).
    #[must_use]
    pub fn resource(mut self, plural: impl Into<String>) -> Self {
        self.only.resource = Some(plural.into());
        self
    }

    /// Only requests in this namespace.
    #[must_use]
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.only.namespace = Some(namespace.into());
        self
    }

    /// Only requests that name this object.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.only.name = Some(name.into());
        self
    }

    /// `Retry-After` seconds for a 429.
    #[must_use]
    pub fn retry_after(mut self, secs: u64) -> Self {
        self.retry_after = secs;
        self
    }
}

/// Feature-gate skew, as in an HA control plane mid-upgrade where apiservers disagree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum GateSkew {
    /// Every request sees the configured gate.
    #[default]
    None,
    /// Every other request (server-wide) sees the gate flipped: one LIST filtered, the next not.
    PerRequest,
    /// Every other connection (one per `client()`, or per TCP connection) sees the gate flipped, for
    /// all its requests.
    PerConnection,
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<(Target, FailRule)>,
    latency: HashMap<Target, Duration>,
    /// Delays applied to the answer, after the request was handled (a write has committed).
    slow_answers: HashMap<Target, Duration>,
    /// Requests handled on a detached task this long after they arrived, and never answered
    /// (`late_commit`; `drop_answer` is a zero delay).
    unanswered: HashMap<Target, Duration>,
    /// Every `close_watches` so far, in order: a watch ends on any entry after its mark that covers it.
    closes: Vec<Target>,
    freeze: HashSet<Target>,
    refuse_all: bool,
    refuse: HashSet<String>,
    outage_until: Option<Instant>,
    lagging_rv: Option<u64>,
    skew: GateSkew,
    skew_counter: u64,
    unfiltered_watch: HashSet<String>,
}

/// The fault state; watches follow changes through `version`.
#[derive(Debug)]
pub(crate) struct FaultState {
    state: Mutex<State>,
    version: watch::Sender<u64>,
}

impl Default for FaultState {
    fn default() -> Self {
        FaultState {
            state: Mutex::new(State::default()),
            version: watch::channel(0).0,
        }
    }
}

/// What a watch remembers to notice a later "close watches": how many had been asked when it opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CloseMark(usize);

impl FaultState {
    fn edit<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let r = f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()));
        self.version.send_modify(|v| *v += 1);
        r
    }

    fn read<R>(&self, f: impl FnOnce(&State) -> R) -> R {
        f(&self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub(crate) fn changes(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Whether requests from `identity` get no answer at all (partition or outage).
    pub(crate) fn refused(&self, identity: &str) -> bool {
        self.read(|s| {
            s.refuse_all
                || s.refuse.contains(identity)
                || s.outage_until.is_some_and(|t| Instant::now() < t)
        })
    }

    pub(crate) fn latency(&self, r: &RequestFacts) -> Duration {
        self.read(|s| {
            s.latency
                .iter()
                .filter(|(target, _)| target.covers(r))
                .map(|(_, d)| *d)
                .max()
                .unwrap_or_default()
        })
    }

    pub(crate) fn answer_latency(&self, r: &RequestFacts) -> Duration {
        self.read(|s| {
            s.slow_answers
                .iter()
                .filter(|(target, _)| target.covers(r))
                .map(|(_, d)| *d)
                .max()
                .unwrap_or_default()
        })
    }

    /// Whether a request is handled on a detached task, after how long from its arrival, and never
    /// answered (the longest of the matching `late_commit`/`drop_answer` targets).
    pub(crate) fn detached(&self, r: &RequestFacts) -> Option<Duration> {
        self.read(|s| {
            s.unanswered
                .iter()
                .filter(|(target, _)| target.covers(r))
                .map(|(_, d)| *d)
                .max()
        })
    }

    /// Consume one matching fail rule.
    pub(crate) fn take_failure(&self, r: &RequestFacts) -> Option<ApiError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let idx = st.rules.iter().position(|(target, rule)| {
            rule.times > 0 && target.covers(r) && rule.only.matches(r)
        })?;
        let rule = &mut st.rules[idx].1;
        rule.times -= 1;
        let err = ApiError::injected(rule.code, (rule.code == 429).then_some(rule.retry_after));
        if rule.times == 0 {
            st.rules.remove(idx);
        }
        Some(err)
    }

    pub(crate) fn close_mark(&self) -> CloseMark {
        self.read(|s| CloseMark(s.closes.len()))
    }

    pub(crate) fn should_close(&self, r: &RequestFacts, mark: CloseMark) -> bool {
        self.read(|s| s.closes.iter().skip(mark.0).any(|t| t.covers(r)))
    }

    pub(crate) fn frozen(&self, r: &RequestFacts) -> bool {
        self.read(|s| {
            s.refuse_all || s.refuse.contains(&*r.identity) || s.freeze.iter().any(|t| t.covers(r))
        })
    }

    pub(crate) fn lagging_rv(&self) -> Option<u64> {
        self.read(|s| s.lagging_rv)
    }

    /// The gate as this request sees it.
    pub(crate) fn effective_gate(&self, gate: bool, conn: u64) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match st.skew {
            GateSkew::None => gate,
            GateSkew::PerRequest => {
                st.skew_counter += 1;
                if st.skew_counter.is_multiple_of(2) {
                    !gate
                } else {
                    gate
                }
            }
            GateSkew::PerConnection => {
                if conn.is_multiple_of(2) {
                    !gate
                } else {
                    gate
                }
            }
        }
    }

    pub(crate) fn watch_unfiltered(&self, plural: &str) -> bool {
        self.read(|s| s.unfiltered_watch.contains(plural))
    }
}

/// The fault switchboard of a [`TestServer`](crate::TestServer). Every switch takes effect at once, also
/// for watches already open.
#[derive(Clone)]
pub struct Faults {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Faults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Faults").finish_non_exhaustive()
    }
}

impl Faults {
    fn st(&self) -> &FaultState {
        &self.inner.faults
    }

    /// Fail the next requests of `target` that `rule` matches with a `Status` (429s carry
    /// `Retry-After`). `target` may be a plain [`Scope`].
    pub fn fail_next(&self, target: impl Into<Target>, rule: FailRule) {
        let target = target.into();
        self.st().edit(|s| s.rules.push((target, rule)));
    }

    /// Whether failures set by [`fail_next`](Self::fail_next) are still waiting for requests to fail.
    pub fn failing(&self) -> bool {
        self.st().read(|s| !s.rules.is_empty())
    }

    /// Delay every request of `target` by `delay` before it is handled (`None` removes the delay set
    /// for exactly that target). Where several targets cover a request, the longest delay applies.
    pub fn latency(&self, target: impl Into<Target>, delay: Option<Duration>) {
        let target = target.into();
        self.st().edit(|s| match delay {
            Some(d) => {
                s.latency.insert(target, d);
            }
            None => {
                s.latency.remove(&target);
            }
        });
    }

    /// Handle every request of `target` at once — a write commits — but hold its answer back by `delay`
    /// (`None` removes the delay set for exactly that target): a loaded apiserver whose clients time out
    /// on requests that did commit. Where several targets cover a request, the longest delay applies.
    pub fn slow_answers(&self, target: impl Into<Target>, delay: Option<Duration>) {
        let target = target.into();
        self.st().edit(|s| match delay {
            Some(d) => {
                s.slow_answers.insert(target, d);
            }
            None => {
                s.slow_answers.remove(&target);
            }
        });
    }

    /// Commit late, after the client gave up: every request of `target` is handled on a task of its
    /// own, `after` (tokio time) from its arrival, and is never answered. The client sees no answer
    /// and times out (over the in-memory service the call never completes; over HTTP the connection
    /// stays open with no response), and dropping its request does not cancel the write: it commits
    /// `after` its arrival, whatever the client did meanwhile. This is an apiserver that accepted a
    /// request and whose etcd committed it after the client's deadline. Where several targets cover
    /// a request (with [`Faults::drop_answer`] too), the longest delay applies. Undo it with
    /// [`Faults::answer_normally`].
    ///
    /// Use a client-side timeout to stop waiting (`tokio::time::timeout` around the call, or a kube
    /// `Config::read_timeout` over HTTP).
    pub fn late_commit(&self, target: impl Into<Target>, after: Duration) {
        let target = target.into();
        self.st().edit(|s| {
            s.unanswered.insert(target, after);
        });
    }

    /// Handle every request of `target` at once — a write commits — and answer nothing, ever: the
    /// answer is lost (an apiserver or a connection dying between commit and response). The handler
    /// runs on a task of its own, so a client giving up does not cancel it. Undo it with
    /// [`Faults::answer_normally`].
    pub fn drop_answer(&self, target: impl Into<Target>) {
        self.late_commit(target, Duration::ZERO);
    }

    /// Remove the [`Faults::late_commit`] or [`Faults::drop_answer`] set for exactly `target`.
    /// Requests already detached still commit on time.
    pub fn answer_normally(&self, target: impl Into<Target>) {
        let target = target.into();
        self.st().edit(|s| {
            s.unanswered.remove(&target);
        });
    }

    /// End every open watch of `target` (the stream ends cleanly, as when an apiserver shuts down).
    /// Watches opened later are not affected.
    pub fn close_watches(&self, target: impl Into<Target>) {
        let target = target.into();
        self.st().edit(|s| s.closes.push(target));
    }

    /// Freeze (or thaw) the watches of `target`: connections stay open, nothing is sent, not even a
    /// timeout's end of stream. Events are kept and delivered on thaw. Thawing removes the freeze set
    /// for exactly that target.
    pub fn freeze_watches(&self, target: impl Into<Target>, frozen: bool) {
        let target = target.into();
        self.st().edit(|s| {
            if frozen {
                s.freeze.insert(target);
            } else {
                s.freeze.remove(&target);
            }
        });
    }

    /// Partition `scope` from the server (or heal it): every request gets no answer at all (the
    /// in-memory service fails the call, HTTP closes the connection) and its open watches freeze.
    pub fn partition(&self, scope: Scope, partitioned: bool) {
        self.st().edit(|s| match scope {
            Scope::All => s.refuse_all = partitioned,
            Scope::Identity(i) => {
                if partitioned {
                    s.refuse.insert(i);
                } else {
                    s.refuse.remove(&i);
                }
            }
        });
    }

    /// A global outage from now for `duration` (tokio time): every watch ends, every request is refused.
    pub fn outage(&self, duration: Duration) {
        self.st().edit(|s| {
            s.outage_until = Some(Instant::now() + duration);
            s.closes.push(Target::from(Scope::All));
        });
    }

    /// Compact the history at the current resourceVersion: every watch or continue token from an older
    /// resourceVersion gets a 410.
    pub fn compact(&self) {
        self.inner.lock_store().compact();
        self.st().edit(|_| {});
    }

    /// Serve `resourceVersion=0` lists from the snapshot at the current resourceVersion from now on,
    /// as a watch cache that stopped following does (`false` catches up again).
    pub fn lagging_lists(&self, lagging: bool) {
        let rv = lagging.then(|| self.inner.lock_store().rv);
        self.st().edit(|s| s.lagging_rv = rv);
    }

    /// Gate skew between "apiservers".
    pub fn gate_skew(&self, skew: GateSkew) {
        self.st().edit(|s| s.skew = skew);
    }

    /// For one resource (plural), LISTs honour `shardSelector` but WATCHes ignore it: the 1.36.0–1.36.3
    /// bug for watches served from etcd (kubernetes/kubernetes#140510).
    pub fn unfiltered_watch(&self, plural: &str, unfiltered: bool) {
        self.st().edit(|s| {
            if unfiltered {
                s.unfiltered_watch.insert(plural.to_string());
            } else {
                s.unfiltered_watch.remove(plural);
            }
        });
    }

    /// Remove every fault (watches already closed stay closed).
    pub fn clear(&self) {
        self.st().edit(|s| {
            let closes = std::mem::take(&mut s.closes);
            *s = State {
                closes,
                ..State::default()
            };
        });
    }
}
