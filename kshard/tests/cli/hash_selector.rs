//! The exact output contract of `kshard hash` and `kshard selector`.

use std::process::{Command, Output};

fn kshard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kshard"))
        .args(args)
        .output()
        .expect("run kshard")
}

fn stdout(o: &Output) -> &str {
    std::str::from_utf8(&o.stdout).unwrap()
}

fn stderr(o: &Output) -> &str {
    std::str::from_utf8(&o.stderr).unwrap()
}

#[test]
fn hash_prints_value_hash_shard() {
    let o = kshard(&[
        "hash",
        "f47ac10b-58cc-4372-a567-0e02b2c3d479",
        "default",
        "",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "f47ac10b-58cc-4372-a567-0e02b2c3d479\t70ed2686c31eff00\t112\n\
         default\tebada5168620c5fe\t235\n\
         \tcbf29ce484222325\t203\n"
    );
}

#[test]
fn hash_with_shards_and_key() {
    let o = kshard(&[
        "hash",
        "--key",
        "namespace",
        "--shards",
        "4",
        "kube-node-lease",
        "kube-system",
    ]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o),
        "kube-node-lease\t021fb6dd71b80174\t0\nkube-system\tdf65c7bc1d82b35e\t3\n"
    );
    let one = kshard(&["hash", "--shards", "1", "abc"]);
    assert_eq!(stdout(&one), "abc\te71fa2190541574b\t0\n");
}

#[test]
fn hash_json() {
    let o = kshard(&["hash", "--json", "a", "abc"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(
        stdout(&o),
        "[{\"value\":\"a\",\"hash\":\"af63dc4c8601ec8c\",\"shard\":175},\
         {\"value\":\"abc\",\"hash\":\"e71fa2190541574b\",\"shard\":231}]\n"
    );
}

#[test]
fn hash_rejects_bad_shard_counts_and_keys() {
    for args in [
        &["hash", "--shards", "3", "a"][..],
        &["hash", "--shards", "131072", "a"][..],
        &["hash", "--shards", "x", "a"][..],
        &["hash", "--key", "name", "a"][..],
        &["hash"][..],
    ] {
        let o = kshard(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stdout(&o).is_empty());
        assert!(!stderr(&o).is_empty());
    }
    let o = kshard(&["hash", "--shards", "3", "a"]);
    assert!(stderr(&o).contains("power of two"), "{}", stderr(&o));
}

#[test]
fn selector_for_owned_shards() {
    let o = kshard(&["selector", "--owned", "0-63,128,130-131"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x4000000000000000') || \
         shardRange(object.metadata.uid, '0x8000000000000000', '0x8100000000000000') || \
         shardRange(object.metadata.uid, '0x8200000000000000', '0x8400000000000000')\n"
    );
    let o = kshard(&[
        "selector",
        "--key",
        "namespace",
        "--shards",
        "2",
        "--owned",
        "1",
    ]);
    assert_eq!(
        stdout(&o),
        "shardRange(object.metadata.namespace, '0x8000000000000000', '0x10000000000000000')\n"
    );
}

#[test]
fn selector_owning_everything_is_the_full_range() {
    let o = kshard(&["selector", "--owned", "0-255"]);
    assert_eq!(
        stdout(&o),
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')\n"
    );
    let o = kshard(&["selector", "--shards", "16", "--owned", "8-15,0-7"]);
    assert_eq!(
        stdout(&o),
        "shardRange(object.metadata.uid, '0x0000000000000000', '0x10000000000000000')\n"
    );
}

#[test]
fn selector_owning_nothing_exits_2() {
    let o = kshard(&["selector", "--owned", ""]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stdout(&o).is_empty(), "never an empty selector");
    assert!(stderr(&o).contains("owning no shards"), "{}", stderr(&o));
}

#[test]
fn selector_rejects_bad_lists() {
    for list in ["0-256", "5-3", "a", "1,,2"] {
        let o = kshard(&["selector", "--owned", list]);
        assert_eq!(o.status.code(), Some(2), "{list}");
        assert!(stdout(&o).is_empty());
    }
    let o = kshard(&["selector", "--owned", "0-256"]);
    assert!(
        stderr(&o).contains("shard 256 does not exist"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn selector_check_prints_canonical_form_in_given_order() {
    let o = kshard(&[
        "selector",
        "--check",
        "shardRange( object.metadata.uid,'0xc000000000000000','0x10000000000000000' )||shardRange(object.metadata.uid,'0x0000000000000000','0x4000000000000000')",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "shardRange(object.metadata.uid, '0xc000000000000000', '0x10000000000000000') || \
         shardRange(object.metadata.uid, '0x0000000000000000', '0x4000000000000000')\n"
    );
}

#[test]
fn selector_check_refuses_with_reason() {
    let cases = [
        (
            "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')",
            "16 lowercase hex digits",
        ),
        (
            "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
            "unsupported field",
        ),
        ("   ", "empty"),
        (
            "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') // c",
            "kube-shard does not",
        ),
    ];
    for (expr, reason) in cases {
        let o = kshard(&["selector", "--check", expr]);
        assert_eq!(o.status.code(), Some(2), "{expr}");
        assert!(stdout(&o).is_empty());
        assert!(stderr(&o).contains(reason), "{expr}: {}", stderr(&o));
    }
}

#[test]
fn selector_needs_owned_or_check() {
    let o = kshard(&["selector"]);
    assert_eq!(o.status.code(), Some(2));
    let o = kshard(&["selector", "--owned", "1", "--check", "x"]);
    assert_eq!(o.status.code(), Some(2));
}
