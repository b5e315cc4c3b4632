//! Planner properties (DESIGN §3): movement first, balance, weights, determinism, pins, succession,
//! contiguity; and the settle/debounce helper.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use proptest::prelude::*;

use super::*;

fn sc(s: u32) -> ShardCount {
    ShardCount::new(s).unwrap()
}

fn id(i: usize) -> MemberId {
    MemberId::new(format!("m{i:02}"), "a")
}

fn members(n: usize) -> Vec<Member> {
    (0..n).map(|i| Member::new(id(i))).collect()
}

/// Apply a plan: its target becomes the current assignment.
fn apply(input: PlanInput, plan: &Plan) -> PlanInput {
    input.with_owners(plan.assignments())
}

/// Shards currently held per member id.
fn held_of(input: &PlanInput) -> BTreeMap<MemberId, u32> {
    let mut held = BTreeMap::new();
    for m in &input.members {
        held.insert(m.id.clone(), 0);
    }
    for owner in input.current.values() {
        if let Some(h) = held.get_mut(owner) {
            *h += 1;
        }
    }
    held
}

/// `Σ max(0, held − quota)` over the report.
fn surplus(plan: &Plan) -> u32 {
    plan.report()
        .members
        .iter()
        .map(|m| m.held.saturating_sub(m.quota))
        .sum()
}

/// The least possible moves for equal weights and all owners live, computed independently: the ⌈S/N⌉
/// quotas go to the largest holders.
fn oracle_equal(s: u32, held: &[u32]) -> u32 {
    let n = held.len() as u32;
    let mut sorted = held.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let ceilings = s % n;
    sorted
        .iter()
        .enumerate()
        .map(|(k, &h)| {
            let q = s / n + u32::from((k as u32) < ceilings);
            h.saturating_sub(q)
        })
        .sum()
}

/// The least possible moves for weights (quotas ⌊S·w/W⌋ or that + 1 where the share is fractional, the
/// number of + 1s fixed by the total), computed independently.
fn oracle_weighted(s: u32, held: &[u32], weights: &[u32]) -> u32 {
    let total_w: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    let mut floors = Vec::new();
    let mut fractional = Vec::new();
    for &w in weights {
        let share = u64::from(s) * u64::from(w);
        floors.push((share / total_w) as u32);
        fractional.push(share % total_w > 0);
    }
    let extra = s - floors.iter().sum::<u32>();
    let base: u32 = held
        .iter()
        .zip(&floors)
        .map(|(&h, &f)| h.saturating_sub(f))
        .sum();
    let helped = held
        .iter()
        .zip(&floors)
        .zip(&fractional)
        .filter(|((&h, &f), &frac)| frac && h > f)
        .count() as u32;
    base - extra.min(helped)
}

fn ranges(plan: &Plan, member: &MemberId) -> u32 {
    plan.report().member(member).unwrap().ranges
}

/// A balanced, contiguous start: `n` members planned from nothing.
fn balanced(s: u32, n: usize) -> (PlanInput, Plan) {
    let input = PlanInput::new(sc(s)).with_members(members(n));
    let first = plan(&input).unwrap();
    (apply(input, &first), first)
}

fn sizes() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => Just(64u32),
        2 => Just(128u32),
        4 => Just(256u32),
        1 => Just(1024u32),
        1 => Just(4096u32),
    ]
}

fn check_equal_balance(plan: &Plan) {
    let planned: Vec<&MemberPlan> = plan
        .report()
        .members
        .iter()
        .filter(|m| m.role == PlanRole::Balanced)
        .collect();
    let s = plan.shards().get();
    let n = planned.len() as u32;
    for m in &planned {
        assert!(
            m.target == s / n || m.target == s.div_ceil(n),
            "{m:?} not within ⌊S/N⌋..⌈S/N⌉"
        );
        assert_eq!(m.target, m.quota);
    }
    assert_eq!(plan.assignments().count() as u32, s);
}

#[test]
fn cold_start_three_to_four_and_back() {
    let s = 256;
    let (three, first) = balanced(s, 3);
    assert_eq!(first.moves().len(), 256);
    assert!(first
        .moves()
        .iter()
        .all(|m| m.reason == MoveReason::Unowned));
    let quotas: Vec<u32> = first.report().members.iter().map(|m| m.quota).collect();
    assert_eq!(quotas.iter().sum::<u32>(), 256);
    assert!(quotas.iter().all(|&q| q == 85 || q == 86));
    for i in 0..3 {
        assert_eq!(ranges(&first, &id(i)), 1);
    }

    let four = three.with_member(Member::new(id(3)));
    let up = plan(&four).unwrap();
    assert_eq!(up.moves().len(), 64);
    assert_eq!(surplus(&up), 64);
    assert!(up.moves().iter().all(|m| m.reason == MoveReason::Rebalance));
    check_equal_balance(&up);
    let up_ranges: Vec<u32> = (0..4).map(|i| ranges(&up, &id(i))).collect();
    let four = apply(four, &up);
    assert!(plan(&four).unwrap().is_noop());

    let back = four.clone().without_member(&id(3));
    let down = plan(&back).unwrap();
    assert_eq!(down.moves().len(), 64);
    assert!(down.moves().iter().all(|m| m.reason == MoveReason::Unowned));
    check_equal_balance(&down);
    let down_ranges: Vec<u32> = (0..3).map(|i| ranges(&down, &id(i))).collect();
    println!(
        "S=256 3→4: 64 moves, ranges {up_ranges:?}; 4→3 (crash): 64 moves, ranges {down_ranges:?}"
    );
    assert!(up_ranges.iter().all(|&r| r <= 2));
    assert!(down_ranges.iter().all(|&r| r <= 2));

    // The same scale-down as a graceful leave.
    let leave = four.with_member(Member::new(id(3)).with_leaving(true));
    let down = plan(&leave).unwrap();
    assert_eq!(down.moves().len(), 64);
    assert!(down.moves().iter().all(|m| m.reason == MoveReason::Leaving));
    assert_eq!(down.report().member(&id(3)).unwrap().quota, 0);
}

#[test]
fn empty_and_degenerate_inputs() {
    let s = sc(16);
    let none = plan(&PlanInput::new(s)).unwrap();
    assert!(none.is_noop());
    assert_eq!(none.report().unassigned.len(), 16);

    // Only a leaver: it keeps its set (nobody can take it), reported unassigned.
    let lone_id = id(0);
    let lone = PlanInput::new(s)
        .with_members([Member::new(id(0)).with_leaving(true)])
        .with_owners((0..16).map(|x| (x, &lone_id)));
    let p = plan(&lone).unwrap();
    assert!(p.is_noop());
    assert_eq!(p.owner_of(3), Some(&id(0)));
    assert_eq!(p.report().unassigned.len(), 16);

    // Only a joining member: not planned yet.
    let joining = PlanInput::new(s).with_members([Member::new(id(0)).with_joining(true)]);
    let p = plan(&joining).unwrap();
    assert!(p.is_noop());
    assert_eq!(p.report().members[0].role, PlanRole::Joining);

    // S = 1, more members than shards.
    let p = plan(&PlanInput::new(sc(1)).with_members(members(3))).unwrap();
    assert_eq!(p.moves().len(), 1);
    assert_eq!(p.report().members.iter().map(|m| m.quota).sum::<u32>(), 1);
}

#[test]
fn malformed_input_is_refused() {
    let s = sc(8);
    let dup = PlanInput::new(s).with_members([Member::new(id(0)), Member::new(id(0))]);
    assert_eq!(
        plan(&dup),
        Err(PlanError::DuplicateMember { member: id(0) })
    );
    let zero = PlanInput::new(s).with_members([Member::new(id(0)).with_weight(0)]);
    assert!(matches!(plan(&zero), Err(PlanError::ZeroWeight { .. })));
    let owner = PlanInput::new(s).with_owner(8, id(0));
    assert_eq!(
        plan(&owner),
        Err(PlanError::ShardOutOfRange {
            what: "owner",
            shard: 8,
            count: 8
        })
    );
    let pin = PlanInput::new(s).with_pin(9, "m00");
    let err = plan(&pin).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pin for shard 9, but there are only 8 shards"
    );
}

#[test]
fn pins_and_their_reports() {
    let s = sc(64);
    let input = PlanInput::new(s)
        .with_members([
            Member::new(id(0)),
            Member::new(id(1)),
            Member::new(id(2)).with_leaving(true),
        ])
        .with_pin(5, "m01")
        .with_pin(6, "gone")
        .with_pin(7, "m02");
    let p = plan(&input).unwrap();
    assert_eq!(p.owner_of(5), Some(&id(1)));
    let ignored: Vec<(u32, PinIgnored)> = p
        .report()
        .ignored_pins
        .iter()
        .map(|x| (x.shard, x.reason))
        .collect();
    assert_eq!(
        ignored,
        vec![(6, PinIgnored::Absent), (7, PinIgnored::Leaving)]
    );
    // A member pinned more than its share keeps the pins; the other shares the rest.
    let heavy = (0..40).fold(PlanInput::new(s).with_members(members(2)), |i, x| {
        i.with_pin(x, "m00")
    });
    let p = plan(&heavy).unwrap();
    assert_eq!(p.shards_of(&id(0)).len(), 40);
    assert_eq!(p.shards_of(&id(1)).len(), 24);
    assert_eq!(p.report().member(&id(0)).unwrap().quota, 40);
}

#[test]
fn extreme_weights_do_not_overflow() {
    let s = sc(4096);
    let input = PlanInput::new(s)
        .with_members((0..300).map(|i| Member::new(id(i)).with_weight(u32::MAX - i as u32)));
    let p = plan(&input).unwrap();
    assert_eq!(p.assignments().count(), 4096);
    check_equal_balance(&p);
    let input = PlanInput::new(s)
        .with_members([Member::new(id(0)).with_weight(u32::MAX), Member::new(id(1))]);
    let p = plan(&input).unwrap();
    assert_eq!(p.shards_of(&id(0)).len(), 4096);
}

#[test]
fn weights_apportion_by_largest_remainder() {
    let s = sc(256);
    let input = PlanInput::new(s).with_members([
        Member::new(id(0)).with_weight(1),
        Member::new(id(1)).with_weight(2),
        Member::new(id(2)).with_weight(5),
    ]);
    let p = plan(&input).unwrap();
    let q: Vec<u32> = p.report().members.iter().map(|m| m.quota).collect();
    assert_eq!(q, vec![32, 64, 160]);
    let input = PlanInput::new(s).with_members([
        Member::new(id(0)).with_weight(1),
        Member::new(id(1)).with_weight(2),
    ]);
    let p = plan(&input).unwrap();
    let q: Vec<u32> = p.report().members.iter().map(|m| m.quota).collect();
    assert_eq!(q, vec![85, 171]);
    // A state off by one within the rounding is left alone (movement first).
    let (a, b) = (id(0), id(1));
    let skew = input.with_owners((0..256).map(|x| (x, if x < 86 { &a } else { &b })));
    assert!(plan(&skew).unwrap().is_noop());
}

#[test]
fn restarted_member_gets_its_absent_namesakes_set() {
    let (input, first) = balanced(64, 3);
    let old = first.shards_of(&id(1));
    let restarted = MemberId::new("m01", "b");
    let input = input
        .without_member(&id(1))
        .with_member(Member::new(restarted.clone()).with_joining(true));
    let p = plan(&input).unwrap();
    assert_eq!(p.shards_of(&restarted), old);
    assert_eq!(p.moves().len(), old.len());
    assert!(p.moves().iter().all(|m| m.reason == MoveReason::Unowned));
    assert_eq!(p.report().successions.len(), 1);
}

#[test]
fn settle_cold_start_and_debounce() {
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let (a, b, c) = (id(0), id(1), id(2));
    let cfg = SettleConfig::new()
        .with_settle_window(Duration::from_secs(10))
        .with_join_debounce(Duration::from_secs(5));
    let mut st = Settle::new(cfg.clone());
    assert!(!st.ready_to_plan(at(0)));
    assert!(st.observe(at(0), []));
    assert!(!st.ready_to_plan(at(60_000)), "no members, no plan");
    assert!(st.observe(at(1_000), [&a]));
    assert!(!st.observe(at(2_000), [&a]));
    assert_eq!(st.next_deadline(at(2_000)), Some(at(11_000)));
    assert!(st.observe(at(3_000), [&a, &b]));
    assert!(!st.ready_to_plan(at(12_999)));
    assert!(st.ready_to_plan(at(13_000)));
    assert!(!st.is_joining(&a, at(13_000)));
    st.mark_planned();
    assert!(st.is_planned());
    assert!(!st.is_joining(&b, at(13_000)));
    assert!(st.observe(at(20_000), [&a, &b, &c]));
    assert!(st.ready_to_plan(at(20_000)));
    assert!(st.is_joining(&c, at(24_999)));
    assert_eq!(st.next_deadline(at(21_000)), Some(at(25_000)));
    assert!(!st.is_joining(&c, at(25_000)));
    // Leaving and coming back restarts the debounce.
    st.observe(at(26_000), [&a, &b]);
    st.observe(at(27_000), [&a, &b, &c]);
    assert!(st.is_joining(&c, at(31_000)));
    assert!(st.is_joining(&id(9), at(31_000)), "never observed");

    // The expected replica count cuts the settle window short.
    let mut st = Settle::new(cfg.with_expected_members(Some(3)));
    st.observe(at(0), [&a, &b]);
    assert!(!st.ready_to_plan(at(1)));
    st.observe(at(1), [&a, &b, &c]);
    assert!(st.ready_to_plan(at(1)));
}

/// Prints, per N at S = 256 and 4096: the moves and ranges of N → N+1 (scale up) and back (crash of the
/// newest member), and of a full rolling update (run with `--nocapture`).
#[test]
fn print_scaling_table() {
    for s in [256, 4096] {
        println!("S={s}: N→N+1 moves (joiner ranges, max ranges) | N+1→N moves (max ranges) | rolling update moves");
        for n in 1..=10 {
            let (input, _) = balanced(s, n);
            let up_input = input.with_member(Member::new(id(n)));
            let up = plan(&up_input).unwrap();
            let max_up = up.report().members.iter().map(|m| m.ranges).max().unwrap();
            let back = apply(up_input, &up).without_member(&id(n));
            let down = plan(&back).unwrap();
            let max_down = down
                .report()
                .members
                .iter()
                .map(|m| m.ranges)
                .max()
                .unwrap();
            let (mut roll, _) = balanced(s, n);
            let mut rolled = 0;
            for i in 0..n {
                roll = roll.with_member(Member::new(MemberId::new(format!("n{i:02}"), "b")));
                roll.members
                    .iter_mut()
                    .find(|m| m.id == id(i))
                    .unwrap()
                    .leaving = true;
                let p = plan(&roll).unwrap();
                rolled += p.moves().len();
                roll = apply(roll, &p).without_member(&id(i));
            }
            assert_eq!(rolled, s as usize);
            println!(
                "  N={n:>2}: {:>4} ({}, {}) | {:>4} ({}) | {rolled}",
                up.moves().len(),
                ranges(&up, &id(n)),
                max_up,
                down.moves().len(),
                max_down
            );
        }
    }
}

/// A deterministic xorshift generator for the long random walk.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// What a random walk measured.
#[derive(Debug, Default)]
struct WalkStats {
    moves: usize,
    followups: usize,
    /// Ranges per member averaged over members and steps.
    mean_ranges: f64,
    /// The most ranges any member held at any step.
    worst: u32,
}

/// `steps` random membership changes (joins, crashes, graceful leaves, rolling replacements, weight
/// changes, pins), applied one by one: every step moves exactly what it must and a replan moves nothing.
fn walk(seed: u64, s: u32, steps: u64, print: bool) -> WalkStats {
    let mut rng = Rng(seed);
    let mut next_name = 4;
    let mut input = PlanInput::new(sc(s)).with_members(members(4));
    let p = plan(&input).unwrap();
    input = apply(input, &p);
    let (mut total_moves, mut followups, mut worst, mut sum, mut count) = (0, 0, 0, 0.0, 0);
    for step in 0..steps {
        let n = input.members.len();
        let op = rng.below(12);
        let mut expected = None::<usize>;
        let held_by = |input: &PlanInput, gone: &MemberId| -> ShardSet {
            input
                .current
                .iter()
                .filter(|(_, o)| *o == gone)
                .map(|(&x, _)| x)
                .collect()
        };
        let name = match op {
            0..=3 if n < 10 => {
                input = input.with_member(Member::new(id(next_name)).with_joined(step));
                next_name += 1;
                "join"
            }
            4 | 5 if n > 3 => {
                let gone = input.members[rng.below(n)].id.clone();
                expected = Some(held_by(&input, &gone).len());
                input = input.without_member(&gone);
                "crash"
            }
            6 | 7 if n > 3 => {
                let k = rng.below(n);
                expected = Some(held_by(&input, &input.members[k].id).len());
                input.members[k].leaving = true;
                "leave"
            }
            8 | 9 => {
                let k = rng.below(n);
                let set = held_by(&input, &input.members[k].id);
                expected = Some(set.len());
                input.members[k].leaving = true;
                let fresh = id(next_name);
                next_name += 1;
                input = input.with_member(
                    Member::new(fresh.clone())
                        .with_joined(step)
                        .with_joining(true),
                );
                assert_eq!(plan(&input).unwrap().shards_of(&fresh), set);
                "replace"
            }
            10 => {
                let shard = rng.below(s as usize) as u32;
                if input.pins.len() >= 3 {
                    input.pins.clear();
                }
                let name = input.members[rng.below(n)].id.name.clone();
                input.pins.insert(shard, name);
                "pin"
            }
            _ => {
                let k = rng.below(n);
                input.members[k].weight = 1 + rng.below(3) as u32;
                "weight"
            }
        };
        let p = plan(&input).unwrap();
        if let Some(e) = expected {
            // Departures: the departed set moves, and (with unequal weights) at most a rounding more.
            assert!(p.moves().len() >= e, "step {step} {name}");
        }
        // Movement first: exactly Σ max(0, held − quota) (leavers' quota is 0) plus the orphaned shards.
        let orphans = s as usize
            - input
                .current
                .values()
                .filter(|o| input.members.iter().any(|m| &m.id == *o))
                .count();
        if name != "pin" {
            assert_eq!(
                p.moves().len(),
                surplus(&p) as usize + orphans,
                "step {step} {name}"
            );
        }
        total_moves += p.moves().len();
        input = apply(input, &p);
        // Departed members go; joins are settled.
        input.members.retain(|m| !m.leaving);
        for m in &mut input.members {
            m.joining = false;
        }
        let mut again = plan(&input).unwrap();
        if !p.report().successions.is_empty() && !again.is_noop() {
            // A successor keeps a whole set above its quota for one round; the next plan balances it.
            assert_eq!(again.moves().len() as u32, surplus(&again));
            followups += again.moves().len();
            input = apply(input, &again);
            again = plan(&input).unwrap();
        }
        assert!(
            again.is_noop(),
            "step {step}: replan moved {:?}",
            again.moves()
        );
        let ranges: Vec<u32> = again.report().members.iter().map(|m| m.ranges).collect();
        worst = worst.max(ranges.iter().copied().max().unwrap_or(0));
        sum += f64::from(ranges.iter().sum::<u32>()) / ranges.len() as f64;
        count += 1;
        if print && step % 10 == 9 {
            println!(
                "step {:>3} {:>7}: {:>2} members, {:>3} moved, ranges per member {ranges:?}",
                step + 1,
                name,
                input.members.len(),
                p.moves().len()
            );
        }
    }
    if print {
        let p = plan(&input).unwrap();
        println!(
            "after {steps} random changes at S={s}: {total_moves} moves, {followups} more rebalancing oversized successors"
        );
        for m in &p.report().members {
            println!(
                "  {:>6} weight {} holds {:>3} shards in {} ranges: {}",
                m.id.to_string(),
                m.weight,
                m.target,
                m.ranges,
                p.shards_of(&m.id)
            );
        }
    }
    WalkStats {
        moves: total_moves,
        followups,
        mean_ranges: sum / f64::from(count),
        worst,
    }
}

/// 100 random membership changes at S = 256 with a fixed seed; prints moves and ranges per member (run
/// with `--nocapture`).
#[test]
fn random_walk_of_100_changes_prints_ranges() {
    let stats = walk(0x5eed_cafe_f00d_1234, 256, 100, true);
    println!("  {stats:?}");
    assert!(
        stats.worst <= 12,
        "ranges per member grew to {}",
        stats.worst
    );
}

/// Many walks: ranges per member stay low on average (the ideal is 1).
#[test]
fn random_walks_keep_ranges_low() {
    for s in [256, 1024] {
        let all: Vec<WalkStats> = (1..=16u64)
            .map(|seed| walk(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15), s, 100, false))
            .collect();
        let mean = all.iter().map(|w| w.mean_ranges).sum::<f64>() / all.len() as f64;
        let worst = all.iter().map(|w| w.worst).max().unwrap();
        let moves = all.iter().map(|w| w.moves + w.followups).sum::<usize>() / all.len();
        println!(
            "S={s}: 16 walks of 100 changes: mean ranges per member {mean:.2}, worst {worst}, {moves} moves per walk"
        );
        assert!(mean < 4.0, "mean ranges per member {mean:.2}");
    }
}

fn perm_of(n: usize) -> impl Strategy<Value = Vec<usize>> {
    Just((0..n).collect::<Vec<_>>()).prop_shuffle()
}

/// A random input: up to 10 members (random weights, some leaving or joining), owners among them, absent
/// ones or none, and pins to present or absent names.
fn any_input() -> impl Strategy<Value = PlanInput> {
    (
        prop_oneof![Just(16u32), Just(64u32), Just(256u32)],
        1..=10usize,
    )
        .prop_flat_map(|(s, n)| {
            (
                prop::collection::vec((1..=4u32, any::<bool>(), any::<bool>(), 0..4u64), n),
                prop::collection::vec(0..n + 2, s as usize),
                prop::collection::btree_map(0..s, 0..n + 1, 0..4),
                any::<bool>(),
            )
                .prop_map(move |(flags, owners, pins, weighted)| {
                    let ms = flags
                        .iter()
                        .enumerate()
                        .map(|(i, &(w, leaving, joining, joined))| {
                            Member::new(id(i))
                                .with_weight(if weighted { w } else { 1 })
                                .with_leaving(leaving && i % 3 == 0)
                                .with_joining(joining && i % 3 == 1)
                                .with_joined(joined)
                        });
                    let mut input = PlanInput::new(sc(s)).with_members(ms);
                    for (x, &o) in owners.iter().enumerate() {
                        match o {
                            o if o < n => input.current.insert(x as u32, id(o)),
                            o if o == n => {
                                input.current.insert(x as u32, MemberId::new("gone", "z"))
                            }
                            _ => None,
                        };
                    }
                    for (x, o) in pins {
                        let name = if o < n {
                            format!("m{o:02}")
                        } else {
                            "gone".to_owned()
                        };
                        input.pins.insert(x, name.into());
                    }
                    input
                })
        })
}

type Verdict = Result<(), TestCaseError>;

fn check_scale_by_one(s: u32, n: usize, k: prop::sample::Index) -> Verdict {
    let (input, _) = balanced(s, n);
    let held = held_of(&input);

    let up_input = input.clone().with_member(Member::new(id(n)));
    let up = plan(&up_input).unwrap();
    let mut hs: Vec<u32> = held.values().copied().collect();
    hs.push(0);
    let moved = up.moves().len() as u32;
    prop_assert_eq!(moved, surplus(&up));
    prop_assert_eq!(moved, oracle_equal(s, &hs));
    prop_assert_eq!(moved, up.report().member(&id(n)).unwrap().quota);
    check_equal_balance(&up);
    prop_assert!(up.moves().iter().all(|m| m.to == id(n)));
    prop_assert!(plan(&apply(up_input, &up)).unwrap().is_noop());

    if n > 1 {
        let gone = id(k.index(n));
        let set = held[&gone];
        let down = plan(&input.clone().without_member(&gone)).unwrap();
        prop_assert_eq!(down.moves().len() as u32, set);
        prop_assert_eq!(surplus(&down), 0);
        check_equal_balance(&down);

        let leaving = input.with_member(Member::new(gone).with_leaving(true));
        let leave = plan(&leaving).unwrap();
        prop_assert_eq!(leave.moves().len() as u32, set);
        prop_assert_eq!(surplus(&leave), set);
        prop_assert!(leave
            .moves()
            .iter()
            .all(|m| m.reason == MoveReason::Leaving));
        check_equal_balance(&leave);
    }
    Ok(())
}

fn random_state() -> impl Strategy<Value = (u32, usize, Vec<Option<usize>>, Vec<u32>)> {
    (sizes(), 1..=10usize).prop_flat_map(|(s, n)| {
        (
            Just(s),
            Just(n),
            prop::collection::vec(
                prop_oneof![8 => (0..n).prop_map(Some), 1 => Just(None)],
                s as usize,
            ),
            prop::collection::vec(1..=5u32, n),
        )
    })
}

fn check_random_state(
    (s, n, owners, weights): (u32, usize, Vec<Option<usize>>, Vec<u32>),
    blocky: bool,
    weighted: bool,
) -> Verdict {
    // Blocky states: long runs per owner, like a real assignment after churn.
    let owners: Vec<Option<usize>> = if blocky {
        let run = (s as usize / 8).max(1);
        (0..s as usize).map(|x| owners[x / run * run]).collect()
    } else {
        owners
    };
    let weights: Vec<u32> = if weighted { weights } else { vec![1; n] };
    let mut input = PlanInput::new(sc(s))
        .with_members((0..n).map(|i| Member::new(id(i)).with_weight(weights[i])));
    let mut orphans = 0;
    for (x, o) in owners.iter().enumerate() {
        match o {
            Some(i) => {
                input.current.insert(x as u32, id(*i));
            }
            None if x % 2 == 0 => orphans += 1,
            None => {
                orphans += 1;
                input.current.insert(x as u32, MemberId::new("gone", "z"));
            }
        }
    }
    let held: Vec<u32> = held_of(&input).values().copied().collect();
    let p = plan(&input).unwrap();
    prop_assert_eq!(p.moves().len() as u32, surplus(&p) + orphans);
    let oracle = if weighted {
        oracle_weighted(s, &held, &weights)
    } else {
        oracle_equal(s, &held)
    };
    prop_assert_eq!(surplus(&p), oracle);
    let total_w: u32 = weights.iter().sum();
    for (i, m) in p.report().members.iter().enumerate() {
        prop_assert_eq!(m.target, m.quota);
        let ideal = f64::from(s) * f64::from(weights[i]) / f64::from(total_w);
        prop_assert!(
            (f64::from(m.target) - ideal).abs() < 1.0,
            "{:?} vs ideal {}",
            m,
            ideal
        );
    }
    if !weighted {
        check_equal_balance(&p);
    }
    // Every move's source is over its quota and its target under: nobody gives and receives.
    for mv in p.moves() {
        if let Some(r) = mv.from.as_ref().and_then(|f| p.report().member(f)) {
            prop_assert!(r.held > r.quota);
        }
        let to = p.report().member(&mv.to).unwrap();
        prop_assert!(to.held < to.quota);
    }
    prop_assert!(plan(&apply(input, &p)).unwrap().is_noop());
    Ok(())
}

fn check_deterministic(input: &PlanInput, perm: Vec<usize>) -> Verdict {
    let a = plan(input).unwrap();
    prop_assert_eq!(&a, &plan(input).unwrap());
    let shuffled = input.clone().with_members(
        perm.into_iter()
            .filter(|&i| i < input.members.len())
            .map(|i| input.members[i].clone()),
    );
    prop_assert_eq!(&a, &plan(&shuffled).unwrap());
    // Every shard has a target whenever some member is planned.
    let any_planned = a
        .report()
        .members
        .iter()
        .any(|m| matches!(m.role, PlanRole::Balanced | PlanRole::Successor));
    if any_planned {
        prop_assert!(a.report().unassigned.is_empty());
        prop_assert_eq!(a.assignments().count() as u32, input.shards.get());
    }
    Ok(())
}

fn check_pins(input: &PlanInput) -> Verdict {
    let p = plan(input).unwrap();
    let by_name = |name: &Arc<str>| {
        let name = name.clone();
        input.members.iter().filter(move |m| m.id.name == name)
    };
    let held = held_of(input);
    for (&x, name) in &input.pins {
        let planned = by_name(name).find(|m| !(m.leaving || (m.joining && held[&m.id] == 0)));
        let ignored = p.report().ignored_pins.iter().find(|i| i.shard == x);
        match planned {
            Some(m) => {
                prop_assert_eq!(p.owner_of(x), Some(&m.id));
                prop_assert!(ignored.is_none());
            }
            None => {
                let reason = ignored.expect("ignored pin reported").reason;
                let expected = if by_name(name).next().is_none() {
                    PinIgnored::Absent
                } else if by_name(name).all(|m| m.leaving) {
                    PinIgnored::Leaving
                } else {
                    PinIgnored::Joining
                };
                prop_assert_eq!(reason, expected);
            }
        }
    }
    // Minimal movement with pins, when every owner is live and planned and nothing is handed over: the
    // pinned shards away from their member, plus Σ max(0, unpinned held − room the pins leave).
    let planned_ids: Vec<&MemberId> = p
        .report()
        .members
        .iter()
        .filter(|m| m.role == PlanRole::Balanced)
        .map(|m| &m.id)
        .collect();
    let all_live = input.current.len() == input.shards.get() as usize
        && input.current.values().all(|o| planned_ids.contains(&o));
    if all_live && p.report().successions.is_empty() {
        let pinned_away = p
            .moves()
            .iter()
            .filter(|m| m.reason == MoveReason::Pinned)
            .count();
        let honoured: Vec<u32> = input
            .pins
            .keys()
            .copied()
            .filter(|x| !p.report().ignored_pins.iter().any(|i| i.shard == *x))
            .collect();
        let mut extra = 0;
        for r in &p.report().members {
            let pins_here = honoured
                .iter()
                .filter(|x| p.owner_of(**x) == Some(&r.id))
                .count() as u32;
            let unpinned_held = input
                .current
                .iter()
                .filter(|(x, o)| **o == r.id && !honoured.contains(x))
                .count() as u32;
            extra += unpinned_held.saturating_sub(r.quota.saturating_sub(pins_here));
        }
        prop_assert_eq!(p.moves().len(), pinned_away + extra as usize);
    }
    Ok(())
}

fn check_succession(s: u32, n: usize, k: prop::sample::Index, joining: bool) -> Verdict {
    let (input, first) = balanced(s, n);
    let leaver = id(k.index(n));
    let set = first.shards_of(&leaver);
    let fresh = MemberId::new("fresh", "x");
    let mut input = input.with_member(Member::new(fresh.clone()).with_joining(joining));
    input
        .members
        .iter_mut()
        .find(|m| m.id == leaver)
        .unwrap()
        .leaving = true;
    let p = plan(&input).unwrap();
    prop_assert_eq!(p.shards_of(&fresh), set.clone());
    prop_assert_eq!(p.moves().len(), set.len());
    prop_assert!(p
        .moves()
        .iter()
        .all(|m| m.from.as_ref() == Some(&leaver) && m.to == fresh));
    prop_assert_eq!(p.report().member(&fresh).unwrap().role, PlanRole::Successor);
    let mut after = apply(input, &p).without_member(&leaver);
    for m in &mut after.members {
        m.joining = false;
    }
    prop_assert!(plan(&after).unwrap().is_noop());
    Ok(())
}

fn check_rolling_update(s: u32, n: usize, same_name: bool) -> Verdict {
    let (mut input, _) = balanced(s, n);
    let mut moved = vec![0u32; s as usize];
    for i in 0..n {
        let name = if same_name {
            format!("m{i:02}")
        } else {
            format!("n{i:02}")
        };
        let new = Member::new(MemberId::new(name, "b"))
            .with_joined(i as u64 + 1)
            .with_joining(true);
        input = input.with_member(new);
        input
            .members
            .iter_mut()
            .find(|m| m.id == id(i))
            .unwrap()
            .leaving = true;
        let p = plan(&input).unwrap();
        for mv in p.moves() {
            moved[mv.shard as usize] += 1;
        }
        input = apply(input, &p).without_member(&id(i));
        for m in &mut input.members {
            m.joining = false;
        }
        prop_assert!(plan(&input).unwrap().is_noop());
    }
    prop_assert!(moved.iter().all(|&c| c == 1), "{:?}", moved);
    Ok(())
}

fn check_contiguity(s: u32, n: usize, k: prop::sample::Index) -> Verdict {
    let (input, first) = balanced(s, n);
    for i in 0..n {
        prop_assert_eq!(ranges(&first, &id(i)), 1);
    }
    let up_input = input.with_member(Member::new(id(n)));
    let up = plan(&up_input).unwrap();
    for i in 0..n {
        prop_assert!(ranges(&up, &id(i)) <= 1);
    }
    let joiner = ranges(&up, &id(n)) as usize;
    prop_assert!(
        joiner <= n.div_ceil(2).max(1),
        "joiner has {} ranges for N={}",
        joiner,
        n
    );
    let up_input = apply(up_input, &up);
    let gone = id(k.index(n + 1));
    let down = plan(&up_input.without_member(&gone)).unwrap();
    for r in &down.report().members {
        prop_assert!(r.ranges <= r.ranges_before + 1, "{:?}", r);
    }
    Ok(())
}

fn check_partial_application(
    (s, n, owners, weights): (u32, usize, Vec<Option<usize>>, Vec<u32>),
    weighted: bool,
    keep: Vec<bool>,
) -> Verdict {
    let weights: Vec<u32> = if weighted { weights } else { vec![1; n] };
    let ids: Vec<MemberId> = (0..n).map(id).collect();
    let input = PlanInput::new(sc(s))
        .with_members((0..n).map(|i| Member::new(id(i)).with_weight(weights[i])))
        .with_owners(
            owners
                .iter()
                .enumerate()
                .map(|(x, o)| (x as u32, &ids[o.unwrap_or(x % n)])),
        );
    let p = plan(&input).unwrap();
    // The coordinator runs a bounded number of moves at a time; replanning after any subset of them is
    // done asks for exactly the rest (no move is wasted, nothing moves twice in total).
    let mut partial = input.clone();
    let mut done = 0;
    for (mv, &take) in p.moves().iter().zip(keep.iter().cycle()) {
        if take {
            partial.current.insert(mv.shard, mv.to.clone());
            done += 1;
        }
    }
    let rest = plan(&partial).unwrap();
    prop_assert_eq!(rest.moves().len(), p.moves().len() - done);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// N → N+1 and N → N−1 (crash and graceful leave) from a balanced state move exactly
    /// `Σ max(0, held − quota)` (plus the departed set), the least possible, and end balanced.
    #[test]
    fn scale_by_one_moves_exactly_the_surplus(
        s in sizes(),
        n in 1..=12usize,
        k in any::<prop::sample::Index>(),
    ) {
        check_scale_by_one(s, n, k)?;
    }

    /// Random current states with every owner live (some shards unowned or owned by an absent member):
    /// moves == `Σ max(0, held − quota)` + the orphaned shards == the independent optimum, and the result
    /// is balanced (equal weights: ⌊S/N⌋ or ⌈S/N⌉; weights: within one shard of S·w/W).
    #[test]
    fn random_states_move_the_least_possible(
        state in random_state(),
        blocky in any::<bool>(),
        weighted in any::<bool>(),
    ) {
        check_random_state(state, blocky, weighted)?;
    }

    /// After any subset of a plan's moves is carried out, the replan moves exactly the rest.
    #[test]
    fn partial_application_then_replan_moves_the_rest(
        state in random_state(),
        weighted in any::<bool>(),
        keep in prop::collection::vec(any::<bool>(), 1..64),
    ) {
        check_partial_application(state, weighted, keep)?;
    }

    /// Same input → same plan; the order of the input members does not matter.
    #[test]
    fn deterministic(input in any_input(), perm in perm_of(10)) {
        check_deterministic(&input, perm)?;
    }

    /// Pins to planned members are honoured and count toward the quota; pins to absent, leaving or
    /// joining members are reported with the reason; movement stays minimal given the pins.
    #[test]
    fn pins_honoured_absent_reported(input in any_input()) {
        check_pins(&input)?;
    }

    /// A leaver's whole set goes to a fresh member and nothing else moves; replanning moves nothing.
    #[test]
    fn leaver_set_goes_to_fresh_joiner(
        s in sizes(),
        n in 1..=10usize,
        k in any::<prop::sample::Index>(),
        joining in any::<bool>(),
    ) {
        check_succession(s, n, k, joining)?;
    }

    /// A rolling update replacing every member one at a time (surge style, or under the same name as a
    /// StatefulSet would) moves every shard exactly once.
    #[test]
    fn rolling_update_moves_each_shard_once(
        s in sizes(),
        n in 1..=8usize,
        same_name in any::<bool>(),
    ) {
        check_rolling_update(s, n, same_name)?;
    }

    /// Contiguity: from nothing, every member gets one range; scaling N → N+1 leaves the old members one
    /// range each and gives the joiner at most ⌈N/2⌉; N+1 → N adds at most one range to any member.
    #[test]
    fn contiguity_bounds(s in sizes(), n in 1..=16usize, k in any::<prop::sample::Index>()) {
        check_contiguity(s, n, k)?;
    }
}

/// Every order of `items` (Heap's algorithm).
fn permutations<T: Clone>(items: &[T]) -> Vec<Vec<T>> {
    fn go<T: Clone>(k: usize, a: &mut Vec<T>, out: &mut Vec<Vec<T>>) {
        if k <= 1 {
            out.push(a.clone());
            return;
        }
        for i in 0..k {
            go(k - 1, a, out);
            let j = if k.is_multiple_of(2) { i } else { 0 };
            a.swap(j, k - 1);
        }
    }
    let mut out = Vec::new();
    go(items.len(), &mut items.to_vec(), &mut out);
    out
}

/// Join order, the planner's half: `joined` is a time since a fixed origin, smaller is earlier. A
/// leaver's set goes whole to the fresh member that joined **first**, and pins between two incarnations of
/// one name go to the earlier one, in whatever order the members are listed. The fresh members' names sort
/// against their join order, so neither the id order nor the listing order can pick the same member by
/// chance. (The runtime's half — first-seen time, not an age — is
/// `safety_group::a_leavers_set_goes_to_the_earliest_joined_member`.)
#[test]
fn successor_and_pins_follow_join_order_whatever_the_listing_order() {
    let s = sc(16);
    let (leaver, keeper) = (id(0), id(1));
    let early = MemberId::new("m09", "a");
    let mid = MemberId::new("m05", "a");
    let late = MemberId::new("m02", "a");
    let (pin_old, pin_new) = (MemberId::new("m07", "b"), MemberId::new("m07", "a"));
    let listed = vec![
        Member::new(leaver.clone())
            .with_leaving(true)
            .with_joined(10),
        Member::new(keeper.clone()).with_joined(20),
        Member::new(late.clone())
            .with_joined(5_000)
            .with_joining(true),
        Member::new(mid.clone())
            .with_joined(3_000)
            .with_joining(true),
        Member::new(early.clone())
            .with_joined(1_000)
            .with_joining(true),
        Member::new(pin_new.clone()).with_joined(4_000),
        Member::new(pin_old.clone()).with_joined(30),
    ];
    let owners: Vec<(u32, &MemberId)> = (0..16)
        .map(|x| {
            (
                x,
                if x < 6 {
                    &leaver
                } else if x < 15 {
                    &keeper
                } else {
                    &pin_old
                },
            )
        })
        .collect();
    let leavers_set: ShardSet = (0..6).collect();
    let mut first: Option<Vec<(u32, MemberId)>> = None;
    let orders = permutations(&listed);
    assert_eq!(orders.len(), 5040);
    for order in orders {
        let input = PlanInput::new(s)
            .with_members(order)
            .with_owners(owners.iter().copied())
            .with_pin(15, "m07");
        let p = plan(&input).unwrap();
        let succ = &p.report().successions;
        assert_eq!(succ.len(), 1, "{succ:?}");
        assert_eq!(
            (&succ[0].from, &succ[0].to, &succ[0].shards),
            (&leaver, &early, &leavers_set),
            "the leaver's set must go to the earliest-joined fresh member"
        );
        assert!(
            p.shards_of(&pin_old).contains(15),
            "the pin goes to the earlier incarnation: {:?}",
            p.assignments().find(|(x, _)| *x == 15)
        );
        let target: Vec<(u32, MemberId)> = p.assignments().map(|(x, m)| (x, m.clone())).collect();
        match &first {
            None => first = Some(target),
            Some(f) => assert_eq!(f, &target, "the plan depends on the listing order"),
        }
    }
}
