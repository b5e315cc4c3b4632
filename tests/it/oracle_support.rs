//! The testserver side of the ownership-history and quiescence oracles (`kube_shard::testing::oracles`): record the
//! committed history of the group's assignment ConfigMap and Leases (and of written objects), and decode it
//! into the oracles' input. The checkers live in the library, which cannot depend on testserver.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_shard::group::assignment::{Assignment, DATA_KEY};
use kube_shard::group::report::{MemberReport, INCARNATION, REPORT, ROLE_LABEL, TAKEN_OVER};
use kube_shard::testing::oracles::history::{
    assert_justified, check, owner_changes, AssignmentVersion, LeaseVersion, OwnershipHistory,
};
use kube_shard::testing::oracles::quiescence::FencedCommit;
use kube_shard::token::FENCE_ANNOTATION;
use kube_shard::ShardKey;
use kube_shard_testserver::{Commit, ResourceFilter, TestServer};

use crate::group::{s, CP_NS, GROUP};

fn assignment_filter() -> ResourceFilter {
    ResourceFilter::resource("configmaps")
        .namespace(CP_NS)
        .name(format!("{GROUP}-assignment"))
}

fn lease_filter() -> ResourceFilter {
    ResourceFilter::resource("leases").namespace(CP_NS)
}

/// Start recording the group's assignment and Leases (call before the members start).
pub(crate) fn record_group(server: &TestServer) {
    server.history().record(assignment_filter());
    server.history().record(lease_filter());
}

/// The recorded history, decoded. A version of the assignment that does not decode (a corrupt write) is
/// skipped: members keep their last good view, so it changes no owner; a deletion is
/// [`AssignmentVersion::deletion`] (the last known owners stay).
pub(crate) fn ownership_history(server: &TestServer) -> OwnershipHistory {
    let assignments = server
        .history()
        .of(&assignment_filter())
        .iter()
        .filter_map(|c| {
            if c.deleted() {
                return Some(AssignmentVersion::deletion(c.resource_version));
            }
            let cm: ConfigMap = c.object_as().ok()?;
            let text = cm.data?.get(DATA_KEY)?.clone();
            let a = Assignment::decode(&text, s(), ShardKey::Uid).ok()?;
            Some(AssignmentVersion::from_assignment(c.resource_version, &a))
        })
        .collect();
    let leases = server
        .history()
        .of(&lease_filter())
        .iter()
        .filter(|c| !c.deleted())
        .filter_map(member_lease)
        .collect();
    OwnershipHistory {
        assignments,
        leases,
    }
}

fn member_lease(c: &Commit) -> Option<LeaseVersion> {
    let lease: Lease = c.object_as().ok()?;
    let meta = lease.metadata;
    if meta.labels.as_ref()?.get(ROLE_LABEL)? != "member" {
        return None;
    }
    let name = meta.name?.strip_prefix(&format!("{GROUP}-"))?.to_owned();
    let ann = meta.annotations.unwrap_or_default();
    let report = ann
        .get(REPORT)
        .and_then(|t| MemberReport::decode(t, s()).ok());
    Some(LeaseVersion::from_report(
        c.resource_version,
        &name,
        ann.get(INCARNATION).map(String::as_str),
        report.as_ref(),
        ann.get(TAKEN_OVER).map(String::as_str),
    ))
}

/// The ownership-history oracle on what was recorded; returns the number of owner changes it judged.
pub(crate) fn check_ownership_history(server: &TestServer) -> usize {
    let h = ownership_history(server);
    assert!(
        !h.assignments.is_empty(),
        "no assignment version recorded: was record_group called before the members started?"
    );
    if !check(&h).is_empty() {
        eprintln!(
            "ownership history oracle: the run's committed history is in {}",
            dump_timeline(server)
        );
    }
    assert_justified(&h);
    let changes = owner_changes(&h);
    eprintln!(
        "ownership history: {} assignment and {} lease versions, {changes} owner changes, all justified",
        h.assignments.len(),
        h.leases.len()
    );
    changes
}

/// Write the recorded assignment and Lease commits (rv, writer, object, and the assignment's or report's
/// text) one per line to a file in the temporary directory, for reading a violation's interleaving; returns
/// its path.
fn dump_timeline(server: &TestServer) -> String {
    let mut commits: Vec<Commit> = server.history().of(&assignment_filter());
    commits.extend(server.history().of(&lease_filter()));
    commits.sort_by_key(|c| c.resource_version);
    let mut text = String::new();
    for c in &commits {
        let ann = c.object.pointer("/metadata/annotations");
        let pick = |k: &str| ann.and_then(|a| a.get(k)).and_then(|v| v.as_str());
        let body = if c.name.ends_with("-assignment") {
            c.object
                .pointer(&format!("/data/{DATA_KEY}"))
                .and_then(|v| v.as_str())
                .unwrap_or("-")
                .to_owned()
        } else {
            format!(
                "renew={} inc={} taken-over={} report={}",
                c.object
                    .pointer("/spec/renewTime")
                    .and_then(|v| v.as_str())
                    .unwrap_or("-"),
                pick(INCARNATION).unwrap_or("-"),
                pick(TAKEN_OVER).unwrap_or("-"),
                pick(REPORT).unwrap_or("-"),
            )
        };
        let change = if c.deleted() { " DELETED" } else { "" };
        text.push_str(&format!(
            "{} {} by {}{change}: {body}\n",
            c.resource_version, c.name, c.identity
        ));
    }
    let path = std::env::temp_dir().join(format!(
        "kube-shard-history-{}-{}.txt",
        std::process::id(),
        commits.last().map_or(0, |c| c.resource_version)
    ));
    match std::fs::write(&path, text) {
        Ok(()) => path.display().to_string(),
        Err(e) => format!("(not written: {e})"),
    }
}

/// Every recorded commit that `filter` covers, as the fence-epoch oracle's input (the raw
/// `kube-shard.io/fence` annotation of each committed version).
pub(crate) fn fenced_commits(server: &TestServer, filter: &ResourceFilter) -> Vec<FencedCommit> {
    server
        .history()
        .of(filter)
        .iter()
        .map(|c| FencedCommit {
            rv: c.resource_version,
            uid: c.uid.clone(),
            fence: c
                .object
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(FENCE_ANNOTATION))
                .and_then(|v| v.as_str())
                .map(str::to_owned),
        })
        .collect::<Vec<_>>()
}

/// The owner name of each shard in the final assignment.
pub(crate) fn final_owners(a: &Assignment) -> BTreeMap<u32, String> {
    a.view
        .shards
        .iter()
        .map(|(s, sa)| (*s, sa.owner.name.to_string()))
        .collect()
}
