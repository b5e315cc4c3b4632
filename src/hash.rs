//! FNV-1a 64 hashing and shard-key extraction, bit for bit as kube-apiserver computes it for KEP-5866.
//!
//! The server hashes the raw UTF-8 bytes of the selected field (`metadata.uid` or `metadata.namespace`)
//! with FNV-1a 64 (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`, xor then multiply), with no
//! salt, prefix or normalisation, and compares the result as an unsigned 64-bit number.
//!
//! Pure: no I/O, no async.

use std::{fmt, str::FromStr};

use kube::api::ObjectMeta;
use kube::Resource;

/// FNV-1a 64 offset basis.
pub const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64 prime.
pub const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `bytes`, exactly as the apiserver's shard filter computes it.
///
/// ```
/// assert_eq!(kube_shard::hash::fnv1a64(b"default"), 0xebada5168620c5fe);
/// ```
#[inline]
#[must_use]
pub const fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut hash = FNV_OFFSET_BASIS;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    hash
}

/// The field whose hash places an object, as the server's `shardRange` understands it.
///
/// The key of a shard group never changes: changing it is a new group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum ShardKey {
    /// `object.metadata.uid`: spreads every object independently.
    Uid,
    /// `object.metadata.namespace`: keeps each namespace together (cluster-scoped objects all hash `""`).
    Namespace,
}

impl ShardKey {
    /// The CEL field path used in a selector (`object.metadata.uid` / `object.metadata.namespace`).
    #[must_use]
    pub const fn field_path(self) -> &'static str {
        match self {
            ShardKey::Uid => "object.metadata.uid",
            ShardKey::Namespace => "object.metadata.namespace",
        }
    }

    /// The short name used in configuration and on the command line (`uid` / `namespace`).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            ShardKey::Uid => "uid",
            ShardKey::Namespace => "namespace",
        }
    }

    /// The key from a CEL field path, if it is one the server accepts.
    #[must_use]
    pub fn from_field_path(path: &str) -> Option<Self> {
        match path {
            "object.metadata.uid" => Some(ShardKey::Uid),
            "object.metadata.namespace" => Some(ShardKey::Namespace),
            _ => None,
        }
    }

    /// The raw field value this key hashes, read from object metadata.
    ///
    /// Cluster-scoped objects (and any object without a namespace) hash the empty namespace `""`, as the
    /// server does. An object without a uid cannot be placed under the `uid` key: that is an error, never
    /// a zero hash.
    pub fn value_of(self, meta: &ObjectMeta) -> Result<&str, KeyError> {
        match self {
            ShardKey::Uid => meta
                .uid
                .as_deref()
                .filter(|uid| !uid.is_empty())
                .ok_or_else(|| KeyError::MissingUid {
                    name: meta
                        .name
                        .clone()
                        .or_else(|| meta.generate_name.clone())
                        .unwrap_or_default(),
                }),
            ShardKey::Namespace => Ok(meta.namespace.as_deref().unwrap_or("")),
        }
    }

    /// The FNV-1a 64 hash of this key's field in `meta`.
    pub fn hash_meta(self, meta: &ObjectMeta) -> Result<u64, KeyError> {
        self.value_of(meta).map(|v| fnv1a64(v.as_bytes()))
    }

    /// The FNV-1a 64 hash of this key's field in any Kubernetes object.
    ///
    /// ```
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::api::ObjectMeta;
    /// use kube_shard::hash::ShardKey;
    ///
    /// let cm = ConfigMap {
    ///     metadata: ObjectMeta {
    ///         name: Some("cfg".into()),
    ///         namespace: Some("default".into()),
    ///         uid: Some("f47ac10b-58cc-4372-a567-0e02b2c3d479".into()),
    ///         ..ObjectMeta::default()
    ///     },
    ///     ..ConfigMap::default()
    /// };
    /// assert_eq!(ShardKey::Uid.hash_object(&cm).unwrap(), 0x70ed2686c31eff00);
    /// assert_eq!(ShardKey::Namespace.hash_object(&cm).unwrap(), 0xebada5168620c5fe);
    /// ```
    pub fn hash_object<K: Resource>(self, obj: &K) -> Result<u64, KeyError> {
        self.hash_meta(obj.meta())
    }
}

impl fmt::Display for ShardKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ShardKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "uid" => Ok(ShardKey::Uid),
            "namespace" => Ok(ShardKey::Namespace),
            other => Err(KeyError::UnknownKey(other.to_owned())),
        }
    }
}

/// Why an object could not be placed, or a key name was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The object has no `metadata.uid` (not yet created, or built by hand); it has no shard under `uid`.
    #[error("object {name:?} has no metadata.uid, so it has no shard under the uid key")]
    MissingUid {
        /// The object's name (or generateName), empty when it has neither.
        name: String,
    },
    /// A shard key name other than `uid` or `namespace`.
    #[error("unknown shard key {0:?}: expected \"uid\" or \"namespace\"")]
    UnknownKey(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of kep-5866.md (`a`/`abc` are Go's own `hash/fnv` golden values).
    const VECTORS: &[(&str, u64)] = &[
        ("", 0xcbf29ce484222325),
        ("a", 0xaf63dc4c8601ec8c),
        ("abc", 0xe71fa2190541574b),
        ("default", 0xebada5168620c5fe),
        ("kube-system", 0xdf65c7bc1d82b35e),
        ("kube-node-lease", 0x021fb6dd71b80174),
        ("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 0x93754b7248a00eb9),
        ("f47ac10b-58cc-4372-a567-0e02b2c3d479", 0x70ed2686c31eff00),
        ("00000000-0000-0000-0000-000000000000", 0x7c384c6218f299f1),
    ];

    #[test]
    fn kep_vectors() {
        for (input, want) in VECTORS {
            assert_eq!(fnv1a64(input.as_bytes()), *want, "fnv1a64({input:?})");
        }
    }

    #[test]
    fn hash_is_over_raw_bytes_without_normalisation() {
        let upper = fnv1a64(b"F47AC10B-58CC-4372-A567-0E02B2C3D479");
        assert_ne!(
            upper, 0x70ed2686c31eff00,
            "uids are hashed as stored, never re-formatted"
        );
        assert_ne!(fnv1a64(" default".as_bytes()), 0xebada5168620c5fe);
    }

    fn meta(ns: Option<&str>, uid: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some("x".into()),
            namespace: ns.map(Into::into),
            uid: uid.map(Into::into),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn key_extraction() {
        let m = meta(
            Some("kube-system"),
            Some("aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"),
        );
        assert_eq!(ShardKey::Uid.hash_meta(&m), Ok(0x93754b7248a00eb9));
        assert_eq!(ShardKey::Namespace.hash_meta(&m), Ok(0xdf65c7bc1d82b35e));
        // cluster-scoped: the empty namespace
        let c = meta(None, Some("u"));
        assert_eq!(ShardKey::Namespace.hash_meta(&c), Ok(0xcbf29ce484222325));
    }

    #[test]
    fn missing_uid_is_an_error_not_a_zero_hash() {
        for uid in [None, Some("")] {
            let err = ShardKey::Uid
                .hash_meta(&meta(Some("default"), uid))
                .unwrap_err();
            assert_eq!(err, KeyError::MissingUid { name: "x".into() });
            assert!(err.to_string().contains("no metadata.uid"));
        }
    }

    #[test]
    fn key_names_round_trip() {
        for key in [ShardKey::Uid, ShardKey::Namespace] {
            assert_eq!(key.to_string().parse::<ShardKey>(), Ok(key));
            assert_eq!(ShardKey::from_field_path(key.field_path()), Some(key));
        }
        let err = "name".parse::<ShardKey>().unwrap_err();
        assert!(err.to_string().contains("unknown shard key \"name\""));
        assert_eq!(ShardKey::from_field_path("metadata.uid"), None);
    }
}
