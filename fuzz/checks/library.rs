#![allow(dead_code)] // each fuzz target uses one check
//! What the fuzz targets assert about the library's decoders, shared with the stable proptest fallback
//! (`tests/it/fuzz_fallback.rs` includes this file): any bytes give `Ok` or `Err`, never a panic, and
//! whatever decodes renders to text that decodes to the same value.
//!
//! Each function takes the raw fuzz input; non-UTF-8 input is an error before it reaches a decoder, as
//! on the wire (the apiserver hands us strings).

use kube_shard::{
    group::{assignment::Assignment, report::MemberReport},
    hash::ShardKey,
    selector::ShardSelector,
    shard::{ShardCount, ShardSet},
    token::FenceToken,
};

/// The group size every decoder is checked against (a typical `S`), plus a small one for edges.
fn counts() -> [ShardCount; 3] {
    [
        ShardCount::new(256).expect("256 is a valid S"),
        ShardCount::new(16).expect("16 is a valid S"),
        ShardCount::new(4).expect("4 is a valid S"),
    ]
}

/// A `shardSelector` expression: parse, render, parse again to the same selector.
pub fn selector(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(sel) = text.parse::<ShardSelector>() {
        let rendered = sel.to_string();
        let again: ShardSelector = rendered
            .parse()
            .unwrap_or_else(|e| panic!("rendered selector {rendered:?} does not parse: {e}"));
        assert_eq!(again, sel, "selector round trip changed {rendered:?}");
    }
}

/// The fence token `"<shard>/<epoch>"`: parse, render, parse again.
pub fn fence_token(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(token) = text.parse::<FenceToken>() {
        let rendered = token.to_string();
        assert_eq!(
            rendered.parse::<FenceToken>().ok(),
            Some(token),
            "token {rendered:?}"
        );
    }
}

/// A shard set (`"0-3,7"`) against each `S`: parse, render, parse again.
pub fn shard_set(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for count in counts() {
        if let Ok(set) = ShardSet::parse(text, count) {
            let rendered = set.to_string();
            let again = ShardSet::parse(&rendered, count)
                .unwrap_or_else(|e| panic!("rendered set {rendered:?} does not parse: {e}"));
            assert_eq!(again, set, "shard set round trip changed {rendered:?}");
        }
    }
}

/// The assignment ConfigMap's text: decode, encode, decode again to the same assignment.
pub fn assignment(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for count in counts() {
        for key in [ShardKey::Uid, ShardKey::Namespace] {
            if let Ok(a) = Assignment::decode(text, count, key) {
                let encoded = a.encode();
                let again = Assignment::decode(&encoded, count, key).unwrap_or_else(|e| {
                    panic!("encoded assignment does not decode: {e}\n{encoded}")
                });
                assert_eq!(again, a, "assignment round trip changed it:\n{encoded}");
            }
        }
    }
}

/// A member's report (its Lease annotation): decode, encode, and the encoding is a fixed point.
pub fn report(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for count in counts() {
        if let Ok(r) = MemberReport::decode(text, count) {
            let encoded = r.encode();
            let again = MemberReport::decode(&encoded, count)
                .unwrap_or_else(|e| panic!("encoded report does not decode: {e}\n{encoded}"));
            assert_eq!(again.encode(), encoded, "report round trip changed it");
        }
    }
}

/// A check: feed it one input; it panics on a violation.
pub type Check = fn(&[u8]);

/// Every library check by name, for the corpus replay.
pub const ALL: &[(&str, Check)] = &[
    ("selector", selector),
    ("fence_token", fence_token),
    ("shard_set", shard_set),
    ("assignment", assignment),
    ("report", report),
];
