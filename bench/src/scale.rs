//! `scale`: the coordinator's pure work and the size of what it writes, at `S` = 4096 with N = 16, 64 and
//! 128 members, against the API limits (a ConfigMap's data ≤ 1 MiB; an object's annotations ≤ 256 KiB in
//! total).
//!
//! Worst-case fragmentation: shard `s` is owned by member `s mod N` (every member holds `S/N` single-shard
//! ranges), at its own epoch (every shard taken over at a different generation), and moving to member
//! `s+1 mod N` under its own move id — every grouping the codec can use is defeated. The member report
//! is the one a member of that assignment publishes: its `S/N` interleaved shards admitted and served,
//! `S/N` warm acks and `S/N` released acks, each under its own move id.
//!
//! Step time: the planner for the join of one more member to the interleaved assignment (which moves
//! `⌈S/(N+1)⌉` shards) and the assignment codec (encode + strict decode), the median of several runs.

use std::time::Instant;

use kube_shard::group::assignment::Assignment;
use kube_shard::group::assignment::{AssignmentView, Handoff, ShardAssignment};
use kube_shard::group::report::Ack;
use kube_shard::group::report::MemberReport;
use kube_shard::ownership::MemberId;
use kube_shard::testing::planner::{Member, PlanInput};
use kube_shard::{ShardCount, ShardKey, ShardSet};
use serde_json::json;

use crate::stats::{f2, percentile, verdict};
use crate::{BenchError, Options, Report, Table};

/// The API server's limit on a ConfigMap's data (bytes).
pub const CONFIGMAP_LIMIT: usize = 1024 * 1024;
/// The API server's limit on an object's annotations, keys and values together (bytes).
pub const ANNOTATIONS_LIMIT: usize = 256 * 1024;

/// Member names: a StatefulSet pod name, or the longest the group accepts (63 characters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Names {
    /// `widget-operator-<i>`.
    Pod,
    /// 63 characters each.
    Longest,
}

fn member_named(i: usize, names: Names) -> MemberId {
    let name = match names {
        Names::Pod => format!("widget-operator-{i}"),
        Names::Longest => format!("{}-{i:03}", "m".repeat(59)),
    };
    // a 16-hex-digit incarnation, as members generate them
    MemberId::new(
        name,
        format!(
            "{:016x}",
            (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ),
    )
}

fn member(i: usize) -> MemberId {
    member_named(i, Names::Pod)
}

const GENERATION: u64 = 1_764_460_800_000;

/// The worst-case assignment of `s` shards over `n` members (see the module docs).
#[must_use]
pub fn worst_assignment(s: ShardCount, n: usize, names: Names) -> Assignment {
    worst_assignment_moving(s, n, names, s.get() as usize)
}

/// Like [`worst_assignment`], with only the first `moving` shards in a move (the coordinator keeps at
/// most `max_concurrent_moves` (64) moving, plus a leaver's whole set).
#[must_use]
pub fn worst_assignment_moving(s: ShardCount, n: usize, names: Names, moving: usize) -> Assignment {
    let member = |i| member_named(i, names);
    let mut view = AssignmentView::new(GENERATION + u64::from(s.get()) + 1);
    for shard in 0..s.get() {
        let i = shard as usize % n;
        let owned = ShardAssignment::owned(member(i), GENERATION + u64::from(shard));
        let a = if (shard as usize) < moving {
            owned.with_handoff(Handoff::Moving {
                id: u64::from(shard) + 1,
                to: member((i + 1) % n),
            })
        } else {
            owned
        };
        view.shards.insert(shard, a);
    }
    let mut a = Assignment::empty(s, ShardKey::Uid);
    a.view = view;
    a.next_move_id = u64::from(s.get()) + 1;
    a
}

/// The interleaved assignment at one epoch with no moves (what fragmentation alone costs).
#[must_use]
pub fn interleaved_assignment(s: ShardCount, n: usize) -> Assignment {
    let mut view = AssignmentView::new(GENERATION);
    for shard in 0..s.get() {
        view.shards.insert(
            shard,
            ShardAssignment::owned(member(shard as usize % n), GENERATION),
        );
    }
    let mut a = Assignment::empty(s, ShardKey::Uid);
    a.view = view;
    a
}

/// The report member 0 of the worst-case assignment publishes.
#[must_use]
pub fn worst_report(s: ShardCount, n: usize) -> MemberReport {
    let mine: ShardSet = (0..s.get())
        .filter(|x| (*x as usize).is_multiple_of(n))
        .collect();
    let mut r = MemberReport::default();
    r.ready = true;
    r.weight = 1;
    r.applied_generation = GENERATION + u64::from(s.get());
    r.seen_generation = r.applied_generation;
    for shard in mine.iter() {
        r.acks.push(Ack::Released {
            shard,
            move_id: u64::from(shard) + 1,
        });
        // the shard it receives from its predecessor, under that move's id
        let incoming = (shard + s.get() - 1) % s.get();
        r.acks.push(Ack::Warm {
            shard: incoming,
            move_id: u64::from(incoming) + 1,
        });
    }
    r.admitted = mine.clone();
    r.serving = mine;
    r
}

fn median_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        f();
        t.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    percentile(&t, 50.0).unwrap_or(f64::NAN)
}

/// One configuration's figures.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Figures {
    /// `S`.
    pub shards: u32,
    /// Members.
    pub members: usize,
    /// Worst-case assignment JSON (bytes).
    pub assignment_bytes: usize,
    /// Interleaved, one epoch, no moves (bytes).
    pub interleaved_bytes: usize,
    /// Interleaved, an epoch per shard, 64 + S/N shards moving: the largest the coordinator writes.
    pub reachable_bytes: usize,
    /// Worst-case member report (bytes).
    pub report_bytes: usize,
    /// Planner, one join to the interleaved assignment (ms, median).
    pub plan_ms: f64,
    /// Worst-case assignment encode + decode (ms, median).
    pub codec_ms: f64,
    /// Whether the strict decoder accepted the worst-case assignment.
    pub decodes: Result<(), String>,
    /// Whether the strict decoder accepted the worst-case report.
    pub report_decodes: Result<(), String>,
}

/// Measure one configuration.
pub fn measure(s: ShardCount, n: usize, names: Names, reps: usize) -> Result<Figures, BenchError> {
    let worst = worst_assignment(s, n, names);
    let text = worst.encode();
    let interleaved = interleaved_assignment(s, n);
    let reachable = worst_assignment_moving(s, n, names, 64 + s.get() as usize / n).encode();
    let report = worst_report(s, n).encode();
    let decodes = Assignment::decode(&text, s, ShardKey::Uid)
        .map(|_| ())
        .map_err(|e| e.to_string());
    let report_decodes = MemberReport::decode(&report, s)
        .map(|_| ())
        .map_err(|e| e.to_string());
    let members: Vec<Member> = (0..=n)
        .map(|i| Member::new(member(i)).with_joined(i as u64))
        .collect();
    let input = PlanInput::new(s)
        .with_owners(interleaved.view.shards.iter().map(|(x, a)| (*x, &a.owner)))
        .with_members(members);
    let mut plan_err = None;
    let plan_ms = median_ms(reps, || {
        if let Err(e) = input.plan() {
            plan_err = Some(e);
        }
    });
    if let Some(e) = plan_err {
        return Err(BenchError::Library(format!("planner: {e}")));
    }
    let codec_ms = median_ms(reps, || {
        let t = worst.encode();
        let _ = Assignment::decode(&t, s, ShardKey::Uid);
    });
    Ok(Figures {
        shards: s.get(),
        members: n,
        assignment_bytes: text.len(),
        interleaved_bytes: interleaved.encode().len(),
        reachable_bytes: reachable.len(),
        report_bytes: report.len(),
        plan_ms,
        codec_ms,
        decodes,
        report_decodes,
    })
}

fn kib(b: usize) -> String {
    format!("{:.1}", b as f64 / 1024.0)
}

/// The scenario.
pub fn run(opts: &Options) -> Result<Report, BenchError> {
    let reps = if opts.quick { 5 } else { 21 };
    let mut table = Table::new(
        format!(
            "scale: worst-case fragmentation (interleaved owners, an epoch per shard, 64 + S/N shards moving under their own move ids); median of {reps} runs"
        ),
        &[
            "S", "N", "names", "assignment KiB (64+S/N moving)", "÷ 1 MiB", "KiB if every shard moved",
            "interleaved KiB", "report KiB", "÷ 256 KiB",
            "plan ms (join)", "codec ms", "decodes", "within limits",
        ],
    );
    let mut json_rows = Vec::new();
    let mut first_over: Option<(u32, usize, Names)> = None;
    // S = 4096 is the configuration; larger S show where the limits are reached
    let configs: &[(u32, usize, Names)] = if opts.quick {
        &[
            (4096, 16, Names::Pod),
            (4096, 64, Names::Pod),
            (4096, 128, Names::Pod),
            (4096, 128, Names::Longest),
            (16384, 128, Names::Pod),
        ]
    } else {
        &[
            (4096, 16, Names::Pod),
            (4096, 64, Names::Pod),
            (4096, 128, Names::Pod),
            (4096, 16, Names::Longest),
            (4096, 128, Names::Longest),
            (16384, 128, Names::Pod),
            (65536, 128, Names::Pod),
        ]
    };
    for &(s, n, names) in configs {
        let count = ShardCount::new(s).map_err(|e| BenchError::Library(e.to_string()))?;
        let f = measure(count, n, names, reps)?;
        let within = f.reachable_bytes <= CONFIGMAP_LIMIT && f.report_bytes <= ANNOTATIONS_LIMIT;
        if !within && first_over.is_none() {
            first_over = Some((s, n, names));
        }
        table.row(vec![
            s.to_string(),
            n.to_string(),
            match names {
                Names::Pod => "pod (19 ch)",
                Names::Longest => "63 ch",
            }
            .into(),
            kib(f.reachable_bytes),
            f2(f.reachable_bytes as f64 / CONFIGMAP_LIMIT as f64),
            kib(f.assignment_bytes),
            kib(f.interleaved_bytes),
            kib(f.report_bytes),
            f2(f.report_bytes as f64 / ANNOTATIONS_LIMIT as f64),
            f2(f.plan_ms),
            f2(f.codec_ms),
            match (&f.decodes, &f.report_decodes) {
                (Ok(()), Ok(())) => "yes".into(),
                (Err(e), _) | (_, Err(e)) => format!("refused: {e}"),
            },
            if s > 4096 {
                format!(
                    "{} (S > 4096: refused by GroupConfig; codec only)",
                    verdict(within)
                )
            } else {
                verdict(within).into()
            },
        ]);
        json_rows.push(json!({
            "shards": s, "members": n, "longest_names": names == Names::Longest, "assignment_bytes": f.assignment_bytes,
            "interleaved_bytes": f.interleaved_bytes, "reachable_bytes": f.reachable_bytes, "report_bytes": f.report_bytes,
            "plan_ms": f.plan_ms, "codec_ms": f.codec_ms,
            "assignment_decodes": f.decodes.is_ok(), "report_decodes": f.report_decodes.is_ok(),
            "within_limits": within,
        }));
    }
    let notes = vec![
        match first_over {
            None => "no configuration reaches a limit".to_owned(),
            Some((s, n, names)) => format!("first configuration over a limit: S={s}, N={n}, names {names:?}"),
        },
        "the limit verdict is for the largest assignment the coordinator writes (at most max_concurrent_moves = 64 moves plus a leaver's set in flight); 'every shard moved' is a bound it does not reach".into(),
        "at a limit: members refuse to decode an assignment over 1 MiB or a report over 256 KiB (a clear error, the last good view kept); the coordinator checks the size before writing: an assignment over 1 MiB is not written (an ALARM log line and an AssignmentTooLarge Warning Event naming the size; the current assignment stays) — nothing is truncated".into(),
    ];
    Ok(Report {
        scenario: "scale",
        tables: vec![table],
        notes,
        json: json!({
            "scenario": "scale", "configmap_limit": CONFIGMAP_LIMIT, "annotations_limit": ANNOTATIONS_LIMIT,
            "rows": json_rows,
            "first_over_limit": first_over.map(|(s, n, names)| json!({"shards": s, "members": n, "longest_names": names == Names::Longest})),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u32) -> ShardCount {
        ShardCount::new(n).unwrap()
    }

    #[test]
    fn worst_case_is_larger_than_interleaved_and_round_trips() {
        let f = measure(s(256), 16, Names::Pod, 1).unwrap();
        assert!(f.assignment_bytes > 2 * f.interleaved_bytes, "{f:?}");
        assert_eq!(f.decodes, Ok(()));
        assert_eq!(f.report_decodes, Ok(()));
        let back = Assignment::decode(
            &worst_assignment(s(256), 16, Names::Pod).encode(),
            s(256),
            ShardKey::Uid,
        )
        .unwrap();
        assert_eq!(back.view.shards.len(), 256);
        assert_eq!(back.moves_in_flight(), 256);
    }

    #[test]
    fn worst_report_has_its_share_and_both_acks_per_shard() {
        let r = worst_report(s(256), 16);
        assert_eq!(r.admitted.len(), 16);
        assert_eq!(r.acks.len(), 32);
        let back = MemberReport::decode(&r.encode(), s(256)).unwrap();
        assert_eq!(back, r);
    }

    /// At a limit the reader refuses with a clear error (and the writer never truncates: encode is whole).
    #[test]
    fn an_assignment_over_one_mib_is_refused_by_name_never_cut() {
        let big = s(16384);
        let text = worst_assignment(big, 128, Names::Pod).encode();
        assert!(text.len() > CONFIGMAP_LIMIT, "{}", text.len());
        assert!(text.ends_with('}'), "encoded whole");
        let err = Assignment::decode(&text, big, ShardKey::Uid).unwrap_err();
        assert!(err.to_string().contains("larger than 1 MiB"), "{err}");
    }
}
