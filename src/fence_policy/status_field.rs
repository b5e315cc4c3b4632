//! Status-field fences: where a CRD's `/status` writes carry the fence token.
//!
//! On a custom resource's `/status` UPDATE the apiserver copies the stored metadata over the request's
//! before validation, so the fence annotation carries nothing there. With a [`StatusFenceField`]
//! (e.g. `.status.kubeShardFence`), [`FencedApi`](crate::ownership::fenced_write::FencedApi) stamps the token
//! into that field on its status writes, and the generator adds policies that compare it on `<plural>/status`.
//! The field must be declared in the CRD's schema (a string), or the apiserver prunes it.
//!
//! Pure: no I/O.

use std::{fmt, str::FromStr};

use serde_json::{Map, Value};

use super::types::PolicyError;

/// CEL's reserved words: not usable as a field name in a policy expression without escaping.
const CEL_RESERVED: &[&str] = &[
    "true",
    "false",
    "null",
    "in",
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
];

/// A field under `.status` that carries the fence token on `/status` writes: `.status.NAME[.NAME...]`,
/// each `NAME` a CEL identifier (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 characters, no `__`, not a CEL
/// reserved word).
///
/// ```
/// use kube_shard::fence_policy::StatusFenceField;
/// let f: StatusFenceField = ".status.kubeShardFence".parse().unwrap();
/// assert_eq!(f.to_string(), ".status.kubeShardFence");
/// assert!(".spec.fence".parse::<StatusFenceField>().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatusFenceField {
    /// The names below `status`, outermost first (never empty).
    path: Vec<String>,
}

impl FromStr for StatusFenceField {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PolicyError::StatusField(s.chars().take(128).collect());
        let mut parts = s.strip_prefix('.').unwrap_or(s).split('.');
        if parts.next() != Some("status") {
            return Err(bad());
        }
        let path: Vec<String> = parts.map(str::to_owned).collect();
        if path.is_empty() || path.len() > 8 || !path.iter().all(|p| identifier(p)) {
            return Err(bad());
        }
        Ok(StatusFenceField { path })
    }
}

impl fmt::Display for StatusFenceField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(".status")?;
        for p in &self.path {
            write!(f, ".{p}")?;
        }
        Ok(())
    }
}

fn identifier(p: &str) -> bool {
    let mut bytes = p.bytes();
    p.len() <= 63
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !p.contains("__")
        && !CEL_RESERVED.contains(&p)
}

/// Why a body could not carry the status fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NotAnObject;

impl StatusFenceField {
    /// The CEL expression of the field's value on `obj` (`object`, `oldObject`), `''` when absent: every
    /// step is guarded by `has()`.
    pub(crate) fn read(&self, obj: &str) -> String {
        let mut at = format!("{obj}.status");
        let mut guards = vec![format!("has({at})")];
        for p in &self.path {
            at = format!("{at}.{p}");
            guards.push(format!("has({at})"));
        }
        format!("{} ? {at} : ''", guards.join(" && "))
    }

    /// Set the field to `token` in `body` (an object, or a merge patch), creating the objects on the way.
    /// A `null` on the way is replaced when `null_is_absent` (a replace's `status: null`); otherwise — a
    /// merge patch that removes it — and for any other non-object on the way, the body cannot carry the
    /// fence.
    pub(crate) fn stamp(
        &self,
        body: &mut Value,
        token: &str,
        null_is_absent: bool,
    ) -> Result<(), NotAnObject> {
        let (leaf, inner) = self.path.split_last().expect("a path is never empty");
        let mut at = body.as_object_mut().ok_or(NotAnObject)?;
        for name in std::iter::once("status").chain(inner.iter().map(String::as_str)) {
            let slot = at
                .entry(name.to_owned())
                .or_insert_with(|| Value::Object(Map::new()));
            if slot.is_null() && null_is_absent {
                *slot = Value::Object(Map::new());
            }
            at = slot.as_object_mut().ok_or(NotAnObject)?;
        }
        at.insert(leaf.clone(), Value::String(token.to_owned()));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_status_paths_only() {
        for ok in [".status.kubeShardFence", "status.fence", ".status.a.b_2"] {
            let f: StatusFenceField = ok.parse().unwrap();
            assert!(f.to_string().starts_with(".status."), "{ok}");
        }
        for bad in [
            "",
            ".status",
            ".spec.fence",
            ".status.",
            ".status..x",
            ".status.in",
            ".status.a__b",
            ".status.1x",
            ".status.a-b",
            ".status.a'b",
            ".status.a.b.c.d.e.f.g.h.i",
        ] {
            assert!(bad.parse::<StatusFenceField>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn read_guards_every_step() {
        let f: StatusFenceField = ".status.a.b".parse().unwrap();
        assert_eq!(
            f.read("oldObject"),
            "has(oldObject.status) && has(oldObject.status.a) && has(oldObject.status.a.b) ? oldObject.status.a.b : ''"
        );
    }

    #[test]
    fn stamp_creates_the_path_and_keeps_the_rest() {
        let f: StatusFenceField = ".status.kubeShardFence".parse().unwrap();
        let mut obj = json!({"metadata": {}, "status": {"x": 1}});
        f.stamp(&mut obj, "3/7", false).unwrap();
        assert_eq!(obj["status"], json!({"x": 1, "kubeShardFence": "3/7"}));
        let mut bare = json!({"spec": {}});
        f.stamp(&mut bare, "3/7", false).unwrap();
        assert_eq!(bare["status"], json!({"kubeShardFence": "3/7"}));
        let mut nulled = json!({"status": null});
        assert_eq!(f.stamp(&mut nulled.clone(), "3/7", false), Err(NotAnObject));
        f.stamp(&mut nulled, "3/7", true).unwrap();
        assert_eq!(nulled["status"], json!({"kubeShardFence": "3/7"}));
        assert_eq!(
            f.stamp(&mut json!({"status": 5}), "3/7", true),
            Err(NotAnObject)
        );
        assert_eq!(f.stamp(&mut json!([]), "3/7", true), Err(NotAnObject));
    }
}
