//! Micro-benchmarks of the pure core: hashing 36-byte uids, selector render and parse, minimal range sets
//! for 256 shards, and the planner at S = 4096 with N = 128 (cold start, one join to an interleaved
//! assignment). Run with `cargo bench -p kube-shard --bench pure`. The scenario figures (movement, scale,
//! recovery) come from `kshard-dev bench`: see docs/performance.md.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kube_shard::{fnv1a64, ShardCount, ShardKey, ShardSelector};

fn uids(n: usize) -> Vec<String> {
    // deterministic, uuid-shaped 36-byte strings
    (0..n as u64)
        .map(|i| {
            let h = fnv1a64(&i.to_le_bytes());
            let x = format!("{h:016x}{:016x}", h.rotate_left(17) ^ i);
            format!(
                "{}-{}-4{}-a{}-{}",
                &x[0..8],
                &x[8..12],
                &x[13..16],
                &x[17..20],
                &x[20..32]
            )
        })
        .collect()
}

fn hash(c: &mut Criterion) {
    let uids = uids(1024);
    assert!(uids.iter().all(|u| u.len() == 36));
    let mut g = c.benchmark_group("hash");
    g.throughput(Throughput::Elements(uids.len() as u64));
    g.bench_function("fnv1a64_uid36_x1024", |b| {
        b.iter(|| {
            let mut acc = 0u64;
            for u in &uids {
                acc ^= fnv1a64(black_box(u.as_bytes()));
            }
            acc
        })
    });
    let s = ShardCount::DEFAULT;
    g.bench_function("shard_of_uid36_x1024", |b| {
        b.iter(|| {
            uids.iter()
                .map(|u| s.shard_of(fnv1a64(u.as_bytes())) as u64)
                .sum::<u64>()
        })
    });
    g.finish();
}

fn selectors(c: &mut Criterion) {
    let s = ShardCount::DEFAULT;
    let mut g = c.benchmark_group("selector");
    // 1 term (a contiguous quarter), 16 terms, 128 terms (every other shard: the worst case for S=256)
    for (name, shards) in [
        ("1_term", (0..64).collect::<Vec<u32>>()),
        ("16_terms", (0..256).filter(|i| i % 16 < 8).collect()),
        ("128_terms", (0..256).step_by(2).collect()),
    ] {
        let sel = ShardSelector::new(ShardKey::Uid, &s.ranges_of(shards).unwrap()).unwrap();
        let text = sel.to_string();
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_with_input(BenchmarkId::new("render", name), &sel, |b, sel| {
            b.iter(|| black_box(sel).to_string())
        });
        g.bench_with_input(BenchmarkId::new("parse", name), &text, |b, text| {
            b.iter(|| black_box(text).parse::<ShardSelector>().unwrap())
        });
        let hashes: Vec<u64> = uids(1024).iter().map(|u| fnv1a64(u.as_bytes())).collect();
        g.throughput(Throughput::Elements(hashes.len() as u64));
        g.bench_with_input(BenchmarkId::new("matches_x1024", name), &sel, |b, sel| {
            b.iter(|| hashes.iter().filter(|h| sel.matches(**h)).count())
        });
    }
    g.finish();
}

fn ranges(c: &mut Criterion) {
    let s = ShardCount::DEFAULT;
    let mut g = c.benchmark_group("ranges");
    let half: Vec<u32> = (0..256).filter(|i| i % 2 == 0).collect();
    let all: Vec<u32> = (0..256).collect();
    g.bench_function("minimal_set_256_shards_all", |b| {
        b.iter(|| s.ranges_of(black_box(&all).iter().copied()).unwrap())
    });
    g.bench_function("minimal_set_256_shards_alternating", |b| {
        b.iter(|| s.ranges_of(black_box(&half).iter().copied()).unwrap())
    });
    g.finish();
}

fn planner(c: &mut Criterion) {
    use kube_shard::ownership::MemberId;
    use kube_shard::testing::planner::{Member, PlanInput};

    let s = ShardCount::new(4096).unwrap();
    let ids: Vec<MemberId> = (0..=128)
        .map(|i| MemberId::new(format!("member-{i:03}"), "a"))
        .collect();
    let members = |n: usize| {
        ids[..n]
            .iter()
            .cloned()
            .map(Member::new)
            .collect::<Vec<_>>()
    };
    let mut g = c.benchmark_group("planner");
    let cold = PlanInput::new(s).with_members(members(128));
    g.bench_function("cold_start_s4096_n128", |b| {
        b.iter(|| black_box(&cold).plan().unwrap())
    });
    // worst-case fragmentation: shard i owned by member i mod 128; then a 129th member joins
    let join = PlanInput::new(s)
        .with_owners((0..4096u32).map(|x| (x, &ids[x as usize % 128])))
        .with_members(members(129));
    g.bench_function("join_interleaved_s4096_n128", |b| {
        b.iter(|| black_box(&join).plan().unwrap())
    });
    g.finish();
}

criterion_group!(benches, hash, selectors, ranges, planner);
criterion_main!(benches);
