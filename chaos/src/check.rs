//! The oracle after every schedule: the safety issue's three oracles on what was recorded, and the settle
//! checks once the faults stopped (every shard owned exactly once by a live member; every Widget's latest
//! generation reconciled by its owner).

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_shard::group::assignment::{Assignment, DATA_KEY};
use kube_shard::group::report::{MemberReport, INCARNATION, REPORT, ROLE_LABEL, TAKEN_OVER};
use kube_shard::ownership::ShardState;
use kube_shard::testing::oracles::history::{AssignmentVersion, LeaseVersion, OwnershipHistory};
use kube_shard::testing::oracles::quiescence::{FencedCommit, ObjectState};
use kube_shard::testing::oracles::{fences, history, quiescence};
use kube_shard::token::FENCE_ANNOTATION;
use kube_shard::ShardKey;
use kube_shard_testserver::{Commit, ResourceFilter, TestServer};
use serde::Serialize;

use crate::world::{shards, World, CP_NS, GROUP, NS};

/// One violation the oracle found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// `fences`, `history`, `epochs`, `unsettled`, `missed-reconcile`, `panic`.
    pub kind: String,
    /// What exactly.
    pub detail: String,
}

impl Finding {
    fn new(kind: &str, detail: impl std::fmt::Display) -> Self {
        Finding {
            kind: kind.to_owned(),
            detail: detail.to_string(),
        }
    }
}

fn assignment_filter() -> ResourceFilter {
    ResourceFilter::resource("configmaps")
        .namespace(CP_NS)
        .name(format!("{GROUP}-assignment"))
}

fn lease_filter() -> ResourceFilter {
    ResourceFilter::resource("leases").namespace(CP_NS)
}

fn widget_filter() -> ResourceFilter {
    ResourceFilter::resource("widgets").namespace(NS)
}

fn child_filter() -> ResourceFilter {
    ResourceFilter::resource("configmaps").namespace(NS)
}

/// Start recording what the oracles read (before the members start).
pub fn record(server: &TestServer) {
    server.history().record(assignment_filter());
    server.history().record(lease_filter());
    server.history().record(widget_filter());
    server.history().record(child_filter());
}

fn decode(cm: &ConfigMap) -> Option<Assignment> {
    let text = cm.data.as_ref()?.get(DATA_KEY)?;
    Assignment::decode(text, shards(), ShardKey::Uid).ok()
}

/// The assignment's and member Leases' committed history, decoded for the history oracle.
#[must_use]
pub fn ownership_history(server: &TestServer) -> OwnershipHistory {
    let assignments = server
        .history()
        .of(&assignment_filter())
        .iter()
        .filter_map(|c| {
            if c.deleted() {
                return Some(AssignmentVersion::deletion(c.resource_version));
            }
            if c.identity == crate::inject::RESTORER {
                // an older text written back: members ignore it (they apply only newer generations);
                // what the coordinators and the CLI write after it is judged
                return None;
            }
            let cm: ConfigMap = c.object_as().ok()?;
            Some(AssignmentVersion::from_assignment(
                c.resource_version,
                &decode(&cm)?,
            ))
        })
        .collect();
    let leases = server
        .history()
        .of(&lease_filter())
        .iter()
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
    if c.deleted() {
        return Some(LeaseVersion::deletion(c.resource_version, &name));
    }
    let ann = meta.annotations.unwrap_or_default();
    let report = ann
        .get(REPORT)
        .and_then(|t| MemberReport::decode(t, shards()).ok());
    Some(LeaseVersion::from_report(
        c.resource_version,
        &name,
        ann.get(INCARNATION).map(String::as_str),
        report.as_ref(),
        ann.get(TAKEN_OVER).map(String::as_str),
    ))
}

fn fenced_commits(server: &TestServer) -> Vec<FencedCommit> {
    server
        .history()
        .of(&widget_filter())
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
        .collect()
}

/// The current Widgets as the quiescence oracle's objects (`namespace/name/uid`, shard, generation).
#[must_use]
pub fn objects(server: &TestServer) -> Vec<ObjectState> {
    server
        .objects("example.kube-shard.io", "widgets")
        .iter()
        .filter_map(|o| {
            let m = &o["metadata"];
            let uid = m["uid"].as_str()?;
            Some(ObjectState {
                key: format!("{}/{}/{uid}", m["namespace"].as_str()?, m["name"].as_str()?),
                shard: shards().shard_of(kube_shard::hash::fnv1a64(uid.as_bytes())),
                generation: m["generation"].as_u64().unwrap_or(1),
            })
        })
        .collect()
}

/// Shard → names of the live members whose own state says Owned.
#[must_use]
pub fn owned_by(w: &World) -> BTreeMap<u32, Vec<String>> {
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for i in w.live() {
        let m = &w.members[i];
        let state = kube_shard::testing::member_state(&m.handle.ownership());
        for (s, st) in state.shards() {
            if matches!(st, ShardState::Owned { .. }) {
                out.entry(s).or_default().push(m.name.clone());
            }
        }
    }
    out
}

/// What the settle check sees now: `Ok(owners)` when every shard is owned by exactly one live member
/// and every Widget's latest generation was reconciled by it; else what is still wrong.
pub fn settled(w: &World) -> Result<BTreeMap<u32, String>, Vec<Finding>> {
    let owned = owned_by(w);
    let mut out = Vec::new();
    for s in 0..shards().get() {
        match owned.get(&s).map(Vec::as_slice) {
            Some([_]) => {}
            None | Some([]) => out.push(Finding::new("unsettled", format!("shard {s} unowned"))),
            Some(many) => out.push(Finding::new(
                "unsettled",
                format!("shard {s} owned by {many:?}"),
            )),
        }
    }
    if !out.is_empty() {
        return Err(out);
    }
    let owners: BTreeMap<u32, String> = owned.into_iter().map(|(s, v)| (s, v[0].clone())).collect();
    let recs = w
        .reconciles
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let missed = quiescence::check_reconciled(&objects(&w.server), &owners, &recs);
    if missed.is_empty() {
        Ok(owners)
    } else {
        Err(missed
            .iter()
            .map(|v| Finding::new("missed-reconcile", v))
            .collect())
    }
}

/// The three safety oracles on the whole run; returns the findings and the number of checks run.
#[must_use]
pub fn safety(w: &World) -> (Vec<Finding>, usize) {
    let mut out: Vec<Finding> = fences::check(&w.fences.history())
        .iter()
        .map(|v| Finding::new("fences", v))
        .collect();
    let h = ownership_history(&w.server);
    out.extend(
        history::check(&h)
            .iter()
            .map(|v| Finding::new("history", v)),
    );
    out.extend(
        quiescence::check_epochs(&fenced_commits(&w.server))
            .iter()
            .map(|v| Finding::new("epochs", v)),
    );
    out.extend(
        check_children(&w.server)
            .into_iter()
            .map(|v| Finding::new("regressed", v)),
    );
    (out, 4)
}

/// No stale actuation: per child ConfigMap and per Widget uid its data names (`widgetUid`; a delete +
/// re-create under one name shares the child), the Widget generation its committed data reflects
/// (`widgetGeneration`) never goes back. A member that reconciles from a cache older than the previous
/// owner's last write (what the activation barrier prevents) writes an older spec over a newer one: its
/// child replace carries the child's current resourceVersion, so no precondition stops it.
#[must_use]
pub fn check_children(server: &TestServer) -> Vec<String> {
    let mut highest: BTreeMap<(String, String), (u64, u64, String)> = BTreeMap::new();
    let mut out = Vec::new();
    for c in server.history().of(&child_filter()) {
        if c.deleted() {
            continue;
        }
        let data = |k: &str| {
            c.object
                .pointer(&format!("/data/{k}"))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        let (Some(widget), Some(g)) = (
            data("widgetUid"),
            data("widgetGeneration").and_then(|v| v.parse::<u64>().ok()),
        ) else {
            continue;
        };
        let key = (c.uid.clone(), widget);
        match highest.get(&key) {
            Some((max, at, by)) if g < *max => out.push(format!(
                "child {}: widgetGeneration {g} committed at rv {} by {} ({:?}, fence {:?}) after {max} at rv {at} by {by}",
                c.name, c.resource_version, c.identity, c.verb, c.fence
            )),
            Some((max, _, _)) if g == *max => {}
            _ => {
                highest.insert(key, (g, c.resource_version, c.identity.clone()));
            }
        }
    }
    out
}
