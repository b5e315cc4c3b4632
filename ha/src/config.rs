//! `HaMode` and `HaConfig`: validated at build time (HA.md contract 6, "Safe input"). An empty mode is
//! standalone (today's behaviour); an unknown word is an error naming the accepted words; timings that let
//! a holder outlive a taker's wait (`renew_deadline + request_timeout ≥ lease_duration`) are refused.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use super::epoch::RANKS;

/// The words `--ha-mode` accepts.
pub const MODE_WORDS: &str = "standalone, active, standby (empty means standalone)";

/// The role named at bootstrap. It names the role only while no HA Lease exists; after that the role is
/// derived from the Leases alone and the flag never bumps an epoch (HA.md contract 4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HaMode {
    /// No HA: the operator behaves as without this module.
    #[default]
    Standalone,
    /// Bootstrap as the Active cluster.
    Active,
    /// Bootstrap as the Standby cluster.
    Standby,
}

impl fmt::Display for HaMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HaMode::Standalone => "standalone",
            HaMode::Active => "active",
            HaMode::Standby => "standby",
        })
    }
}

impl FromStr for HaMode {
    type Err = HaConfigError;

    fn from_str(s: &str) -> Result<Self, HaConfigError> {
        match s.trim() {
            "" | "standalone" => Ok(HaMode::Standalone),
            "active" => Ok(HaMode::Active),
            "standby" => Ok(HaMode::Standby),
            other => Err(HaConfigError::UnknownMode(other.to_string())),
        }
    }
}

/// A configuration refused at build time.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HaConfigError {
    /// `--ha-mode` is not one of [`MODE_WORDS`].
    #[error("unknown HA mode {0:?}: accepted are {MODE_WORDS}")]
    UnknownMode(String),
    /// The cluster id is empty, too long, or not lower-case alphanumerics, '-' and '.'.
    #[error("cluster id {0:?} must be 1-63 characters of a-z, 0-9, '-' and '.'")]
    ClusterId(String),
    /// The rank is not below the epoch's K.
    #[error("rank {0} must be below {RANKS}")]
    Rank(u64),
    /// A required setting is missing.
    #[error("{0} is required in {1} mode")]
    Missing(&'static str, HaMode),
    /// No namespace was given and neither POD_NAMESPACE nor the service account's namespace file is there.
    #[error("no namespace: set --ha-namespace, POD_NAMESPACE (downward API) or run in a pod")]
    NoNamespace,
    /// The timings break the elector's assumptions.
    #[error("timings: {0}")]
    Timings(String),
    /// Both a lag bound and automatic promotion without one were asked for.
    #[error("a maximum automatic-promotion lag and automatic promotion without a lag bound exclude each other")]
    LagBound,
}

/// The elector's timings. Defaults follow the group's (DESIGN "Defaults"): 15 s / 10 s / 2 s, a 2.5 s request
/// timeout and 2 s grace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Timings {
    /// How long a taker waits after observing a version unchanged (before grace).
    pub lease_duration: Duration,
    /// A holder holds a Lease while its last successful renewal *started* less than this long ago.
    pub renew_deadline: Duration,
    /// Renewals and reads are sent this often.
    pub retry_period: Duration,
    /// Every Lease request (and every fenced write made inside a term) gives up after this.
    pub request_timeout: Duration,
    /// Added to every takeover wait.
    pub grace: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            request_timeout: Duration::from_millis(2500),
            grace: Duration::from_secs(2),
        }
    }
}

impl Timings {
    /// Timings with these values (checked by [`Timings::validate`] and [`HaConfigBuilder::build`]).
    #[must_use]
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
        request_timeout: Duration,
        grace: Duration,
    ) -> Self {
        Timings {
            lease_duration,
            renew_deadline,
            retry_period,
            request_timeout,
            grace,
        }
    }

    /// Refuse `renew_deadline + request_timeout ≥ lease_duration` (HA.md "No cross-machine clocks"), a
    /// retry period not below the renew deadline, zero durations, and a lease duration the Lease cannot
    /// publish exactly (not whole seconds).
    pub fn validate(&self) -> Result<(), HaConfigError> {
        let err = |m: String| Err(HaConfigError::Timings(m));
        if self.renew_deadline.is_zero()
            || self.retry_period.is_zero()
            || self.request_timeout.is_zero()
        {
            return err("renew_deadline, retry_period and request_timeout must be positive".into());
        }
        if self.renew_deadline + self.request_timeout >= self.lease_duration {
            return err(format!(
                "renew_deadline ({:?}) + request_timeout ({:?}) must be below lease_duration ({:?})",
                self.renew_deadline, self.request_timeout, self.lease_duration
            ));
        }
        if self.retry_period >= self.renew_deadline {
            return err(format!(
                "retry_period ({:?}) must be below renew_deadline ({:?})",
                self.retry_period, self.renew_deadline
            ));
        }
        if self.lease_duration.subsec_nanos() != 0 {
            return err(format!(
                "lease_duration ({:?}) must be whole seconds (spec.leaseDurationSeconds)",
                self.lease_duration
            ));
        }
        Ok(())
    }
}

/// A validated HA configuration. Build it with [`HaConfig::builder`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HaConfig {
    /// The mode named at bootstrap.
    pub mode: HaMode,
    /// This cluster's stable id (empty in standalone mode).
    pub cluster_id: String,
    /// This cluster's rank (distinct per cluster).
    pub rank: u16,
    /// The HA name: the Leases are `<name>-ha`.
    pub name: String,
    /// The namespace of the HA Lease in each cluster.
    pub namespace: String,
    /// The witness Lease's namespace in the witness cluster (a namespace of its own: RBAC cannot narrow
    /// `create` by name).
    pub witness_namespace: String,
    /// Kubeconfig of this cluster (`None`: in-cluster or the default).
    pub local_kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the peer cluster.
    pub remote_kubeconfig: Option<PathBuf>,
    /// Kubeconfig of the witness cluster (`None`: no witness, promotion is a command).
    pub witness_kubeconfig: Option<PathBuf>,
    /// The elector's timings.
    pub timings: Timings,
    /// Witness mode: promote automatically only while the mirror's lag (the time since the latest probe
    /// its watermark has passed, for every kind: [`crate::HaControl::mirror_confirmed`]) is below
    /// this; with no confirmation yet, nothing is promoted automatically. With a witness, the builder
    /// always sets it ([`HaConfig::default_max_auto_promote_lag`] unless given), except when
    /// [`HaConfigBuilder::auto_promote_without_lag_bound`] was asked for: only then is it `None` (no
    /// gate). Without a witness it has no effect.
    pub max_auto_promote_lag: Option<Duration>,
    /// Kinds whose objects carry fence stamps: a start reads a sample of their stamps so that new epochs
    /// start above every surviving one ([`crate::floor`]). Empty: only the ConfigMaps are read.
    pub stamped_kinds: Vec<crate::checkpoint::Kind>,
    /// The kinds this side's mirror covers (`None`: no mirror runs here), published in this side's
    /// identity so the other side and `kshard ha check` compare them.
    pub mirrored_kinds: Option<Vec<crate::checkpoint::Kind>>,
}

impl HaConfig {
    /// A builder for the HA name `name` (the Leases are `<name>-ha`).
    pub fn builder(name: impl Into<String>) -> HaConfigBuilder {
        HaConfigBuilder {
            name: name.into(),
            ..HaConfigBuilder::default()
        }
    }

    /// The HA Lease name, `<name>-ha`.
    #[must_use]
    pub fn lease_name(&self) -> String {
        format!("{}-ha", self.name)
    }

    /// Whether a witness is configured.
    #[must_use]
    pub fn has_witness(&self) -> bool {
        self.witness_kubeconfig.is_some()
    }

    /// The lag bound of automatic promotion when none is given: `2 × (lease_duration + grace) + 20 s`
    /// (54 s with the default timings). Why: the lag at a candidacy is at least the takeover wait
    /// (`lease_duration + grace`: the mirror's probes of the dead Active fail from its death on) plus up
    /// to one probe period (10 s by default) of lag before the death; twice the wait and two probe
    /// periods leave a healthy mirror room, while a mirror that stopped confirming about a minute
    /// before the death (stalled, or not running at all) blocks the automatic promotion, and a human
    /// decides with `kshard ha promote --force`, which says what it loses.
    #[must_use]
    pub fn default_max_auto_promote_lag(timings: &Timings) -> Duration {
        (timings.lease_duration + timings.grace) * 2 + Duration::from_secs(20)
    }
}

/// Builds a [`HaConfig`]; [`HaConfigBuilder::build`] validates it.
#[derive(Clone, Debug, Default)]
#[must_use]
pub struct HaConfigBuilder {
    mode: HaMode,
    mode_word: Option<String>,
    cluster_id: String,
    rank: u64,
    name: String,
    namespace: Option<String>,
    witness_namespace: Option<String>,
    local: Option<PathBuf>,
    remote: Option<PathBuf>,
    witness: Option<PathBuf>,
    timings: Timings,
    env_namespace: Option<String>,
    max_auto_promote_lag: Option<Duration>,
    stamped_kinds: Vec<crate::checkpoint::Kind>,
    mirrored_kinds: Option<Vec<crate::checkpoint::Kind>>,
    unbounded_auto_promotion: bool,
}

impl HaConfigBuilder {
    /// The mode as the flag spells it (parsed, and refused if unknown, by `build`).
    pub fn mode_word(mut self, word: impl Into<String>) -> Self {
        self.mode_word = Some(word.into());
        self
    }

    /// The mode.
    pub fn mode(mut self, mode: HaMode) -> Self {
        self.mode = mode;
        self.mode_word = None;
        self
    }

    /// This cluster's id and rank.
    pub fn cluster(mut self, id: impl Into<String>, rank: u64) -> Self {
        self.cluster_id = id.into();
        self.rank = rank;
        self
    }

    /// The HA Lease's namespace (default: the pod's, from POD_NAMESPACE or the service account).
    pub fn namespace(mut self, ns: impl Into<String>) -> Self {
        self.namespace = Some(ns.into());
        self
    }

    /// The witness Lease's namespace (default: the HA namespace).
    pub fn witness_namespace(mut self, ns: impl Into<String>) -> Self {
        self.witness_namespace = Some(ns.into());
        self
    }

    /// The kubeconfigs of this, the peer and the witness cluster.
    pub fn kubeconfigs(
        mut self,
        local: Option<PathBuf>,
        remote: Option<PathBuf>,
        witness: Option<PathBuf>,
    ) -> Self {
        self.local = local;
        self.remote = remote;
        self.witness = witness;
        self
    }

    /// Witness mode: promote automatically only while the mirror's lag is below `lag`
    /// (`--max-auto-promote-lag`). `None` keeps the default bound
    /// ([`HaConfig::default_max_auto_promote_lag`]): it never turns the gate off.
    pub fn max_auto_promote_lag(mut self, lag: Option<Duration>) -> Self {
        self.max_auto_promote_lag = lag;
        self
    }

    /// The kinds whose objects carry fence stamps (the operator's fenced kinds, the mirrored kinds): a
    /// start reads a sample of their stamps, so a pair whose Leases were lost never takes an epoch below
    /// them ([`crate::floor`]).
    pub fn stamped_kinds(
        mut self,
        kinds: impl IntoIterator<Item = crate::checkpoint::Kind>,
    ) -> Self {
        self.stamped_kinds = kinds.into_iter().collect();
        self
    }

    /// The kinds this side's mirror covers: published in this side's identity, where the other side and
    /// `kshard ha check` compare them (a switchover carries only the kinds both mirrors cover).
    pub fn mirrored_kinds(
        mut self,
        kinds: impl IntoIterator<Item = crate::checkpoint::Kind>,
    ) -> Self {
        self.mirrored_kinds = Some(kinds.into_iter().collect());
        self
    }

    /// Witness mode without a lag bound: the witness promotes automatically whatever the mirror's lag,
    /// also with no mirror running (everything the old Active wrote since the mirror's position is
    /// lost, silently). Only for deployments without a mirror; refused together with a bound.
    pub fn auto_promote_without_lag_bound(mut self) -> Self {
        self.unbounded_auto_promotion = true;
        self
    }

    /// The timings.
    pub fn timings(mut self, t: Timings) -> Self {
        self.timings = t;
        self
    }

    /// Take the default namespace from the pod's environment: `POD_NAMESPACE` (downward API), else the
    /// service account's namespace file. Never a hard-coded namespace.
    pub fn namespace_from_pod(mut self) -> Self {
        self.env_namespace = std::env::var("POD_NAMESPACE")
            .ok()
            .or_else(|| {
                std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                    .ok()
            })
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        self
    }

    /// The same as [`HaConfigBuilder::namespace_from_pod`] with the pod's namespace given (tests).
    pub fn pod_namespace(mut self, ns: Option<String>) -> Self {
        self.env_namespace = ns;
        self
    }

    /// Validate. Standalone needs nothing else; active and standby need a cluster id, a rank, a namespace
    /// and the peer's kubeconfig.
    pub fn build(self) -> Result<HaConfig, HaConfigError> {
        let mode = match &self.mode_word {
            Some(w) => w.parse()?,
            None => self.mode,
        };
        if mode == HaMode::Standalone {
            return Ok(HaConfig {
                mode,
                cluster_id: String::new(),
                rank: 0,
                name: self.name,
                namespace: String::new(),
                witness_namespace: String::new(),
                local_kubeconfig: None,
                remote_kubeconfig: None,
                witness_kubeconfig: None,
                timings: self.timings,
                max_auto_promote_lag: None,
                stamped_kinds: Vec::new(),
                mirrored_kinds: None,
            });
        }
        check_cluster_id(&self.cluster_id)?;
        if self.rank >= RANKS {
            return Err(HaConfigError::Rank(self.rank));
        }
        if self.name.is_empty() {
            return Err(HaConfigError::Missing("the HA name", mode));
        }
        if self.remote.is_none() {
            return Err(HaConfigError::Missing(
                "the peer's kubeconfig (--ha-remote-kubeconfig)",
                mode,
            ));
        }
        self.timings.validate()?;
        let namespace = self
            .namespace
            .or(self.env_namespace)
            .filter(|s| !s.is_empty())
            .ok_or(HaConfigError::NoNamespace)?;
        Ok(HaConfig {
            mode,
            cluster_id: self.cluster_id,
            rank: u16::try_from(self.rank).map_err(|_| HaConfigError::Rank(self.rank))?,
            name: self.name,
            witness_namespace: self.witness_namespace.unwrap_or_else(|| namespace.clone()),
            namespace,
            local_kubeconfig: self.local,
            remote_kubeconfig: self.remote,
            max_auto_promote_lag: match (self.witness.is_some(), self.unbounded_auto_promotion) {
                (_, true) if self.max_auto_promote_lag.is_some() => {
                    return Err(HaConfigError::LagBound)
                }
                (_, true) => None,
                (true, false) => Some(
                    self.max_auto_promote_lag
                        .unwrap_or_else(|| HaConfig::default_max_auto_promote_lag(&self.timings)),
                ),
                (false, false) => self.max_auto_promote_lag,
            },
            witness_kubeconfig: self.witness,
            timings: self.timings,
            stamped_kinds: self.stamped_kinds,
            mirrored_kinds: self.mirrored_kinds,
        })
    }
}

fn check_cluster_id(id: &str) -> Result<(), HaConfigError> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(HaConfigError::ClusterId(id.to_string()))
    }
}

/// The Standby's checkpoint ConfigMap name.
#[must_use]
pub fn checkpoint_name(cfg: &HaConfig) -> String {
    format!("{}-ha-mirror", cfg.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn full() -> HaConfigBuilder {
        HaConfig::builder("op")
            .cluster("east", 1)
            .kubeconfigs(None, Some("/peer".into()), None)
            .pod_namespace(Some("ops".into()))
    }

    #[test]
    fn empty_mode_is_standalone_and_needs_nothing() {
        let c = HaConfig::builder("op").mode_word("").build().unwrap();
        assert_eq!(c.mode, HaMode::Standalone);
        assert_eq!("standalone".parse::<HaMode>().unwrap(), HaMode::Standalone);
    }

    #[test]
    fn unknown_mode_names_the_accepted_words() {
        let e = full().mode_word("primary").build().unwrap_err();
        assert_eq!(e, HaConfigError::UnknownMode("primary".into()));
        let msg = e.to_string();
        for w in ["standalone", "active", "standby"] {
            assert!(msg.contains(w), "{msg}");
        }
    }

    #[test]
    fn namespace_defaults_to_the_pods_and_is_never_invented() {
        let c = full().mode(HaMode::Active).build().unwrap();
        assert_eq!(
            (c.namespace.as_str(), c.witness_namespace.as_str()),
            ("ops", "ops")
        );
        assert_eq!(c.lease_name(), "op-ha");
        let c = full()
            .mode(HaMode::Active)
            .namespace("explicit")
            .build()
            .unwrap();
        assert_eq!(c.namespace, "explicit");
        let e = full()
            .mode(HaMode::Standby)
            .pod_namespace(None)
            .build()
            .unwrap_err();
        assert_eq!(e, HaConfigError::NoNamespace);
    }

    #[test]
    fn active_and_standby_need_an_id_a_rank_and_a_peer() {
        let e = full()
            .mode(HaMode::Active)
            .cluster("", 1)
            .build()
            .unwrap_err();
        assert!(matches!(e, HaConfigError::ClusterId(_)));
        let e = full()
            .mode(HaMode::Active)
            .cluster("East/1", 1)
            .build()
            .unwrap_err();
        assert!(matches!(e, HaConfigError::ClusterId(_)));
        let e = full()
            .mode(HaMode::Active)
            .cluster("east", 1000)
            .build()
            .unwrap_err();
        assert_eq!(e, HaConfigError::Rank(1000));
        let e = full()
            .mode(HaMode::Standby)
            .kubeconfigs(None, None, None)
            .build()
            .unwrap_err();
        assert!(matches!(e, HaConfigError::Missing(_, HaMode::Standby)));
    }

    #[test]
    fn with_a_witness_automatic_promotion_always_has_a_lag_bound_unless_turned_off_by_name() {
        let w = || {
            full().mode(HaMode::Standby).kubeconfigs(
                None,
                Some("/peer".into()),
                Some("/witness".into()),
            )
        };
        let c = w().build().unwrap();
        assert_eq!(c.max_auto_promote_lag, Some(Duration::from_secs(54)));
        let c = w().max_auto_promote_lag(None).build().unwrap();
        assert_eq!(
            c.max_auto_promote_lag,
            Some(Duration::from_secs(54)),
            "None is the default, not off"
        );
        let c = w()
            .max_auto_promote_lag(Some(Duration::from_secs(30)))
            .build()
            .unwrap();
        assert_eq!(c.max_auto_promote_lag, Some(Duration::from_secs(30)));
        let c = w().auto_promote_without_lag_bound().build().unwrap();
        assert_eq!(c.max_auto_promote_lag, None);
        let e = w()
            .auto_promote_without_lag_bound()
            .max_auto_promote_lag(Some(Duration::from_secs(30)))
            .build()
            .unwrap_err();
        assert_eq!(e, HaConfigError::LagBound);
    }

    #[test]
    fn renew_deadline_plus_request_timeout_must_stay_below_lease_duration() {
        let s = Duration::from_secs;
        let t = Timings::new(s(15), s(10), s(2), s(5), s(2));
        let e = full().mode(HaMode::Active).timings(t).build().unwrap_err();
        assert!(
            e.to_string().contains("must be below lease_duration"),
            "{e}"
        );
        let t = Timings::new(s(15), s(10), s(2), Duration::from_millis(4999), s(2));
        assert!(full().mode(HaMode::Active).timings(t).build().is_ok());
        let t = Timings::new(s(15), s(2), s(2), s(1), s(2));
        assert!(full().mode(HaMode::Active).timings(t).build().is_err());
        let t = Timings::new(Duration::from_millis(15_500), s(10), s(2), s(1), s(2));
        assert!(full().mode(HaMode::Active).timings(t).build().is_err());
    }

    proptest! {
        #[test]
        fn the_parser_accepts_exactly_the_mode_words(s in "\\PC{0,12}") {
            let r = s.parse::<HaMode>();
            let t = s.trim();
            match t {
                "" | "standalone" => prop_assert_eq!(r.unwrap(), HaMode::Standalone),
                "active" => prop_assert_eq!(r.unwrap(), HaMode::Active),
                "standby" => prop_assert_eq!(r.unwrap(), HaMode::Standby),
                _ => prop_assert_eq!(r.unwrap_err(), HaConfigError::UnknownMode(t.to_string())),
            }
        }

        #[test]
        fn mode_display_parses_back(m in prop_oneof![Just(HaMode::Standalone), Just(HaMode::Active), Just(HaMode::Standby)]) {
            prop_assert_eq!(m.to_string().parse::<HaMode>().unwrap(), m);
        }

        #[test]
        fn validated_timings_always_leave_the_taker_a_margin(ld in 1u64..60, rd in 1u64..60_000, to in 1u64..60_000, rp in 1u64..60_000) {
            let t = Timings::new(Duration::from_secs(ld), Duration::from_millis(rd), Duration::from_millis(rp), Duration::from_millis(to), Duration::ZERO);
            if t.validate().is_ok() {
                prop_assert!(t.renew_deadline + t.request_timeout < t.lease_duration);
                prop_assert!(t.retry_period < t.renew_deadline);
            }
        }
    }
}
