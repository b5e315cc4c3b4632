//! A reconcile admitted once and writing for longer than the term it was admitted in: without a
//! group there is no shard fence, so only the HA permit's send-time check ends its writes with the term.
//! Two testservers, paused time, the overlap checker of `ha_elector.rs` (last completion under each
//! (cluster, epoch)).

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;
use kube_shard_ha::overlap::{HaOverlap, Violation};
use kube_shard_ha::{HaHandle, HaMode};
use kube_shard_testserver::{Scope, TestServer};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::elector::{no_overlap, server, start, until, NS};

/// How long the reconcile keeps writing after its admission.
const RECONCILE: Duration = Duration::from_secs(25);
/// Each write is in flight this long.
const WRITE: Duration = Duration::from_millis(300);

/// What the long reconcile did.
#[derive(Debug, Default)]
struct Outcome {
    writes: u32,
    /// When (after its start) the reconcile found its term ended.
    ended: Option<Duration>,
}

async fn app_api(sa: &TestServer) -> Api<ConfigMap> {
    let api = Api::namespaced(sa.client("a-app"), NS);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("work".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &cm).await.unwrap();
    sa.faults().latency(Scope::identity("a-app"), Some(WRITE));
    api
}

async fn write(api: &Api<ConfigMap>, n: u32) -> kube::Result<ConfigMap> {
    let patch = serde_json::json!({"data": {"n": n.to_string()}});
    api.patch("work", &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// The pattern the docs showed: admit once at the top of the reconcile, then write until done.
fn admit_once(ha: HaHandle, api: Api<ConfigMap>, o: HaOverlap) -> JoinHandle<Outcome> {
    tokio::spawn(async move {
        let epoch = ha.admit().expect("admitted");
        let t0 = Instant::now();
        let mut out = Outcome::default();
        while t0.elapsed() < RECONCILE {
            let w = o.admit("a", epoch.wire());
            if write(&api, out.writes).await.is_ok() {
                out.writes += 1;
            }
            drop(w);
        }
        out
    })
}

/// A and B; a long reconcile on A starts; A is cut from both apiservers (its renewals and its reads of
/// the peer fail; the reconcile's own client still reaches A's apiserver); B is force-promoted once
/// armed. Returns the checker and the reconcile's outcome.
async fn a_long_reconcile_across_a_forced_promotion(
    reconcile: impl FnOnce(HaHandle, Api<ConfigMap>, HaOverlap) -> JoinHandle<Outcome>,
) -> (HaOverlap, Outcome) {
    let (sa, sb) = (server().await, server().await);
    let o = HaOverlap::default();
    let a = start("a", 1, HaMode::Active, &sa, &sb, None, &o);
    let b = start("b", 2, HaMode::Standby, &sb, &sa, None, &o);
    until(Duration::from_secs(30), "A active", || a.handle.is_active()).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let long = reconcile(a.handle.clone(), app_api(&sa).await, o.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    sa.faults().partition(Scope::identity("a-op"), true);
    sb.faults().partition(Scope::identity("a-op"), true);
    let mut promoted = false;
    for _ in 0..40 {
        if b.control.force_promote().await.is_ok() {
            promoted = true;
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(promoted, "B armed within 40 s");
    until(Duration::from_secs(30), "B admitting", || {
        o.intervals().contains_key(&("b".to_string(), 2002))
    })
    .await;
    let out = long.await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let iv = o.intervals();
    let (a_end, b_start) = (iv[&("a".into(), 1001)].end, iv[&("b".into(), 2002)].start);
    eprintln!(
        "[ha] long reconcile: {out:?}; A's last completion − B's first admission: {:+.2} s",
        a_end.duration_since(b_start).as_secs_f64() - b_start.duration_since(a_end).as_secs_f64()
    );
    a.stop();
    b.stop();
    (o, out)
}

/// The documented pattern: a permit taken once, each write sent through it (checked, then cut at the
/// term's end).
fn permit_per_write(ha: HaHandle, api: Api<ConfigMap>, o: HaOverlap) -> JoinHandle<Outcome> {
    tokio::spawn(async move {
        let permit = ha.permit().expect("admitted");
        let t0 = Instant::now();
        let mut out = Outcome::default();
        while t0.elapsed() < RECONCILE {
            let (o, api, n, epoch) = (&o, &api, out.writes, permit.epoch().wire());
            let res = permit
                .send(|| async move {
                    // recorded only once sent: the check passed
                    let _w = o.admit("a", epoch);
                    write(api, n).await
                })
                .await;
            match res {
                Ok(_) => out.writes += 1,
                Err(e) if e.is_term_ended() => {
                    out.ended = Some(t0.elapsed());
                    break;
                }
                Err(_) => {}
            }
        }
        out
    })
}

/// The checker catches the writes of a reconcile admitted once: they go on after A's term ended and
/// after B was promoted.
#[tokio::test(start_paused = true)]
async fn ha_permit_a_reconcile_admitted_once_writes_after_its_term_and_the_checker_sees_it() {
    let (o, out) = a_long_reconcile_across_a_forced_promotion(admit_once).await;
    assert!(out.writes > 60, "{out:?}");
    assert_eq!(
        o.violations(),
        vec![Violation::Overlap {
            a: ("a".into(), 1001),
            b: ("b".into(), 2002)
        }],
        "intervals: {:?}",
        o.intervals()
    );
}

/// A reconcile that sends each write through its permit stops at the end of the term it was admitted
/// in: no write of A's after B's promotion.
#[tokio::test(start_paused = true)]
async fn ha_permit_a_reconcile_writing_through_its_permit_stops_with_its_term() {
    let (o, out) = a_long_reconcile_across_a_forced_promotion(permit_per_write).await;
    assert!(out.writes > 0, "{out:?}");
    // cut 1 s after it began; the term ends within renew_deadline (10 s) of A's last renewal
    let ended = out.ended.expect("the term ended under the reconcile");
    assert!(ended <= Duration::from_secs(11), "{out:?}");
    no_overlap(&o);
}
