//! The promotion checks every promotion path runs before it writes anything: `promote --force`,
//! `promote --token`, `switchover` and `demote` (against the Standby, before the freeze), and the
//! library functions behind them ([`crate::failover::force_promote_with`],
//! [`crate::switchover::promote_with_token`]).
//!
//! The mirror is read from the Standby's own checkpoint ([`MirrorRecord`]), never from a command's
//! flags, which are only cross-checked. A refusal changes nothing; [`Overrides`] lists the ones a human
//! may override.
//!
//! See `docs/ha.md#the-promotion-checks` for the refusals, in order.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};

use super::target::{positions, require_synced, KindPosition, TargetRefused};
use crate::checkpoint::{DemotionToken, Kind};
use crate::config::checkpoint_name;
use crate::failback::{divergent_objects, NotPromotable};
use crate::mirror::checkpoint::{kind_diff, MirrorRecord, MIRROR_KEY};
use crate::mirror::error::api_err;
use crate::mirror::MirrorConfig;
use crate::HaConfig;

/// The refusals a human may override, each named for what it risks (the CLI's `--allow-*` flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Overrides {
    /// `--allow-unsynced`: promote by force although a kind's initial LIST is not recorded as applied
    /// (the objects not copied yet are lost).
    pub allow_unsynced: bool,
    /// `--allow-divergent`: promote although this cluster holds objects that are not copies of the
    /// peer's (they become live objects of the new Active).
    pub allow_divergent: bool,
    /// `--allow-kind-mismatch`: go on with the checkpoint's kinds and scope although the command names
    /// others.
    pub allow_kind_mismatch: bool,
    /// `--allow-no-mirror`: promote although no mirror ever ran here (nothing shows what this cluster
    /// holds of the peer's objects).
    pub allow_no_mirror: bool,
}

impl Overrides {
    /// No override.
    #[must_use]
    pub fn none() -> Self {
        Overrides::default()
    }

    /// Set `--allow-unsynced`.
    #[must_use]
    pub fn unsynced(mut self, on: bool) -> Self {
        self.allow_unsynced = on;
        self
    }

    /// Set `--allow-divergent`.
    #[must_use]
    pub fn divergent(mut self, on: bool) -> Self {
        self.allow_divergent = on;
        self
    }

    /// Set `--allow-kind-mismatch`.
    #[must_use]
    pub fn kind_mismatch(mut self, on: bool) -> Self {
        self.allow_kind_mismatch = on;
        self
    }

    /// Set `--allow-no-mirror`.
    #[must_use]
    pub fn no_mirror(mut self, on: bool) -> Self {
        self.allow_no_mirror = on;
        self
    }

    /// The flags set, as a command spells them.
    #[must_use]
    pub fn flags(&self) -> Vec<&'static str> {
        [
            (self.allow_unsynced, "--allow-unsynced"),
            (self.allow_divergent, "--allow-divergent"),
            (self.allow_kind_mismatch, "--allow-kind-mismatch"),
            (self.allow_no_mirror, "--allow-no-mirror"),
        ]
        .into_iter()
        .filter_map(|(on, f)| on.then_some(f))
        .collect()
    }
}

/// What a promotion expects of this cluster's mirror (a command's flags, cross-checked against the
/// checkpoint), and the overrides.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct PromotionChecks {
    /// The mirrored kinds the command names (`--kind`).
    pub kinds: Option<Vec<Kind>>,
    /// The mirror's source the command names (`--peer-cluster-id`).
    pub source: Option<String>,
    /// The mirror's scope the command names (`--mirror-namespace`).
    pub namespaces: Option<BTreeSet<String>>,
    /// The mirror's label selector the command names (`--mirror-labels`), as the mirror records it.
    pub labels: Option<String>,
    /// The overrides.
    pub overrides: Overrides,
}

impl PromotionChecks {
    /// Cross-check the mirrored kinds against `kinds` (empty: none named).
    #[must_use]
    pub fn kinds(mut self, kinds: Vec<Kind>) -> Self {
        self.kinds = (!kinds.is_empty()).then_some(kinds);
        self
    }

    /// Cross-check the mirror's source.
    #[must_use]
    pub fn source(mut self, cluster: Option<String>) -> Self {
        self.source = cluster;
        self
    }

    /// Cross-check the mirror's scope against `namespaces` (empty: none named).
    #[must_use]
    pub fn namespaces(mut self, namespaces: Vec<String>) -> Self {
        self.namespaces = (!namespaces.is_empty()).then(|| namespaces.into_iter().collect());
        self
    }

    /// Cross-check the mirror's label selector against `selector` (`None` or empty: none named).
    pub fn labels(mut self, selector: Option<&str>) -> Result<Self, crate::mirror::MirrorError> {
        self.labels = match selector {
            Some(t) => {
                let s = crate::mirror::labels::parse_labels(t)?;
                (!s.selects_all()).then(|| s.to_string())
            }
            None => None,
        };
        Ok(self)
    }

    /// The overrides.
    #[must_use]
    pub fn overrides(mut self, o: Overrides) -> Self {
        self.overrides = o;
        self
    }
}

/// Which promotion the checks are for.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum PromotionPath<'a> {
    /// `promote --force`: also refuses a kind without a completed initial LIST.
    Forced,
    /// `promote --token`: the token's kinds must be the mirror's.
    DemotionToken(&'a DemotionToken),
    /// Before a demotion (`demote`, `switchover`), against the Standby that will promote.
    BeforeDemotion,
}

/// What the checks found.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Checked {
    /// The mirror the checkpoint records (`None`: no mirror ever ran here, and `--allow-no-mirror`).
    pub mirror: Option<MirrorConfig>,
    /// Every mirrored kind's position and initial-LIST record.
    pub kinds: Vec<KindPosition>,
    /// Each refusal an override let pass, with its flag and what it let pass.
    pub overridden: Vec<String>,
}

async fn read(ha: &HaConfig, local: &Client) -> Result<BTreeMap<String, String>, TargetRefused> {
    let api: Api<ConfigMap> = Api::namespaced(local.clone(), &ha.namespace);
    Ok(api
        .get_opt(&checkpoint_name(ha))
        .await
        .map_err(api_err("reading the checkpoint"))?
        .and_then(|c| c.data)
        .unwrap_or_default())
}

/// The mirror of checkpoint `cp` on the cluster of `ha`, cross-checked against `checks` and `path`
/// (pure). `Ok(None)`: no record, and `--allow-no-mirror`.
fn recorded_mirror(
    ha: &HaConfig,
    cp: &BTreeMap<String, String>,
    checks: &PromotionChecks,
    path: PromotionPath<'_>,
    overridden: &mut Vec<String>,
) -> Result<Option<MirrorConfig>, TargetRefused> {
    let o = checks.overrides;
    let Some(text) = cp.get(MIRROR_KEY) else {
        if !o.allow_no_mirror {
            return Err(TargetRefused::NoMirror {
                checkpoint: format!("{}/{}", ha.namespace, checkpoint_name(ha)),
            });
        }
        overridden.push("--allow-no-mirror: no mirror ever ran on this cluster".into());
        return Ok(None);
    };
    let record: MirrorRecord = text.parse().map_err(TargetRefused::BadRecord)?;
    let named = [
        ("--peer-cluster-id", checks.source.as_deref()),
        (
            "the token",
            match path {
                PromotionPath::DemotionToken(t) => Some(t.cluster.as_str()),
                _ => None,
            },
        ),
    ];
    for (what, given) in named {
        if let Some(given) = given.filter(|g| *g != record.source) {
            return Err(TargetRefused::Source {
                what: what.into(),
                given: given.into(),
                recorded: record.source.clone(),
            });
        }
    }
    let mine = record.keys();
    if let PromotionPath::DemotionToken(t) = path {
        let theirs: BTreeSet<String> = t.kinds.keys().cloned().collect();
        if let Some(d) = kind_diff(&mine, &theirs) {
            return Err(TargetRefused::TokenKinds(d));
        }
    }
    if let Some(given) = &checks.kinds {
        if let Some(d) = kind_diff(&mine, &given.iter().map(Kind::key).collect()) {
            if !o.allow_kind_mismatch {
                return Err(TargetRefused::KindMismatch(d));
            }
            overridden.push(format!(
                "--allow-kind-mismatch: --kind differs ({d}); the checkpoint's kinds are checked"
            ));
        }
    }
    if let Some(given) = checks.namespaces.as_ref() {
        if record.namespaces.as_ref() != Some(given) {
            let recorded = record
                .namespaces
                .as_ref()
                .map_or("every namespace".to_string(), |n| format!("{n:?}"));
            if !o.allow_kind_mismatch {
                return Err(TargetRefused::ScopeMismatch {
                    given: format!("{given:?}"),
                    recorded,
                });
            }
            overridden.push(format!("--allow-kind-mismatch: --mirror-namespace differs from the mirror's scope ({recorded}); the checkpoint's scope is checked"));
        }
    }
    if let Some(given) = checks.labels.as_ref() {
        if record.labels.as_ref() != Some(given) {
            let recorded = record
                .labels
                .clone()
                .unwrap_or_else(|| "every object".into());
            if !o.allow_kind_mismatch {
                return Err(TargetRefused::ScopeMismatch {
                    given: format!("labels {given:?}"),
                    recorded: format!("labels {recorded:?}"),
                });
            }
            overridden.push(format!("--allow-kind-mismatch: --mirror-labels differs from the mirror's selector ({recorded}); the checkpoint's selector is checked"));
        }
    }
    Ok(Some(record.config(ha.clone())?))
}

/// The mirror a command names when no mirror ever ran here (`--allow-no-mirror`): `--kind` with
/// `--peer-cluster-id` (its objects are still checked), else none.
fn named_mirror(
    ha: &HaConfig,
    checks: &PromotionChecks,
) -> Result<Option<MirrorConfig>, TargetRefused> {
    let (Some(kinds), Some(source)) = (&checks.kinds, &checks.source) else {
        return Ok(None);
    };
    let record = MirrorRecord {
        source: source.clone(),
        kinds: kinds.clone(),
        namespaces: checks.namespaces.clone(),
        own_configmaps: Vec::new(),
        labels: checks.labels.clone(),
    };
    Ok(Some(record.config(ha.clone())?))
}

/// Run the promotion checks for `path` on `local`, the cluster of `ha` (the Standby to promote; only
/// its HA name and namespaces are used, to find the checkpoint): the mirror from its checkpoint,
/// cross-checked against `checks`; nothing is written. Refusals are [`TargetRefused`]; overrides that
/// let one pass are listed in [`Checked::overridden`].
#[tracing::instrument(skip_all, fields(path = ?path))]
pub async fn check_promotion(
    ha: &HaConfig,
    local: &Client,
    checks: &PromotionChecks,
    path: PromotionPath<'_>,
) -> Result<Checked, TargetRefused> {
    let cp = read(ha, local).await?;
    if let Some(mark) = cp.get(crate::checkpoint::LEFT_HA_KEY) {
        return Err(TargetRefused::LeftHa(mark.clone()));
    }
    let mut overridden = Vec::new();
    let mirror = match recorded_mirror(ha, &cp, checks, path, &mut overridden)? {
        Some(m) => Some(m),
        None => named_mirror(ha, checks)?,
    };
    let Some(m) = mirror else {
        return Ok(Checked {
            mirror: None,
            kinds: Vec::new(),
            overridden,
        });
    };
    let divergent = divergent_objects(&m, local).await?;
    if !divergent.is_empty() {
        let refused = NotPromotable(divergent);
        if !checks.overrides.allow_divergent {
            return Err(TargetRefused::Divergent(refused));
        }
        overridden.push(format!("--allow-divergent: {refused}"));
    }
    let kinds = positions(&m, &cp);
    if let PromotionPath::Forced = path {
        if let Err(e) = require_synced(&m, &kinds) {
            if !checks.overrides.allow_unsynced {
                return Err(e);
            }
            overridden.push(format!("--allow-unsynced: {e}"));
        }
    }
    Ok(Checked {
        mirror: Some(m),
        kinds,
        overridden,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HaMode;

    fn ha() -> HaConfig {
        HaConfig::builder("widgets")
            .mode(HaMode::Standby)
            .cluster("b", 2)
            .namespace("ops")
            .kubeconfigs(None, Some("/peer".into()), None)
            .build()
            .unwrap()
    }

    fn cp(record: Option<&str>) -> BTreeMap<String, String> {
        record
            .map(|r| BTreeMap::from([(MIRROR_KEY.to_string(), r.to_string())]))
            .unwrap_or_default()
    }

    const TWO: &str = "v1 source=a kinds=secrets/v1,configmaps/v1 namespaces=apps own=-";

    fn run(
        record: Option<&str>,
        checks: &PromotionChecks,
        path: PromotionPath<'_>,
    ) -> (Result<Option<MirrorConfig>, TargetRefused>, Vec<String>) {
        let mut notes = Vec::new();
        let r = recorded_mirror(&ha(), &cp(record), checks, path, &mut notes);
        (r, notes)
    }

    #[test]
    fn without_a_recorded_mirror_a_promotion_is_refused_unless_allowed_by_name() {
        let (r, _) = run(None, &PromotionChecks::default(), PromotionPath::Forced);
        let e = r.unwrap_err();
        assert!(matches!(e, TargetRefused::NoMirror { .. }), "{e}");
        assert!(e.to_string().contains("--allow-no-mirror"), "{e}");
        let allowed = PromotionChecks::default().overrides(Overrides::none().no_mirror(true));
        let (r, notes) = run(None, &allowed, PromotionPath::Forced);
        assert!(r.unwrap().is_none());
        assert!(notes[0].starts_with("--allow-no-mirror"), "{notes:?}");
        let (r, _) = run(Some("v1 garbage"), &allowed, PromotionPath::Forced);
        assert!(matches!(r, Err(TargetRefused::BadRecord(_))), "{r:?}");
    }

    #[test]
    fn the_mirrors_kinds_come_from_the_checkpoint_and_what_a_command_names_is_a_cross_check() {
        let (r, _) = run(
            Some(TWO),
            &PromotionChecks::default(),
            PromotionPath::Forced,
        );
        let m = r.unwrap().unwrap();
        let keys: Vec<String> = m.kinds.mirrored().map(Kind::key).collect();
        assert_eq!(keys, vec!["configmaps".to_string(), "secrets".to_string()]);
        assert_eq!(m.source_cluster, "a");
        let one = PromotionChecks::default().kinds(vec!["secrets/v1".parse().unwrap()]);
        let (r, _) = run(Some(TWO), &one, PromotionPath::Forced);
        let e = r.unwrap_err();
        assert!(
            matches!(&e, TargetRefused::KindMismatch(d) if d.missing == ["configmaps"]),
            "{e}"
        );
        let (r, notes) = run(
            Some(TWO),
            &one.overrides(Overrides::none().kind_mismatch(true)),
            PromotionPath::Forced,
        );
        assert!(r.unwrap().is_some());
        assert!(notes[0].contains("missing configmaps"), "{notes:?}");
        let scope = PromotionChecks::default().namespaces(vec!["other".into()]);
        let (r, _) = run(Some(TWO), &scope, PromotionPath::Forced);
        assert!(
            matches!(r, Err(TargetRefused::ScopeMismatch { .. })),
            "{r:?}"
        );
        let source = PromotionChecks::default().source(Some("c".into()));
        let (r, _) = run(Some(TWO), &source, PromotionPath::Forced);
        assert!(matches!(r, Err(TargetRefused::Source { .. })), "{r:?}");
    }

    #[test]
    fn a_token_must_cover_exactly_the_mirrors_kinds_whatever_the_overrides() {
        let all = PromotionChecks::default().overrides(
            Overrides::none()
                .kind_mismatch(true)
                .divergent(true)
                .unsynced(true),
        );
        let token = |k: &str, src: &str| -> DemotionToken {
            format!("v1;src={src}/u;e=1001;k={k};id=t").parse().unwrap()
        };
        let lacking = token("secrets:5", "a");
        let (r, _) = run(Some(TWO), &all, PromotionPath::DemotionToken(&lacking));
        let e = r.unwrap_err();
        assert!(e.to_string().contains("missing configmaps"), "{e}");
        let extra = token("secrets:5,configmaps:5,jobs.batch:5", "a");
        let (r, _) = run(Some(TWO), &all, PromotionPath::DemotionToken(&extra));
        assert!(r
            .unwrap_err()
            .to_string()
            .contains("not mirrored here: jobs.batch"));
        let foreign = token("secrets:5,configmaps:5", "c");
        let (r, _) = run(Some(TWO), &all, PromotionPath::DemotionToken(&foreign));
        assert!(matches!(r, Err(TargetRefused::Source { .. })), "{r:?}");
        let good = token("secrets:5,configmaps:5", "a");
        let (r, _) = run(
            Some(TWO),
            &PromotionChecks::default(),
            PromotionPath::DemotionToken(&good),
        );
        assert!(r.unwrap().is_some());
    }

    #[test]
    fn the_overrides_print_as_their_flags() {
        assert!(Overrides::none().flags().is_empty());
        let o = Overrides::none().unsynced(true).no_mirror(true);
        assert_eq!(o.flags(), vec!["--allow-unsynced", "--allow-no-mirror"]);
    }
}
