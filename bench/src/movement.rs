//! `movement`: what a membership change costs, on the real planner (pure, no I/O).
//!
//! For `S` = 256 and 4096 and a membership sequence of joins from 1 to 32 members then leaves back to 1
//! (random join names, random leave order; once with equal weights, once with random weights 1–4):
//!
//! - **ours**: shards the planner moves ÷ the optimum `Σ max(0, held − quota)` (plus shards of absent or
//!   leaving owners, which must move whatever the plan);
//! - the fraction of the keyspace remapped by kube-shard (moves ÷ S) next to `hash % N`, static contiguous
//!   ranges (`N` equal ranges by ordinal, as JOSDK's static `shardSelector` or kube-state-metrics), and a
//!   100-vnode consistent-hash ring, measured on the same sequence over sampled object hashes;
//! - ranges per member (p50, max) and the longest selector after 100 random changes (joins, graceful
//!   leaves and crashes) with `N` ≤ 16.
//!
//! Target: moves = 1.00 × optimum; `hash % N`'s remapped fraction ÷ ours ≥ 0.95 × min(N before, N after);
//! ranges per member p50 ≤ 4, max ≤ 12 at S = 256, N ≤ 16.

use std::collections::BTreeMap;

use kube_shard::group::optimal_moves;
use kube_shard::ownership::MemberId;
use kube_shard::testing::planner::{Member, PlanInput};
use kube_shard::{fnv1a64, ShardCount, ShardKey, ShardSelector};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::stats::{f2, percentile, ratio, verdict};
use crate::{BenchError, Options, Report, Table};

/// Largest membership of the join/leave sequence.
const MAX_MEMBERS: usize = 32;
/// Virtual nodes per member (per unit of weight) of the ring baseline.
const VNODES: usize = 100;

/// One membership change and what each scheme remapped.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Step {
    /// Members before.
    pub before: usize,
    /// Members after.
    pub after: usize,
    /// Shards the planner moved.
    pub moves: usize,
    /// The optimum for this change.
    pub optimum: usize,
    /// Keyspace fraction remapped by kube-shard (moves ÷ S).
    pub ours: f64,
    /// … by `hash % N` (owner = members[h mod N], members in join order).
    pub modulo: f64,
    /// … by static contiguous ranges (owner = members[⌊h·N / 2^64⌋]).
    pub ranges: f64,
    /// … by a consistent-hash ring of 100 vnodes per unit of weight.
    pub ring: f64,
}

impl Step {
    /// `hash % N`'s remapped fraction ÷ ours ÷ min(N before, N after): the target is ≥ 0.95.
    #[must_use]
    pub fn modulo_advantage(&self) -> f64 {
        ratio(self.modulo, self.ours) / self.before.min(self.after) as f64
    }
}

#[derive(Clone, Debug)]
struct Live {
    name: String,
    weight: u32,
    joined: u64,
}

fn id(name: &str) -> MemberId {
    MemberId::new(name.to_owned(), "1")
}

/// Object hashes the keyspace fractions are sampled on.
fn sample_hashes(n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| fnv1a64(format!("{i:08x}-0000-4000-8000-bench-object").as_bytes()))
        .collect()
}

struct Ring(Vec<(u64, usize)>);

impl Ring {
    fn new(live: &[Live]) -> Self {
        let mut points: Vec<(u64, usize)> = live
            .iter()
            .enumerate()
            .flat_map(|(i, m)| {
                (0..VNODES * m.weight as usize)
                    .map(move |v| (fnv1a64(format!("{}#{v}", m.name).as_bytes()), i))
            })
            .collect();
        points.sort_unstable();
        Ring(points)
    }

    fn owner(&self, h: u64) -> usize {
        let i = self.0.partition_point(|(p, _)| *p < h);
        self.0[i % self.0.len()].1
    }
}

/// The name owning each sampled hash under a scheme.
fn owners(live: &[Live], hashes: &[u64], scheme: &str) -> Vec<String> {
    let n = live.len() as u64;
    let ring = (scheme == "ring").then(|| Ring::new(live));
    hashes
        .iter()
        .map(|&h| {
            let i = match scheme {
                "modulo" => (h % n) as usize,
                "ranges" => ((u128::from(h) * u128::from(n)) >> 64) as usize,
                _ => ring.as_ref().map_or(0, |r| r.owner(h)),
            };
            live[i].name.clone()
        })
        .collect()
}

fn changed(a: &[String], b: &[String]) -> f64 {
    let diff = a.iter().zip(b).filter(|(x, y)| x != y).count();
    diff as f64 / a.len().max(1) as f64
}

/// The planner's state between changes.
struct Planner {
    s: ShardCount,
    current: BTreeMap<u32, MemberId>,
}

impl Planner {
    /// Plan one change; `leaving` names a member leaving gracefully (still in `live`). Returns
    /// (moves, optimum, max ranges per planned member, p50 ranges, longest selector).
    fn change(&mut self, live: &[Live], leaving: Option<&str>) -> Result<Outcome, BenchError> {
        let members = live.iter().map(|m| {
            Member::new(id(&m.name))
                .with_weight(m.weight)
                .with_joined(m.joined)
                .with_leaving(Some(m.name.as_str()) == leaving)
        });
        let input = PlanInput::new(self.s)
            .with_owners(self.current.iter().map(|(s, m)| (*s, m)))
            .with_members(members);
        let plan = input
            .plan()
            .map_err(|e| BenchError::Library(format!("planner refused a valid input: {e}")))?;
        // the optimum: the library's own (the planner's quotas over the members that stay)
        let staying: Vec<(MemberId, u32)> = live
            .iter()
            .filter(|m| Some(m.name.as_str()) != leaving)
            .map(|m| (id(&m.name), m.weight))
            .collect();
        let optimum = optimal_moves(
            self.s,
            self.current.iter().map(|(s, m)| (*s, m)),
            staying.iter().map(|(m, w)| (m, *w)),
        )
        .ok_or_else(|| BenchError::Library("no optimum for a valid input".into()))?;
        let mut ranges = Vec::new();
        let mut selector = 0;
        for m in &plan.report().members {
            if Some(&*m.id.name) == leaving {
                continue;
            }
            ranges.push(f64::from(m.ranges));
            let set = plan.shards_of(&m.id);
            if !set.is_empty() {
                let sel = ShardSelector::for_shards(ShardKey::Uid, self.s, &set)
                    .map_err(|e| BenchError::Library(format!("selector: {e}")))?;
                selector = selector.max(sel.to_string().len());
            }
        }
        self.current = plan.assignments().map(|(s, m)| (s, m.clone())).collect();
        Ok(Outcome {
            moves: plan.moves().len(),
            optimum: usize::try_from(optimum).unwrap_or(usize::MAX),
            ranges,
            selector,
        })
    }
}

struct Outcome {
    moves: usize,
    optimum: usize,
    ranges: Vec<f64>,
    selector: usize,
}

/// Joins from 1 to 32 then leaves back to 1, planned and compared with the baselines.
pub fn sequence(
    s: ShardCount,
    weighted: bool,
    seed: u64,
    samples: usize,
) -> Result<Vec<Step>, BenchError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let hashes = sample_hashes(samples);
    let mut names: Vec<String> = (0..MAX_MEMBERS).map(|i| format!("member-{i:02}")).collect();
    names.shuffle(&mut rng);
    let mut live: Vec<Live> = Vec::new();
    let mut planner = Planner {
        s,
        current: BTreeMap::new(),
    };
    let mut steps = Vec::new();
    let mut record = |before: &[Live], after: &[Live], o: &Outcome| {
        if before.is_empty() || after.is_empty() {
            return;
        }
        let f = |scheme| {
            changed(
                &owners(before, &hashes, scheme),
                &owners(after, &hashes, scheme),
            )
        };
        steps.push(Step {
            before: before.len(),
            after: after.len(),
            moves: o.moves,
            optimum: o.optimum,
            ours: o.moves as f64 / f64::from(s.get()),
            modulo: f("modulo"),
            ranges: f("ranges"),
            ring: f("ring"),
        });
    };
    for (i, name) in names.iter().enumerate() {
        let before = live.clone();
        let weight = if weighted { rng.random_range(1..=4) } else { 1 };
        live.push(Live {
            name: name.clone(),
            weight,
            joined: i as u64,
        });
        let o = planner.change(&live, None)?;
        record(&before, &live, &o);
    }
    let mut order: Vec<String> = names.clone();
    order.shuffle(&mut rng);
    for name in order.iter().take(MAX_MEMBERS - 1) {
        let before = live.clone();
        let o = planner.change(&live, Some(name))?;
        live.retain(|m| &m.name != name);
        record(&before, &live, &o);
    }
    Ok(steps)
}

/// Ranges per member and selector length after `changes` random joins, graceful leaves and crashes,
/// with 1 ≤ N ≤ `max_n` (starting from 4 members).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Fragmentation {
    /// p50 of ranges per planned member, over every state of the walk.
    pub p50: f64,
    /// The most ranges any planned member had in any state.
    pub max: f64,
    /// p50 after the last change.
    pub final_p50: f64,
    /// max after the last change.
    pub final_max: f64,
    /// The longest selector (bytes) any member watched with.
    pub selector_bytes: usize,
    /// Whether every change moved exactly the optimum.
    pub moves_optimal: bool,
}

/// The random walk behind [`Fragmentation`].
pub fn fragmentation(
    s: ShardCount,
    max_n: usize,
    changes: usize,
    seed: u64,
) -> Result<Fragmentation, BenchError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut planner = Planner {
        s,
        current: BTreeMap::new(),
    };
    let mut next = 0u64;
    let fresh = |next: &mut u64| {
        *next += 1;
        Live {
            name: format!("m-{:03}", (*next * 7919) % 1000),
            weight: 1,
            joined: *next,
        }
    };
    let mut live: Vec<Live> = (0..4).map(|_| fresh(&mut next)).collect();
    let mut all = Vec::new();
    let mut last = Vec::new();
    let mut selector = 0;
    let mut optimal = true;
    let first = planner.change(&live, None)?;
    optimal &= first.moves == first.optimum;
    for _ in 0..changes {
        let n = live.len();
        let join = n == 1 || (n < max_n && rng.random_bool(0.5));
        let o = if join {
            live.push(fresh(&mut next));
            planner.change(&live, None)?
        } else {
            let victim = live[rng.random_range(0..n)].name.clone();
            let graceful = rng.random_bool(0.5);
            let o = if graceful {
                planner.change(&live, Some(&victim))?
            } else {
                live.retain(|m| m.name != victim);
                planner.change(&live, None)?
            };
            live.retain(|m| m.name != victim);
            o
        };
        optimal &= o.moves == o.optimum;
        selector = selector.max(o.selector);
        all.extend(o.ranges.iter().copied());
        last = o.ranges;
    }
    Ok(Fragmentation {
        p50: percentile(&all, 50.0).unwrap_or(0.0),
        max: percentile(&all, 100.0).unwrap_or(0.0),
        final_p50: percentile(&last, 50.0).unwrap_or(0.0),
        final_max: percentile(&last, 100.0).unwrap_or(0.0),
        selector_bytes: selector,
        moves_optimal: optimal,
    })
}

fn count(n: u32) -> ShardCount {
    ShardCount::new(n).expect("a power of two")
}

/// The scenario.
pub fn run(opts: &Options) -> Result<Report, BenchError> {
    let samples = if opts.quick { 8_192 } else { 32_768 };
    let mut summary = Table::new(
        format!(
            "movement: joins 1→{MAX_MEMBERS} then leaves →1 (random order); keyspace sampled on {samples} object hashes"
        ),
        &[
            "S", "weights", "changes", "moves ÷ optimum", "min(%N÷ours÷minN)", "min(static÷ours÷minN)",
            "min(ring÷ours÷minN)", "target",
        ],
    );
    let mut detail = Table::new(
        "movement: keyspace remapped per change, S=256, equal weights (selected changes)",
        &[
            "N",
            "ours moved",
            "optimum",
            "ours",
            "hash % N",
            "static ranges",
            "ring(100 vnodes)",
        ],
    );
    let mut json_seq = Vec::new();
    let mut all_met = true;
    for s in [256, 4096] {
        for weighted in [false, true] {
            let steps = sequence(count(s), weighted, opts.seed, samples)?;
            let moves: usize = steps.iter().map(|x| x.moves).sum();
            let optimum: usize = steps.iter().map(|x| x.optimum).sum();
            let exact = steps.iter().all(|x| x.moves == x.optimum);
            let min_of =
                |f: &dyn Fn(&Step) -> f64| steps.iter().map(f).fold(f64::INFINITY, f64::min);
            let modulo = min_of(&|x| x.modulo_advantage());
            let worst = steps
                .iter()
                .min_by(|a, b| a.modulo_advantage().total_cmp(&b.modulo_advantage()))
                .map_or_else(String::new, |x| {
                    format!(
                        " at {}→{} ({} moved; %N {})",
                        x.before,
                        x.after,
                        x.moves,
                        f2(x.modulo)
                    )
                });
            let ranges = min_of(&|x| ratio(x.ranges, x.ours) / x.before.min(x.after) as f64);
            let ring = min_of(&|x| ratio(x.ring, x.ours) / x.before.min(x.after) as f64);
            // weights: hash % N cannot weigh members, so its target applies to equal weights only
            let met = exact && (weighted || modulo >= 0.95);
            all_met &= met;
            summary.row(vec![
                s.to_string(),
                if weighted { "random 1–4" } else { "equal" }.into(),
                steps.len().to_string(),
                format!(
                    "{} ({moves}/{optimum})",
                    f2(ratio(moves as f64, optimum as f64))
                ),
                format!("{}{worst}", f2(modulo)),
                f2(ranges),
                f2(ring),
                verdict(met).into(),
            ]);
            if s == 256 && !weighted {
                for x in steps
                    .iter()
                    .filter(|x| [1, 2, 3, 4, 8, 16, 31].contains(&x.before.min(x.after)))
                {
                    detail.row(vec![
                        format!("{}→{}", x.before, x.after),
                        x.moves.to_string(),
                        x.optimum.to_string(),
                        f2(x.ours),
                        f2(x.modulo),
                        f2(x.ranges),
                        f2(x.ring),
                    ]);
                }
            }
            json_seq.push(json!({
                "shards": s, "weighted": weighted, "changes": steps.len(),
                "moves": moves, "optimum": optimum, "every_change_optimal": exact,
                "min_modulo_advantage": modulo, "min_static_advantage": ranges, "min_ring_advantage": ring,
                "target_met": met,
            }));
        }
    }
    let mut frag = Table::new(
        "movement: ranges per member after 100 random changes (joins, graceful leaves, crashes), N ≤ 16",
        &["S", "ranges p50", "ranges max", "final p50", "final max", "selector max (bytes)", "moves optimal", "target"],
    );
    let mut json_frag = Vec::new();
    for s in [256, 4096] {
        let f = fragmentation(count(s), 16, 100, opts.seed)?;
        let met = s != 256 || (f.p50 <= 4.0 && f.max <= 12.0 && f.moves_optimal);
        all_met &= met;
        frag.row(vec![
            s.to_string(),
            f2(f.p50),
            f2(f.max),
            f2(f.final_p50),
            f2(f.final_max),
            f.selector_bytes.to_string(),
            f.moves_optimal.to_string(),
            if s == 256 {
                verdict(met)
            } else {
                "(no target)"
            }
            .into(),
        ]);
        json_frag.push(json!({
            "shards": s, "ranges_p50": f.p50, "ranges_max": f.max, "final_p50": f.final_p50,
            "final_max": f.final_max, "selector_bytes_max": f.selector_bytes, "moves_optimal": f.moves_optimal,
        }));
    }
    let notes = vec![
        "min(X÷ours÷minN): over every change, scheme X's remapped keyspace ÷ kube-shard's ÷ min(N before, N after); target for hash % N ≥ 0.95 (equal weights)".into(),
        "static ranges and the ring are shown for comparison; they have no target".into(),
        format!("every target met: {all_met}"),
    ];
    Ok(Report {
        scenario: "movement",
        tables: vec![summary, detail, frag],
        notes,
        json: json!({
            "scenario": "movement", "samples": samples, "seed": opts.seed,
            "sequences": json_seq, "fragmentation": json_frag, "targets_met": all_met,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn planner_moves_the_optimum_and_modulo_remaps_about_n_times_more() {
        let steps = sequence(count(64), false, 1, 2048).unwrap();
        assert_eq!(steps.len(), 2 * (MAX_MEMBERS - 1));
        for x in &steps {
            assert_eq!(x.moves, x.optimum, "{x:?}");
        }
        // with random weights 1–4 too, the planner moves exactly the library's optimum
        for x in sequence(count(64), true, 1, 256).unwrap() {
            assert_eq!(x.moves, x.optimum, "weighted: {x:?}");
        }
        // a join from 1 to 2 remaps half the keyspace under every scheme but the ring
        let first = &steps[0];
        assert!((first.modulo - 0.5).abs() < 0.05, "{first:?}");
        assert!((first.ours - 0.5).abs() < 1e-9, "{first:?}");
        // a join from 15 to 16: hash % N remaps ~15/16, kube-shard ~1/16
        let x = steps
            .iter()
            .find(|x| x.before == 15 && x.after == 16)
            .unwrap();
        assert!(x.modulo > 0.85 && x.ours < 0.1, "{x:?}");
    }

    #[test]
    fn ring_owner_wraps_around() {
        let live = vec![
            Live {
                name: "a".into(),
                weight: 1,
                joined: 0,
            },
            Live {
                name: "b".into(),
                weight: 1,
                joined: 1,
            },
        ];
        let ring = Ring::new(&live);
        assert_eq!(ring.0.len(), 2 * VNODES);
        // past the last point wraps to the first; a point's own hash belongs to it
        assert_eq!(ring.owner(u64::MAX), ring.0[0].1);
        let (p, owner) = ring.0[7];
        assert_eq!(ring.owner(p), owner);
    }

    #[test]
    fn fragmentation_stays_low_at_256_shards() {
        let f = fragmentation(count(256), 16, 30, 7).unwrap();
        assert!(f.moves_optimal);
        assert!(f.max >= 1.0 && f.selector_bytes > 0, "{f:?}");
    }
}
