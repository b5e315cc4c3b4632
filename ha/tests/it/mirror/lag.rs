//! `--max-auto-promote-lag` (HA.md contract 3): with a witness, automatic promotion happens only while
//! the mirror's lag — the time since the latest probe its watermark passed, reported through
//! `HaControl::mirror_confirmed` — is below the bound. Three testservers, paused time; the Active's
//! elector is stopped (killed) and the Standby's "mirror" confirms every second until then, or stopped
//! confirming long before.

use std::time::Duration;

use kube_shard_ha::{HaClients, HaConfig, HaHandle, HaMetrics, HaMode};
use kube_shard_testserver::TestServer;
use tokio::time::Instant;

use crate::harness::CP_NS;

fn cfg(id: &str, rank: u64, mode: HaMode, lag: Option<Duration>) -> HaConfig {
    HaConfig::builder("widgets")
        .mode(mode)
        .cluster(id, rank)
        .namespace(CP_NS)
        .kubeconfigs(None, Some("/peer".into()), Some("/witness".into()))
        .max_auto_promote_lag(lag)
        .build()
        .unwrap()
}

fn start(
    id: &str,
    rank: u64,
    mode: HaMode,
    lag: Option<Duration>,
    own: &TestServer,
    peer: &TestServer,
    w: &TestServer,
) -> (
    HaHandle,
    kube_shard_ha::HaControl,
    tokio::task::JoinHandle<()>,
) {
    let who = format!("{id}-op");
    let clients = HaClients::new(own.client(&who), peer.client(&who), Some(w.client(&who)));
    let (h, c, t) = kube_shard_ha::spawn(
        &cfg(id, rank, mode, lag),
        clients,
        kube_shard::rt::Clock::system(),
        HaMetrics::default(),
    );
    (h, c, t.unwrap())
}

/// The Active dies at `died`; the mirror confirmed every second until `last_confirm` (relative to the
/// death, negative = before). Returns when B first acts after the death, if within 120 s.
async fn run(max_lag: Option<Duration>, mirror_stops_before_death: Duration) -> Option<Duration> {
    let (sa, _) = crate::harness::group_server().await;
    let (sb, _) = crate::harness::group_server().await;
    let (sw, _) = crate::harness::group_server().await;
    let (ha_a, _ca, ta) = start("a", 1, HaMode::Active, None, &sa, &sb, &sw);
    let (ha_b, cb, tb) = start("b", 2, HaMode::Standby, max_lag, &sb, &sa, &sw);
    let start = Instant::now();
    while !ha_a.is_active() {
        assert!(start.elapsed() < Duration::from_secs(60), "A never active");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the mirror confirms for 30 s at least, then stops `mirror_stops_before_death` before the death
    let died = Instant::now() + Duration::from_secs(30) + mirror_stops_before_death;
    let confirm_until = died - mirror_stops_before_death;
    let clock = ha_b.clock();
    let mirror = tokio::spawn(async move {
        while Instant::now() < confirm_until {
            let _ = cb.mirror_confirmed(clock.elapsed()).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    tokio::time::sleep_until(died).await;
    ta.abort();
    assert!(!ha_b.is_active());
    let mut acted = None;
    while died.elapsed() < Duration::from_secs(120) {
        if ha_b.is_active() {
            acted = Some(died.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    mirror.abort();
    tb.abort();
    acted
}

#[tokio::test(start_paused = true)]
async fn ha_lag_a_mirror_within_the_bound_lets_the_witness_promote() {
    // the mirror confirms until A dies: at the candidacy (the 17 s wait) the lag is about 17 s < 30 s
    let t = run(Some(Duration::from_secs(30)), Duration::ZERO).await;
    eprintln!("[ha-lag] bound 30 s, mirror current: B active {t:?} after A died");
    assert!(t.is_some_and(|t| t < Duration::from_secs(30)), "{t:?}");
}

#[tokio::test(start_paused = true)]
async fn ha_lag_a_lagging_mirror_blocks_automatic_promotion() {
    // the mirror stopped confirming 20 s before A died: lag ≥ 20 s + the wait > 30 s, never below the bound
    let t = run(Some(Duration::from_secs(30)), Duration::from_secs(20)).await;
    assert_eq!(t, None, "promoted with a mirror lagging past the bound");
}

/// With a witness and no bound given, automatic promotion still has one (the default): a Standby whose
/// mirror stopped confirming two minutes before the Active died is not promoted automatically.
#[tokio::test(start_paused = true)]
async fn ha_lag_without_a_bound_given_a_stopped_mirror_still_blocks_automatic_promotion() {
    let t = run(None, Duration::from_secs(120)).await;
    assert_eq!(
        t, None,
        "promoted with a mirror stopped long before the death"
    );
}

/// The default bound lets a current mirror's Standby promote automatically.
#[tokio::test(start_paused = true)]
async fn ha_lag_the_default_bound_lets_a_current_mirror_promote() {
    let t = run(None, Duration::ZERO).await;
    assert!(t.is_some_and(|t| t < Duration::from_secs(40)), "{t:?}");
}
