//! What the mirror records in the Standby's checkpoint ConfigMap besides its positions, and how the
//! promotion checks read it (pure):
//!
//! - [`MIRROR_KEY`]: the mirror itself ([`MirrorRecord`]): its source cluster, its mirrored kinds and
//!   its scope, written when a mirror starts. The promotion checks read the kinds from here, so they run
//!   whether or not a command names them (`--kind` is a cross-check).
//! - [`SYNCED_KEY`]: per kind, the completed initial LIST ([`Synced`]): the LIST's resourceVersion, its
//!   object count, the objects left on the failed list and the time; written once every object of that
//!   LIST was applied (or recorded failed). "Synced" means this record, never a mere position (a
//!   position exists within a second of the first LIST's arrival). A checkpoint written before this
//!   record existed reads as not synced.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use super::config::MirrorConfig;
use super::error::MirrorError;
use super::kinds::{KindSet, OwnObjects};
use crate::checkpoint::Kind;
use crate::HaConfig;

/// The checkpoint key of the [`MirrorRecord`].
pub const MIRROR_KEY: &str = "mirror";
/// The checkpoint key of the [`Synced`] records, one line per kind.
pub const SYNCED_KEY: &str = "synced";

/// The mirror as it records itself in the checkpoint:
/// `v1 source=<cluster> kinds=<kind/version>,… namespaces=<ns>,…|* own=<ns>/<name>,…|-`, then
/// ` labels=<selector>` (the rest of the line) when the mirror has a label selector.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MirrorRecord {
    /// The source (the peer's) cluster id.
    pub source: String,
    /// The mirrored kinds.
    pub kinds: Vec<Kind>,
    /// The scope (`None`: every namespace).
    pub namespaces: Option<BTreeSet<String>>,
    /// ConfigMaps (namespace, name) never copied beyond the checkpoint itself (the group's assignment).
    pub own_configmaps: Vec<(String, String)>,
    /// The label selector (`None`: every object).
    pub labels: Option<String>,
}

impl MirrorRecord {
    /// The record of the mirror of `cfg`.
    #[must_use]
    pub fn of(cfg: &MirrorConfig) -> Self {
        let default = OwnObjects::new(
            &cfg.ha.name,
            &cfg.ha.namespace,
            &cfg.ha.witness_namespace,
            None,
        );
        MirrorRecord {
            source: cfg.source_cluster.clone(),
            kinds: cfg.kinds.mirrored().cloned().collect(),
            namespaces: cfg.namespaces.clone(),
            labels: cfg.labels.as_ref().map(ToString::to_string),
            own_configmaps: cfg
                .own
                .configmaps
                .iter()
                .filter(|c| !default.configmaps.contains(c))
                .cloned()
                .collect(),
        }
    }

    /// The mirror configuration it records, on the cluster of `ha` (for the promotion checks: its
    /// kinds, scope, own objects and source).
    pub fn config(&self, ha: HaConfig) -> Result<MirrorConfig, MirrorError> {
        // the mirror that wrote the record was built with these kinds, Secrets allowed or not
        let set = self
            .kinds
            .iter()
            .fold(KindSet::builder().allow_secrets(true), |b, k| {
                b.mirrored(k.clone())
            })
            .build(&self.kinds)?;
        let mut m = MirrorConfig::new(ha, &self.source, set);
        if let Some(ns) = &self.namespaces {
            m = m.namespaces(ns.iter().cloned());
        }
        if let Some(l) = &self.labels {
            m = m.labels(l)?;
        }
        for (ns, name) in &self.own_configmaps {
            m = m.assignment(ns, name);
        }
        Ok(m)
    }

    /// The kind keys (`<plural>.<group>`).
    #[must_use]
    pub fn keys(&self) -> BTreeSet<String> {
        self.kinds.iter().map(Kind::key).collect()
    }
}

fn list<T: fmt::Display>(items: impl IntoIterator<Item = T>, empty: &str) -> String {
    let v: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    if v.is_empty() {
        empty.to_string()
    } else {
        v.join(",")
    }
}

impl fmt::Display for MirrorRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ns = match &self.namespaces {
            None => "*".to_string(),
            Some(s) => list(s, "-"),
        };
        let own = list(
            self.own_configmaps.iter().map(|(n, c)| format!("{n}/{c}")),
            "-",
        );
        write!(
            f,
            "v1 source={} kinds={} namespaces={ns} own={own}",
            self.source,
            list(&self.kinds, "-")
        )?;
        match &self.labels {
            Some(l) => write!(f, " labels={l}"),
            None => Ok(()),
        }
    }
}

impl FromStr for MirrorRecord {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("the mirror record {s:?} does not decode: {why}");
        let (head, labels) = match s.split_once(" labels=") {
            Some((h, l)) => (h, Some(l.trim())),
            None => (s, None),
        };
        if let Some(l) = labels {
            super::labels::parse_labels(l).map_err(|e| bad(&e.to_string()))?;
        }
        let mut words = head.split_whitespace();
        if words.next() != Some("v1") {
            return Err(bad("not v1"));
        }
        let mut field = |name: &str| {
            words
                .next()
                .and_then(|w| w.strip_prefix(name))
                .and_then(|w| w.strip_prefix('='))
                .ok_or_else(|| bad(&format!("no {name}")))
        };
        let (source, kinds, ns, own) = (
            field("source")?,
            field("kinds")?,
            field("namespaces")?,
            field("own")?,
        );
        let items = |v: &str| -> Vec<String> {
            if v == "-" {
                Vec::new()
            } else {
                v.split(',').map(str::to_string).collect()
            }
        };
        let kinds = items(kinds)
            .iter()
            .map(|k| k.parse::<Kind>().map_err(|e| bad(&e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let own_configmaps = items(own)
            .iter()
            .map(|o| {
                o.split_once('/')
                    .map(|(n, c)| (n.to_string(), c.to_string()))
                    .ok_or_else(|| bad("an own ConfigMap is not <namespace>/<name>"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if source.is_empty() || kinds.is_empty() {
            return Err(bad("no source or no kind"));
        }
        if words.next().is_some() {
            return Err(bad("unknown words after own="));
        }
        Ok(MirrorRecord {
            source: source.to_string(),
            kinds,
            namespaces: (ns != "*").then(|| items(ns).into_iter().collect()),
            own_configmaps,
            labels: labels.map(str::to_string),
        })
    }
}

/// A kind's completed initial LIST, as recorded: one line of [`SYNCED_KEY`],
/// `<kind> source=<cluster>/<uid> list-rv=<n> objects=<n> failed=<n> at=<RFC 3339>`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct Synced {
    /// The source identity, `<cluster>/<uid of its kube-system namespace>`.
    pub source: String,
    /// The LIST's resourceVersion.
    pub list_rv: u64,
    /// The objects in scope the LIST held.
    pub objects: usize,
    /// Of them, the objects on the failed list when the rest was applied (not copied).
    pub failed: usize,
    /// When the LIST was found applied (wall clock, RFC 3339).
    pub at: String,
}

impl Synced {
    /// A record of the LIST at `list_rv` from `source`.
    #[must_use]
    pub fn new(source: String, list_rv: u64, objects: usize, failed: usize, at: String) -> Self {
        Synced {
            source,
            list_rv,
            objects,
            failed,
            at,
        }
    }

    fn line(&self, kind: &str) -> String {
        format!(
            "{kind} source={} list-rv={} objects={} failed={} at={}",
            self.source, self.list_rv, self.objects, self.failed, self.at
        )
    }

    fn parse(line: &str) -> Option<(String, Synced)> {
        let mut w = line.split_whitespace();
        let kind = w.next()?.to_string();
        let mut field = |name: &str| {
            w.next()
                .and_then(|x| x.strip_prefix(name))
                .and_then(|x| x.strip_prefix('='))
                .map(str::to_string)
        };
        let s = Synced {
            source: field("source")?,
            list_rv: field("list-rv")?.parse().ok()?,
            objects: field("objects")?.parse().ok()?,
            failed: field("failed")?.parse().ok()?,
            at: field("at")?,
        };
        Some((kind, s))
    }
}

/// The [`Synced`] record of `kind` in checkpoint `data` (an unreadable line counts as none).
#[must_use]
pub fn synced(data: &BTreeMap<String, String>, kind: &str) -> Option<Synced> {
    data.get(SYNCED_KEY)?
        .lines()
        .filter_map(Synced::parse)
        .find(|(k, _)| k == kind)
        .map(|(_, s)| s)
}

/// Record `s` for `kind` in checkpoint `data` (replacing the kind's line).
pub fn put_synced(data: &mut BTreeMap<String, String>, kind: &str, s: &Synced) {
    drop_synced(data, kind);
    let text = data.entry(SYNCED_KEY.to_string()).or_default();
    text.push_str(&s.line(kind));
    text.push('\n');
}

/// Remove `kind`'s [`Synced`] record from checkpoint `data`.
pub fn drop_synced(data: &mut BTreeMap<String, String>, kind: &str) {
    if let Some(text) = data.get_mut(SYNCED_KEY) {
        let prefix = format!("{kind} ");
        *text = text
            .lines()
            .filter(|l| !l.starts_with(&prefix))
            .map(|l| format!("{l}\n"))
            .collect();
    }
}

/// A kind's position entry in the checkpoint: `v1 source=<cluster>/<uid> rv=<n>`.
#[must_use]
pub fn position_text(source: &str, rv: u64) -> String {
    format!("v1 source={source} rv={rv}")
}

/// The position entry of `kind` in checkpoint `data`: (`<cluster>/<uid>`, rv).
#[must_use]
pub fn position_entry(data: &BTreeMap<String, String>, kind: &str) -> Option<(String, u64)> {
    let rest = data.get(kind)?.strip_prefix("v1 source=")?;
    let (src, rv) = rest.split_once(" rv=")?;
    Some((src.to_string(), rv.parse().ok()?))
}

/// Whether `kind` is synced from cluster `source_cluster` in checkpoint `data`: its [`Synced`] record is
/// from that cluster and from the same incarnation (`<cluster>/<uid>`) as its position.
#[must_use]
pub fn synced_from(
    data: &BTreeMap<String, String>,
    kind: &str,
    source_cluster: &str,
) -> Option<Synced> {
    let (pos_src, _) = position_entry(data, kind)?;
    let s = synced(data, kind)?;
    let cluster = s.source.split_once('/').map(|(c, _)| c)?;
    (cluster == source_cluster && s.source == pos_src).then_some(s)
}

/// Two kind sets that differ: the kinds the other side lacks and the kinds it has in excess.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct KindDiff {
    /// In the mirror's set, not in the other.
    pub missing: Vec<String>,
    /// In the other set, not in the mirror's.
    pub extra: Vec<String>,
}

impl fmt::Display for KindDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if !self.missing.is_empty() {
            parts.push(format!("missing {}", self.missing.join(", ")));
        }
        if !self.extra.is_empty() {
            parts.push(format!("not mirrored here: {}", self.extra.join(", ")));
        }
        f.write_str(&parts.join("; "))
    }
}

/// The difference between the mirror's kind keys and `other`'s (`None`: equal).
#[must_use]
pub fn kind_diff(mirror: &BTreeSet<String>, other: &BTreeSet<String>) -> Option<KindDiff> {
    let d = KindDiff {
        missing: mirror.difference(other).cloned().collect(),
        extra: other.difference(mirror).cloned().collect(),
    };
    (!d.missing.is_empty() || !d.extra.is_empty()).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> MirrorRecord {
        MirrorRecord {
            source: "a".into(),
            kinds: vec![
                "widgets.example.com/v1".parse().unwrap(),
                "configmaps/v1".parse().unwrap(),
            ],
            namespaces: Some(BTreeSet::from(["apps".to_string(), "ops".to_string()])),
            own_configmaps: vec![("ops".into(), "g-assignment".into())],
            labels: None,
        }
    }

    #[test]
    fn the_mirror_record_round_trips_and_garbage_is_refused() {
        let r = record();
        let text = r.to_string();
        assert_eq!(
            text,
            "v1 source=a kinds=widgets.example.com/v1,configmaps/v1 namespaces=apps,ops own=ops/g-assignment"
        );
        assert_eq!(text.parse::<MirrorRecord>().unwrap(), r);
        let all = MirrorRecord {
            namespaces: None,
            own_configmaps: Vec::new(),
            ..r
        };
        assert_eq!(all.to_string().parse::<MirrorRecord>().unwrap(), all);
        let labelled = MirrorRecord {
            labels: Some("app=shop,tier in (api,web)".into()),
            ..all.clone()
        };
        let text = labelled.to_string();
        assert!(
            text.ends_with(" own=- labels=app=shop,tier in (api,web)"),
            "{text}"
        );
        assert_eq!(text.parse::<MirrorRecord>().unwrap(), labelled);
        for bad in [
            "",
            "v2 source=a kinds=configmaps/v1 namespaces=* own=-",
            "v1 source=a kinds=- namespaces=* own=-",
            "v1 source=a kinds=configmaps namespaces=* own=-",
            "v1 source=a kinds=configmaps/v1 namespaces=*",
            "v1 source=a kinds=configmaps/v1 namespaces=* own=nons",
            "v1 source=a kinds=configmaps/v1 namespaces=* own=- extra",
            "v1 source=a kinds=configmaps/v1 namespaces=* own=- labels=a in (b",
        ] {
            assert!(bad.parse::<MirrorRecord>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn synced_needs_a_record_from_the_positions_incarnation() {
        let mut d = BTreeMap::from([(
            "widgets.example.com".to_string(),
            "v1 source=a/u1 rv=1200".to_string(),
        )]);
        assert_eq!(
            synced_from(&d, "widgets.example.com", "a"),
            None,
            "a position alone is not synced (an older checkpoint)"
        );
        let s = Synced::new("a/u1".into(), 1100, 200, 1, "2024-01-01T00:00:00Z".into());
        put_synced(&mut d, "widgets.example.com", &s);
        put_synced(
            &mut d,
            "configmaps",
            &Synced::new("a/u1".into(), 7, 0, 0, "t".into()),
        );
        assert_eq!(synced_from(&d, "widgets.example.com", "a"), Some(s.clone()));
        assert_eq!(synced_from(&d, "widgets.example.com", "c"), None);
        assert_eq!(synced_from(&d, "configmaps", "a"), None, "no position");
        // the peer re-created (another kube-system uid): its position is not the synced incarnation's
        d.insert("widgets.example.com".into(), "v1 source=a/u2 rv=5".into());
        assert_eq!(synced_from(&d, "widgets.example.com", "a"), None);
        drop_synced(&mut d, "widgets.example.com");
        assert_eq!(synced(&d, "widgets.example.com"), None);
        assert!(synced(&d, "configmaps").is_some(), "other kinds kept");
        d.insert(SYNCED_KEY.into(), "garbage\nwidgets.example.com x".into());
        assert_eq!(synced(&d, "widgets.example.com"), None);
    }

    #[test]
    fn a_mirror_configuration_round_trips_through_its_record() {
        let ha = HaConfig::builder("widgets")
            .mode(crate::HaMode::Standby)
            .cluster("b", 2)
            .namespace("ops")
            .kubeconfigs(None, Some("/peer".into()), None)
            .build()
            .unwrap();
        let r = record();
        let cfg = r.config(ha).unwrap();
        assert!(cfg
            .own
            .configmaps
            .contains(&("ops".to_string(), "widgets-ha-mirror".to_string())));
        let mut sorted = r;
        sorted.kinds.sort_by_key(Kind::key);
        assert_eq!(MirrorRecord::of(&cfg), sorted, "kinds in key order");
    }

    #[test]
    fn kind_differences_name_both_sides() {
        let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let mirror = set(&["configmaps", "secrets"]);
        assert_eq!(kind_diff(&mirror, &set(&["secrets", "configmaps"])), None);
        let d = kind_diff(&mirror, &set(&["secrets", "jobs.batch"])).unwrap();
        assert_eq!(d.missing, vec!["configmaps".to_string()]);
        assert_eq!(d.extra, vec!["jobs.batch".to_string()]);
        assert_eq!(
            d.to_string(),
            "missing configmaps; not mirrored here: jobs.batch"
        );
    }
}
