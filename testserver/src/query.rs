//! Query parameters (first value wins, as Go's `url.Values.Get`) and the list/watch filter.

use std::collections::HashMap;

use kube_shard::{fnv1a64, SelectorError, ShardKey, ShardSelector};

use crate::{
    labels::{FieldSelector, LabelSelector},
    resources::ResourceInfo,
    status::{ApiError, ApiResult},
    store::Obj,
};

#[derive(Debug, Default)]
pub(crate) struct Query {
    map: HashMap<String, String>,
}

impl Query {
    pub(crate) fn parse(query: Option<&str>) -> Self {
        let mut map = HashMap::new();
        for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            map.entry(k.into_owned()).or_insert_with(|| v.into_owned());
        }
        Query { map }
    }

    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.map.get(key).map(String::as_str)
    }

    /// A boolean parameter as the apiserver's query decoder reads it.
    pub(crate) fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1" | "True" | "TRUE"))
    }
}

/// Label, field and shard selectors, ANDed.
#[derive(Debug, Default)]
pub(crate) struct Filter {
    pub(crate) labels: LabelSelector,
    pub(crate) fields: FieldSelector,
    pub(crate) shard: Option<ShardSelector>,
}

/// The KEP-5866 parse failure as the server answers it: 500, no reason.
pub(crate) fn shard_error(e: &SelectorError) -> ApiError {
    let text = e.to_string();
    let message = if text.starts_with("invalid shard selector: ") {
        text
    } else {
        // Forms the server's CEL parser accepts but kube-shard's parser does not (documented).
        format!("invalid shard selector: {text}")
    };
    ApiError::new(500, None, message)
}

impl Filter {
    /// `gate` is the `ShardedListAndWatch` gate as this request sees it: off, `shardSelector` is ignored
    /// entirely (even an invalid one).
    pub(crate) fn parse(q: &Query, gate: bool, info: &ResourceInfo) -> ApiResult<Self> {
        let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or_default())?;
        let fields = FieldSelector::parse(q.get("fieldSelector").unwrap_or_default())?;
        fields.check_supported(&info.group, &info.plural)?;
        let shard = match q.get("shardSelector") {
            Some(s) if gate && !s.is_empty() => {
                Some(s.parse::<ShardSelector>().map_err(|e| shard_error(&e))?)
            }
            _ => None,
        };
        Ok(Filter {
            labels,
            fields,
            shard,
        })
    }

    pub(crate) fn matches_shard(&self, obj: &Obj) -> bool {
        self.shard.as_ref().is_none_or(|s| {
            let value = match s.key() {
                ShardKey::Namespace => obj.namespace.as_str(),
                _ => obj.uid.as_str(),
            };
            s.matches(fnv1a64(value.as_bytes()))
        })
    }

    pub(crate) fn matches_labels_fields(&self, obj: &Obj) -> bool {
        self.labels.matches(&obj.value) && self.fields.matches(&obj.value)
    }

    pub(crate) fn matches(&self, obj: &Obj) -> bool {
        self.matches_shard(obj) && self.matches_labels_fields(obj)
    }

    /// No label or field selector (remainingItemCount is only computed then).
    pub(crate) fn no_predicates(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }
}
