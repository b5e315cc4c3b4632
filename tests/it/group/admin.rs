//! The group read and edited from outside it (`kube_shard::group::admin`), as `kshard status`, `pin` and
//! `drain` do, with the ownership-history oracle running.

use std::time::Duration;

use kube_shard::group::admin::{AdminError, Edit, GroupRef, GroupView};
use kube_shard_testserver::Scope;

use crate::group::recovery::{owners_moved_since_a_backup, write_back};
use crate::group::{
    assignment, check_fences, each_shard_owned_once, owned_count, until, Member, CP_NS, GROUP,
    LEASE,
};

/// An edit over an older assignment written back (a restored backup) is refused while a live member has
/// applied a newer one: nothing is written, and every owner change in the committed history stays
/// justified by a release or a takeover mark once the coordinator writes over the backup.
#[tokio::test(start_paused = true)]
async fn an_edit_over_a_written_back_assignment_is_refused_and_moves_no_owner() {
    let (server, log, ms, backup) = owners_moved_since_a_backup().await;
    let newer = assignment(&server).await.unwrap().view.generation;
    // the members do not see the write-back until the edit has been tried
    for m in &ms {
        server
            .faults()
            .freeze_watches(Scope::identity(m.name.as_str()), true);
    }
    write_back(&server, backup.clone()).await;
    let g = GroupRef::new(server.client("admin"), CP_NS, GROUP);
    let stored = g.read().await.unwrap().assignment.view.generation;
    assert!(stored < newer, "the backup is older");
    let refused = g
        .edit(Edit::Pin {
            shard: 3,
            member: "a".into(),
        })
        .await;
    match refused {
        Err(AdminError::RolledBack {
            stored: s, applied, ..
        }) => {
            assert_eq!(s, stored);
            assert!(applied >= newer, "applied {applied} < {newer}");
        }
        other => panic!("an edit over a rolled-back assignment: {other:?}"),
    }
    let after = g.read().await.unwrap().assignment;
    assert_eq!(after.view.generation, stored, "the refused edit wrote");
    assert!(after.pins.is_empty());
    for m in &ms {
        server
            .faults()
            .freeze_watches(Scope::identity(m.name.as_str()), false);
    }
    tokio::time::sleep(LEASE * 2).await;
    let refs: Vec<&Member> = ms.iter().collect();
    until(Duration::from_secs(60), "every shard admitted once", || {
        each_shard_owned_once(&refs)
    })
    .await;
    // once the coordinator wrote over the backup, the same edit goes through
    let written = g
        .edit(Edit::Pin {
            shard: 3,
            member: "a".into(),
        })
        .await
        .unwrap();
    assert!(written.view.generation > newer);
    until(Duration::from_secs(60), "the pin is honoured", || {
        ms[0].handle.status().owned.contains(3)
    })
    .await;
    crate::oracle_support::check_ownership_history(&server);
    check_fences(&log);
}

/// The reader sees what the members do: every member with its Lease, the shards the assignment gives it,
/// and no shard unowned, admitted twice or owned without being served once the group settled.
#[tokio::test(start_paused = true)]
async fn the_view_of_a_settled_group_matches_its_members() {
    let (server, log, ms) = crate::support::settled_group(&["a", "b"]).await;
    tokio::time::sleep(LEASE).await;
    let v = GroupView::read(server.client("admin"), CP_NS, GROUP)
        .await
        .unwrap();
    assert_eq!(v.members.len(), 2);
    assert!(v.coordinator.is_some());
    for (m, mv) in ms.iter().zip(&v.members) {
        assert_eq!(mv.name, m.name);
        assert!(!mv.expired && mv.report_error.is_none() && !mv.stale_incarnation);
        assert_eq!(mv.owned.len(), owned_count(m), "{}", m.name);
        assert_eq!(v.holding(&m.name), owned_count(m));
    }
    assert!(v.unowned().is_empty());
    assert!(v.multi_admitted().is_empty());
    assert!(v.owned_not_serving().is_empty());
    let missing = GroupView::read(server.client("admin"), CP_NS, "no-such-group").await;
    assert!(matches!(missing, Err(AdminError::NoAssignment { .. })));
    check_fences(&log);
}
