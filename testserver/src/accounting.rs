//! Per-identity accounting: requests by verb, what was delivered, bytes written.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt,
    sync::Mutex,
};

use kube_shard::fnv1a64;

/// The verb of a request, as kube-apiserver's audit log names it (`discovery` for non-resource reads).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Verb {
    /// GET of one object (or of its `/status`).
    Get,
    /// GET of a collection.
    List,
    /// GET of a collection with `watch=true`.
    Watch,
    /// POST.
    Create,
    /// PUT.
    Update,
    /// PATCH (merge, JSON, strategic or apply).
    Patch,
    /// DELETE of one object.
    Delete,
    /// DELETE of a collection.
    DeleteCollection,
    /// Discovery and other non-resource requests (`/api`, `/apis`, `/version`, ...).
    Discovery,
}

impl Verb {
    /// Whether the verb writes.
    #[must_use]
    pub fn is_write(self) -> bool {
        matches!(
            self,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
        )
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verb::Get => "get",
            Verb::List => "list",
            Verb::Watch => "watch",
            Verb::Create => "create",
            Verb::Update => "update",
            Verb::Patch => "patch",
            Verb::Delete => "delete",
            Verb::DeleteCollection => "deletecollection",
            Verb::Discovery => "discovery",
        })
    }
}

/// What one identity asked for and was sent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Accounting {
    /// Requests by verb (including refused and failed ones).
    pub requests: BTreeMap<Verb, u64>,
    /// Requests refused by a partition or an outage (no response at all).
    pub refused: u64,
    /// Requests answered with a `Status` failure (4xx/5xx), injected or not.
    pub errors: u64,
    /// Items delivered in LIST responses (and `deletecollection` answers).
    pub list_items: u64,
    /// `ADDED`/`MODIFIED`/`DELETED`/`ERROR` events delivered on watches (bookmarks not included).
    pub watch_events: u64,
    /// `BOOKMARK` events delivered.
    pub bookmarks: u64,
    /// Distinct object uids delivered by get, list, watch and write answers.
    pub distinct_uids: u64,
    /// Response body bytes written.
    pub bytes_written: u64,
}

impl Accounting {
    /// Requests with one verb.
    #[must_use]
    pub fn requests(&self, verb: Verb) -> u64 {
        self.requests.get(&verb).copied().unwrap_or(0)
    }

    /// All requests.
    #[must_use]
    pub fn total_requests(&self) -> u64 {
        self.requests.values().sum()
    }
}

#[derive(Debug, Default)]
struct Entry {
    acc: Accounting,
    // 64-bit hashes of the uids: exact enough for counting, a fraction of the memory.
    uids: HashSet<u64>,
}

/// The ledger of every identity.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    per: Mutex<HashMap<String, Entry>>,
}

impl Ledger {
    fn with(&self, identity: &str, f: impl FnOnce(&mut Entry)) {
        let mut per = self.per.lock().unwrap_or_else(|e| e.into_inner());
        match per.get_mut(identity) {
            Some(e) => f(e),
            None => f(per.entry(identity.to_string()).or_default()),
        }
    }

    pub(crate) fn request(&self, identity: &str, verb: Verb) {
        self.with(identity, |e| *e.acc.requests.entry(verb).or_default() += 1);
    }

    pub(crate) fn refused(&self, identity: &str) {
        self.with(identity, |e| e.acc.refused += 1);
    }

    pub(crate) fn error(&self, identity: &str) {
        self.with(identity, |e| e.acc.errors += 1);
    }

    pub(crate) fn bytes(&self, identity: &str, n: usize) {
        self.with(identity, |e| e.acc.bytes_written += n as u64);
    }

    /// Items delivered: `list` counts them as list items, otherwise as watch events (or neither for gets).
    pub(crate) fn delivered<'a>(
        &self,
        identity: &str,
        kind: Delivery,
        uids: impl IntoIterator<Item = &'a str>,
        bytes: usize,
    ) {
        self.with(identity, |e| {
            let mut n = 0u64;
            for uid in uids {
                n += 1;
                if !uid.is_empty() && e.uids.insert(fnv1a64(uid.as_bytes())) {
                    e.acc.distinct_uids += 1;
                }
            }
            match kind {
                Delivery::List => e.acc.list_items += n,
                Delivery::WatchEvent => e.acc.watch_events += 1,
                Delivery::Bookmark => e.acc.bookmarks += 1,
                Delivery::Object => {}
            }
            e.acc.bytes_written += bytes as u64;
        });
    }

    pub(crate) fn get(&self, identity: &str) -> Accounting {
        let per = self.per.lock().unwrap_or_else(|e| e.into_inner());
        per.get(identity).map(|e| e.acc.clone()).unwrap_or_default()
    }

    pub(crate) fn identities(&self) -> Vec<String> {
        let per = self.per.lock().unwrap_or_else(|e| e.into_inner());
        let mut v: Vec<_> = per.keys().cloned().collect();
        v.sort();
        v
    }

    pub(crate) fn reset(&self) {
        self.per.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Delivery {
    List,
    WatchEvent,
    Bookmark,
    Object,
}
