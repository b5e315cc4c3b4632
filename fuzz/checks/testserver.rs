#![allow(dead_code)] // each fuzz target uses one check
//! What the fuzz targets assert about testserver's parsers and patch appliers (its `fuzzing` feature),
//! shared with the stable fallback (`tests/it/fuzz_fallback.rs`): any input gives an answer, never a
//! panic; an answer to a bad request is a 4xx (a 5xx would be the server blaming itself for the
//! client's bytes) — except where the real server answers 5xx itself (an invalid `shardSelector`); and
//! the empty patches change nothing.
//!
//! Patch targets split their input at the first NUL byte: document, then patch.

use kube_shard_testserver::fuzzing;

fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

fn client_error(what: &str, input: &[u8], code: u16) {
    assert!(
        (400..500).contains(&code),
        "{what}: answered {code} for {:?}",
        String::from_utf8_lossy(input)
    );
}

/// A LIST or WATCH query string. The one 5xx allowed is the real server's answer to an invalid
/// KEP-5866 `shardSelector`: 500 with `invalid shard selector: …` (docs/kep-5866.md).
pub fn query(data: &[u8]) {
    match fuzzing::parse_query(&text(data)) {
        Err((500, message)) if message.starts_with("invalid shard selector: ") => {}
        Err((code, _)) => client_error("query", data, code),
        Ok(()) => {}
    }
}

/// A `labelSelector`.
pub fn label_selector(data: &[u8]) {
    if let Err((code, _)) = fuzzing::parse_label_selector(&text(data)) {
        client_error("labelSelector", data, code);
    }
}

/// A `fieldSelector`.
pub fn field_selector(data: &[u8]) {
    if let Err((code, _)) = fuzzing::parse_field_selector(&text(data)) {
        client_error("fieldSelector", data, code);
    }
}

fn split(data: &[u8]) -> (&[u8], &[u8]) {
    match data.iter().position(|b| *b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// Whether `out` is `doc` as the server prints it after parsing: compared as text, byte for byte,
/// with `doc` parsed and printed the same way. Parsing both and comparing values is wrong: serde_json's
/// default float parser is not correctly rounded, so a printed float can parse back one ulp away
/// (`"3" * 49` became 3.333333333333334e48 after a round trip; kept in `regressions/json_patch/`).
fn same_json(out: &[u8], doc: &[u8]) -> bool {
    let printed = serde_json::from_slice::<serde_json::Value>(doc)
        .ok()
        .and_then(|v| serde_json::to_vec(&v).ok());
    printed.as_deref() == Some(out)
}

/// An RFC 6902 JSON patch; `[]` changes nothing.
pub fn json_patch(data: &[u8]) {
    let (doc, patch) = split(data);
    if let Err((code, _)) = fuzzing::apply_json_patch(doc, patch) {
        client_error("json patch", data, code);
    }
    if let Ok(out) = fuzzing::apply_json_patch(doc, b"[]") {
        assert!(
            same_json(&out, doc),
            "an empty JSON patch changed the document"
        );
    }
}

/// An RFC 7386 merge patch; `{}` changes nothing on an object.
pub fn merge_patch(data: &[u8]) {
    let (doc, patch) = split(data);
    if let Err((code, _)) = fuzzing::apply_merge_patch(doc, patch) {
        client_error("merge patch", data, code);
    }
    let is_object = serde_json::from_slice::<serde_json::Value>(doc).is_ok_and(|v| v.is_object());
    if is_object {
        let out = fuzzing::apply_merge_patch(doc, b"{}").expect("{} applies to any object");
        assert!(
            same_json(&out, doc),
            "an empty merge patch changed the document"
        );
    }
}

/// A strategic merge patch on a Deployment and on a Pod (merge keys on lists).
pub fn strategic_merge_patch(data: &[u8]) {
    let (doc, patch) = split(data);
    for kind in ["Deployment", "Pod", "ConfigMap"] {
        match fuzzing::apply_strategic_merge_patch(kind, doc, patch) {
            Err((501, _)) => return, // not implemented in this build
            Err((code, _)) => client_error("strategic merge patch", data, code),
            Ok(_) => {}
        }
    }
}

/// A protobuf request body: decoded into an object of the kind asked for, or refused with a 4xx (400 for
/// bytes that are not a message, 415 for a message the server does not decode); never a panic, never a 5xx.
pub fn protobuf_body(data: &[u8]) {
    match fuzzing::decode_protobuf_body(data) {
        Err((code, _)) => client_error("protobuf body", data, code),
        Ok(v) => {
            let kind =
                fuzzing::PROTOBUF_KINDS[usize::from(data[0]) % fuzzing::PROTOBUF_KINDS.len()].2;
            assert_eq!(
                v["kind"], kind,
                "a decoded body is an object of the endpoint's kind"
            );
            assert!(v.is_object());
        }
    }
}

/// A check: feed it one input; it panics on a violation.
pub type Check = fn(&[u8]);

/// Every testserver check by name, for the corpus replay.
pub const ALL: &[(&str, Check)] = &[
    ("query", query),
    ("label_selector", label_selector),
    ("field_selector", field_selector),
    ("json_patch", json_patch),
    ("merge_patch", merge_patch),
    ("strategic_merge_patch", strategic_merge_patch),
    ("protobuf_body", protobuf_body),
];
