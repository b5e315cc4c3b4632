//! LIST and WATCH requests with a `shardSelector`, built the way `kube_runtime::watcher` builds its own.
//!
//! kube 5's `ListParams`/`WatchParams` have no shard field and `watcher::Config`'s converters are private,
//! so this module rebuilds the same parameters from every `watcher::Config` field, appends
//! `&shardSelector=<form-urlencoded canonical text>` (the URI kube builds always has a `?`), and tags the
//! request with kube's own `&'static str` extension (`"list"`, `"watch"`, ...) so kube's trace layer names
//! the span. A selector is never empty ([`ShardSelector`] cannot be) and never sent on deletecollection
//! (this module builds no such request).
//!
//! Pure: builds requests, sends nothing.

use kube::api::{ListParams, VersionMatch, WatchParams};
use kube::core::Request;
use kube::runtime::watcher::{Config, InitialListStrategy, ListSemantic};

use crate::selector::ShardSelector;

/// Which resourceVersion a LIST asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListFrom {
    /// As `watcher::Config::list_semantic` says (`Any` = `resourceVersion=0&resourceVersionMatch=NotOlderThan`,
    /// `MostRecent` = a consistent read).
    Configured,
    /// A consistent (quorum) read: no resourceVersion.
    Consistent,
    /// `resourceVersion=<rv>&resourceVersionMatch=NotOlderThan`.
    NotOlderThan(String),
}

/// Builds the requests of one watched resource.
#[derive(Debug, Clone)]
pub(crate) struct Requests {
    request: Request,
    config: Config,
    metadata: bool,
    /// The shard label strategy: a selector becomes `kube-shard.io/shard in (...)` (ANDed with the
    /// configured label selector) instead of a `shardSelector`.
    shard_label: Option<crate::shard::ShardCount>,
}

/// A request could not be built (an invalid `watcher::Config`, such as a zero page size).
#[derive(Debug, thiserror::Error)]
#[error("cannot build {verb} request: {source}")]
pub(crate) struct RequestError {
    verb: &'static str,
    #[source]
    source: kube::core::request::Error,
}

impl Requests {
    /// Requests for the collection at `url` (from `Api::resource_url`); `metadata` selects
    /// `PartialObjectMetadata` lists and watches.
    pub(crate) fn new(url: &str, config: Config, metadata: bool) -> Self {
        Requests {
            request: Request::new(url),
            config,
            metadata,
            shard_label: None,
        }
    }

    /// Render selectors as the shard label selector of `count` shards.
    pub(crate) fn with_shard_label(mut self, count: crate::shard::ShardCount) -> Self {
        self.shard_label = Some(count);
        self
    }

    /// The label selector to send, and the shard selector left to append.
    fn selectors<'a>(
        &self,
        selector: Option<&'a ShardSelector>,
    ) -> (Option<String>, Option<&'a ShardSelector>) {
        match (self.shard_label, selector) {
            (Some(count), Some(sel)) => {
                let shards = super::depkey::shards_of_ranges(count, &sel.ranges());
                let clause = super::depkey::shard_label_selector(&shards);
                let labels = match self.config.label_selector.as_deref() {
                    Some(user) if !user.is_empty() => format!("{user},{clause}"),
                    _ => clause,
                };
                (Some(labels), None)
            }
            _ => (self.config.label_selector.clone(), selector),
        }
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The collection's URL (for logs).
    pub(crate) fn url(&self) -> &str {
        &self.request.url_path
    }

    /// A LIST page: `limit` overrides the configured page size (e.g. `Some(1)` for a barrier probe).
    pub(crate) fn list(
        &self,
        selector: Option<&ShardSelector>,
        from: &ListFrom,
        limit: Option<u32>,
        continue_token: Option<&str>,
    ) -> Result<http::Request<Vec<u8>>, RequestError> {
        let (resource_version, version_match) = match from {
            ListFrom::Configured => match self.config.list_semantic {
                ListSemantic::Any => (Some("0".to_owned()), Some(VersionMatch::NotOlderThan)),
                ListSemantic::MostRecent => (None, None),
            },
            ListFrom::Consistent => (None, None),
            ListFrom::NotOlderThan(rv) => (Some(rv.clone()), Some(VersionMatch::NotOlderThan)),
        };
        let (label_selector, selector) = self.selectors(selector);
        let lp = ListParams {
            label_selector,
            field_selector: self.config.field_selector.clone(),
            resource_version,
            version_match,
            limit: limit.or(self.config.page_size),
            continue_token: continue_token.map(str::to_owned),
            ..ListParams::default()
        };
        let (built, tag) = if self.metadata {
            (self.request.list_metadata(&lp), "list_metadata")
        } else {
            (self.request.list(&lp), "list")
        };
        let req = built.map_err(|source| RequestError { verb: tag, source })?;
        Ok(finish(req, selector, tag))
    }

    /// A WATCH from `resource_version`; `initial` asks for a streaming list (`sendInitialEvents=true`)
    /// when the config's initial list strategy is `StreamingList`.
    pub(crate) fn watch(
        &self,
        selector: Option<&ShardSelector>,
        resource_version: &str,
        initial: bool,
    ) -> Result<http::Request<Vec<u8>>, RequestError> {
        let (label_selector, selector) = self.selectors(selector);
        let wp = WatchParams {
            label_selector,
            field_selector: self.config.field_selector.clone(),
            timeout: self.config.timeout,
            bookmarks: self.config.bookmarks,
            send_initial_events: initial && self.streaming_list(),
        };
        let (built, tag) = if self.metadata {
            (
                self.request.watch_metadata(&wp, resource_version),
                "watch_metadata",
            )
        } else {
            (self.request.watch(&wp, resource_version), "watch")
        };
        let req = built.map_err(|source| RequestError { verb: tag, source })?;
        Ok(finish(req, selector, tag))
    }

    /// Whether the initial sync is a streaming list (watch with `sendInitialEvents=true`).
    pub(crate) fn streaming_list(&self) -> bool {
        self.config.initial_list_strategy == InitialListStrategy::StreamingList
    }
}

fn finish(
    mut req: http::Request<Vec<u8>>,
    selector: Option<&ShardSelector>,
    tag: &'static str,
) -> http::Request<Vec<u8>> {
    if let Some(selector) = selector {
        let uri = req.uri().to_string();
        let sep = if uri.contains('?') { '&' } else { '?' };
        let encoded: String =
            form_urlencoded::byte_serialize(selector.to_string().as_bytes()).collect();
        let with = format!("{uri}{sep}shardSelector={encoded}");
        // the canonical selector is plain ASCII and form-urlencoded: the URI stays valid
        if let Ok(parsed) = with.parse() {
            *req.uri_mut() = parsed;
        }
    }
    req.extensions_mut().insert(tag);
    req
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{hash::ShardKey, shard::ShardCount};

    fn sel() -> ShardSelector {
        let s = ShardCount::new(2).unwrap();
        ShardSelector::new(ShardKey::Uid, &s.ranges_of([1]).unwrap()).unwrap()
    }

    fn query(req: &http::Request<Vec<u8>>) -> Vec<(String, String)> {
        form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect()
    }

    fn get<'a>(q: &'a [(String, String)], k: &str) -> Option<&'a str> {
        q.iter().find(|(key, _)| key == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn list_carries_every_config_field_and_the_selector() {
        let config = Config::default()
            .labels("app=x")
            .fields("metadata.name!=y")
            .page_size(7)
            .any_semantic();
        let r = Requests::new("/api/v1/configmaps", config, false);
        let req = r
            .list(Some(&sel()), &ListFrom::Configured, None, None)
            .unwrap();
        let q = query(&req);
        assert_eq!(req.uri().path(), "/api/v1/configmaps");
        assert_eq!(get(&q, "labelSelector"), Some("app=x"));
        assert_eq!(get(&q, "fieldSelector"), Some("metadata.name!=y"));
        assert_eq!(get(&q, "limit"), Some("7"));
        // as kube does: resourceVersion=0 is dropped when paging (the apiserver cache ignores limit there)
        assert_eq!(get(&q, "resourceVersion"), None);
        let mut unpaged = Config::default().any_semantic();
        unpaged.page_size = None;
        let r0 = Requests::new("/api/v1/configmaps", unpaged, false);
        let q0 = query(&r0.list(None, &ListFrom::Configured, None, None).unwrap());
        assert_eq!(get(&q0, "resourceVersion"), Some("0"));
        assert_eq!(get(&q0, "resourceVersionMatch"), Some("NotOlderThan"));
        assert_eq!(get(&q, "shardSelector"), Some(sel().to_string().as_str()));
        assert_eq!(req.extensions().get::<&'static str>(), Some(&"list"));
    }

    #[test]
    fn list_pages_resend_the_selector_and_drop_the_resource_version() {
        let r = Requests::new("/api/v1/configmaps", Config::default(), false);
        let req = r
            .list(
                Some(&sel()),
                &ListFrom::NotOlderThan("42".into()),
                Some(1),
                Some("tok"),
            )
            .unwrap();
        let q = query(&req);
        assert_eq!(get(&q, "continue"), Some("tok"));
        assert_eq!(get(&q, "limit"), Some("1"));
        assert_eq!(
            get(&q, "resourceVersion"),
            None,
            "kube drops the rv with a continue token"
        );
        assert!(
            get(&q, "shardSelector").is_some(),
            "the continue token does not carry it"
        );
        let req = r.list(None, &ListFrom::Consistent, None, None).unwrap();
        let q = query(&req);
        assert_eq!(get(&q, "resourceVersion"), None);
        assert_eq!(get(&q, "shardSelector"), None);
    }

    #[test]
    fn watch_carries_timeout_bookmarks_and_streaming_list() {
        let config = Config::default().timeout(30).streaming_lists();
        let r = Requests::new("/apis/example.io/v1/namespaces/ns/widgets", config, true);
        let req = r.watch(Some(&sel()), "0", true).unwrap();
        let q = query(&req);
        assert_eq!(get(&q, "watch"), Some("true"));
        assert_eq!(get(&q, "timeoutSeconds"), Some("30"));
        assert_eq!(get(&q, "allowWatchBookmarks"), Some("true"));
        assert_eq!(get(&q, "sendInitialEvents"), Some("true"));
        assert_eq!(get(&q, "resourceVersionMatch"), Some("NotOlderThan"));
        assert_eq!(
            req.extensions().get::<&'static str>(),
            Some(&"watch_metadata")
        );
        assert!(req
            .headers()
            .get(http::header::ACCEPT)
            .is_some_and(|v| v.to_str().unwrap().contains("PartialObjectMetadata")));
        // a resumed watch never asks for initial events again
        let q = query(&r.watch(Some(&sel()), "17", false).unwrap());
        assert_eq!(get(&q, "sendInitialEvents"), None);
        assert_eq!(get(&q, "resourceVersion"), Some("17"));
    }
}
