//! The writer: a client of the pair, not an HA participant. It keeps creating, changing and deleting
//! Widgets `w-0..objects` on whichever cluster the HA Leases name Active (the highest epoch readable),
//! retries a write the apiserver refused (the freeze on a demoted cluster, a conflict) on the cluster
//! named then, and records every acknowledged write (name, uid, resourceVersion, the `spec.size` it
//! stored) and every write of unknown outcome.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;
use tracing::Instrument;

use super::oracle::{Op, Write};
use kube_shard_example_operator::widget::{Widget, WidgetSpec};

/// An acknowledged write.
#[derive(Clone, Debug)]
pub(crate) struct Ack {
    pub(crate) write: Write,
    /// The cluster that acknowledged it.
    pub(crate) cluster: &'static str,
    pub(crate) uid: String,
    /// The resourceVersion the cluster answered (for a delete, the last one read).
    pub(crate) rv: u64,
    pub(crate) at: Instant,
}

#[derive(Debug, Default)]
pub(crate) struct Log {
    pub(crate) acked: Vec<Ack>,
    pub(crate) maybe: Vec<Write>,
}

/// The shared writer state. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Writer {
    pub(crate) log: Arc<Mutex<Log>>,
    pub(crate) refused: Arc<AtomicU64>,
    paused: Arc<AtomicBool>,
    idle: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

/// The clusters as the writer reaches them.
pub(crate) struct Targets {
    pub(crate) clusters: Vec<(&'static str, Client)>,
    pub(crate) ns: String,
    pub(crate) lease: String,
}

impl Writer {
    pub(crate) fn new() -> Self {
        Writer {
            log: Arc::default(),
            refused: Arc::default(),
            paused: Arc::default(),
            idle: Arc::default(),
            stop: Arc::default(),
        }
    }

    pub(crate) fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn acked(&self) -> u64 {
        self.log().acked.len() as u64
    }

    /// Pause between two writes (returns once no write is in flight, at most 10 s).
    pub(crate) async fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        let t0 = Instant::now();
        while !self.idle.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub(crate) fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Create every Widget `w-0..objects` on the Active once (recorded like every other write).
    pub(crate) async fn seed(&self, t: &Targets, objects: usize) -> Result<(), String> {
        let Some((cluster, client)) = active(t).await else {
            return Err("no HA Lease names an Active".into());
        };
        let api: Api<Widget> = Api::namespaced(client, &t.ns);
        for i in 0..objects {
            let name = format!("w-{i}");
            let seq = i as u64 + 1;
            match write_once(&api, &name, seq, false).await {
                Ok(Some((op, uid, rv))) => self.log().acked.push(Ack {
                    write: Write { name, seq, op },
                    cluster,
                    uid,
                    rv,
                    at: Instant::now(),
                }),
                _ => return Err(format!("creating Widget {name} failed")),
            }
        }
        Ok(())
    }

    /// Start writing `rate` writes a second over `objects` names.
    pub(crate) fn spawn(
        &self,
        t: Targets,
        objects: usize,
        rate: u32,
    ) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(
            async move { me.run(t, objects, rate).await }
                .instrument(tracing::info_span!("demo_ha_writer")),
        )
    }

    async fn run(self, t: Targets, objects: usize, rate: u32) {
        let period = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
        let mut seq = 1_000_000u64;
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for i in 0u64.. {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            if self.paused.load(Ordering::SeqCst) {
                self.idle.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            self.idle.store(false, Ordering::SeqCst);
            tick.tick().await;
            // a reproducible spread of names and ops (xorshift): a name is deleted now and then and
            // created again later
            let r = xorshift(i);
            let name = format!("w-{}", r % objects.max(1) as u64);
            let delete = (r >> 32).is_multiple_of(10);
            for _attempt in 0..200 {
                if self.stop.load(Ordering::SeqCst) {
                    return;
                }
                seq += 1;
                let Some((cluster, client)) = active(&t).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let api: Api<Widget> = Api::namespaced(client, &t.ns);
                match write_once(&api, &name, seq, delete).await {
                    Ok(Some((op, uid, rv))) => {
                        self.log().acked.push(Ack {
                            write: Write {
                                name: name.clone(),
                                seq,
                                op,
                            },
                            cluster,
                            uid,
                            rv,
                            at: Instant::now(),
                        });
                        break;
                    }
                    // nothing to delete
                    Ok(None) => break,
                    Err(Outcome::Refused) => {
                        self.refused.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(Outcome::Unknown(op)) => {
                        self.log().maybe.push(Write {
                            name: name.clone(),
                            seq,
                            op,
                        });
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A reproducible pseudo-random number for step `i` (xorshift64* of `i + 1`).
fn xorshift(i: u64) -> u64 {
    let mut x = i.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    x.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

enum Outcome {
    /// The apiserver answered with an error: nothing was written.
    Refused,
    /// No answer: the write may have committed.
    Unknown(Op),
}

fn classify(e: &kube::Error, op: Op) -> Outcome {
    match e {
        kube::Error::Api(_) => Outcome::Refused,
        _ => Outcome::Unknown(op),
    }
}

fn rv_of(w: &Widget) -> u64 {
    w.metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

/// One write: a create when the Widget is missing, else an update of `spec.size` (or a delete).
async fn write_once(
    api: &Api<Widget>,
    name: &str,
    seq: u64,
    delete: bool,
) -> Result<Option<(Op, String, u64)>, Outcome> {
    let cur = api.get_opt(name).await.map_err(|_| Outcome::Refused)?;
    if cur
        .as_ref()
        .is_some_and(|w| w.metadata.deletion_timestamp.is_some())
    {
        // Terminating (a copy the mirror deleted, waiting for the garbage collector): neither a create
        // nor an update can give it a live state; try again later
        return Err(Outcome::Refused);
    }
    let size = i64::try_from(seq).unwrap_or(i64::MAX);
    match cur {
        None if delete => Ok(None),
        None => {
            let mut w = Widget::new(
                name,
                api_ns(api),
                WidgetSpec {
                    size: Some(size),
                    ..WidgetSpec::default()
                },
            );
            // in the mirror's scope (a label selector, as a real deployment scopes it)
            w.metadata.labels = Some(super::cluster_objects::labels());
            let got = api
                .create(&PostParams::default(), &w)
                .await
                .map_err(|e| classify(&e, Op::Put))?;
            Ok(Some((
                Op::Put,
                got.metadata.uid.clone().unwrap_or_default(),
                rv_of(&got),
            )))
        }
        Some(old) if delete => {
            let dp = DeleteParams {
                preconditions: Some(kube::api::Preconditions {
                    uid: old.metadata.uid.clone(),
                    resource_version: old.metadata.resource_version.clone(),
                }),
                ..DeleteParams::default()
            };
            api.delete(name, &dp)
                .await
                .map_err(|e| classify(&e, Op::Delete))?;
            Ok(Some((
                Op::Delete,
                old.metadata.uid.clone().unwrap_or_default(),
                rv_of(&old),
            )))
        }
        Some(mut w) => {
            w.spec.size = Some(size);
            let got = api
                .replace(name, &PostParams::default(), &w)
                .await
                .map_err(|e| classify(&e, Op::Put))?;
            Ok(Some((
                Op::Put,
                got.metadata.uid.clone().unwrap_or_default(),
                rv_of(&got),
            )))
        }
    }
}

fn api_ns(api: &Api<Widget>) -> &str {
    api.namespace().unwrap_or_default()
}

/// The cluster the HA Leases name Active: the holder at the highest epoch among the Leases readable.
pub(crate) async fn active(t: &Targets) -> Option<(&'static str, Client)> {
    let mut best: Option<(u64, String)> = None;
    for (_, c) in &t.clusters {
        let api: Api<Lease> = Api::namespaced(c.clone(), &t.ns);
        let Ok(Ok(Some(l))) =
            tokio::time::timeout(Duration::from_millis(500), api.get_opt(&t.lease)).await
        else {
            continue;
        };
        if let Ok(r) = kube_shard_ha::record::decode(&l) {
            let e = r.epoch.wire();
            if best.as_ref().is_none_or(|(b, _)| e > *b) {
                best = Some((e, r.cluster));
            }
        }
    }
    let (_, id) = best?;
    t.clusters
        .iter()
        .find(|(c, _)| *c == id)
        .map(|(c, cl)| (*c, cl.clone()))
}
