//! Faults, switchable at run time, globally or per identity.

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
}

/// "Fail the next N requests with this status", optionally only for one verb or resource.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailRule {
    /// The HTTP status: 403, 429 (sent with `Retry-After`), 500, 503 and 504 have kube-apiserver's reasons.
    pub code: u16,
    /// How many matching requests fail.
    pub times: u32,
    /// Only requests with this verb.
    pub verb: Option<Verb>,
    /// Only requests for this resource (plural, like `configmaps`).
    pub resource: Option<String>,
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
            verb: None,
            resource: None,
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
        self.verb = Some(verb);
        self
    }

    /// Only requests for this resource (plural).
    #[must_use]
    pub fn resource(mut self, plural: impl Into<String>) -> Self {
        self.resource = Some(plural.into());
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
    rules: Vec<(Scope, FailRule)>,
    latency: HashMap<Scope, Duration>,
    close_all: u64,
    close: HashMap<String, u64>,
    freeze_all: bool,
    freeze: HashSet<String>,
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

/// What a watch remembers to notice "close all watches".
#[derive(Debug, Clone, Copy)]
pub(crate) struct CloseMark {
    all: u64,
    mine: u64,
}

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

    pub(crate) fn latency(&self, identity: &str) -> Duration {
        self.read(|s| {
            s.latency
                .iter()
                .filter(|(scope, _)| scope.covers(identity))
                .map(|(_, d)| *d)
                .max()
                .unwrap_or_default()
        })
    }

    /// Consume one matching fail rule.
    pub(crate) fn take_failure(
        &self,
        identity: &str,
        verb: Verb,
        resource: Option<&str>,
    ) -> Option<ApiError> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let idx = st.rules.iter().position(|(scope, r)| {
            scope.covers(identity)
                && r.times > 0
                && r.verb.is_none_or(|v| v == verb)
                && r.resource
                    .as_deref()
                    .is_none_or(|want| resource == Some(want))
        })?;
        let rule = &mut st.rules[idx].1;
        rule.times -= 1;
        let err = ApiError::injected(rule.code, (rule.code == 429).then_some(rule.retry_after));
        if rule.times == 0 {
            st.rules.remove(idx);
        }
        Some(err)
    }

    pub(crate) fn close_mark(&self, identity: &str) -> CloseMark {
        self.read(|s| CloseMark {
            all: s.close_all,
            mine: s.close.get(identity).copied().unwrap_or(0),
        })
    }

    pub(crate) fn should_close(&self, identity: &str, mark: CloseMark) -> bool {
        self.read(|s| {
            s.close_all != mark.all || s.close.get(identity).copied().unwrap_or(0) != mark.mine
        })
    }

    pub(crate) fn frozen(&self, identity: &str) -> bool {
        self.read(|s| {
            s.freeze_all
                || s.freeze.contains(identity)
                || s.refuse_all
                || s.refuse.contains(identity)
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

    /// Fail the next matching requests of `scope` with a `Status` (429s carry `Retry-After`).
    pub fn fail_next(&self, scope: Scope, rule: FailRule) {
        self.st().edit(|s| s.rules.push((scope, rule)));
    }

    /// Delay every request of `scope` by `delay` before it is handled (`None` removes it).
    pub fn latency(&self, scope: Scope, delay: Option<Duration>) {
        self.st().edit(|s| match delay {
            Some(d) => {
                s.latency.insert(scope, d);
            }
            None => {
                s.latency.remove(&scope);
            }
        });
    }

    /// End every open watch of `scope` (the stream ends cleanly, as when an apiserver shuts down).
    pub fn close_watches(&self, scope: Scope) {
        self.st().edit(|s| match scope {
            Scope::All => s.close_all += 1,
            Scope::Identity(i) => *s.close.entry(i).or_default() += 1,
        });
    }

    /// Freeze (or thaw) the watches of `scope`: connections stay open, nothing is sent, not even a
    /// timeout's end of stream. Events are kept and delivered on thaw.
    pub fn freeze_watches(&self, scope: Scope, frozen: bool) {
        self.st().edit(|s| match scope {
            Scope::All => s.freeze_all = frozen,
            Scope::Identity(i) => {
                if frozen {
                    s.freeze.insert(i);
                } else {
                    s.freeze.remove(&i);
                }
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
            s.close_all += 1;
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
            let (close_all, close) = (s.close_all, std::mem::take(&mut s.close));
            *s = State {
                close_all,
                close,
                ..State::default()
            };
        });
    }
}
