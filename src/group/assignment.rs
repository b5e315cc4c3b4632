//! The assignment ConfigMap: a versioned, range-encoded record of who owns which shard.
//!
//! One ConfigMap per group (`<group>-assignment`), written only by the coordinator and only with a
//! resourceVersion precondition. Its data key `assignment` holds JSON (`drained` is omitted while empty):
//!
//! ```json
//! {"format":1,"shards":256,"key":"uid","generation":1764460800123,"nextMoveId":18,
//!  "owners":[{"name":"pod-0","incarnation":"a1b2","epoch":1764460800001,"shards":"0-127"},
//!            {"name":"pod-1","incarnation":"c3d4","epoch":1764460800001,"shards":"128-255"}],
//!  "moves":[{"shards":"120-127","id":17,"phase":"moving","toName":"pod-1","toIncarnation":"c3d4"}],
//!  "pins":{"5":"pod-1"},"paused":false,"drained":["pod-2"]}
//! ```
//!
//! Decoding is strict: an `S` or key other than the group's is [`AssignmentError::Mismatch`], every other
//! broken rule an error naming it, never a panic. Pure: no I/O, no async.
//!
//! See `docs/control-plane.md#objects-in-the-groups-namespace`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::hash::ShardKey;
pub use crate::ownership::state::{AssignmentView, Handoff, ShardAssignment};
use crate::ownership::{MemberId, MoveId};
use crate::shard::{ShardCount, ShardSet};

/// The data key of the ConfigMap that holds the JSON.
pub const DATA_KEY: &str = "assignment";

/// The assignment ConfigMap's annotation naming the generation of a rebuild (a rolled-back assignment
/// written again, or a re-creation without a view of the last one): whichever coordinator finds that
/// generation stored plans nothing until every live member applied it and their fences from before can
/// no longer be valid — a coordinator process that did not write it included.
pub const REBUILT_ANNOTATION: &str = "kube-shard.io/rebuilt-generation";

/// How far (ms) a generation may lead both the reader's wall clock and the highest generation it accepted
/// (one day). Generations are wall-clock ms; a larger one is refused as hostile or broken.
pub const MAX_GENERATION_STEP: u64 = 24 * 60 * 60 * 1000;

/// The format version this code writes and reads.
pub const FORMAT: u32 = 1;

/// A decoded assignment: the view members apply, plus what only the coordinator needs.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Assignment {
    /// `S`.
    pub shards: ShardCount,
    /// The key.
    pub key: ShardKey,
    /// The per-shard view and the generation.
    pub view: AssignmentView,
    /// The next move id to hand out.
    pub next_move_id: MoveId,
    /// Manual pins: shard → member name.
    pub pins: BTreeMap<u32, String>,
    /// Rebalancing paused (`kshard pause`): no new moves are started; takeovers still happen.
    pub paused: bool,
    /// Drained members, by name (`kshard drain`): planned like leaving members (quota 0, pins to them
    /// ignored) until undrained, whatever incarnation runs under the name. A drained member stays in the
    /// group: it renews, and keeps its shards only when no undrained member is live.
    pub drained: BTreeSet<String>,
}

impl Assignment {
    /// An empty assignment at generation 0.
    #[must_use]
    pub fn empty(shards: ShardCount, key: ShardKey) -> Self {
        Assignment {
            shards,
            key,
            view: AssignmentView::new(0),
            next_move_id: 1,
            pins: BTreeMap::new(),
            paused: false,
            drained: BTreeSet::new(),
        }
    }

    /// The generation of the next write: `max(previous + 1, now_ms)`, so generations (and the epochs made
    /// from them) never go backwards, even if the ConfigMap is lost and re-created — but at most
    /// `previous + MAX_GENERATION_STEP` once there is a previous one, so one forward-skewed clock moves
    /// them by at most [`MAX_GENERATION_STEP`] per write (members refuse a generation further than that
    /// above both their clock and what they accepted).
    #[must_use]
    pub fn next_generation(previous: u64, now_ms: u64) -> u64 {
        let next = previous.saturating_add(1);
        if previous == 0 {
            return next.max(now_ms);
        }
        next.max(now_ms.min(previous.saturating_add(MAX_GENERATION_STEP)))
    }

    /// Encode to the ConfigMap's JSON.
    #[must_use]
    pub fn encode(&self) -> String {
        // group shards by (owner, epoch) and by (move id, phase, target)
        let mut owners: BTreeMap<(MemberId, u64), ShardSet> = BTreeMap::new();
        let mut moves: BTreeMap<(MoveId, &'static str, MemberId), ShardSet> = BTreeMap::new();
        for (shard, a) in &self.view.shards {
            owners
                .entry((a.owner.clone(), a.epoch))
                .or_default()
                .insert(*shard);
            match &a.handoff {
                Handoff::Stable => {}
                Handoff::Moving { id, to } => {
                    moves
                        .entry((*id, "moving", to.clone()))
                        .or_default()
                        .insert(*shard);
                }
                Handoff::Draining { id, to } => {
                    moves
                        .entry((*id, "draining", to.clone()))
                        .or_default()
                        .insert(*shard);
                }
            }
        }
        let wire = Wire {
            format: FORMAT,
            shards: self.shards.get(),
            key: self.key.as_str().to_owned(),
            generation: self.view.generation,
            next_move_id: self.next_move_id,
            owners: owners
                .into_iter()
                .map(|((m, epoch), set)| WireOwner {
                    name: m.name.to_string(),
                    incarnation: m.incarnation.to_string(),
                    epoch,
                    shards: set.to_string(),
                })
                .collect(),
            moves: moves
                .into_iter()
                .map(|((id, phase, to), set)| WireMove {
                    shards: set.to_string(),
                    id,
                    phase: phase.to_owned(),
                    to_name: to.name.to_string(),
                    to_incarnation: to.incarnation.to_string(),
                })
                .collect(),
            pins: self
                .pins
                .iter()
                .map(|(s, n)| (s.to_string(), n.clone()))
                .collect(),
            paused: self.paused,
            drained: self.drained.iter().cloned().collect(),
        };
        serde_json::to_string(&wire).unwrap_or_default()
    }

    /// Decode and validate against the `S` and key the text itself states: for a tool that reads a group it
    /// is not a member of (`group::admin`). Members use [`decode`](Self::decode) with their own.
    pub fn decode_stated(text: &str) -> Result<Self, AssignmentError> {
        #[derive(Deserialize)]
        struct Head {
            format: u32,
            shards: u32,
            key: String,
        }
        if text.len() > MAX_TEXT {
            return Err(AssignmentError::TooLarge { len: text.len() });
        }
        let head: Head =
            serde_json::from_str(text).map_err(|e| AssignmentError::Malformed(e.to_string()))?;
        if head.format != FORMAT {
            return Err(AssignmentError::UnknownFormat(head.format));
        }
        let shards = ShardCount::new(head.shards)
            .map_err(|e| AssignmentError::Invalid(format!("shards: {e}")))?;
        let key: ShardKey = head
            .key
            .parse()
            .map_err(|e: crate::hash::KeyError| AssignmentError::Invalid(e.to_string()))?;
        Self::decode(text, shards, key)
    }

    /// Decode and validate, against the group's own `S` and key.
    pub fn decode(text: &str, shards: ShardCount, key: ShardKey) -> Result<Self, AssignmentError> {
        if text.len() > MAX_TEXT {
            return Err(AssignmentError::TooLarge { len: text.len() });
        }
        if !text.trim_start().starts_with('{') {
            return Err(AssignmentError::Malformed("not a JSON object".into()));
        }
        let wire: Wire =
            serde_json::from_str(text).map_err(|e| AssignmentError::Malformed(e.to_string()))?;
        if wire.format != FORMAT {
            return Err(AssignmentError::UnknownFormat(wire.format));
        }
        let their_shards = ShardCount::new(wire.shards)
            .map_err(|e| AssignmentError::Invalid(format!("shards: {e}")))?;
        let their_key: ShardKey = wire
            .key
            .parse()
            .map_err(|e: crate::hash::KeyError| AssignmentError::Invalid(e.to_string()))?;
        if their_shards != shards || their_key != key {
            return Err(AssignmentError::Mismatch {
                theirs: format!("S={their_shards} key={their_key}"),
                ours: format!("S={shards} key={key}"),
            });
        }
        let parse_set = |what: &str, text: &str| {
            ShardSet::parse(text, shards)
                .map_err(|e| AssignmentError::Invalid(format!("{what}: {e}")))
        };
        let member = |name: &str, inc: &str| -> Result<MemberId, AssignmentError> {
            if name.is_empty() || inc.is_empty() || name.len() > 253 || inc.len() > 253 {
                return Err(AssignmentError::Invalid(format!(
                    "member {name:?}/{inc:?}: name and incarnation must be 1 to 253 characters"
                )));
            }
            Ok(MemberId::new(name, inc))
        };
        let mut view = AssignmentView::new(wire.generation);
        for o in &wire.owners {
            let owner = member(&o.name, &o.incarnation)?;
            if o.epoch > wire.generation {
                return Err(AssignmentError::Invalid(format!(
                    "owner {owner}: epoch {} is above the generation {}",
                    o.epoch, wire.generation
                )));
            }
            for s in parse_set("owner shards", &o.shards)?.iter() {
                if view.shards.contains_key(&s) {
                    return Err(AssignmentError::Invalid(format!(
                        "shard {s} has more than one owner"
                    )));
                }
                view.shards
                    .insert(s, ShardAssignment::owned(owner.clone(), o.epoch));
            }
        }
        let mut moved = BTreeSet::new();
        for m in &wire.moves {
            let to = member(&m.to_name, &m.to_incarnation)?;
            if m.id == 0 || m.id >= wire.next_move_id {
                return Err(AssignmentError::Invalid(format!(
                    "move id {} is not below nextMoveId {}",
                    m.id, wire.next_move_id
                )));
            }
            for s in parse_set("move shards", &m.shards)?.iter() {
                if !moved.insert(s) {
                    return Err(AssignmentError::Invalid(format!("shard {s} has two moves")));
                }
                let Some(entry) = view.shards.get_mut(&s) else {
                    return Err(AssignmentError::Invalid(format!(
                        "shard {s} moves but has no owner"
                    )));
                };
                if entry.owner == to {
                    return Err(AssignmentError::Invalid(format!(
                        "shard {s} moves to its own owner"
                    )));
                }
                entry.handoff = match m.phase.as_str() {
                    "moving" => Handoff::Moving {
                        id: m.id,
                        to: to.clone(),
                    },
                    "draining" => Handoff::Draining {
                        id: m.id,
                        to: to.clone(),
                    },
                    other => {
                        return Err(AssignmentError::Invalid(format!(
                            "unknown move phase {other:?}"
                        )))
                    }
                };
            }
        }
        let mut pins = BTreeMap::new();
        for (s, name) in &wire.pins {
            let shard: u32 = s
                .parse()
                .map_err(|_| AssignmentError::Invalid(format!("pin shard {s:?}")))?;
            shards
                .check(shard)
                .map_err(|e| AssignmentError::Invalid(format!("pin: {e}")))?;
            if name.is_empty() || name.len() > 253 {
                return Err(AssignmentError::Invalid(format!(
                    "pin member name {name:?}"
                )));
            }
            pins.insert(shard, name.clone());
        }
        let mut drained = BTreeSet::new();
        for name in &wire.drained {
            if name.is_empty() || name.len() > 253 {
                return Err(AssignmentError::Invalid(format!(
                    "drained member name {name:?}"
                )));
            }
            if !drained.insert(name.clone()) {
                return Err(AssignmentError::Invalid(format!(
                    "member {name:?} is drained twice"
                )));
            }
        }
        Ok(Assignment {
            shards,
            key,
            view,
            next_move_id: wire.next_move_id.max(1),
            pins,
            paused: wire.paused,
            drained,
        })
    }

    /// The shards owned by `member`.
    #[must_use]
    pub fn owned_by(&self, member: &MemberId) -> ShardSet {
        self.view
            .shards
            .iter()
            .filter(|(_, a)| &a.owner == member)
            .map(|(s, _)| *s)
            .collect()
    }

    /// Shards with a move in flight.
    #[must_use]
    pub fn moves_in_flight(&self) -> usize {
        self.view
            .shards
            .values()
            .filter(|a| a.handoff != Handoff::Stable)
            .count()
    }

    /// Each shard with an owner, and its owner (what [`optimal_moves`](crate::group::optimal_moves) and the
    /// planner take).
    pub fn owners(&self) -> impl Iterator<Item = (u32, &MemberId)> + '_ {
        self.view.shards.iter().map(|(s, sa)| (*s, &sa.owner))
    }

    /// Shards the member named `member` owns or is receiving (the target of a move in flight).
    #[must_use]
    pub fn holding(&self, member: &str) -> usize {
        self.view
            .shards
            .values()
            .filter(|sa| {
                let to = match &sa.handoff {
                    Handoff::Moving { to, .. } | Handoff::Draining { to, .. } => Some(to),
                    Handoff::Stable => None,
                };
                sa.owner.name.as_ref() == member || to.is_some_and(|t| t.name.as_ref() == member)
            })
            .count()
    }

    /// Shards without an owner.
    #[must_use]
    pub fn unowned(&self) -> ShardSet {
        (0..self.shards.get())
            .filter(|s| !self.view.shards.contains_key(s))
            .collect()
    }
}

/// The largest assignment text read or written: a ConfigMap holds at most 1 MiB in all, and a hostile
/// ConfigMap cannot make us allocate without bound.
pub const MAX_TEXT: usize = 1 << 20;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Wire {
    format: u32,
    shards: u32,
    key: String,
    generation: u64,
    next_move_id: u64,
    #[serde(default)]
    owners: Vec<WireOwner>,
    #[serde(default)]
    moves: Vec<WireMove>,
    #[serde(default)]
    pins: BTreeMap<String, String>,
    #[serde(default)]
    paused: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    drained: Vec<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireOwner {
    name: String,
    incarnation: String,
    epoch: u64,
    shards: String,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WireMove {
    shards: String,
    id: u64,
    phase: String,
    to_name: String,
    to_incarnation: String,
}

/// Why an assignment could not be decoded. The caller keeps its last good view.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AssignmentError {
    /// Not JSON of the expected shape.
    #[error("malformed assignment: {0}")]
    Malformed(String),
    /// A format version this code does not know.
    #[error("unknown assignment format {0} (this build reads format 1)")]
    UnknownFormat(u32),
    /// The assignment was made for another `S` or key: a group's `S` and key never change.
    #[error("assignment was made for {theirs}, but this group has {ours}: S and the key are immutable (use a new group name)")]
    Mismatch {
        /// What the assignment says.
        theirs: String,
        /// What this member is configured with.
        ours: String,
    },
    /// A rule of the format is broken.
    #[error("invalid assignment: {0}")]
    Invalid(String),
    /// Larger than any assignment we write.
    #[error("assignment text of {len} bytes is larger than 1 MiB")]
    TooLarge {
        /// The size.
        len: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_tool_decodes_with_the_stated_shard_count_and_key() {
        let s = ShardCount::new(8).unwrap();
        let a = Assignment::empty(s, ShardKey::Namespace);
        let back = Assignment::decode_stated(&a.encode()).unwrap();
        assert_eq!((back.shards, back.key), (s, ShardKey::Namespace));
        for bad in [
            "",
            "[]",
            "{}",
            "{\"format\":9,\"shards\":8,\"key\":\"uid\"}",
        ] {
            assert!(Assignment::decode_stated(bad).is_err(), "{bad}");
        }
        let huge = " ".repeat(MAX_TEXT + 1);
        assert!(matches!(
            Assignment::decode_stated(&huge),
            Err(AssignmentError::TooLarge { .. })
        ));
    }

    fn s() -> ShardCount {
        ShardCount::new(16).unwrap()
    }

    fn sample() -> Assignment {
        let a = MemberId::new("pod-0", "a1");
        let b = MemberId::new("pod-1", "b2");
        let mut x = Assignment::empty(s(), ShardKey::Uid);
        x.view.generation = 100;
        x.next_move_id = 9;
        for sh in 0..8 {
            x.view
                .shards
                .insert(sh, ShardAssignment::owned(a.clone(), 50));
        }
        for sh in 8..16 {
            x.view
                .shards
                .insert(sh, ShardAssignment::owned(b.clone(), 60));
        }
        for sh in [6, 7] {
            x.view.shards.get_mut(&sh).unwrap().handoff = Handoff::Moving {
                id: 8,
                to: b.clone(),
            };
        }
        x.pins.insert(3, "pod-0".into());
        x.drained.insert("pod-9".into());
        x
    }

    #[test]
    fn round_trip_is_compact() {
        let x = sample();
        let text = x.encode();
        assert!(text.contains("\"shards\":\"0-7\""), "{text}");
        assert!(text.contains("\"shards\":\"6-7\""), "{text}");
        assert_eq!(Assignment::decode(&text, s(), ShardKey::Uid).unwrap(), x);
        assert_eq!(x.moves_in_flight(), 2);
        assert!(x.unowned().is_empty());
    }

    #[test]
    fn immutable_s_and_key_are_enforced() {
        let text = sample().encode();
        let err =
            Assignment::decode(&text, ShardCount::new(32).unwrap(), ShardKey::Uid).unwrap_err();
        assert!(matches!(err, AssignmentError::Mismatch { .. }));
        assert!(err.to_string().contains("immutable"));
        assert!(Assignment::decode(&text, s(), ShardKey::Namespace).is_err());
    }

    #[test]
    fn corrupt_data_is_an_error_never_a_panic() {
        let good = sample().encode();
        let cases = [
            "".to_owned(),
            "{".to_owned(),
            "null".to_owned(),
            good.replace("\"format\":1", "\"format\":2"),
            good.replace("\"shards\":16", "\"shards\":15"),
            good.replace("\"0-7\"", "\"0-8\""),
            good.replace("\"0-7\"", "\"0-99\""),
            good.replace("\"0-7\"", "\"7-0\""),
            good.replace("\"epoch\":50", "\"epoch\":500"),
            good.replace("\"phase\":\"moving\"", "\"phase\":\"teleporting\""),
            good.replace("\"id\":8", "\"id\":9"),
            good.replace("\"toName\":\"pod-1\"", "\"toName\":\"\""),
            good.replace("\"paused\":false", "\"paused\":false,\"extra\":1"),
            good.replace("\"3\":\"pod-0\"", "\"x\":\"pod-0\""),
            good.replace("\"3\":\"pod-0\"", "\"99\":\"pod-0\""),
            good.replace("[\"pod-9\"]", "[\"pod-9\",\"pod-9\"]"),
            good.replace("[\"pod-9\"]", "[\"\"]"),
            good.replace("[\"pod-9\"]", "\"pod-9\""),
            "x".repeat(MAX_TEXT + 1),
        ];
        for c in cases {
            assert!(
                Assignment::decode(&c, s(), ShardKey::Uid).is_err(),
                "{}",
                &c[..c.len().min(200)]
            );
        }
    }

    #[test]
    fn drained_is_omitted_while_empty_so_older_readers_still_decode() {
        let mut x = sample();
        assert!(x.encode().contains("\"drained\":[\"pod-9\"]"));
        x.drained.clear();
        let text = x.encode();
        assert!(!text.contains("drained"), "{text}");
        assert_eq!(Assignment::decode(&text, s(), ShardKey::Uid).unwrap(), x);
    }

    #[test]
    fn generations_never_go_backwards() {
        assert_eq!(Assignment::next_generation(5, 3), 6);
        assert_eq!(Assignment::next_generation(5, 1000), 1000);
        assert_eq!(Assignment::next_generation(u64::MAX, 0), u64::MAX);
    }

    /// One forward-skewed clock moves a generation by at most the bound per write (members refuse
    /// only what is further ahead), and the first generation is the wall clock.
    #[test]
    fn a_skewed_clock_moves_generations_by_at_most_the_bound() {
        let now = 1_700_000_000_000u64;
        let skewed = now + 365 * MAX_GENERATION_STEP;
        assert_eq!(
            Assignment::next_generation(now, skewed),
            now + MAX_GENERATION_STEP
        );
        assert_eq!(Assignment::next_generation(0, now), now);
        assert_eq!(Assignment::next_generation(now, now + 5), now + 5);
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in ".{0,300}") {
            let _ = Assignment::decode(&text, s(), ShardKey::Uid);
        }

        #[test]
        fn random_assignments_round_trip(owners in prop::collection::vec(0u8..4, 16), moving in prop::collection::vec(0u8..3, 16), gen in 1u64..1_000_000) {
            let members: Vec<MemberId> = (0..4).map(|i| MemberId::new(format!("m{i}"), format!("i{i}"))).collect();
            let mut x = Assignment::empty(s(), ShardKey::Uid);
            x.view.generation = gen;
            x.next_move_id = 5;
            for (sh, o) in owners.iter().enumerate() {
                let mut a = ShardAssignment::owned(members[*o as usize].clone(), gen / 2);
                let to = members[(*o as usize + 1) % 4].clone();
                a.handoff = match moving[sh] {
                    1 => Handoff::Moving { id: 3, to },
                    2 => Handoff::Draining { id: 4, to },
                    _ => Handoff::Stable,
                };
                x.view.shards.insert(sh as u32, a);
            }
            let back = Assignment::decode(&x.encode(), s(), ShardKey::Uid).unwrap();
            prop_assert_eq!(back, x);
        }
    }
}
