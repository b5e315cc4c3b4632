//! Two clusters' configurations checked against each other by the records they write: each record carries
//! its writer's identity (the `kube-system` uid of its cluster and its rank). One cluster id on both sides,
//! one rank on both sides, and a peer client that reaches this very cluster each hold the side that sees
//! it, with an alarm — never two Actives. Two testservers, paused time, the cross-cluster overlap checker.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kube_shard_ha::faults::Faults;
use kube_shard_ha::overlap::HaOverlap;
use kube_shard_ha::{HaMode, Timings};

use crate::elector::{no_overlap, server, start, start_labelled, Op};

fn side(
    label: &str,
    id: &str,
    rank: u64,
    mode: HaMode,
    own_peer: [&kube_shard_testserver::TestServer; 2],
    o: &HaOverlap,
) -> Op {
    start_labelled(
        label,
        id,
        rank,
        mode,
        own_peer,
        None,
        o,
        (Timings::default(), Faults::none()),
        kube_shard::rt::Clock::system(),
    )
}

/// Both clusters were given `--ha-cluster-id prod` (shared Helm values), A active at rank 1, B standby at
/// rank 2. B's own Lease then names "prod" at the highest epoch, which B took for its own term and resumed
/// (both admitted at epoch 1001 for good). Now the record's `kube-system` uid is not B's: B holds, alarmed,
/// and admits nothing; and A, reading the identity B published, holds alarmed too (a pair that can never
/// fail over is not left running silently).
#[tokio::test(start_paused = true)]
async fn ha_two_clusters_given_one_id_never_both_admit() {
    let (sa, sb) = (server().await, server().await);
    let o = HaOverlap::default();
    let a = side("site-a", "prod", 1, HaMode::Active, [&sa, &sb], &o);
    let b = side("site-b", "prod", 2, HaMode::Standby, [&sb, &sa], &o);
    tokio::time::sleep(Duration::from_secs(60)).await;
    no_overlap(&o);
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0, "B admitted");
    let st = b.control.status().await.unwrap();
    assert_eq!(st.role, "standby");
    assert!(
        st.alarm
            .as_deref()
            .is_some_and(|a| a.starts_with("IdentityConflict")),
        "{st:?}"
    );
    // A reads the identity B published (a Standby writes no record): A holds too, alarmed
    let st = a.control.status().await.unwrap();
    assert!(
        st.alarm
            .as_deref()
            .is_some_and(|a| a.starts_with("IdentityConflict")),
        "the Active never saw the Standby's identity: {st:?}"
    );
    assert!(!a.handle.is_active(), "A still admits");
    a.stop();
    b.stop();
}

/// Both clusters were given the same rank. A standby that reads the Active's record at its own rank holds,
/// alarmed, the Active that reads the Standby's published identity at its own rank holds too, and the
/// Standby refuses a forced promotion (equal ranks make equal epochs, and neither side of a healed
/// partition would step down).
#[tokio::test(start_paused = true)]
async fn ha_a_peer_at_our_rank_is_alarmed_and_never_promoted() {
    let (sa, sb) = (server().await, server().await);
    let o = HaOverlap::default();
    let a = start("a", 1, HaMode::Active, &sa, &sb, None, &o);
    let b = start("b", 1, HaMode::Standby, &sb, &sa, None, &o);
    let mut st = b.control.status().await.unwrap();
    for _ in 0..100 {
        if st.alarm.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        st = b.control.status().await.unwrap();
    }
    assert!(
        st.alarm
            .as_deref()
            .is_some_and(|a| a.starts_with("EqualRank")),
        "{st:?}"
    );
    // the Active reads the rank the Standby published: both sides hold
    assert!(!a.handle.is_active(), "A admits");
    let st_a = a.control.status().await.unwrap();
    assert!(
        st_a.alarm
            .as_deref()
            .is_some_and(|a| a.starts_with("EqualRank")),
        "{st_a:?}"
    );
    // A stops: B is armed after the wait, but a forced promotion is refused while the conflict stands
    a.stop();
    tokio::time::sleep(Duration::from_secs(60)).await;
    let r = b.control.force_promote().await;
    assert!(
        format!("{r:?}").contains("Misconfigured"),
        "a forced promotion at an equal rank: {r:?}"
    );
    assert_eq!(b.admitted.load(Ordering::SeqCst), 0);
    no_overlap(&o);
    b.stop();
}

/// The peer kubeconfig points at this very cluster (one `kube-system` uid): the "two" Leases are one, and
/// a bootstrap would make this side Active with no peer at all. It admits nothing, alarmed for good.
#[tokio::test(start_paused = true)]
async fn ha_a_peer_client_reaching_this_cluster_admits_nothing() {
    let sa = server().await;
    let o = HaOverlap::default();
    let a = start("a", 1, HaMode::Active, &sa, &sa, None, &o);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(a.admitted.load(Ordering::SeqCst), 0, "admitted");
    let st = a.control.status().await.unwrap();
    assert_eq!(st.alarm.as_deref(), Some("PeerIsThisCluster"), "{st:?}");
    a.stop();
}
