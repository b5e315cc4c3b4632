//! The fuzz targets' checks (`fuzz/checks/library.rs`) on the stable toolchain: over proptest input,
//! and over every input kept in `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` (a crash
//! found by `cargo fuzz` is saved under `regressions/` and so stays a test here).
//!
//! `KUBE_SHARD_FUZZ_SEEDS=1 cargo test -p kube-shard --test it fuzz_fallback::write_seeds -- --ignored`
//! (re)writes the seed inputs built from real encoders into `fuzz/corpus/`.

#[path = "../../fuzz/checks/library.rs"]
mod checks;
#[path = "../../fuzz/checks/testserver.rs"]
mod server_checks;

use std::path::{Path, PathBuf};

use kube_shard::{
    group::{
        assignment::{Assignment, Handoff, ShardAssignment},
        report::{Ack, MemberReport},
    },
    hash::ShardKey,
    ownership::MemberId,
    shard::{ShardCount, ShardSet},
};
use proptest::prelude::*;

/// The library's checks and testserver's, by target name.
fn all_checks() -> impl Iterator<Item = (&'static str, checks::Check)> {
    checks::ALL.iter().chain(server_checks::ALL).copied()
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// Every file under `fuzz/<kind>/<target>/`, with its target's check.
fn kept_inputs(kind: &str) -> Vec<(PathBuf, checks::Check)> {
    let mut out = Vec::new();
    for (name, check) in all_checks() {
        let dir = fuzz_dir().join(kind).join(name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            out.push((e.path(), check));
        }
    }
    out
}

#[test]
fn corpora_and_regressions_pass_every_check() {
    let corpus = kept_inputs("corpus");
    assert!(
        corpus.len() >= all_checks().count(),
        "the fuzz corpora are missing: {} files under fuzz/corpus",
        corpus.len()
    );
    for (path, check) in corpus.into_iter().chain(kept_inputs("regressions")) {
        let data = std::fs::read(&path).unwrap();
        if std::panic::catch_unwind(|| check(&data)).is_err() {
            panic!("{} fails its fuzz check", path.display());
        }
    }
}

/// The round-trip half of each check runs only on input that decodes: every corpus must hold some.
#[test]
fn each_corpus_reaches_a_successful_decode() {
    type Decodes = fn(&[u8]) -> bool;
    let decodes: &[(&str, Decodes)] = &[
        ("selector", |d| {
            std::str::from_utf8(d)
                .is_ok_and(|t| t.parse::<kube_shard::selector::ShardSelector>().is_ok())
        }),
        ("fence_token", |d| {
            std::str::from_utf8(d).is_ok_and(|t| t.parse::<kube_shard::token::FenceToken>().is_ok())
        }),
        ("shard_set", |d| {
            std::str::from_utf8(d).is_ok_and(|t| ShardSet::parse(t, s(16)).is_ok())
        }),
        ("assignment", |d| {
            std::str::from_utf8(d)
                .is_ok_and(|t| Assignment::decode(t, s(16), ShardKey::Uid).is_ok())
        }),
        ("report", |d| {
            std::str::from_utf8(d).is_ok_and(|t| MemberReport::decode(t, s(16)).is_ok())
        }),
        ("protobuf_body", |d| {
            kube_shard_testserver::fuzzing::decode_protobuf_body(d).is_ok()
        }),
    ];
    for (name, decodes) in decodes {
        let dir = fuzz_dir().join("corpus").join(name);
        let ok = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .filter(|e| decodes(&std::fs::read(e.path()).unwrap()))
            .count();
        assert!(ok > 0, "no input in {} decodes", dir.display());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        for (_, check) in all_checks() {
            check(&data);
        }
    }

    /// Near-valid input: a kept seed with a few bytes changed reaches deeper than random bytes.
    #[test]
    fn mutated_seeds_never_panic(pick in any::<prop::sample::Index>(),
                                 edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let seeds = kept_inputs("corpus");
        let (path, check) = &seeds[pick.index(seeds.len())];
        let mut data = std::fs::read(path).unwrap();
        for (at, byte) in edits {
            if !data.is_empty() {
                let i = at.index(data.len());
                data[i] = byte;
            }
        }
        check(&data);
    }
}

fn s(n: u32) -> ShardCount {
    ShardCount::new(n).unwrap()
}

/// Seed inputs from the real encoders and the hand-written edge cases of the unit tests.
fn seeds() -> Vec<(&'static str, &'static str, String)> {
    let a = MemberId::new("pod-0", "a1");
    let b = MemberId::new("pod-1", "b2");
    let mut x = Assignment::empty(s(16), ShardKey::Uid);
    x.view.generation = 100;
    x.next_move_id = 9;
    for sh in 0..16 {
        let owner = if sh < 8 { a.clone() } else { b.clone() };
        x.view.shards.insert(sh, ShardAssignment::owned(owner, 50));
    }
    x.view.shards.get_mut(&6).unwrap().handoff = Handoff::Moving {
        id: 8,
        to: b.clone(),
    };
    x.view.shards.get_mut(&7).unwrap().handoff = Handoff::Draining {
        id: 8,
        to: b.clone(),
    };
    x.pins.insert(3, "pod-0".into());
    x.drained.insert("pod-9".into());
    let mut report = MemberReport::default();
    report.ready = true;
    report.weight = 2;
    report.applied_generation = 100;
    report.seen_generation = 100;
    report.acks = vec![
        Ack::Warm {
            shard: 3,
            move_id: 7,
        },
        Ack::Released {
            shard: 9,
            move_id: 2,
        },
    ];
    report.admitted = ShardSet::parse("0-7,12", s(16)).unwrap();
    report.serving = ShardSet::parse("0-12", s(16)).unwrap();
    let sel = kube_shard::selector::ShardSelector::for_shards(
        ShardKey::Uid,
        s(16),
        &ShardSet::parse("0-3,9", s(16)).unwrap(),
    )
    .unwrap();
    let deployment = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d","labels":{"a":"b"}},"spec":{"replicas":2,"template":{"spec":{"containers":[{"name":"c","image":"i","env":[{"name":"X","value":"1"}]}]}}}}"#;
    vec![
        ("query", "selectors", "labelSelector=a%3Db%2Cc%20in%20(d)&fieldSelector=metadata.name%3Dx&limit=5&resourceVersion=7&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true".into()),
        ("query", "shard", "shardSelector=shardRange(object.metadata.uid%2C%20%270x0000000000000000%27%2C%20%270x8000000000000000%27)&watch=1&sendInitialEvents=true".into()),
        ("label_selector", "all", "a=b,c!=d,e in (f,g),h notin (i),j,!k".into()),
        ("field_selector", "name", "metadata.name=x,metadata.namespace!=y".into()),
        ("json_patch", "ops", format!("{deployment}\0[{{\"op\":\"replace\",\"path\":\"/spec/replicas\",\"value\":3}},{{\"op\":\"add\",\"path\":\"/metadata/labels/z\",\"value\":\"1\"}},{{\"op\":\"remove\",\"path\":\"/metadata/labels/a\"}},{{\"op\":\"test\",\"path\":\"/kind\",\"value\":\"Deployment\"}},{{\"op\":\"move\",\"from\":\"/metadata/labels\",\"path\":\"/metadata/annotations\"}},{{\"op\":\"copy\",\"from\":\"/kind\",\"path\":\"/metadata/name\"}}]")),
        ("merge_patch", "nested", format!("{deployment}\0{{\"metadata\":{{\"labels\":{{\"a\":null,\"n\":\"m\"}}}},\"spec\":{{\"replicas\":5}}}}")),
        ("strategic_merge_patch", "containers", format!("{deployment}\0{{\"spec\":{{\"template\":{{\"spec\":{{\"containers\":[{{\"name\":\"c\",\"image\":\"j\"}},{{\"name\":\"d\",\"image\":\"k\"}}],\"$setElementOrder/containers\":[{{\"name\":\"d\"}},{{\"name\":\"c\"}}]}}}}}}}}")),
        ("strategic_merge_patch", "delete", format!("{deployment}\0{{\"spec\":{{\"template\":{{\"spec\":{{\"containers\":[{{\"name\":\"c\",\"$patch\":\"delete\"}}]}}}}}}}}")),
        ("assignment", "sample", x.encode()),
        (
            "assignment",
            "empty",
            Assignment::empty(s(16), ShardKey::Uid).encode(),
        ),
        ("report", "sample", report.encode()),
        ("report", "default", MemberReport::default().encode()),
        ("selector", "uid", sel.to_string()),
        (
            "selector",
            "namespace",
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000')"
                .into(),
        ),
        ("fence_token", "plain", "17/1764460800000".into()),
        ("fence_token", "max", format!("{}/{}", u32::MAX, u64::MAX)),
        ("shard_set", "ranges", "0-1,3,5-15".into()),
        ("shard_set", "empty", String::new()),
    ]
}

#[test]
#[ignore = "writes fuzz/corpus: run with KUBE_SHARD_FUZZ_SEEDS=1"]
fn write_seeds() {
    if std::env::var_os("KUBE_SHARD_FUZZ_SEEDS").is_none() {
        return;
    }
    for (target, name, text) in seeds() {
        let dir = fuzz_dir().join("corpus").join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("seed-{name}")), text).unwrap();
    }
}
