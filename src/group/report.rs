//! What a member publishes in its Lease (its control channel), and what the coordinator writes there.
//!
//! Annotations of the member Lease `<group>-<name>`:
//!
//! | annotation | written by | content |
//! |---|---|---|
//! | `kube-shard.io/incarnation` | the member | its incarnation (random per process start) |
//! | `kube-shard.io/report` | the member | [`MemberReport`] as JSON: readiness, leaving, weight, generations, acks, admitted and serving shards |
//! | `kube-shard.io/taken-over` | the coordinator | the incarnation it took over (the member self-fences and rejoins) |
//!
//! Only the member writes `spec.renewTime`; liveness is judged from it alone. Decoding is strict and bounded:
//! hostile annotations produce an error (the report is then treated as absent), never a panic.
//!
//! Pure: no I/O, no async.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ownership::{Ack, MoveId};
use crate::shard::{ShardCount, ShardSet};

/// The incarnation annotation.
pub const INCARNATION: &str = "kube-shard.io/incarnation";
/// The report annotation.
pub const REPORT: &str = "kube-shard.io/report";
/// The taken-over annotation.
pub const TAKEN_OVER: &str = "kube-shard.io/taken-over";
/// The label every Lease of a group carries (value: the group name).
pub const GROUP_LABEL: &str = "kube-shard.io/group";
/// The label that tells member Leases (`member`) from the coordinator Lease (`coordinator`).
pub const ROLE_LABEL: &str = "kube-shard.io/role";

const MAX_REPORT: usize = 256 * 1024;

/// A member's report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
    /// Its acks.
    pub acks: Vec<Ack>,
    /// The shards it admits work for now.
    pub admitted: ShardSet,
    /// The shards its read streams serve (read and synced).
    pub serving: ShardSet,
}

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
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
}

fn one() -> u32 {
    1
}

impl MemberReport {
    /// Encode as the annotation's JSON.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut warm: BTreeMap<MoveId, ShardSet> = BTreeMap::new();
        let mut released: BTreeMap<MoveId, ShardSet> = BTreeMap::new();
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
        let wire = Wire {
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
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// Decode and validate against the group's `S`.
    pub fn decode(text: &str, shards: ShardCount) -> Result<Self, ReportError> {
        if text.len() > MAX_REPORT {
            return Err(ReportError(format!(
                "{} bytes is larger than 256 KiB",
                text.len()
            )));
        }
        if !text.trim_start().starts_with('{') {
            return Err(ReportError("not a JSON object".into()));
        }
        let wire: Wire = serde_json::from_str(text).map_err(|e| ReportError(e.to_string()))?;
        if wire.weight == 0 || wire.weight > 1000 {
            return Err(ReportError(format!(
                "weight {} is not from 1 to 1000",
                wire.weight
            )));
        }
        let set = |what: &str, t: &str| {
            ShardSet::parse(t, shards).map_err(|e| ReportError(format!("{what}: {e}")))
        };
        let mut acks = Vec::new();
        for (kind, map) in [("warm", &wire.warm), ("released", &wire.released)] {
            for (m, t) in map {
                let move_id: MoveId = m
                    .parse()
                    .map_err(|_| ReportError(format!("{kind} ack move id {m:?}")))?;
                for shard in set(kind, t)?.iter() {
                    acks.push(if kind == "warm" {
                        Ack::Warm { shard, move_id }
                    } else {
                        Ack::Released { shard, move_id }
                    });
                }
            }
        }
        acks.sort();
        Ok(MemberReport {
            ready: wire.ready,
            leaving: wire.leaving,
            weight: wire.weight,
            applied_generation: wire.applied_generation,
            seen_generation: wire.seen_generation,
            acks,
            admitted: set("admitted", &wire.admitted)?,
            serving: set("serving", &wire.serving)?,
        })
    }

    /// Whether the member acked `warm(shard, move_id)`.
    #[must_use]
    pub fn warm(&self, shard: u32, move_id: MoveId) -> bool {
        self.acks.contains(&Ack::Warm { shard, move_id })
    }

    /// Whether the member acked `released(shard, move_id)`.
    #[must_use]
    pub fn released(&self, shard: u32, move_id: MoveId) -> bool {
        self.acks.contains(&Ack::Released { shard, move_id })
    }
}

/// A member report that could not be decoded (the report is treated as absent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid member report: {0}")]
pub struct ReportError(String);

#[cfg(test)]
mod tests {
    use super::*;
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
        };
        let text = r.encode();
        assert!(text.contains("\"7\":\"3-4\""), "{text}");
        let mut back = MemberReport::decode(&text, s()).unwrap();
        back.acks.sort();
        let mut want = r.clone();
        want.acks.sort();
        assert_eq!(back, want);
        assert!(back.warm(4, 7) && !back.warm(4, 8) && back.released(9, 2));
    }

    #[test]
    fn hostile_reports_are_errors() {
        for bad in [
            "",
            "[]",
            "{\"weight\":0}",
            "{\"weight\":100000}",
            "{\"admitted\":\"0-64\"}",
            "{\"warm\":{\"x\":\"1\"}}",
            "{\"warm\":{\"1\":\"a\"}}",
            "{\"unknown\":true}",
            "{\"appliedGeneration\":-1}",
        ] {
            assert!(MemberReport::decode(bad, s()).is_err(), "{bad}");
        }
        assert!(MemberReport::decode(&"x".repeat(MAX_REPORT + 1), s()).is_err());
        // an empty object is a valid (empty) report with weight 1
        assert_eq!(MemberReport::decode("{}", s()).unwrap().weight, 1);
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(t in ".{0,200}") {
            let _ = MemberReport::decode(&t, s());
        }
    }
}
