//! The HA demo (`kshard-dev demo ha`): cross-cluster Active/Standby (HA.md) end to end.
//!
//! Two embedded API servers (in-process, resourceVersion counters far apart) are clusters `a` and `b`,
//! each with the Widget CRD. Per cluster the HA participants run as tasks of this process: the elector
//! (`kube_shard_ha::spawn`, time-scaled timings: `setup::timings`) and a small operator that admits
//! through the `HaHandle` and writes Widget status under the admitted epoch. The Standby runs the mirror
//! (`kube_shard_ha::mirror`). A writer (`writer`) keeps creating, changing and deleting Widgets on
//! whichever cluster the HA Leases name Active, retrying writes the apiserver refuses. Then:
//!
//! 1. **lag**: `a` Active, `b` mirroring; the time from each acknowledged write to its copy on `b`
//!    (`lag`) gives p50/p99 at the writer's rate;
//! 2. **planned switchover** `a` → `b` (`demote`: the mark, the wait, the freeze, the token; `promote
//!    --token`: the mirror's catch-up, the takeover); the lost-write oracle on `b` (must be 0); `a`
//!    rejoins as Standby (the library's failback, `phases::rejoin`) and mirrors `b`;
//! 3. **unplanned failover**: `b`'s apiserver is partitioned (its elector cannot reach `a` either), the
//!    mirror is stopped and `a` is promoted with `promote --force --old-active-stopped`; the time from
//!    the failure to `a` admitting; the lost writes, compared with what was not yet mirrored;
//! 4. **heal**: `b` returns and must step down by itself without admitting;
//! 5. **failback**: `b` rejoins as Standby (its divergent objects counted and pruned), mirrors `a`, and
//!    a planned switchover `a` → `b` (lost must be 0).
//!
//! *Lost* (`oracle::lost`): a write acknowledged by either cluster that the new Active does not hold
//! at that version (the `spec.size` it stored) or a newer one. Throughout, every operator admission
//! interval and status write is recorded by (cluster, failover epoch) on one clock (`measure`): the
//! time two clusters admitted at once and the writes accepted under a lower epoch must both be 0.
//!
//! [`run`] returns the report ([`HaDemoReport`]); a violated invariant is in it, not an error.

mod cluster_objects;
mod lag;
mod measure;
pub mod oracle;
mod phases;
mod proxy;
mod setup;
mod view;
mod writer;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube_shard::rt::Clock;
use kube_shard_ha::HaMode;
use serde::Serialize;
use tokio::time::Instant;

use self::lag::Tracker;
use self::measure::Recorder;
use self::oracle::Lost;
use self::setup::{Backend, Cluster, RealCluster};
use self::writer::{Targets, Writer};
use crate::demo::DemoError;
use kube_shard_example_operator::widget::Widget;

/// What `kshard-dev demo ha` runs (its flags).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct HaDemoOptions {
    /// Widgets the writer works on (`w-0..N`).
    pub objects: usize,
    /// Writes a second (creates, spec changes, deletes).
    pub write_rate: u32,
    /// The shortest run: a 3 s lag window and short settle times (about 40 s in all).
    pub quick: bool,
    /// Draw the live view on stdout (a terminal); else progress lines on stderr.
    pub view: bool,
    /// The namespace of the Widgets and of the HA Leases and checkpoints. Default: `kshard-demo-ha` on
    /// the embedded servers, a fresh `kshard-demo-ha-<random>` on real clusters.
    pub namespace: Option<String>,
    /// Before the failure, hold the mirror's watch on the Active this many seconds (testserver's
    /// frozen watches), so that the unplanned failover loses what was written meanwhile and the old
    /// Active comes back with divergent objects. 0: the mirror runs freely.
    pub stall_mirror: f64,
    /// Two real clusters instead of the embedded servers: `a` (Active first) and the Standby `b`.
    pub real: Option<(PathBuf, PathBuf)>,
    /// A planted bug for the tests: after the planned switchover, drop one mirrored write on the new
    /// Active (delete one Widget it should hold), so the lost-write oracle must report it. The run ends
    /// after that phase's check (the later phases are reported "not measured").
    pub plant_lost_write: bool,
}

impl Default for HaDemoOptions {
    /// The CLI's defaults.
    fn default() -> Self {
        HaDemoOptions {
            objects: 200,
            write_rate: 40,
            quick: false,
            view: false,
            namespace: None,
            stall_mirror: 0.0,
            real: None,
            plant_lost_write: false,
        }
    }
}

impl HaDemoOptions {
    /// Refuse contradicting or out-of-range options.
    pub fn validate(&self) -> Result<(), DemoError> {
        let bad = |m: &str| Err(DemoError::Options(format!("kshard-dev demo ha: {m}")));
        if self.real.is_some() && self.stall_mirror != 0.0 {
            return bad("--stall-mirror needs the embedded servers (it holds the mirror's watch with testserver's frozen watches; the real-cluster proxy can only cut connections)");
        }
        if let Some(ns) = &self.namespace {
            if ns.is_empty() || ns.len() > 63 {
                return bad("--namespace must be a DNS label");
            }
        }
        if !(self.stall_mirror.is_finite() && (0.0..=600.0).contains(&self.stall_mirror)) {
            return bad("--stall-mirror must be between 0 and 600 seconds");
        }
        if self.objects == 0 || self.write_rate == 0 {
            return bad("--objects and --write-rate must be positive");
        }
        Ok(())
    }
}

/// A lost write, by phase, with the cluster that acknowledged it and the object's uid there.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct LostIn {
    pub phase: &'static str,
    #[serde(flatten)]
    pub lost: Lost,
    pub acked_by: &'static str,
    pub uid: String,
}

/// The HA demo's result (`kshard-dev demo ha --json` prints it).
#[derive(Clone, Debug, Default, Serialize)]
#[non_exhaustive]
pub struct HaDemoReport {
    /// `embedded` (two in-process API servers) or `real` (two clusters by kubeconfig).
    pub mode: String,
    /// Where the Widgets and the HA Leases were.
    pub namespace: String,
    pub objects: usize,
    pub write_rate: u32,
    pub lease_duration_seconds: f64,
    pub renew_deadline_seconds: f64,
    /// Mirror lag at the writer's rate: acknowledged write → its copy on the Standby.
    pub lag_p50_ms: Option<f64>,
    pub lag_p99_ms: Option<f64>,
    pub lag_samples: u64,
    /// Lost writes per phase (planned and failback must be 0).
    pub lost_planned: Option<u64>,
    pub lost_unplanned: Option<u64>,
    pub lost_failback: Option<u64>,
    /// At the failure: writes the Active had acknowledged that were not yet on the Standby, and the age
    /// of the oldest (the lag at failure). The unplanned loss must not exceed the count.
    pub unmirrored_at_failure: Option<u64>,
    pub oldest_unmirrored_at_failure_ms: Option<f64>,
    /// From the Active's failure (the partition) to the Standby admitting.
    pub failover_seconds: Option<f64>,
    /// From `demote` to the new Active admitting.
    pub planned_switchover_seconds: Option<f64>,
    pub failback_switchover_seconds: Option<f64>,
    /// The old Active's objects the new Active did not hold (by name and recorded source uid) when it
    /// rejoined as Standby after the failover (pruned before the failback).
    pub divergent_objects_at_failback: Option<u64>,
    pub divergent_objects_after_planned: Option<u64>,
    /// Objects only a rejoining Standby held because the Active deleted them after taking over (pruned
    /// too; not divergent).
    pub deleted_by_new_active_at_rejoin: u64,
    /// Operator admission intervals of the old Active after the heal (must be 0).
    pub old_active_admissions_after_heal: Option<u64>,
    pub writes_acknowledged: u64,
    pub writes_refused_and_retried: u64,
    pub writes_unknown_outcome: u64,
    pub operator_status_writes: u64,
    pub writes_accepted_with_lower_epoch: u64,
    /// Time both clusters had an admission open at once (the cross-cluster overlap measure).
    pub two_actives_seconds: f64,
    pub epochs: Vec<String>,
    pub lost: Vec<LostIn>,
    /// What each cluster holds for itself (`kube-root-ca.crt`, the `default` ServiceAccount, another
    /// tool's ConfigMap) kept its own content through every phase, and the operator's labelled ConfigMaps
    /// (mirrored under the label scope) are the same on both sides at the end.
    pub cluster_objects_kept: Option<bool>,
    /// After the planned switchover the frozen old Active accepted writes outside the mirror's scope
    /// (its controllers', another tool's) and refused one inside it.
    pub freeze_kept_to_the_mirrors_scope: Option<bool>,
    pub duration_seconds: f64,
    pub invariants_held: bool,
    pub failures: Vec<String>,
}

/// Run the HA demo to its verdict: `Ok` with the report whether or not the invariants held (see
/// [`HaDemoReport::invariants_held`]); `Err` only for bad options.
pub async fn run(opts: &HaDemoOptions) -> Result<HaDemoReport, DemoError> {
    opts.validate()?;
    Ok(demo(opts).await)
}

/// What the live view shows, shared with its task.
#[derive(Default)]
struct Shown {
    phase: String,
    partitioned: [bool; 2],
    lost: [Option<u64>; 3],
    lag_p50_ms: Option<f64>,
}

struct Demo<'a> {
    args: &'a HaDemoOptions,
    ns: String,
    started: Instant,
    clock: Clock,
    rec: Recorder,
    a: Cluster,
    b: Cluster,
    writer: Writer,
    shown: Arc<Mutex<Shown>>,
    tty: bool,
    /// Lost writes already counted in an earlier phase.
    counted: BTreeSet<(String, u64)>,
}

fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

async fn demo(args: &HaDemoOptions) -> HaDemoReport {
    let started = Instant::now();
    let real = args.real.clone();
    let ns = match (&args.namespace, &real) {
        (Some(ns), _) => ns.clone(),
        (None, None) => "kshard-demo-ha".into(),
        (None, Some(_)) => setup::fresh_namespace(),
    };
    let mut report = HaDemoReport {
        mode: if real.is_some() { "real" } else { "embedded" }.into(),
        namespace: ns.clone(),
        objects: args.objects,
        write_rate: args.write_rate,
        lease_duration_seconds: setup::timings().lease_duration.as_secs_f64(),
        renew_deadline_seconds: setup::timings().renew_deadline.as_secs_f64(),
        ..HaDemoReport::default()
    };
    let mut d = match Demo::new(args, ns, real, started).await {
        Ok(d) => d,
        Err(e) => {
            report.failures.push(e.to_string());
            report.duration_seconds = secs(started.elapsed());
            return report;
        }
    };
    let view = d.spawn_view();
    let res = d.scenario(&mut report).await;
    d.writer.stop();
    view.abort();
    if d.tty {
        d.draw_once();
    }
    if let Err(e) = res {
        report.failures.push(e.to_string());
    }
    d.finish(&mut report);
    d.a.stop();
    d.b.stop();
    if let (Some(ra), Some(rb)) = (d.a.real(), d.b.real()) {
        // heal whatever a failed phase left cut, then undo the run on both clusters
        ra.cut(false, rb);
        rb.cut(false, ra);
        for c in [&d.a, &d.b] {
            let cfg = setup::ha_config(c.id, c.rank, kube_shard_ha::HaMode::Standby, &d.ns);
            let problems = match cfg {
                Ok(cfg) => setup::cleanup_real(&c.backend, &d.ns, &cfg).await,
                Err(e) => vec![e.to_string()],
            };
            for p in problems {
                eprintln!("kshard-dev demo ha: cleaning up cluster {}: {p}", c.id);
            }
        }
        ra.stop();
        rb.stop();
    }
    report
}

impl<'a> Demo<'a> {
    async fn new(
        args: &'a HaDemoOptions,
        ns: String,
        real: Option<(PathBuf, PathBuf)>,
        started: Instant,
    ) -> Result<Self, DemoError> {
        let clock = setup::clock();
        let rec = Recorder::new(started);
        let (sa, sb) = match &real {
            None => (
                Backend::Embedded(setup::server(1, &ns).await?),
                Backend::Embedded(setup::server(50_000_000, &ns).await?),
            ),
            Some((pa, pb)) => {
                let ra = RealCluster::connect(pa, "b").await?;
                let rb = RealCluster::connect(pb, "a").await?;
                let (sa, sb) = (Backend::Real(ra), Backend::Real(rb));
                let probe = setup::ha_config("a", 1, HaMode::Standby, &ns)?;
                setup::prepare_real(&sa, &sb, &ns, &probe).await?;
                (sa, sb)
            }
        };
        let ns = &ns;
        let mut a = setup::start(
            ("a", 1, HaMode::Active),
            sa.clone(),
            &sb,
            ns,
            clock.clone(),
            &rec,
        )?;
        let mut b = setup::start(("b", 2, HaMode::Standby), sb, &sa, ns, clock.clone(), &rec)?;
        if real.is_some() {
            // no garbage collector on a bare apiserver: the demo finishes the mirror's orphan deletes
            for c in [&mut a, &mut b] {
                let t = setup::gc_stand_in(&c.backend, ns);
                c.add_task(t);
            }
        }
        Ok(Demo {
            args,
            ns: ns.clone(),
            started,
            clock,
            rec,
            a,
            b,
            writer: Writer::new(),
            shown: Arc::default(),
            tty: args.view,
            counted: BTreeSet::new(),
        })
    }

    fn ns(&self) -> &str {
        &self.ns
    }

    fn shown(&self) -> std::sync::MutexGuard<'_, Shown> {
        self.shown.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_phase(&self, phase: &str) {
        let t = self.started.elapsed().as_secs_f64();
        self.shown().phase = phase.to_owned();
        if !self.tty {
            eprintln!("kshard-dev demo ha: [{t:6.1}s] {phase}");
        }
    }

    fn frame(&self) -> String {
        let s = self.shown();
        view::render(&view::Frame {
            phase: &s.phase,
            elapsed: self.started.elapsed().as_secs_f64(),
            clusters: [
                ("a", &self.a.handle, s.partitioned[0]),
                ("b", &self.b.handle, s.partitioned[1]),
            ],
            acked: self.writer.acked(),
            refused: self
                .writer
                .refused
                .load(std::sync::atomic::Ordering::Relaxed),
            lag_p50_ms: s.lag_p50_ms,
            lost: s.lost,
        })
    }

    fn draw_once(&self) {
        print!("{}", self.frame());
    }

    /// On a terminal, redraw the view in place every 250 ms.
    fn spawn_view(&self) -> tokio::task::JoinHandle<()> {
        if !self.tty {
            return tokio::spawn(async {});
        }
        let (a, b, w, shown, started) = (
            self.a.handle.clone(),
            self.b.handle.clone(),
            self.writer.clone(),
            self.shown.clone(),
            self.started,
        );
        tokio::spawn(async move {
            let mut first = true;
            loop {
                let text = {
                    let s = shown.lock().unwrap_or_else(|e| e.into_inner());
                    view::render(&view::Frame {
                        phase: &s.phase,
                        elapsed: started.elapsed().as_secs_f64(),
                        clusters: [("a", &a, s.partitioned[0]), ("b", &b, s.partitioned[1])],
                        acked: w.acked(),
                        refused: w.refused.load(std::sync::atomic::Ordering::Relaxed),
                        lag_p50_ms: s.lag_p50_ms,
                        lost: s.lost,
                    })
                };
                if !first {
                    print!("\x1b[{}A", view::LINES);
                }
                first = false;
                print!("{text}");
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
    }

    fn targets(&self) -> Targets {
        Targets {
            clusters: vec![
                ("a", self.a.client("writer")),
                ("b", self.b.client("writer")),
            ],
            ns: self.ns().to_owned(),
            lease: format!("{}-ha", setup::HA_NAME),
        }
    }

    fn standby_api(&self, c: &Cluster) -> Api<Widget> {
        Api::namespaced(c.client("demo-lag"), self.ns())
    }

    fn pace(&self, long: u64, quick: u64) -> Duration {
        Duration::from_secs(if self.args.quick { quick } else { long })
    }

    async fn wait_active(
        &self,
        c: &Cluster,
        above: u64,
        within: Duration,
    ) -> Result<Duration, DemoError> {
        let t0 = Instant::now();
        loop {
            if let Some(t) = self.rec.first_admission_above(c.id, above) {
                return Ok(t);
            }
            if t0.elapsed() > within {
                return Err(DemoError::failed(format!(
                    "cluster {} did not admit above epoch {above} within {within:?}",
                    c.id
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The lost-write oracle against `active` with the writer paused: the writes lost that no earlier
    /// phase counted.
    async fn lost(
        &mut self,
        phase: &'static str,
        on: &str,
        plant: bool,
    ) -> Result<Vec<Lost>, DemoError> {
        self.writer.pause().await;
        let active = if on == "a" { &self.a } else { &self.b };
        let res = self.lost_paused(active, plant).await;
        self.writer.resume();
        let fresh: Vec<Lost> = res?
            .into_iter()
            .filter(|l| !self.counted.contains(&(l.name.clone(), l.seq)))
            .collect();
        for l in &fresh {
            self.counted.insert((l.name.clone(), l.seq));
        }
        tracing::info!(phase, lost = fresh.len(), "demo ha: lost-write oracle");
        Ok(fresh)
    }

    async fn lost_paused(&self, active: &Cluster, plant: bool) -> Result<Vec<Lost>, DemoError> {
        let mut held = phases::held(active, self.ns()).await?;
        let (acked, maybe) = {
            let log = self.writer.log();
            let acked: Vec<_> = log.acked.iter().map(|a| a.write.clone()).collect();
            (acked, log.maybe.clone())
        };
        if plant {
            // PLANTED BUG: one mirrored write is dropped on the new Active
            let victim = oracle::lost(&acked, &maybe, &held).is_empty().then(|| {
                held.keys()
                    .find(|n| {
                        acked
                            .iter()
                            .rev()
                            .find(|w| &w.name == *n)
                            .is_some_and(|w| w.op == oracle::Op::Put)
                    })
                    .cloned()
            });
            if let Some(Some(name)) = victim {
                let api: Api<Widget> = Api::namespaced(active.client("demo-planted"), self.ns());
                api.delete(&name, &kube::api::DeleteParams::default())
                    .await
                    .map_err(|e| DemoError::failed(format!("planting a lost write: {e}")))?;
                held.remove(&name);
            }
        }
        Ok(oracle::lost(&acked, &maybe, &held))
    }

    /// Cluster `standby` rejoins under the other one, with the writer paused (so the writer's log says
    /// which of the Standby-only objects the Active deleted since).
    async fn rejoin(&self, standby: &str) -> Result<phases::Rejoined, DemoError> {
        let (s, a) = if standby == "a" {
            (&self.a, &self.b)
        } else {
            (&self.b, &self.a)
        };
        self.writer.pause().await;
        let deleted: BTreeSet<String> = {
            let log = self.writer.log();
            let mut latest: std::collections::BTreeMap<&str, &writer::Ack> = Default::default();
            for ack in &log.acked {
                latest.insert(&ack.write.name, ack);
            }
            latest
                .into_iter()
                .filter(|(_, ack)| ack.write.op == oracle::Op::Delete && ack.cluster == a.id)
                .map(|(n, _)| n.to_owned())
                .collect()
        };
        let res = phases::rejoin(s, a, self.ns(), &deleted).await;
        self.writer.resume();
        res
    }

    fn record_lost(
        &self,
        report: &mut HaDemoReport,
        phase: &'static str,
        idx: usize,
        lost: Vec<Lost>,
    ) -> u64 {
        let n = lost.len() as u64;
        self.shown().lost[idx] = Some(n);
        let log = self.writer.log();
        report.lost.extend(lost.into_iter().take(50).map(|lost| {
            let ack = log
                .acked
                .iter()
                .find(|a| a.write.name == lost.name && a.write.seq == lost.seq);
            LostIn {
                phase,
                acked_by: ack.map_or("?", |a| a.cluster),
                uid: ack.map(|a| a.uid.clone()).unwrap_or_default(),
                lost,
            }
        }));
        n
    }

    async fn scenario(&mut self, report: &mut HaDemoReport) -> Result<(), DemoError> {
        let ns = self.ns().to_owned();
        let clock = self.clock.clone();
        self.set_phase("starting clusters a (Active) and b (Standby)");
        self.wait_active(&self.a, 0, Duration::from_secs(30))
            .await?;
        let epoch_a = self.a.handle.active_epoch().map_or(0, |e| e.wire());
        report.epochs.push(format!("a/{epoch_a}"));
        let targets = self.targets();
        self.writer
            .seed(&targets, self.args.objects)
            .await
            .map_err(DemoError::failed)?;
        let mut kept = cluster_objects::Kept::new();
        cluster_objects::make(&self.a, &ns, true, &mut kept).await?;
        cluster_objects::make(&self.b, &ns, false, &mut kept).await?;
        self.set_phase("b mirrors a: the mirror's first LIST");
        let mirror = phases::start_mirror(&self.b, &self.a, &ns, clock.clone()).await?;
        let tracker = Tracker::start(&self.writer, "a", self.standby_api(&self.b));
        let _writer_task = self
            .writer
            .spawn(targets, self.args.objects, self.args.write_rate);

        // 1. lag
        self.set_phase("measuring mirror lag under the writer");
        let window = self.pace(10, 3);
        let t0 = Instant::now();
        while t0.elapsed() < window {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let p50 = oracle::quantile(&tracker.samples(), 0.5).map(ms);
            self.shown().lag_p50_ms = p50;
        }
        let samples = tracker.samples();
        report.lag_samples = samples.len() as u64;
        report.lag_p50_ms = oracle::quantile(&samples, 0.5).map(ms);
        report.lag_p99_ms = oracle::quantile(&samples, 0.99).map(ms);

        // 2. planned switchover a → b
        self.set_phase("planned switchover a → b (demote, freeze, token; promote --token)");
        let t0 = self.rec.now();
        let epoch_b = phases::switchover(&self.a, &self.b, &ns, clock.clone()).await?;
        phases::stop_mirror(mirror).await;
        tracker.stop();
        let admitted = self
            .wait_active(&self.b, epoch_a, Duration::from_secs(30))
            .await?;
        report.planned_switchover_seconds = Some(secs(admitted.saturating_sub(t0)));
        report.epochs.push(format!("b/{}", epoch_b.wire()));
        let lost = self
            .lost("planned", "b", self.args.plant_lost_write)
            .await?;
        report.lost_planned = Some(self.record_lost(report, "planned", 0, lost));
        if self.args.plant_lost_write {
            // the plant is for the planned switchover's oracle: the later phases would only take time
            self.set_phase("done: the planted loss is counted; the later phases are not run");
            return Ok(());
        }
        let refused = cluster_objects::freeze_scope(&self.a, &ns).await;
        report.freeze_kept_to_the_mirrors_scope = Some(refused.is_empty());
        report.failures.extend(refused);
        self.set_phase("a rejoins as Standby and mirrors b");
        let r = self.rejoin("a").await?;
        report.divergent_objects_after_planned = Some(r.divergent.len() as u64);
        report.deleted_by_new_active_at_rejoin += r.deleted_by_active;
        let mirror = phases::start_mirror(&self.a, &self.b, &ns, clock.clone()).await?;
        let tracker = Tracker::start(&self.writer, "b", self.standby_api(&self.a));
        tokio::time::sleep(self.pace(4, 2)).await;

        // 3. unplanned failover: b's apiserver partitioned, a promoted by force
        let stall = Duration::try_from_secs_f64(self.args.stall_mirror).unwrap_or_default();
        if !stall.is_zero() {
            self.set_phase(&format!("the mirror's watch on b is held for {stall:?}"));
            phases::hold_mirror(&self.b, &self.a, true);
            tokio::time::sleep(stall).await;
        }
        self.set_phase("unplanned failover: b's apiserver partitioned; promote --force on a");
        phases::partition(&self.b, &self.a, true);
        let failed_at = self.rec.now();
        self.shown().partitioned[1] = true;
        // the mirror's stop runs beside the promotion: on real clusters its request in flight to the
        // partitioned cluster hangs on a stalled connection (up to stop_mirror's 10 s bound), which is
        // the demo's sequencing, not part of the failover
        let stopping = tokio::spawn(phases::stop_mirror(mirror));
        let (unmirrored, oldest) = tracker.unmirrored(&self.writer, "b");
        tracker.stop();
        report.unmirrored_at_failure = Some(unmirrored);
        report.oldest_unmirrored_at_failure_ms = Some(ms(oldest));
        let promoted = phases::force_promote(&self.a, &self.b, &ns, clock.clone()).await;
        let _ = stopping.await;
        let epoch_a2 = promoted?;
        let admitted = self
            .wait_active(&self.a, epoch_b.wire(), Duration::from_secs(30))
            .await?;
        report.failover_seconds = Some(secs(admitted.saturating_sub(failed_at)));
        report.epochs.push(format!("a/{}", epoch_a2.wire()));
        tokio::time::sleep(self.pace(3, 1)).await;
        let lost = self.lost("unplanned", "a", false).await?;
        report.lost_unplanned = Some(self.record_lost(report, "unplanned", 1, lost));

        // 4. heal: b must step down by itself
        self.set_phase("heal: b returns and must step down without admitting");
        phases::partition(&self.b, &self.a, false);
        phases::hold_mirror(&self.b, &self.a, false);
        let healed = self.rec.now();
        self.shown().partitioned[1] = false;
        let t0 = Instant::now();
        loop {
            let st = self.b.control.status().await.ok();
            if st.is_some_and(|s| s.role == "standby" && s.epoch >= epoch_a2.wire()) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                return Err(DemoError::failed(
                    "b did not step down within 30 s of the heal",
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(self.pace(3, 2)).await;
        report.old_active_admissions_after_heal = Some(self.rec.admissions_since("b", healed));

        // 5. failback: b rejoins (divergent objects), mirrors a, planned switchover a → b
        self.set_phase("failback: b rejoins as Standby (pairing, divergent objects) and mirrors a");
        let r = self.rejoin("b").await?;
        report.divergent_objects_at_failback = Some(r.divergent.len() as u64);
        report.deleted_by_new_active_at_rejoin += r.deleted_by_active;
        let mirror = phases::start_mirror(&self.b, &self.a, &ns, clock.clone()).await?;
        tokio::time::sleep(self.pace(4, 2)).await;
        self.set_phase("failback: planned switchover a → b");
        let t0 = self.rec.now();
        let epoch_b2 = phases::switchover(&self.a, &self.b, &ns, clock.clone()).await?;
        phases::stop_mirror(mirror).await;
        let admitted = self
            .wait_active(&self.b, epoch_a2.wire(), Duration::from_secs(30))
            .await?;
        report.failback_switchover_seconds = Some(secs(admitted.saturating_sub(t0)));
        report.epochs.push(format!("b/{}", epoch_b2.wire()));
        tokio::time::sleep(self.pace(2, 1)).await;
        let lost = self.lost("failback", "b", false).await?;
        report.lost_failback = Some(self.record_lost(report, "failback", 2, lost));
        let touched = cluster_objects::check(&self.a, &self.b, &ns, &kept).await;
        report.cluster_objects_kept = Some(touched.is_empty());
        report.failures.extend(touched);
        self.set_phase("done");
        Ok(())
    }

    fn finish(&self, report: &mut HaDemoReport) {
        let intervals = self.rec.intervals();
        let writes = self.rec.writes();
        report.operator_status_writes = writes.len() as u64;
        report.writes_accepted_with_lower_epoch = oracle::lower_epoch_writes(&intervals, &writes);
        report.two_actives_seconds = secs(oracle::overlap(&intervals));
        {
            let log = self.writer.log();
            report.writes_acknowledged = log.acked.len() as u64;
            report.writes_unknown_outcome = log.maybe.len() as u64;
        }
        report.writes_refused_and_retried = self
            .writer
            .refused
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut f = Vec::new();
        for (what, v) in [
            ("lost writes in the planned switchover", report.lost_planned),
            ("lost writes in the failback", report.lost_failback),
            (
                "old Active admissions after the heal",
                report.old_active_admissions_after_heal,
            ),
            (
                "divergent objects after the planned switchover",
                report.divergent_objects_after_planned,
            ),
        ] {
            match v {
                Some(0) => {}
                Some(n) => f.push(format!("{what}: {n}")),
                None => f.push(format!("{what}: not measured")),
            }
        }
        if report.writes_accepted_with_lower_epoch != 0 {
            f.push(format!(
                "writes accepted with a lower epoch: {}",
                report.writes_accepted_with_lower_epoch
            ));
        }
        if report.two_actives_seconds > 0.0 {
            f.push(format!("two Actives for {} s", report.two_actives_seconds));
        }
        if let (Some(l), Some(u)) = (report.lost_unplanned, report.unmirrored_at_failure) {
            if l > u {
                f.push(format!(
                    "the failover lost {l} writes, more than the {u} not yet mirrored at the failure"
                ));
            }
        }
        if report.lag_samples == 0 {
            f.push("no mirror lag sample".into());
        }
        report.failures.extend(f);
        report.invariants_held = report.failures.is_empty();
        report.duration_seconds = secs(self.started.elapsed());
    }
}
