//! Planned switchover (HA.md contract 2) in shard groups on two testservers (three with a witness),
//! paused time: `kube_shard_ha::switchover::{demote, promote_with_token, cancel}` against the Active's
//! group (members ack `ha-drained`) and the Standby, with the cross-cluster overlap checker
//! (`kube_shard_ha::overlap`) recording every worker's requests under (cluster, the permit's
//! failover epoch). The mirrored kind is `secrets/v1`; a small mirror stand-in copies A's Secrets to B
//! and writes its position (the LIST's resourceVersion) into B's checkpoint, as the mirror will.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::ByteString;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::Api;
use kube_shard_ha::overlap::{HaOverlap, Violation};
use kube_shard_ha::switchover::{
    self, DemoteOptions, DemotionToken, FreezeScope, Kind, PromoteOptions, SwitchError,
};
use kube_shard_ha::{HaClients, HaConfig, HaMode};
use kube_shard_testserver::TestServer;
use tokio::time::Instant;

use crate::group::{
    ha_config, is_admitting, owned_shard, side, two_active_members_and_a_standby, two_servers,
    Side, Worker,
};
use crate::harness::{until, CP_NS};

fn kinds() -> Vec<Kind> {
    vec!["secrets/v1".parse().unwrap()]
}

/// The demotion of the mirrored kinds in the mirror's scope (the namespace `CP_NS`).
fn demote_opts() -> DemoteOptions {
    DemoteOptions::new(kinds())
        .group(crate::harness::GROUP, Some(CP_NS.into()))
        .scope(FreezeScope::new(vec![CP_NS.into()], None).unwrap())
}

/// The commands' view of cluster `id` (rank) with `own` and `peer`.
fn cmd(id: &str, rank: u64, own: &TestServer, peer: &TestServer) -> (HaConfig, HaClients) {
    let who = format!("kshard-{id}");
    (
        ha_config(id, rank, HaMode::Standby),
        HaClients::new(own.client(&who), peer.client(&who), None),
    )
}

async fn uid_of_kube_system(s: &TestServer) -> String {
    let ns: Api<Namespace> = Api::all(s.client("admin"));
    ns.get("kube-system").await.unwrap().metadata.uid.unwrap()
}

/// Writes Secrets `w-0..5` on A (identity `writer`) every 200 ms while `on`; counts accepted and refused.
struct Writer {
    ok: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

fn secret(name: &str, v: u64) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(CP_NS.into()),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            "v".to_string(),
            ByteString(v.to_string().into_bytes()),
        )])),
        ..Secret::default()
    }
}

async fn put(api: &Api<Secret>, s: Secret) -> Result<(), kube::Error> {
    let name = s.metadata.name.clone().unwrap();
    match api.get_opt(&name).await? {
        None => api.create(&PostParams::default(), &s).await.map(|_| ()),
        Some(old) => {
            let mut s = s;
            s.metadata.resource_version = old.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &s)
                .await
                .map(|_| ())
        }
    }
}

fn writer(a: &TestServer) -> Writer {
    let api: Api<Secret> = Api::namespaced(a.client("writer"), CP_NS);
    let (ok, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (o, r) = (ok.clone(), refused.clone());
    let task = tokio::spawn(async move {
        for i in 0u64.. {
            match put(&api, secret(&format!("w-{}", i % 5), i)).await {
                Ok(()) => o.fetch_add(1, Ordering::SeqCst),
                Err(_) => r.fetch_add(1, Ordering::SeqCst),
            };
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    Writer { ok, refused, task }
}

/// The mirror stand-in: every 500 ms copies A's Secrets in the namespace to B and records the LIST's
/// resourceVersion as B's position for `secrets` from A's source identity.
fn mirror(a: &TestServer, b: &TestServer, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
    let src: Api<Secret> = Api::namespaced(a.client("mirror"), CP_NS);
    let dst: Api<Secret> = Api::namespaced(b.client("mirror"), CP_NS);
    let (a, bc) = (a.client("admin"), b.client("mirror"));
    tokio::spawn(async move {
        let ns: Api<Namespace> = Api::all(a);
        let source = format!(
            "a/{}",
            ns.get("kube-system").await.unwrap().metadata.uid.unwrap()
        );
        let cfg = ha_config("b", 2, HaMode::Standby);
        record_stand_in(&bc, &cfg).await;
        while !stop.load(Ordering::SeqCst) {
            let l = src.list(&ListParams::default()).await.unwrap();
            for s in l.items {
                let mut c = secret(s.metadata.name.as_deref().unwrap(), 0);
                c.data = s.data.clone();
                c.metadata.labels = Some(BTreeMap::from([(
                    "kube-shard.io/mirrored-from".to_string(),
                    "a".to_string(),
                )]));
                put(&dst, c).await.unwrap();
            }
            let rv: u64 = l.metadata.resource_version.unwrap().parse().unwrap();
            switchover::write_position(&bc, &cfg, "secrets", &source, rv)
                .await
                .unwrap();
            // a catch-up request reached: acknowledge it and hold (copy nothing more) while it stays
            loop {
                let asked = requested(&bc, &cfg).await;
                match asked {
                    Some(t) if rv >= t.kinds["secrets"] => {
                        acknowledge(&bc, &cfg, &t).await;
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    _ => break,
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
}

/// What a mirror records of itself in the checkpoint when it starts, for the stand-in (A's Secrets in
/// the namespace): the promotion checks read the mirrored kinds there.
async fn record_stand_in(c: &kube::Client, cfg: &HaConfig) {
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), &cfg.namespace);
    let name = switchover::checkpoint_name(cfg);
    let text = format!("v1 source=a kinds=secrets/v1 namespaces={CP_NS} own=-");
    match api.get_opt(&name).await.unwrap() {
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..ObjectMeta::default()
                },
                data: Some(BTreeMap::from([("mirror".to_string(), text)])),
                ..ConfigMap::default()
            };
            api.create(&PostParams::default(), &cm).await.unwrap();
        }
        Some(_) => {
            let patch = serde_json::json!({"data": {"mirror": text}});
            api.patch(
                &name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .unwrap();
        }
    }
}

/// The catch-up request `promote --token` left in the checkpoint of the cluster `c` reaches.
async fn requested(c: &kube::Client, cfg: &HaConfig) -> Option<DemotionToken> {
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), &cfg.namespace);
    let cm = api
        .get_opt(&switchover::checkpoint_name(cfg))
        .await
        .unwrap()?;
    cm.data?.get(switchover::CATCH_UP_KEY)?.parse().ok()
}

/// The mirror stand-in's acknowledgement of a catch-up to `token` (what the real mirror writes once its
/// catch-up is applied and it holds).
async fn acknowledge(c: &kube::Client, cfg: &HaConfig, token: &DemotionToken) {
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), &cfg.namespace);
    let patch =
        serde_json::json!({"data": {switchover::CAUGHT_UP_KEY: format!("{} failed=0", token.id)}});
    api.patch(
        &switchover::checkpoint_name(cfg),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
}

/// A (members a1, a2) Active and B (b1) Standby, both admitting/holding; the writer and the mirror run.
struct Pair {
    sa: TestServer,
    sb: TestServer,
    o: HaOverlap,
    a: Vec<Side>,
    b: Side,
    writer: Writer,
    mirror_stop: Arc<AtomicBool>,
}

async fn pair() -> Pair {
    pair_with(true).await
}

/// With `stand_in`, the mirror stand-in copies the Secrets; without, nothing does (the caller starts
/// the real mirror).
async fn pair_with(stand_in: bool) -> Pair {
    let (sa, sb) = two_servers().await;
    let o = HaOverlap::default();
    let (a, b) = two_active_members_and_a_standby(&sa, &sb, &o).await;
    let writer = writer(&sa);
    let mirror_stop = Arc::new(AtomicBool::new(false));
    if stand_in {
        mirror(&sa, &sb, mirror_stop.clone());
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    Pair {
        sa,
        sb,
        o,
        a,
        b,
        writer,
        mirror_stop,
    }
}

impl Pair {
    fn kill(&self) {
        self.mirror_stop.store(true, Ordering::SeqCst);
        self.writer.task.abort();
        for s in self.a.iter().chain([&self.b]) {
            s.kill();
        }
    }

    async fn demote(&self, opts: &DemoteOptions) -> Result<DemotionToken, SwitchError> {
        let (cfg, clients) = cmd("a", 1, &self.sa, &self.sb);
        switchover::demote(&cfg, &clients, opts, |l| eprintln!("[demote] {l}")).await
    }

    async fn promote(
        &self,
        t: &DemotionToken,
        timeout: Duration,
    ) -> Result<kube_shard_ha::FailoverEpoch, SwitchError> {
        let (cfg, clients) = cmd("b", 2, &self.sb, &self.sa);
        let opts = PromoteOptions::new(timeout);
        switchover::promote_with_token(
            &cfg,
            clients,
            kube_shard::rt::Clock::system(),
            t,
            &opts,
            |l| eprintln!("[promote] {l}"),
        )
        .await
    }

    fn b_admitted(&self) -> u64 {
        self.b.admitted.load(Ordering::SeqCst)
    }
}

#[tokio::test(start_paused = true)]
async fn ha_switchover_under_writes_no_overlap_and_a_higher_epoch() {
    let p = pair().await;
    let t0 = Instant::now();
    let token = p.demote(&demote_opts()).await.unwrap();
    let demoted = t0.elapsed();
    assert_eq!(token.epoch.wire(), 1001);
    assert_eq!(
        token.source(),
        format!("a/{}", uid_of_kube_system(&p.sa).await)
    );
    for s in &p.a {
        assert!(!is_admitting(&s.ownership()), "a demoted member admits");
    }
    // the freeze refuses the writer from the token on
    let (ok, refused) = (
        p.writer.ok.load(Ordering::SeqCst),
        p.writer.refused.load(Ordering::SeqCst),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        p.writer.ok.load(Ordering::SeqCst),
        ok,
        "a write was accepted after the freeze"
    );
    assert!(p.writer.refused.load(Ordering::SeqCst) > refused);
    assert_eq!(p.b_admitted(), 0);
    let epoch = p.promote(&token, Duration::from_secs(60)).await.unwrap();
    assert!(epoch.wire() > 1001 && epoch.wire() == 2002, "{epoch}");
    until(
        Duration::from_secs(30),
        "B's worker admitting at 2002",
        || p.o.intervals().contains_key(&("b".to_string(), 2002)),
    )
    .await;
    let first = p.o.intervals()[&("b".to_string(), 2002)].start;
    eprintln!(
        "[switchover] demote took {demoted:?}; demote start → B admitting {:?}",
        first.duration_since(t0)
    );
    tokio::time::sleep(Duration::from_secs(20)).await;
    for s in &p.a {
        assert!(!is_admitting(&s.ownership()));
        let st = s.ha.control.status().await.unwrap();
        assert_eq!(st.role, "standby", "{st:?}");
    }
    assert!(is_admitting(&p.b.ownership()));
    // nothing acknowledged was lost: every Secret on A is on B with the same data
    let on = |s: &TestServer| {
        let api: Api<Secret> = Api::namespaced(s.client("admin"), CP_NS);
        async move {
            let l = api.list(&ListParams::default()).await.unwrap();
            l.items
                .into_iter()
                .map(|s| (s.metadata.name.unwrap(), s.data))
                .collect::<BTreeMap<_, _>>()
        }
    };
    let (sa, sb) = (on(&p.sa).await, on(&p.sb).await);
    assert!(!sa.is_empty());
    for (k, v) in &sa {
        assert_eq!(sb.get(k), Some(v), "{k}");
    }
    assert_eq!(p.o.violations(), vec![], "{:?}", p.o.intervals());
    // the same token again
    let again = p.promote(&token, Duration::from_secs(5)).await.unwrap_err();
    assert!(again.to_string().contains("already used"), "{again}");
    p.kill();
}

#[tokio::test(start_paused = true)]
async fn ha_switchover_demote_cancel_restores_the_active() {
    let p = pair().await;
    let token = p.demote(&demote_opts()).await.unwrap();
    assert!(p.a.iter().all(|s| !is_admitting(&s.ownership())));
    let (cfg, clients) = cmd("a", 1, &p.sa, &p.sb);
    switchover::cancel(&cfg, &clients).await.unwrap();
    until(Duration::from_secs(20), "A admitting again", || {
        p.a.iter().all(|s| is_admitting(&s.ownership()))
    })
    .await;
    for s in &p.a {
        assert_eq!(s.ha.handle.active_epoch().unwrap().wire(), 1001);
    }
    let ok = p.writer.ok.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        p.writer.ok.load(Ordering::SeqCst) > ok,
        "the freeze was not lifted"
    );
    // the cancelled token is refused (stale: the source is not demoting any more)
    let e = p.promote(&token, Duration::from_secs(5)).await.unwrap_err();
    assert!(e.to_string().contains("stale"), "{e}");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(p.b_admitted(), 0);
    assert_eq!(p.o.violations(), vec![]);
    p.kill();
}

/// `demote --cancel` racing a token promotion: the cancel has read its own Lease (still demoting) when the
/// promotion takes that Lease over, and the cancel's own write is answered late. The cancel's write is the
/// serialisation point, so the freeze is lifted only after it: the promotion wins, the cancel fails, and the
/// freeze stays on A — users' writes to the covered kinds are never accepted by a cluster that is no longer
/// Active. (Before, the cancel lifted the freeze first: B Active and A taking writes its failback loses.)
#[tokio::test(start_paused = true)]
async fn ha_switchover_a_cancel_losing_to_the_promotion_leaves_the_freeze() {
    use kube_shard_testserver::{Scope, Verb};
    let p = pair().await;
    let token = p.demote(&demote_opts()).await.unwrap();
    // the cancel's Lease writes (identity kshard-a on A) are handled 2 s late
    p.sa.faults().latency(
        Scope::identity("kshard-a")
            .verb(Verb::Update)
            .resource("leases"),
        Some(Duration::from_secs(2)),
    );
    let (cfg, clients) = cmd("a", 1, &p.sa, &p.sb);
    let cancel = tokio::spawn(async move { switchover::cancel(&cfg, &clients).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let promoted = p.promote(&token, Duration::from_secs(30)).await;
    let cancelled = cancel.await.unwrap();
    assert!(promoted.is_ok(), "{promoted:?}");
    assert!(
        cancelled.is_err(),
        "the cancel lost the race: {cancelled:?}"
    );
    // A is frozen still: the writer's Secrets are refused
    let ok = p.writer.ok.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        p.writer.ok.load(Ordering::SeqCst),
        ok,
        "A took writes after B's promotion: the freeze was lifted"
    );
    p.kill();
}

/// A member whose reconcile holds its permit (and a request under the old term) for `hold`.
fn stalled(s: &Side, o: &HaOverlap, hold: Duration) -> tokio::task::JoinHandle<()> {
    let own = s.ownership();
    let o = o.clone();
    tokio::spawn(async move {
        let p = own.admit_shard(owned_shard(&own)).unwrap();
        let f = p.fence().unwrap();
        let w = o.admit("a", p.failover_epoch().unwrap().wire());
        tokio::time::sleep(hold).await;
        drop((w, f, p));
    })
}

#[tokio::test(start_paused = true)]
async fn ha_switchover_a_stalled_member_fails_the_demotion_and_no_token_is_issued() {
    let p = pair().await;
    let st = stalled(&p.a[1], &p.o, Duration::from_secs(60));
    tokio::task::yield_now().await;
    let t0 = Instant::now();
    let e = p
        .demote(&demote_opts().drain_timeout(Duration::from_secs(20)))
        .await
        .unwrap_err();
    eprintln!("[switchover] stalled member: {e}");
    match &e {
        SwitchError::NotDrained { pending, .. } => {
            assert_eq!(pending.len(), 1, "{pending:?}");
            assert!(pending[0].contains("a2"), "{pending:?}");
        }
        other => panic!("{other}"),
    }
    assert!(t0.elapsed() >= Duration::from_secs(20));
    // no token in the Lease, nothing frozen, B still standing by
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(p.sa.client("admin"), CP_NS);
    let l = leases.get("widgets-ha").await.unwrap();
    let state = kube_shard_ha::record::decode(&l).unwrap().state;
    assert!(state.demoting && state.token.is_none(), "{state:?}");
    assert_eq!(p.b_admitted(), 0);
    // once the stalled reconcile ends, the demotion completes
    st.await.unwrap();
    let token = p.demote(&demote_opts()).await.unwrap();
    assert_eq!(token.epoch.wire(), 1001);
    assert_eq!(p.o.violations(), vec![]);
    p.kill();
}

/// A member's request under the old term stays open 30 s; the Standby is promoted with the token at once.
async fn stalled_switchover(skip_acks: bool) -> HaOverlap {
    let p = pair().await;
    let st = stalled(&p.a[1], &p.o, Duration::from_secs(30));
    tokio::task::yield_now().await;
    let mut opts = demote_opts();
    opts.skip_acks = skip_acks;
    let token = p.demote(&opts).await.unwrap();
    p.promote(&token, Duration::from_secs(60)).await.unwrap();
    until(Duration::from_secs(30), "B admitting", || {
        is_admitting(&p.b.ownership())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    st.await.unwrap();
    p.kill();
    p.o
}

#[tokio::test(start_paused = true)]
async fn ha_switchover_waits_for_a_stalled_request_and_never_overlaps() {
    let o = stalled_switchover(false).await;
    assert_eq!(o.violations(), vec![], "{:?}", o.intervals());
}

#[tokio::test(start_paused = true)]
async fn ha_switchover_the_overlap_checker_finds_a_token_issued_before_the_acks() {
    let o = stalled_switchover(true).await;
    assert!(
        o.violations()
            .iter()
            .any(|v| matches!(v, Violation::Overlap { .. })),
        "the planted bug was not found: {:?}",
        o.intervals()
    );
}

#[tokio::test(start_paused = true)]
async fn ha_switchover_wrong_tokens_a_lagging_mirror_and_writes_after_the_token_are_refused() {
    let p = pair().await;
    // freeze-exempt identity `gc` may still write on A
    let token = p
        .demote(&demote_opts().freeze_exempt(vec!["gc".into()]))
        .await
        .unwrap();
    let mut foreign = token.clone();
    foreign.uid = "another-cluster".into();
    let e = p
        .promote(&foreign, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("foreign source"), "{e}");
    let mut old = token.clone();
    old.epoch = kube_shard_ha::FailoverEpoch::new(0, 1).unwrap();
    let e = p.promote(&old, Duration::from_secs(5)).await.unwrap_err();
    assert!(e.to_string().contains("stale"), "{e}");
    // the mirror stops below the token: wait, then a per-kind report, no change on either side
    p.mirror_stop.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (cfg_b, _) = cmd("b", 2, &p.sb, &p.sa);
    let src = token.source();
    switchover::write_position(
        &p.sb.client("admin"),
        &cfg_b,
        "secrets",
        &src,
        token.kinds["secrets"] - 1,
    )
    .await
    .unwrap();
    let t0 = Instant::now();
    let e = p
        .promote(&token, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(t0.elapsed() >= Duration::from_secs(10));
    match &e {
        SwitchError::Behind { report, .. } => {
            assert_eq!(report.len(), 1);
            assert_eq!(report[0].position, Some(token.kinds["secrets"] - 1));
        }
        other => panic!("{other}"),
    }
    eprintln!("[switchover] {e}");
    // the mirror catches up, but an exempt writer changed a Secret after the token
    switchover::write_position(
        &p.sb.client("admin"),
        &cfg_b,
        "secrets",
        &src,
        token.kinds["secrets"],
    )
    .await
    .unwrap();
    acknowledge(&p.sb.client("admin"), &cfg_b, &token).await;
    let gc: Api<Secret> = Api::namespaced(p.sa.client("gc"), CP_NS);
    put(&gc, secret("w-0", 999)).await.unwrap();
    let e = p
        .promote(&token, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("accepted writes after its demotion"),
        "{e}"
    );
    // nothing changed: A demoting, B standing by
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(p.b_admitted(), 0);
    assert!(p.a.iter().all(|s| !is_admitting(&s.ownership())));
    assert_eq!(p.o.violations(), vec![]);
    p.kill();
}

fn witness_builder(
    name: &str,
    cluster: &str,
    rank: u64,
    mode: HaMode,
    own: &TestServer,
    peer: &TestServer,
    w: &TestServer,
) -> crate::group::HaBuilder {
    let who = format!("{name}-ha");
    // no mirror here: without a lag gate, so that only the demoting record keeps B from promoting
    let cfg = HaConfig::builder("widgets")
        .mode(mode)
        .cluster(cluster, rank)
        .namespace(CP_NS)
        .kubeconfigs(None, Some("/peer".into()), Some("/witness".into()))
        .auto_promote_without_lag_bound()
        .build()
        .unwrap();
    crate::group::HaBuilder {
        group: crate::harness::builder(own, name),
        ha: kube_shard_ha::Attach::new(
            cfg,
            HaClients::new(own.client(&who), peer.client(&who), Some(w.client(&who))),
        ),
    }
}

/// Demotion against automatic promotion: with a witness, a demoting Active keeps its Leases in the state
/// `demoting(token)`, and the Standby never promotes itself from it — not even once the old Active is gone
/// for far longer than the takeover wait; the token promotes it without a wait.
#[tokio::test(start_paused = true)]
async fn ha_switchover_with_a_witness_a_demoting_active_is_never_auto_promoted_over() {
    let (sa, sb) = two_servers().await;
    let (sw, _) = crate::harness::group_server().await;
    let o = HaOverlap::default();
    let a = side(
        witness_builder("a1", "a", 1, HaMode::Active, &sa, &sb, &sw),
        "a1",
        "a",
        &o,
        Worker::Honest,
    );
    let b = side(
        witness_builder("b1", "b", 2, HaMode::Standby, &sb, &sa, &sw),
        "b1",
        "b",
        &o,
        Worker::Honest,
    );
    until(Duration::from_secs(40), "A admitting", || {
        is_admitting(&a.ownership())
    })
    .await;
    let writer = writer(&sa);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let who = "kshard-a";
    let mut cfg_a = ha_config("a", 1, HaMode::Standby);
    cfg_a = HaConfig::builder("widgets")
        .mode(HaMode::Standby)
        .cluster("a", 1)
        .namespace(CP_NS)
        .kubeconfigs(None, Some("/peer".into()), Some("/witness".into()))
        .build()
        .unwrap_or(cfg_a);
    let clients_a = HaClients::new(sa.client(who), sb.client(who), Some(sw.client(who)));
    let token = switchover::demote(&cfg_a, &clients_a, &demote_opts(), |l| {
        eprintln!("[demote] {l}")
    })
    .await
    .unwrap();
    // the demoting Active propagates demoting(token) to the witness, then dies
    tokio::time::sleep(Duration::from_secs(5)).await;
    a.kill();
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert_eq!(
        b.admitted.load(Ordering::SeqCst),
        0,
        "B promoted itself over a demoting Active"
    );
    // the mirror's record and position (its stand-in), then the token
    let cfg_b = HaConfig::builder("widgets")
        .mode(HaMode::Standby)
        .cluster("b", 2)
        .namespace(CP_NS)
        .kubeconfigs(None, Some("/peer".into()), Some("/witness".into()))
        .build()
        .unwrap();
    record_stand_in(&sb.client("mirror"), &cfg_b).await;
    switchover::write_position(
        &sb.client("mirror"),
        &cfg_b,
        "secrets",
        &token.source(),
        token.kinds["secrets"],
    )
    .await
    .unwrap();
    acknowledge(&sb.client("mirror"), &cfg_b, &token).await;
    let t0 = Instant::now();
    let clients_b = HaClients::new(
        sb.client("kshard-b"),
        sa.client("kshard-b"),
        Some(sw.client("kshard-b")),
    );
    let e = switchover::promote_with_token(
        &cfg_b,
        clients_b,
        kube_shard::rt::Clock::system(),
        &token,
        &PromoteOptions::new(Duration::from_secs(60)),
        |l| eprintln!("[promote] {l}"),
    )
    .await
    .unwrap();
    until(Duration::from_secs(30), "B admitting", || {
        is_admitting(&b.ownership())
    })
    .await;
    eprintln!(
        "[switchover] witness: promote --token → B admitting {:?} (epoch {e})",
        t0.elapsed()
    );
    assert_eq!(o.violations(), vec![], "{:?}", o.intervals());
    writer.task.abort();
    b.kill();
}

/// The real mirror (`kube_shard_ha::mirror`) of A's Secrets into B, as B's operator would run it.
async fn real_mirror(p: &Pair) -> kube_shard_ha::mirror::Mirror {
    real_mirror_of(p, &kinds()).await
}

/// The real mirror of A's objects of `mirrored` into B.
async fn real_mirror_of(p: &Pair, mirrored: &[Kind]) -> kube_shard_ha::mirror::Mirror {
    use kube_shard_ha::mirror::{KindSet, Mirror, MirrorConfig, MirrorWiring};
    let set = mirrored
        .iter()
        .fold(KindSet::builder(), |b, k| b.mirrored(k.clone()))
        .allow_secrets(true)
        .build(mirrored)
        .unwrap();
    let cfg = MirrorConfig::new(ha_config("b", 2, HaMode::Standby), "a", set)
        .namespaces([CP_NS])
        .whole_builtin_kinds(true)
        .assignment(CP_NS, format!("{}-assignment", crate::harness::GROUP));
    Mirror::start(
        cfg,
        p.sa.client("mirror"),
        p.sb.client("mirror"),
        MirrorWiring::default(),
    )
    .await
    .unwrap()
}

/// The real mirror (`kube_shard_ha::mirror`) instead of the stand-in: B mirrors A's Secrets under the
/// writer; `promote --token` asks it to catch up through the checkpoint and waits for its position; after
/// the promotion every Secret on A is on B with the same data, and B's copies carry the mirror's marks.
#[tokio::test(start_paused = true)]
async fn ha_switchover_with_the_real_mirror_loses_nothing() {
    let p = pair_with(false).await;
    let m = real_mirror(&p).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let token = p.demote(&demote_opts()).await.unwrap();
    let t0 = Instant::now();
    let epoch = p.promote(&token, Duration::from_secs(60)).await.unwrap();
    eprintln!(
        "[switchover] promote --token with the real mirror took {:?}",
        t0.elapsed()
    );
    assert_eq!(epoch.wire(), 2002);
    let st = m.kind("secrets").unwrap();
    assert!(st.position.unwrap() >= token.kinds["secrets"], "{st:?}");
    assert!(st.failed.is_empty(), "{st:?}");
    m.stop().await;
    let on = |s: &TestServer| {
        let api: Api<Secret> = Api::namespaced(s.client("admin"), CP_NS);
        async move {
            let l = api.list(&ListParams::default()).await.unwrap();
            l.items
                .into_iter()
                .map(|s| (s.metadata.name.clone().unwrap(), s))
                .collect::<BTreeMap<_, _>>()
        }
    };
    let (sa, sb) = (on(&p.sa).await, on(&p.sb).await);
    assert!(sa.len() >= 5, "{}", sa.len());
    for (k, v) in &sa {
        let c = sb.get(k).unwrap_or_else(|| panic!("{k} lost"));
        assert_eq!(c.data, v.data, "{k}");
        let ann = c.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            ann.get("kube-shard.io/fence").map(String::as_str),
            Some("1001:mirror")
        );
        assert_eq!(ann.get("kube-shard.io/source-uid"), v.metadata.uid.as_ref());
    }
    assert!(p.writer.ok.load(Ordering::SeqCst) > 0);
    p.kill();
}

/// The real-cluster demo's planned loss: a catch-up queues every object of the kind, and when a bookmark
/// had already carried the position past the token, `promote --token` used to go ahead while the queue was
/// still being worked through; a user's write to the new Active was then put back to the old Active's
/// version ("the copy was changed by someone else"). The mirror must apply the catch-up and hold (write
/// nothing more) before the takeover.
#[tokio::test(start_paused = true)]
async fn ha_switchover_a_write_to_the_new_active_is_never_reverted_by_the_catch_up() {
    let p = pair_with(false).await;
    let on_a: Api<Secret> = Api::namespaced(p.sa.client("admin"), CP_NS);
    let quiet: Vec<String> = (0..40).map(|i| format!("q-{i:02}")).collect();
    for q in &quiet {
        put(&on_a, secret(q, 1)).await.unwrap();
    }
    let m = real_mirror(&p).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let token = p.demote(&demote_opts()).await.unwrap();
    // a bookmark (every 60 s) carries the position past the token before anyone asks for a catch-up
    tokio::time::sleep(Duration::from_secs(70)).await;
    let before = m.kind("secrets").unwrap().position.unwrap_or(0);
    eprintln!(
        "[catch-up] position {before} before the promotion, token {}",
        token.kinds["secrets"]
    );
    // the Standby's apiserver is slow for the mirror: the catch-up's queue takes seconds to work through
    p.sb.faults().latency(
        kube_shard_testserver::Scope::identity("mirror"),
        Some(Duration::from_millis(500)),
    );
    let t0 = Instant::now();
    p.promote(&token, Duration::from_secs(60)).await.unwrap();
    eprintln!("[catch-up] promoted after {:?}", t0.elapsed());
    // a user edits every quiet Secret on the new Active at once (an edit keeps the labels and annotations)
    let on_b: Api<Secret> = Api::namespaced(p.sb.client("user"), CP_NS);
    for q in &quiet {
        let mut s = on_b.get(q).await.unwrap();
        s.data = secret(q, 999).data;
        on_b.replace(q, &PostParams::default(), &s).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(60)).await;
    let st = m.kind("secrets").unwrap();
    eprintln!(
        "[catch-up] {} writes, {} catch-ups, {} pending, {} failed",
        st.writes,
        st.catchups,
        st.pending,
        st.failed.len()
    );
    m.stop().await;
    let mut reverted = Vec::new();
    for q in &quiet {
        let s = on_b.get(q).await.unwrap();
        if s.data
            .as_ref()
            .and_then(|d| d.get("v"))
            .map(|v| v.0.clone())
            != Some(b"999".to_vec())
        {
            reverted.push(q.clone());
        }
    }
    assert!(
        reverted.is_empty(),
        "the mirror put back {} of the new Active's writes: {reverted:?}",
        reverted.len()
    );
    p.kill();
}

/// The hold's two ends with the real mirror: while a catch-up request stands and is acknowledged, a
/// change on the source (by an identity the freeze exempts) is not copied; a promotion refused for that
/// very change withdraws the request, the mirror releases its hold and copies the change.
#[tokio::test(start_paused = true)]
async fn ha_switchover_the_mirror_holds_while_asked_and_mirrors_on_after_a_refused_promotion() {
    let p = pair_with(false).await;
    let m = real_mirror(&p).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let token = p
        .demote(&demote_opts().freeze_exempt(vec!["gc".into()]))
        .await
        .unwrap();
    let (cfg_b, _) = cmd("b", 2, &p.sb, &p.sa);
    let admin_b = p.sb.client("admin");
    let cm: Api<ConfigMap> = Api::namespaced(admin_b.clone(), &cfg_b.namespace);
    let cp = || async {
        cm.get(&switchover::checkpoint_name(&cfg_b))
            .await
            .unwrap()
            .data
            .unwrap_or_default()
    };
    // ask for the catch-up as `promote --token` does, and wait for the acknowledgement
    let patch = serde_json::json!({"data": {switchover::CATCH_UP_KEY: token.to_string()}});
    cm.patch(
        &switchover::checkpoint_name(&cfg_b),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        cp().await.get(switchover::CAUGHT_UP_KEY),
        Some(&format!("{} failed=0", token.id))
    );
    let gc: Api<Secret> = Api::namespaced(p.sa.client("gc"), CP_NS);
    let on_b: Api<Secret> = Api::namespaced(admin_b.clone(), CP_NS);
    let v = |s: Secret| s.data.unwrap_or_default().get("v").map(|b| b.0.clone());
    put(&gc, secret("w-1", 777)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_ne!(
        v(on_b.get("w-1").await.unwrap()),
        Some(b"777".to_vec()),
        "the mirror copied while it holds"
    );
    // the promotion is refused for that write, and withdraws its request
    let e = p
        .promote(&token, Duration::from_secs(20))
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("accepted writes after its demotion"),
        "{e}"
    );
    assert_eq!(cp().await.get(switchover::CATCH_UP_KEY), None);
    let t0 = Instant::now();
    while v(on_b.get("w-1").await.unwrap()) != Some(b"777".to_vec()) {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the mirror still holds after the request was withdrawn"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("[hold] copied {:?} after the refusal", t0.elapsed());
    m.stop().await;
    p.kill();
}

/// A forced promotion holds the mirror too: the old Active's operator is stopped but its apiserver still
/// takes its users' writes; once the new Active takes over, a mirror still copying would put the objects
/// its users change back to the old Active's newer versions until the mirror duty stops it. The mirror
/// holds after arming and before the candidacy (`hold: false` plants the bug: no hold).
async fn forced_promotion_then_edits_on_b(hold: bool) -> Vec<String> {
    use kube_shard_ha::failover::{force_promote_with, ForceOptions};
    let p = pair_with(false).await;
    let m = real_mirror(&p).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // A's operator stops; its apiserver and its writer go on
    for s in &p.a {
        s.kill();
    }
    let (cfg_b, clients_b) = cmd("b", 2, &p.sb, &p.sa);
    let opts = ForceOptions::new(Duration::from_secs(120));
    let _planted =
        (!hold).then(|| kube_shard::testing::faults::plant(kube_shard_ha::faults::NO_MIRROR_HOLD));
    let mut said = Vec::new();
    force_promote_with(
        &cfg_b,
        clients_b,
        kube_shard::rt::Clock::system(),
        &opts,
        |l| said.push(l.to_string()),
    )
    .await
    .unwrap();
    if hold {
        assert!(
            said.iter().any(|l| l.contains("the mirror holds")),
            "{said:?}"
        );
    }
    // B's users edit every Secret the writer keeps changing on A (an edit keeps labels and annotations)
    let on_b: Api<Secret> = Api::namespaced(p.sb.client("user"), CP_NS);
    for i in 0..5 {
        let name = format!("w-{i}");
        let mut s = on_b.get(&name).await.unwrap();
        s.data = secret(&name, 999).data;
        on_b.replace(&name, &PostParams::default(), &s)
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    m.stop().await;
    let mut reverted = Vec::new();
    for i in 0..5 {
        let name = format!("w-{i}");
        let s = on_b.get(&name).await.unwrap();
        if s.data.unwrap_or_default().get("v").map(|v| v.0.clone()) != Some(b"999".to_vec()) {
            reverted.push(name);
        }
    }
    p.kill();
    reverted
}

#[tokio::test(start_paused = true)]
async fn ha_forced_promotion_holds_the_mirror_before_the_takeover() {
    let reverted = forced_promotion_then_edits_on_b(true).await;
    assert!(
        reverted.is_empty(),
        "the mirror put the old Active's versions over the new Active's edits: {reverted:?}"
    );
}

/// The check above without the hold: the mirror, still running after the takeover, copies over the edits.
#[tokio::test(start_paused = true)]
async fn ha_forced_promotion_without_the_hold_loses_the_new_actives_edits() {
    let reverted = forced_promotion_then_edits_on_b(false).await;
    assert!(!reverted.is_empty(), "no edit reverted without the hold");
}

/// A token must cover every kind the Standby's mirror copies: the mirror holds every kind once the
/// token's kinds caught up, so a kind left out of the token (and of the freeze) keeps taking writes on
/// the old Active that never reach the new one. The promotion refuses and names the missing kind.
#[tokio::test(start_paused = true)]
async fn a_promotion_refuses_a_token_missing_a_mirrored_kind() {
    let p = pair_with(false).await;
    let both: Vec<Kind> = vec![
        "secrets/v1".parse().unwrap(),
        "configmaps/v1".parse().unwrap(),
    ];
    let m = real_mirror_of(&p, &both).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // the demotion covers Secrets only
    let token = p.demote(&demote_opts()).await.unwrap();
    // the catch-up request `promote --token` makes: a mirror that accepts it holds every kind
    let (cfg_b, _) = cmd("b", 2, &p.sb, &p.sa);
    let cm: Api<ConfigMap> = Api::namespaced(p.sb.client("admin"), &cfg_b.namespace);
    let patch = serde_json::json!({"data": {switchover::CATCH_UP_KEY: token.to_string()}});
    cm.patch(
        &switchover::checkpoint_name(&cfg_b),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let acked = cm
        .get(&switchover::checkpoint_name(&cfg_b))
        .await
        .unwrap()
        .data
        .unwrap_or_default()
        .get(switchover::CAUGHT_UP_KEY)
        .is_some_and(|a| a.starts_with(&token.id));
    // a write of the other mirrored kind on A after the token: not frozen
    let late: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "late"}})).unwrap();
    Api::<ConfigMap>::namespaced(p.sa.client("writer"), CP_NS)
        .create(&PostParams::default(), &late)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let r = p.promote(&token, Duration::from_secs(60)).await;
    let on_b = Api::<ConfigMap>::namespaced(p.sb.client("admin"), CP_NS)
        .get_opt("late")
        .await
        .unwrap()
        .is_some();
    let e = r.expect_err(&format!(
        "promoted with a token lacking configmaps (the write after the token on B: {on_b})"
    ));
    eprintln!("[kinds] refused: {e}");
    assert!(e.to_string().contains("missing configmaps"), "{e}");
    assert!(
        !acked,
        "the mirror caught up to (and held for) a token lacking one of its kinds"
    );
    assert_eq!(p.b_admitted(), 0, "nothing changed");
    m.stop().await;
    p.kill();
}

/// The freeze covers what the mirror copies and nothing else: a built-in kind is not frozen without the
/// mirror's scope; under the scope, a write in another namespace and a write of an object each cluster
/// makes for itself (a service-account token Secret) are accepted, while the writer's Secrets in the
/// scope are refused.
#[tokio::test(start_paused = true)]
async fn the_freeze_covers_only_the_mirrors_scope() {
    let p = pair().await;
    let whole = DemoteOptions::new(kinds()).group(crate::harness::GROUP, Some(CP_NS.into()));
    let e = p.demote(&whole).await.unwrap_err();
    assert!(e.to_string().contains("built-in kind"), "{e}");
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "elsewhere"}})).unwrap();
    Api::<Namespace>::all(p.sa.client("admin"))
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let _token = p.demote(&demote_opts()).await.unwrap();
    let refused_before = p.writer.refused.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(p.writer.refused.load(Ordering::SeqCst) > refused_before);
    let other: Api<Secret> = Api::namespaced(p.sa.client("writer"), "elsewhere");
    let mut out = secret("out-of-scope", 1);
    out.metadata.namespace = Some("elsewhere".into());
    put(&other, out)
        .await
        .expect("a write outside the mirror's scope is accepted");
    let mut token_secret = secret("default-token-x", 1);
    token_secret.metadata.annotations = Some(BTreeMap::from([(
        "kubernetes.io/service-account.name".to_string(),
        "default".to_string(),
    )]));
    let scoped: Api<Secret> = Api::namespaced(p.sa.client("writer"), CP_NS);
    put(&scoped, token_secret)
        .await
        .expect("a token Secret (made by each cluster for itself) is accepted");
    let e = put(&scoped, secret("w-0", 99)).await.unwrap_err();
    assert!(e.to_string().contains(switchover::FREEZE_MARK), "{e}");
    p.kill();
}

/// A failed object (one the Standby's cluster refuses to store: here its admission policy) holds the
/// mirror's position below the token, so a token promotion is refused and says why; `--accept-failed`
/// promotes once the mirror caught up but for it, and lists exactly what is lost (read from both
/// clusters, not taken from the mirror).
#[tokio::test(start_paused = true)]
async fn a_token_promotion_accepts_failed_objects_only_when_asked_and_lists_them() {
    let p = pair_with(false).await;
    refuse_secret_on(&p.sb, "blocked").await;
    put(
        &Api::namespaced(p.sa.client("admin"), CP_NS),
        secret("blocked", 1),
    )
    .await
    .unwrap();
    let m = real_mirror(&p).await;
    until(
        Duration::from_secs(300),
        "the refused Secret on the failed list",
        || m.kind("secrets").is_some_and(|k| k.failed.len() == 1),
    )
    .await;
    let token = p.demote(&demote_opts()).await.unwrap();
    let e = p
        .promote(&token, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("--accept-failed"), "{e}");
    let (cfg, clients) = cmd("b", 2, &p.sb, &p.sa);
    let promoted = switchover::promote_by_token(
        &cfg,
        clients,
        kube_shard::rt::Clock::system(),
        &token,
        &PromoteOptions::new(Duration::from_secs(60)).accept_failed(true),
        |l| eprintln!("[promote] {l}"),
    )
    .await
    .unwrap();
    let lost: Vec<String> = promoted.accepted.iter().map(ToString::to_string).collect();
    assert_eq!(lost, [format!("secrets {CP_NS}/blocked (not copied)")]);
    m.stop().await;
    p.kill();
}

/// An admission policy on `s` refusing every write of the Secret `name`.
async fn refuse_secret_on(s: &TestServer, name: &str) {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "refuse"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "resources": ["secrets"],
                "operations": ["CREATE", "UPDATE"],
            }]},
            "validations": [{"expression": format!("request.name != '{name}'")}],
        },
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "refuse"},
        "spec": {"policyName": "refuse", "validationActions": ["Deny"]},
    }))
    .unwrap();
    let pp = PostParams::default();
    Api::<ValidatingAdmissionPolicy>::all(s.client("admin"))
        .create(&pp, &policy)
        .await
        .unwrap();
    Api::<ValidatingAdmissionPolicyBinding>::all(s.client("admin"))
        .create(&pp, &binding)
        .await
        .unwrap();
}

/// The freeze stays on an old Active for as long as it is the Standby; only taking the cluster out of HA
/// lifts it: refused while the cluster leads the pair and while its mirror duty is recorded mirroring
/// (unless its operator is asserted stopped); then the cluster is marked, its writers are accepted again,
/// and it is never a promotion target again.
#[tokio::test(start_paused = true)]
async fn only_leaving_ha_lifts_the_freeze_of_a_standby_and_it_is_never_promoted_again() {
    let p = pair().await;
    let (cfg_a, clients_a) = cmd("a", 1, &p.sa, &p.sb);
    let opts = switchover::LeaveOptions::new("decommissioned");
    let e = switchover::leave(&cfg_a, &clients_a, &opts)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("leads the pair"), "{e}");
    let token = p.demote(&demote_opts()).await.unwrap();
    p.promote(&token, Duration::from_secs(60)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let refused = p.writer.refused.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        p.writer.refused.load(Ordering::SeqCst) > refused,
        "the old Active is frozen"
    );
    let cm: Api<ConfigMap> = Api::namespaced(p.sa.client("admin"), &cfg_a.namespace);
    let recorded: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": switchover::checkpoint_name(&cfg_a)},
        "data": {"duty": "mirroring"},
    }))
    .unwrap();
    cm.create(&PostParams::default(), &recorded).await.unwrap();
    let e = switchover::leave(&cfg_a, &clients_a, &opts)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("--operator-stopped"), "{e}");
    switchover::leave(&cfg_a, &clients_a, &opts.clone().operator_stopped(true))
        .await
        .unwrap();
    let ok = p.writer.ok.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        p.writer.ok.load(Ordering::SeqCst) > ok,
        "the freeze was not lifted"
    );
    let checks = kube_shard_ha::promotion::check_promotion(
        &cfg_a,
        &p.sa.client("admin"),
        &kube_shard_ha::promotion::PromotionChecks::default(),
        kube_shard_ha::promotion::PromotionPath::Forced,
    )
    .await
    .unwrap_err();
    assert!(checks.to_string().contains("taken out of HA"), "{checks}");
    use kube_shard_ha::mirror::{KindSet, Mirror, MirrorConfig, MirrorWiring};
    let set = KindSet::builder()
        .mirrored(kinds()[0].clone())
        .allow_secrets(true)
        .build(&kinds())
        .unwrap();
    let cfg = MirrorConfig::new(ha_config("a", 1, HaMode::Standby), "b", set)
        .namespaces([CP_NS])
        .whole_builtin_kinds(true);
    let e = Mirror::start(
        cfg,
        p.sb.client("mirror"),
        p.sa.client("mirror"),
        MirrorWiring::default(),
    )
    .await
    .unwrap_err();
    assert!(e.to_string().contains("taken out of HA"), "{e}");
    p.kill();
}
