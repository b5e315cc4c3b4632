//! Entry points for the fuzz crate (feature `fuzzing`): thin wrappers around the server's parsers and
//! patch appliers. Each takes untrusted text or bytes and returns a `Result`; none may panic. Not a
//! stable API.

use serde_json::Value;

use crate::{
    labels::{FieldSelector, LabelSelector},
    list,
    query::{Filter, Query},
    resources::Registry,
    rest::{self, PatchType},
    schema::{Schemas, Ty},
    status::ApiError,
};

/// A rejected input: the HTTP status and message the server would answer.
pub type Rejected = (u16, String);

fn rejected(e: ApiError) -> Rejected {
    (e.code, e.message)
}

/// Parse a query string as a LIST or WATCH of ConfigMaps reads it (gate on): selectors, `limit`,
/// `continue`, `resourceVersion`, `timeoutSeconds`.
pub fn parse_query(query: &str) -> Result<(), Rejected> {
    let q = Query::parse(Some(query));
    let registry = Registry::with_builtins();
    let info = registry
        .get("", "v1", "configmaps")
        .ok_or((500, "configmaps are built in".to_string()))?;
    Filter::parse(&q, true, &info).map_err(rejected)?;
    list::parse_limit(&q).map_err(rejected)?;
    if let Some(token) = q.get("continue").filter(|t| !t.is_empty()) {
        list::decode_continue(token).map_err(rejected)?;
    }
    if let Some(rv) = q.get("resourceVersion").filter(|t| !t.is_empty()) {
        list::parse_rv(rv).map_err(rejected)?;
    }
    Ok(())
}

/// Parse a `labelSelector`.
pub fn parse_label_selector(text: &str) -> Result<(), Rejected> {
    LabelSelector::parse(text).map(drop).map_err(rejected)
}

/// Parse a `fieldSelector`.
pub fn parse_field_selector(text: &str) -> Result<(), Rejected> {
    FieldSelector::parse(text).map(drop).map_err(rejected)
}

fn json(bytes: &[u8]) -> Result<Value, Rejected> {
    serde_json::from_slice(bytes).map_err(|e| (400, e.to_string()))
}

fn patched(target: &[u8], patch: &[u8], ptype: PatchType, ty: &Ty) -> Result<Vec<u8>, Rejected> {
    let mut t = json(target)?;
    rest::apply_patch(&mut t, ptype, json(patch)?, ty).map_err(rejected)?;
    serde_json::to_vec(&t).map_err(|e| (500, e.to_string()))
}

/// Apply an RFC 6902 JSON patch to a JSON document; the patched document.
pub fn apply_json_patch(target: &[u8], patch: &[u8]) -> Result<Vec<u8>, Rejected> {
    patched(target, patch, PatchType::Json, &Ty::Untyped)
}

/// Apply an RFC 7386 JSON merge patch to a JSON document; the patched document.
pub fn apply_merge_patch(target: &[u8], patch: &[u8]) -> Result<Vec<u8>, Rejected> {
    patched(target, patch, PatchType::Merge, &Ty::Untyped)
}

/// Apply a strategic merge patch to a JSON object of built-in `kind` (such as `Deployment`); the
/// patched document. An unknown kind is an error (the server refuses strategic merge for custom
/// resources).
pub fn apply_strategic_merge_patch(
    kind: &str,
    target: &[u8],
    patch: &[u8],
) -> Result<Vec<u8>, Rejected> {
    let ty = Schemas::builtin()
        .kind_by_name(kind)
        .ok_or((415, format!("no built-in kind {kind:?}")))?;
    patched(target, patch, PatchType::Strategic, &ty)
}

/// The kinds [`decode_protobuf_body`] decodes a body as, picked by the input's first byte.
pub const PROTOBUF_KINDS: &[(&str, &str, &str)] = &[
    ("", "v1", "Namespace"),
    ("", "v1", "ConfigMap"),
    ("", "v1", "Secret"),
    ("apps", "v1", "Deployment"),
    ("", "v1", "Service"),
    ("batch", "v1", "Job"),
    ("batch", "v1", "CronJob"),
    ("", "v1", "Pod"),
    ("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding"),
    ("scheduling.k8s.io", "v1", "PriorityClass"),
    ("", "v1", "ResourceQuota"),
    ("example.com", "v1", "Widget"),
];

/// Decode a protobuf request body (`application/vnd.kubernetes.protobuf`) as the kind `data[0]` picks
/// from [`PROTOBUF_KINDS`], the rest being the body: the JSON object it stands for, or the answer to a bad
/// body.
pub fn decode_protobuf_body(data: &[u8]) -> Result<Value, Rejected> {
    let Some((pick, body)) = data.split_first() else {
        return Err((400, "no input".into()));
    };
    let (group, version, kind) = PROTOBUF_KINDS[usize::from(*pick) % PROTOBUF_KINDS.len()];
    let json = crate::protobuf::body_to_json(group, version, kind, body).map_err(rejected)?;
    serde_json::from_slice(&json).map_err(|e| (500, format!("the decoder wrote invalid JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrappers_accept_good_input_and_reject_bad() {
        assert!(parse_query("labelSelector=a%3Db&limit=5&resourceVersion=7").is_ok());
        assert_eq!(parse_query("limit=x").unwrap_err().0, 400);
        assert!(parse_query("continue=%%%").is_err());
        assert!(parse_label_selector("a in (b,c),!d").is_ok());
        assert!(parse_label_selector("a in (").is_err());
        assert!(parse_field_selector("metadata.name=x").is_ok());
        assert!(parse_field_selector("metadata.name~x").is_err());
        let doc = br#"{"a":1,"b":{"c":2}}"#;
        let out = apply_merge_patch(doc, br#"{"b":{"c":null,"d":3}}"#).unwrap();
        assert_eq!(json(&out).unwrap(), serde_json::json!({"a":1,"b":{"d":3}}));
        let out = apply_json_patch(doc, br#"[{"op":"remove","path":"/a"}]"#).unwrap();
        assert_eq!(json(&out).unwrap(), serde_json::json!({"b":{"c":2}}));
        assert!(apply_json_patch(doc, br#"[{"op":"remove","path":"/zz"}]"#).is_err());
        assert!(apply_merge_patch(b"{", b"{}").is_err());
    }

    #[test]
    fn garbage_never_panics() {
        let inputs: [&[u8]; 6] = [
            b"",
            b"\xff\xfe",
            b"[",
            b"null",
            b"{\"a\":[1,{}]}",
            b"%zz&=&&",
        ];
        let mut outcomes = Vec::new();
        for a in inputs {
            let text = String::from_utf8_lossy(a);
            outcomes.push(parse_query(&text).is_ok());
            outcomes.push(parse_label_selector(&text).is_ok());
            outcomes.push(parse_field_selector(&text).is_ok());
            for b in inputs {
                let applied = [
                    apply_json_patch(a, b).is_ok(),
                    apply_merge_patch(a, b).is_ok(),
                    apply_strategic_merge_patch("Deployment", a, b).is_ok(),
                ];
                if a.is_empty() || b.is_empty() {
                    assert_eq!(applied, [false; 3], "{a:?} {b:?}");
                }
            }
        }
        // The empty selector and query are valid.
        assert_eq!(&outcomes[..3], &[true, true, true]);
    }
}
