//! What a member publishes in its Lease (its control channel), and what the coordinator writes there.
//!
//! The member writes `kube-shard.io/incarnation` and `kube-shard.io/report` ([`MemberReport`] as JSON:
//! readiness, leaving, weight, generations, acks, admitted and serving shards); the coordinator writes
//! `kube-shard.io/taken-over` and [`ASSIGNMENT_HINT`]. Only the member writes `spec.renewTime`; liveness is
//! judged from it alone. Decoding is strict and bounded: hostile annotations are an error, never a panic.
//!
//! Pure: no I/O, no async. See `docs/control-plane.md#objects-in-the-groups-namespace`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::ownership::state::Ack;
use crate::ownership::MoveId;
use crate::shard::{ShardCount, ShardSet};

/// The incarnation annotation.
pub const INCARNATION: &str = "kube-shard.io/incarnation";
/// The report annotation.
pub const REPORT: &str = "kube-shard.io/report";
/// The taken-over annotation.
pub const TAKEN_OVER: &str = "kube-shard.io/taken-over";
/// Member Lease annotation written by the coordinator (the Lease as control channel): the assignment
/// generation this member is behind on. The member reads its own Lease at every renewal, so this reaches
/// it when its assignment watch is stuck; it then reads the assignment directly.
pub const ASSIGNMENT_HINT: &str = "kube-shard.io/assignment-hint";
/// Member Lease annotation: the failover epoch (wire form) whose term this member has drained at its term
/// gate's request (`TermGate::drain_requests`) — it admits nothing under it and every permit and fence it
/// issued under it has ended. Cross-cluster HA's planned demotion asks for it (HA.md contract 2,
/// `ha-drained(epoch)`: the wire name is HA's) and `kshard ha demote` waits for it on every member.
pub const GATE_DRAINED: &str = "kube-shard.io/ha-drained";
/// Member Lease annotation: the member's Pod, `<namespace>/<name>/<uid>` ([`GroupConfig::pod`](super::config::GroupConfig::pod)).
/// A member whose Lease expired and whose Pod is observed deleted or replaced (another uid under the name)
/// is gone by that evidence, as one whose Lease was deleted: it is not taken over, so it counts against no
/// takeover budget.
pub const POD: &str = "kube-shard.io/pod";
/// The label every Lease of a group carries (value: the group name).
pub const GROUP_LABEL: &str = "kube-shard.io/group";
/// The label that tells member Leases (`member`) from the coordinator Lease (`coordinator`).
pub const ROLE_LABEL: &str = "kube-shard.io/role";

/// The report format this build writes and reads (the `format` field). Reports of builds from before the
/// report was versioned carry none; a member refuses those and any other version with an error that says
/// so ([`ReportError::is_other_format`]): members of different formats cannot share a group.
pub const FORMAT: u32 = 2;

const MAX_REPORT: usize = 256 * 1024;

/// A member's report.
///
/// Acks are kept as sets of shards per move id, never expanded per (move, shard): a decoded report holds at
/// most `S` move ids per kind and names each shard at most once per kind (an honest member acks `warm` once
/// per Incoming shard and `released` once per shard), so decoding a hostile annotation costs O(S).
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct MemberReport {
    /// Its read streams are registered and synced.
    pub ready: bool,
    /// It is shutting down: move its shards away.
    pub leaving: bool,
    /// Its placement weight (≥ 1).
    pub weight: u32,
    /// The highest assignment generation it applied.
    pub applied_generation: u64,
    /// The highest assignment generation it has ever seen (re-creation starts above it).
    pub seen_generation: u64,
    /// Acks added in process (the member's own report, before encoding). A decoded report keeps its acks
    /// indexed by move id instead: ask [`MemberReport::warm`] and [`MemberReport::released`], which see both.
    pub acks: Vec<Ack>,
    /// The shards it admits work for now.
    pub admitted: ShardSet,
    /// The shards its read streams serve (read and synced).
    pub serving: ShardSet,
    /// The shards the assignment names it the owner of at an epoch it is past (a rolled-back
    /// assignment, see [`MemberState::stale`](crate::ownership::state::MemberState::stale)): the coordinator
    /// re-grants them at a new epoch. Left out of the JSON when empty. Added in format 2.
    pub stale: ShardSet,
    /// The shards it holds that the assignment names another owner of at an epoch at or below its own (a
    /// rolled-back assignment, see [`MemberState::kept`](crate::ownership::state::MemberState::kept)): it keeps
    /// them, and the coordinator names it the owner again. Left out of the JSON when empty.
    pub kept: ShardSet,
    /// Decoded `warm` acks: move id → shards.
    pub(crate) warm_acks: BTreeMap<MoveId, ShardSet>,
    /// Decoded `released` acks: move id → shards.
    pub(crate) released_acks: BTreeMap<MoveId, ShardSet>,
}

impl PartialEq for MemberReport {
    /// Equal content: acks compare as sets, however they are held.
    fn eq(&self, other: &Self) -> bool {
        self.ready == other.ready
            && self.leaving == other.leaving
            && self.weight == other.weight
            && self.applied_generation == other.applied_generation
            && self.seen_generation == other.seen_generation
            && self.admitted == other.admitted
            && self.serving == other.serving
            && self.stale == other.stale
            && self.kept == other.kept
            && self.ack_sets() == other.ack_sets()
    }
}

impl Eq for MemberReport {}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
    format: u32,
    #[serde(default)]
    ready: bool,
    #[serde(default)]
    leaving: bool,
    #[serde(default = "one")]
    weight: u32,
    #[serde(default)]
    applied_generation: u64,
    #[serde(default)]
    seen_generation: u64,
    /// move id → shards
    #[serde(default)]
    warm: BTreeMap<String, String>,
    #[serde(default)]
    released: BTreeMap<String, String>,
    #[serde(default)]
    admitted: String,
    #[serde(default)]
    serving: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    stale: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    kept: String,
}

fn one() -> u32 {
    1
}

impl MemberReport {
    /// Every ack, in process and decoded: (`warm`, `released`), move id → shards.
    fn ack_sets(&self) -> (AckSets, AckSets) {
        let mut warm = self.warm_acks.clone();
        let mut released = self.released_acks.clone();
        for ack in &self.acks {
            match *ack {
                Ack::Warm { shard, move_id } => {
                    warm.entry(move_id).or_default().insert(shard);
                }
                Ack::Released { shard, move_id } => {
                    released.entry(move_id).or_default().insert(shard);
                }
            }
        }
        (warm, released)
    }

    /// Encode as the annotation's JSON.
    #[must_use]
    pub fn encode(&self) -> String {
        let (warm, released) = self.ack_sets();
        let wire = Wire {
            format: FORMAT,
            ready: self.ready,
            leaving: self.leaving,
            weight: self.weight.max(1),
            applied_generation: self.applied_generation,
            seen_generation: self.seen_generation,
            warm: warm
                .into_iter()
                .map(|(m, s)| (m.to_string(), s.to_string()))
                .collect(),
            released: released
                .into_iter()
                .map(|(m, s)| (m.to_string(), s.to_string()))
                .collect(),
            admitted: self.admitted.to_string(),
            serving: self.serving.to_string(),
            stale: self.stale.to_string(),
            kept: self.kept.to_string(),
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// Decode and validate against the group's `S`.
    pub fn decode(text: &str, shards: ShardCount) -> Result<Self, ReportError> {
        if text.len() > MAX_REPORT {
            return Err(ReportError::new(format!(
                "{} bytes is larger than 256 KiB",
                text.len()
            )));
        }
        if !text.trim_start().starts_with('{') {
            return Err(ReportError::new("not a JSON object".into()));
        }
        check_format(text)?;
        let wire: Wire = serde_json::from_str(text).map_err(|e| ReportError::new(e.to_string()))?;
        if wire.weight == 0 || wire.weight > 1000 {
            return Err(ReportError::new(format!(
                "weight {} is not from 1 to 1000",
                wire.weight
            )));
        }
        let set = |what: &str, t: &str| {
            ShardSet::parse(t, shards).map_err(|e| ReportError::new(format!("{what}: {e}")))
        };
        Ok(MemberReport {
            ready: wire.ready,
            leaving: wire.leaving,
            weight: wire.weight,
            applied_generation: wire.applied_generation,
            seen_generation: wire.seen_generation,
            acks: Vec::new(),
            admitted: set("admitted", &wire.admitted)?,
            serving: set("serving", &wire.serving)?,
            stale: set("stale", &wire.stale)?,
            kept: set("kept", &wire.kept)?,
            warm_acks: ack_sets("warm", &wire.warm, shards)?,
            released_acks: ack_sets("released", &wire.released, shards)?,
        })
    }

    /// Whether the member acked `warm(shard, move_id)`.
    #[must_use]
    pub fn warm(&self, shard: u32, move_id: MoveId) -> bool {
        self.warm_acks
            .get(&move_id)
            .is_some_and(|s| s.contains(shard))
            || self.acks.contains(&Ack::Warm { shard, move_id })
    }

    /// Whether the member acked `released(shard, move_id)`.
    #[must_use]
    pub fn released(&self, shard: u32, move_id: MoveId) -> bool {
        self.released_acks
            .get(&move_id)
            .is_some_and(|s| s.contains(shard))
            || self.acks.contains(&Ack::Released { shard, move_id })
    }
}

/// Whether an assignment at generation `stored` is older than what a live member reports applied — an
/// older assignment written back (a restored backup, a re-applied manifest): the member's name and its
/// generation. No writer may plan from it or edit it (the coordinator writes a newer view over it first).
/// `live` are the reports of members seen renewing; a report more than
/// [`MAX_GENERATION_STEP`](crate::group::assignment::MAX_GENERATION_STEP) above both `now_ms` and
/// `stored` is ignored, so one hostile report cannot stop every writer.
#[must_use]
pub fn applied_above<'a>(
    stored: u64,
    live: impl IntoIterator<Item = (&'a str, &'a MemberReport)>,
    now_ms: u64,
) -> Option<(String, u64)> {
    let limit = now_ms
        .max(stored)
        .saturating_add(crate::group::assignment::MAX_GENERATION_STEP);
    live.into_iter()
        .filter(|(_, r)| r.applied_generation > stored && r.applied_generation <= limit)
        .max_by_key(|(_, r)| r.applied_generation)
        .map(|(name, r)| (name.to_owned(), r.applied_generation))
}

/// The reports of the member Leases among `leases` (the group's, as listed) whose `renewTime` is within their
/// `leaseDurationSeconds` (15 s when unset) of `now_ms`, by Lease name: what a writer outside the group —
/// the CLI — counts as live for [`applied_above`]. Undecodable reports are left out.
#[must_use]
pub fn live_reports(
    leases: &[k8s_openapi::api::coordination::v1::Lease],
    now_ms: i64,
    shards: ShardCount,
) -> Vec<(String, MemberReport)> {
    leases
        .iter()
        .filter_map(|l| {
            let meta = &l.metadata;
            if meta.labels.as_ref()?.get(ROLE_LABEL)? != "member" {
                return None;
            }
            let (age, duration) = lease_age(l.spec.as_ref(), now_ms);
            if age.is_none_or(|age| age > duration) {
                return None;
            }
            let report =
                MemberReport::decode(meta.annotations.as_ref()?.get(REPORT)?, shards).ok()?;
            Some((meta.name.clone().unwrap_or_default(), report))
        })
        .collect()
}

/// How long before `now_ms` (a reader's wall clock) a Lease was last renewed (`None`: never; a renewal
/// stamped ahead of the reader counts as just now), and its `leaseDurationSeconds` (15 s when unset): a
/// member's report counts while the first is at most the second.
pub(crate) fn lease_age(
    spec: Option<&k8s_openapi::api::coordination::v1::LeaseSpec>,
    now_ms: i64,
) -> (Option<std::time::Duration>, std::time::Duration) {
    let age = spec
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| now_ms.saturating_sub(t.0.as_millisecond()))
        .map(|ms| std::time::Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
    let seconds = spec.and_then(|s| s.lease_duration_seconds).unwrap_or(15);
    let duration = std::time::Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
    (age, duration)
}

type AckSets = BTreeMap<MoveId, ShardSet>;

/// Decode one kind of acks, bounded: at most `S` move ids, each naming at least one shard, no shard under
/// two move ids — what an honest member publishes — so the result holds at most `S` shards.
fn ack_sets(
    kind: &str,
    wire: &BTreeMap<String, String>,
    shards: ShardCount,
) -> Result<AckSets, ReportError> {
    let max = shards.get() as usize;
    if wire.len() > max {
        return Err(ReportError::new(format!(
            "{kind} acks: {} move ids, more than S = {max}",
            wire.len()
        )));
    }
    let mut seen = ShardSet::new();
    let mut out = AckSets::new();
    for (m, t) in wire {
        let move_id: MoveId = m
            .parse()
            .map_err(|_| ReportError::new(format!("{kind} ack move id {m:?}")))?;
        let set =
            ShardSet::parse(t, shards).map_err(|e| ReportError::new(format!("{kind}: {e}")))?;
        if set.is_empty() {
            return Err(ReportError::new(format!("{kind} ack {m} names no shard")));
        }
        for shard in set.iter() {
            if !seen.insert(shard) {
                return Err(ReportError::new(format!(
                    "{kind} acks: shard {shard} is acked under two move ids"
                )));
            }
        }
        if out.insert(move_id, set).is_some() {
            return Err(ReportError::new(format!("{kind} acks: move id {m} twice")));
        }
    }
    Ok(out)
}

/// Refuse a report of another format before reading it strictly (a newer format may have fields this build
/// does not know: the error must say "another format", not "unknown field").
fn check_format(text: &str) -> Result<(), ReportError> {
    #[derive(Deserialize)]
    struct Probe {
        #[serde(default)]
        format: Option<serde_json::Value>,
    }
    let probe: Probe = serde_json::from_str(text).map_err(|e| ReportError::new(e.to_string()))?;
    let found = match probe.format {
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(u64::from(FORMAT)) => {
            return Ok(())
        }
        Some(v) => format!("format {v}"),
        None => "no format field (a build from before member reports were versioned)".to_owned(),
    };
    Err(ReportError::other_format(format!(
        "member report with {found}; this build reads format {FORMAT} only: members of different formats cannot share a group (docs/protocol.md, \"Formats\")"
    )))
}

/// A member report that could not be decoded (the report is treated as absent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid member report: {msg}")]
pub struct ReportError {
    msg: String,
    other_format: bool,
}

impl ReportError {
    fn new(msg: String) -> Self {
        ReportError {
            msg,
            other_format: false,
        }
    }

    fn other_format(msg: String) -> Self {
        ReportError {
            msg,
            other_format: true,
        }
    }

    /// The report is in another format than this build's [`FORMAT`] (a member of another build): refuse
    /// loudly, never guess.
    #[must_use]
    pub fn is_other_format(&self) -> bool {
        self.other_format
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_reports_are_the_member_leases_renewed_within_their_duration() {
        use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let report = MemberReport {
            applied_generation: 7,
            ..MemberReport::default()
        }
        .encode();
        let lease = |name: &str, role: &str, renewed_ms: i64, text: &str| Lease {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some([(ROLE_LABEL.to_owned(), role.to_owned())].into()),
                annotations: Some([(REPORT.to_owned(), text.to_owned())].into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(
                    k8s_openapi::jiff::Timestamp::from_millisecond(renewed_ms).unwrap(),
                )),
                ..Default::default()
            }),
        };
        let now = 1_000_000;
        let leases = [
            lease("g-a", "member", now - 1_000, &report),
            lease("g-old", "member", now - 16_000, &report),
            lease("g-coordinator", "coordinator", now, &report),
            lease("g-bad", "member", now, "{not a report"),
        ];
        let live = live_reports(&leases, now, s());
        assert_eq!(live.len(), 1, "{live:?}");
        assert_eq!(
            (live[0].0.as_str(), live[0].1.applied_generation),
            ("g-a", 7)
        );
    }

    #[test]
    fn a_lease_age_is_measured_on_the_readers_clock() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        use std::time::Duration;
        let spec = |renewed_ms: Option<i64>, secs: Option<i32>| LeaseSpec {
            lease_duration_seconds: secs,
            renew_time: renewed_ms
                .map(|ms| MicroTime(k8s_openapi::jiff::Timestamp::from_millisecond(ms).unwrap())),
            ..Default::default()
        };
        let now = 1_000_000;
        assert_eq!(
            lease_age(Some(&spec(Some(now - 2_500), Some(10))), now),
            (Some(Duration::from_millis(2_500)), Duration::from_secs(10))
        );
        // a renewal stamped ahead of the reader counts as just now; no duration is 15 s
        assert_eq!(
            lease_age(Some(&spec(Some(now + 5_000), None)), now),
            (Some(Duration::ZERO), Duration::from_secs(15))
        );
        // never renewed, or no spec at all: no age
        assert_eq!(lease_age(Some(&spec(None, Some(3))), now).0, None);
        assert_eq!(lease_age(None, now), (None, Duration::from_secs(15)));
        // a hostile negative duration is zero, never a panic
        assert_eq!(
            lease_age(Some(&spec(Some(now), Some(-4))), now).1,
            Duration::ZERO
        );
    }

    #[test]
    fn an_assignment_below_a_live_members_applied_generation_is_named_with_that_member() {
        let r = |g: u64| MemberReport {
            applied_generation: g,
            ..MemberReport::default()
        };
        let (a, b, hostile) = (r(90), r(120), r(u64::MAX));
        let live = [("a", &a), ("b", &b), ("x", &hostile)];
        assert_eq!(applied_above(100, live, 100), Some(("b".into(), 120)));
        assert_eq!(applied_above(120, live, 100), None);
        assert_eq!(applied_above(100, [("x", &hostile)], 100), None);
    }
    use proptest::prelude::*;

    fn s() -> ShardCount {
        ShardCount::new(64).unwrap()
    }

    #[test]
    fn round_trip() {
        let r = MemberReport {
            ready: true,
            leaving: false,
            weight: 2,
            applied_generation: 10,
            seen_generation: 12,
            acks: vec![
                Ack::Warm {
                    shard: 3,
                    move_id: 7,
                },
                Ack::Warm {
                    shard: 4,
                    move_id: 7,
                },
                Ack::Released {
                    shard: 9,
                    move_id: 2,
                },
            ],
            admitted: ShardSet::parse("0-15,20", s()).unwrap(),
            serving: ShardSet::parse("0-20", s()).unwrap(),
            ..MemberReport::default()
        };
        let text = r.encode();
        assert!(text.contains("\"7\":\"3-4\""), "{text}");
        let mut back = MemberReport::decode(&text, s()).unwrap();
        back.acks.sort();
        let mut want = r.clone();
        want.acks.sort();
        assert_eq!(back, want);
        assert!(back.warm(4, 7) && !back.warm(4, 8) && back.released(9, 2));
        assert!(!text.contains("stale"), "left out when empty: {text}");
        let stale = MemberReport {
            stale: ShardSet::parse("2,5-6", s()).unwrap(),
            ..r
        };
        let text = stale.encode();
        assert!(text.contains("\"stale\":\"2,5-6\""), "{text}");
        assert_eq!(MemberReport::decode(&text, s()).unwrap().stale, stale.stale);
    }

    #[test]
    fn hostile_reports_are_errors() {
        assert!(MemberReport::decode("", s()).is_err());
        assert!(MemberReport::decode("[]", s()).is_err());
        for bad in [
            "\"weight\":0",
            "\"weight\":100000",
            "\"admitted\":\"0-64\"",
            "\"warm\":{\"x\":\"1\"}",
            "\"warm\":{\"1\":\"a\"}",
            "\"warm\":{\"1\":\"\"}",
            "\"unknown\":true",
            "\"appliedGeneration\":-1",
        ] {
            let text = format!("{{\"format\":{FORMAT},{bad}}}");
            let err = MemberReport::decode(&text, s()).unwrap_err();
            assert!(!err.is_other_format(), "{text}: {err}");
        }
        assert!(MemberReport::decode(&"x".repeat(MAX_REPORT + 1), s()).is_err());
        // an object with only the format is a valid (empty) report with weight 1
        let empty = format!("{{\"format\":{FORMAT}}}");
        assert_eq!(MemberReport::decode(&empty, s()).unwrap().weight, 1);
    }

    /// Step 5 of issue 14: the report carries a format version; a member refuses, with an error that says
    /// so, a report without one (a build from before versioning) or of another version — even one with
    /// fields it does not know.
    #[test]
    fn a_report_of_another_format_is_refused_loudly() {
        let text = MemberReport {
            weight: 1,
            ..MemberReport::default()
        }
        .encode();
        assert!(
            text.starts_with(&format!("{{\"format\":{FORMAT},")),
            "{text}"
        );
        assert_eq!(MemberReport::decode(&text, s()).unwrap().weight, 1);
        for (bad, found) in [
            ("{}", "no format"),
            ("{\"ready\":true,\"weight\":2}", "no format"),
            ("{\"format\":3,\"somethingNew\":[1,2]}", "format 3"),
            ("{\"format\":1,\"admitted\":\"0\"}", "format 1"),
            ("{\"format\":0}", "format 0"),
            ("{\"format\":\"1\"}", "format \"1\""),
        ] {
            let err = MemberReport::decode(bad, s()).unwrap_err();
            assert!(err.is_other_format(), "{bad}: {err}");
            let msg = err.to_string();
            assert!(
                msg.contains(found) && msg.contains(&format!("format {FORMAT}")),
                "{bad}: {msg}"
            );
        }
        // the right format with an unknown field is still refused (strict), but not as another format
        let err =
            MemberReport::decode(&format!("{{\"format\":{FORMAT},\"x\":1}}"), s()).unwrap_err();
        assert!(!err.is_other_format(), "{err}");
    }

    /// A report of `kind` acks, `"<id>": "<set>"` for ids from 1 while it stays under the size limit.
    fn hostile(kind: &str, set: &str) -> String {
        let mut text = format!("{{\"format\":{FORMAT},\"{kind}\":{{");
        let mut id = 1u64;
        loop {
            let entry = format!("\"{id}\":\"{set}\",");
            if text.len() + entry.len() + 2 > MAX_REPORT {
                break;
            }
            text.push_str(&entry);
            id += 1;
        }
        text.pop();
        text.push_str("}}");
        text
    }

    /// A hostile report: ~15 000 move ids each acking all 4096 shards fit in 256 KiB and used to expand into
    /// ~6·10⁷ acks (~1 GB). Refused now; an honest report at the limit (every shard warm and released once,
    /// 2·S move ids) keeps every entry.
    #[test]
    fn hostile_ack_sets_are_refused_and_honest_ones_kept() {
        let big = ShardCount::new(4096).unwrap();
        for kind in ["warm", "released"] {
            let text = hostile(kind, "0-4095");
            assert!(text.len() > 200 * 1024, "{}", text.len());
            let err = match MemberReport::decode(&text, big) {
                Ok(r) => panic!(
                    "a hostile {kind} report of {} bytes was accepted: {} acks",
                    text.len(),
                    r.acks.len()
                ),
                Err(e) => e.to_string(),
            };
            assert!(err.contains(kind) && err.contains("move ids"), "{err}");
        }
        // within the move-id cap, a shard acked under two move ids is refused too
        let two =
            format!("{{\"format\":{FORMAT},\"released\":{{\"1\":\"0-4095\",\"2\":\"0-4095\"}}}}");
        let err = MemberReport::decode(&two, big).unwrap_err().to_string();
        assert!(
            err.contains("shard 0") && err.contains("two move ids"),
            "{err}"
        );

        let mut honest = MemberReport {
            weight: 1,
            ..MemberReport::default()
        };
        for shard in 0..4096u32 {
            let m = u64::from(shard);
            honest.acks.push(Ack::Warm {
                shard,
                move_id: 10_000 + m,
            });
            honest.acks.push(Ack::Released { shard, move_id: m });
        }
        honest.acks.sort();
        let back = MemberReport::decode(&honest.encode(), big).unwrap();
        for shard in 0..4096u32 {
            let m = u64::from(shard);
            assert!(back.warm(shard, 10_000 + m) && back.released(shard, m));
            assert!(!back.warm(shard, m) && !back.released(shard, m + 1));
        }
        assert_eq!(back, honest);
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(t in ".{0,200}") {
            let _ = MemberReport::decode(&t, s());
        }
    }
}
