//! The dependency-key map's pure parts: where a secondary object belongs, and the shard label.
//!
//! A secondary's own uid never lands in its parent's range, so it belongs to the shards of the primaries it
//! depends on: its own namespace under the `namespace` key, its controller owner's shard (FNV-1a of the
//! owner's uid), the `kube-shard.io/shard` label the operator stamped on it, or a user mapper resolved
//! through the primaries' index (`dependent.rs`).
//!
//! Pure: no I/O, no async. See `docs/secondary-caches.md#the-api`.

use kube::api::ObjectMeta;

use crate::hash::{fnv1a64, ShardKey};
use crate::range::RangeSet;
use crate::shard::ShardCount;

/// The label the shard label strategy stamps on children: `kube-shard.io/shard=<n>` (decimal).
pub const SHARD_LABEL: &str = "kube-shard.io/shard";

/// The largest shard count the shard label strategy accepts. A member owning every shard sends
/// `kube-shard.io/shard in (0,1,…,255)`: 1 KiB of label selector, 1.4 KiB form-urlencoded, well under the
/// 8 KiB request-line limit of common proxies and load balancers (4096 shards would need ~27 KiB).
pub const LABEL_MAX_SHARDS: u32 = 256;

/// The uid of the controller ownerReference (`controller: true`), if any.
#[must_use]
pub(crate) fn controller_owner_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references
        .as_ref()?
        .iter()
        .find(|r| r.controller == Some(true))
        .map(|r| r.uid.as_str())
        .filter(|u| !u.is_empty())
}

/// The shard an object's shard label names, if it carries a valid one.
#[must_use]
pub(crate) fn labelled_shard(meta: &ObjectMeta, count: ShardCount) -> Option<u32> {
    let value = meta.labels.as_ref()?.get(SHARD_LABEL)?;
    if value.is_empty() || value.len() > 4 || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let shard: u32 = value.parse().ok()?;
    (shard < count.get()).then_some(shard)
}

/// Stamp the shard label of `shard` on a child's metadata (before creating it).
pub fn stamp_shard_label(meta: &mut ObjectMeta, shard: u32) {
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(SHARD_LABEL.to_owned(), shard.to_string());
}

/// The shard of a primary (its parent) under the group key: what to stamp on its children.
///
/// # Errors
/// When the parent has no uid (under the `uid` key): it was not read from the server.
pub fn shard_of_parent(
    parent: &ObjectMeta,
    key: ShardKey,
    count: ShardCount,
) -> Result<u32, crate::hash::KeyError> {
    Ok(count.shard_of(key.hash_meta(parent)?))
}

/// The placement hash of a child by its controller owner (`None` without one): the owner's own hash.
#[must_use]
pub(crate) fn owner_hash(meta: &ObjectMeta) -> Option<u64> {
    controller_owner_uid(meta).map(|u| fnv1a64(u.as_bytes()))
}

/// A representative hash of `shard` (the start of its range).
#[must_use]
pub(crate) fn shard_hash(count: ShardCount, shard: u32) -> Option<u64> {
    count.range_of(shard).ok().map(|r| r.start())
}

/// The shards whose ranges `ranges` covers (any overlap).
#[must_use]
pub(crate) fn shards_of_ranges(count: ShardCount, ranges: &RangeSet) -> Vec<u32> {
    let mut out = Vec::new();
    for r in ranges.iter() {
        let first = count.shard_of(r.start());
        let last_hash = u64::try_from(r.end() - 1).unwrap_or(u64::MAX);
        let last = count.shard_of(last_hash);
        out.extend(first..=last);
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `kube-shard.io/shard in (a,b,…)` for `shards` (sorted, non-empty).
#[must_use]
pub(crate) fn shard_label_selector(shards: &[u32]) -> String {
    let list: Vec<String> = shards.iter().map(u32::to_string).collect();
    format!("{SHARD_LABEL} in ({})", list.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owned_by(uid: &str, controller: bool) -> ObjectMeta {
        ObjectMeta {
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: "p".into(),
                uid: uid.into(),
                controller: Some(controller),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn owner_hash_is_the_owners_uid_hash() {
        let s = ShardCount::new(16).unwrap();
        let parent = ObjectMeta {
            uid: Some("parent-uid".into()),
            ..ObjectMeta::default()
        };
        let child = owned_by("parent-uid", true);
        assert_eq!(
            owner_hash(&child).map(|h| s.shard_of(h)),
            Some(shard_of_parent(&parent, ShardKey::Uid, s).unwrap())
        );
        assert_eq!(
            owner_hash(&owned_by("x", false)),
            None,
            "only the controller"
        );
        assert_eq!(owner_hash(&ObjectMeta::default()), None);
    }

    #[test]
    fn shard_label_round_trip_and_validation() {
        let s = ShardCount::new(16).unwrap();
        let mut m = ObjectMeta::default();
        stamp_shard_label(&mut m, 9);
        assert_eq!(labelled_shard(&m, s), Some(9));
        for bad in ["16", "-1", "", "0x1", "99999", " 1"] {
            m.labels
                .as_mut()
                .unwrap()
                .insert(SHARD_LABEL.into(), bad.into());
            assert_eq!(labelled_shard(&m, s), None, "{bad:?}");
        }
    }

    #[test]
    fn label_selector_of_ranges_and_its_worst_case_length() {
        let s = ShardCount::new(16).unwrap();
        let ranges = s.ranges_of([1, 2, 3, 9]).unwrap();
        let shards = shards_of_ranges(s, &ranges);
        assert_eq!(shards, [1, 2, 3, 9]);
        assert_eq!(
            shard_label_selector(&shards),
            "kube-shard.io/shard in (1,2,3,9)"
        );
        assert_eq!(shards_of_ranges(s, &RangeSet::full()).len(), 16);
        let max = ShardCount::new(LABEL_MAX_SHARDS).unwrap();
        let all: Vec<u32> = (0..max.get()).collect();
        let sel = shard_label_selector(&all);
        let encoded: String = form_urlencoded::byte_serialize(sel.as_bytes()).collect();
        assert!(encoded.len() < 2048, "{} bytes", encoded.len());
    }
}
