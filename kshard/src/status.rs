//! `kshard status`: a live shard group as its objects show it — members, coordinator, generation, moves,
//! unowned shards, the ring — read through the library's one reader (`GroupView`: the assignment ConfigMap
//! `<group>-assignment`, the member Leases `<group>-<name>` with their reports, the coordinator Lease
//! `<group>-coordinator`). `S` and the key are taken from the assignment itself.
//!
//! A member whose requests the API server refuses (401, 403) says so in its Lease, and the status shows it;
//! a group with no assignment says which RBAC is likely missing: no member Lease at all (the Leases cannot
//! be created), or members but no assignment (the coordinator cannot write it).

use std::collections::BTreeMap;
use std::io::Write;

use kube::Client;
use kube_shard::group::admin::{AdminError, GroupRef, GroupView, MemberLease};
use kube_shard::group::assignment::Handoff;
use serde::Serialize;

use crate::cli::CliError;
use crate::ops::GroupArgs;

/// One member as the status shows it.
#[derive(Debug, Serialize)]
pub(crate) struct MemberStatus {
    pub(crate) name: String,
    pub(crate) incarnation: String,
    pub(crate) ready: bool,
    pub(crate) leaving: bool,
    /// Drained by `kshard drain`: planned with quota 0 until `kshard undrain`.
    pub(crate) drained: bool,
    /// Not renewed within its `leaseDurationSeconds` (by this machine's clock): its report is stale and
    /// does not count toward multi-owned shards.
    pub(crate) expired: bool,
    /// Seconds since `spec.renewTime` (by this machine's clock).
    pub(crate) lease_age_seconds: Option<f64>,
    pub(crate) owned: usize,
    pub(crate) owned_shards: String,
    pub(crate) admitted: String,
    pub(crate) serving: String,
    pub(crate) applied_generation: u64,
    /// Its incarnation is not the one the assignment names for its shards (a restart not yet seen).
    pub(crate) stale_incarnation: bool,
    /// A request of the group the API server refuses this member (401, 403), as its Lease says.
    pub(crate) permission_error: Option<String>,
}

/// The group as `kshard status` shows it.
#[derive(Debug, Serialize)]
pub(crate) struct GroupStatusView {
    pub(crate) group: String,
    pub(crate) namespace: String,
    pub(crate) shards: u32,
    pub(crate) key: String,
    pub(crate) coordinator: Option<String>,
    pub(crate) generation: u64,
    pub(crate) paused: bool,
    /// Members drained by `kshard drain` (by name).
    pub(crate) drained: Vec<String>,
    pub(crate) moves_in_flight: usize,
    pub(crate) members: Vec<MemberStatus>,
    /// Shards without an owner in the assignment.
    pub(crate) unowned: String,
    pub(crate) unowned_count: usize,
    /// Shards admitted by more than one member (per their reports).
    pub(crate) multi_owned: String,
    pub(crate) multi_owned_count: usize,
    /// Shards owned (stable) in the assignment that their owner's report does not serve.
    pub(crate) owned_not_serving: String,
    pub(crate) owned_not_serving_count: usize,
    /// The ring: one character per 1/64 of the hash space, a letter per member (`.` unowned, upper case
    /// while moving).
    pub(crate) ring: String,
    pub(crate) legend: BTreeMap<String, String>,
}

/// Read the group's state ([`GroupView`], the library's one reader) and lay it out for printing; without
/// an assignment, say why there is none.
pub(crate) async fn read_group(
    client: Client,
    namespace: &str,
    group: &str,
) -> Result<GroupStatusView, CliError> {
    let g = GroupRef::new(client, namespace, group);
    match g.read().await {
        Ok(v) => Ok(status_view(&v)),
        Err(AdminError::NoAssignment { .. }) => {
            let members: Vec<(String, Option<String>)> = g
                .member_leases()
                .await?
                .into_iter()
                .map(|m: MemberLease| (m.name, m.permission_error))
                .collect();
            Err(no_assignment(group, namespace, &members).into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Why a group has no assignment ConfigMap, by the member Leases present (each member's name and the
/// refusal its Lease reports).
fn no_assignment(
    group: &str,
    namespace: &str,
    members: &[(String, Option<String>)],
) -> StatusError {
    let (group, namespace) = (group.to_owned(), namespace.to_owned());
    if members.is_empty() {
        return StatusError::NoMembers { group, namespace };
    }
    let names: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
    let reported: String = members
        .iter()
        .filter_map(|(n, p)| Some(format!("\n  {n}: {}", p.as_ref()?)))
        .collect();
    StatusError::NoAssignment {
        group,
        namespace,
        members: names.join(", "),
        reported,
    }
}

/// A group `kshard status` cannot show, with what is likely missing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StatusError {
    /// Neither an assignment nor a member Lease.
    #[error("group {group:?} has no assignment ConfigMap and no member Lease in namespace {namespace}: no member has joined. If its replicas are running, they likely lack RBAC to create Leases there: the group's Role needs get, list, watch, create, update and delete on leases in API group coordination.k8s.io in namespace {namespace} (see deploy/rbac.yaml; the replicas log \"forbidden: cannot create coordination.k8s.io/leases ...\"). Else the group name or the namespace is wrong.")]
    NoMembers { group: String, namespace: String },
    /// Member Leases, but no assignment.
    #[error("group {group:?} in namespace {namespace} has members ({members}) but no assignment ConfigMap {group}-assignment: either a cold start is still settling (seconds), or the coordinator cannot write it: the group's Role needs get, list, watch, create and update on configmaps in API group \"\" in namespace {namespace} (see deploy/rbac.yaml).{reported}")]
    NoAssignment {
        group: String,
        namespace: String,
        members: String,
        /// Each member's own report of a refusal, one per line.
        reported: String,
    },
}

fn status_view(v: &GroupView) -> GroupStatusView {
    let a = &v.assignment;
    let members: Vec<MemberStatus> = v
        .members
        .iter()
        .map(|m| MemberStatus {
            name: m.name.clone(),
            incarnation: m.incarnation.clone(),
            ready: m.report.ready,
            leaving: m.report.leaving,
            drained: m.drained,
            expired: m.expired,
            lease_age_seconds: m.lease_age.map(|d| (d.as_secs_f64() * 10.0).round() / 10.0),
            owned: m.owned.len(),
            owned_shards: m.owned.to_string(),
            admitted: m.report.admitted.to_string(),
            serving: m.report.serving.to_string(),
            applied_generation: m.report.applied_generation,
            stale_incarnation: m.stale_incarnation,
            permission_error: m.permission_error.clone(),
        })
        .collect();
    let (unowned, multi, not_serving) = (v.unowned(), v.multi_admitted(), v.owned_not_serving());
    let (ring, legend) = ring(v);
    GroupStatusView {
        group: v.group.clone(),
        namespace: v.namespace.clone(),
        shards: a.shards.get(),
        key: a.key.to_string(),
        coordinator: v.coordinator.clone(),
        generation: a.view.generation,
        paused: a.paused,
        drained: a.drained.iter().cloned().collect(),
        moves_in_flight: a.moves_in_flight(),
        members,
        unowned_count: unowned.len(),
        unowned: unowned.to_string(),
        multi_owned_count: multi.len(),
        multi_owned: multi.to_string(),
        owned_not_serving_count: not_serving.len(),
        owned_not_serving: not_serving.to_string(),
        ring,
        legend,
    }
}

/// The ring: one character per 1/64 of the hash space, a letter per member (`.` unowned, upper case while
/// moving), and the legend.
fn ring(v: &GroupView) -> (String, BTreeMap<String, String>) {
    let a = &v.assignment;
    let mut names: Vec<String> = a
        .view
        .shards
        .values()
        .map(|sa| sa.owner.name.to_string())
        .collect();
    names.extend(v.members.iter().map(|m| m.name.clone()));
    names.sort();
    names.dedup();
    let mut legend = BTreeMap::new();
    let mut letter_of: BTreeMap<String, char> = BTreeMap::new();
    for (i, n) in names.iter().enumerate() {
        let c = (b'a' + (i % 26) as u8) as char;
        letter_of.insert(n.clone(), c);
        legend.insert(c.to_string(), n.clone());
    }
    let cells = 64usize;
    let ring = (0..cells)
        .map(|cell| {
            let shard = (cell * a.shards.get() as usize / cells) as u32;
            match a.view.shards.get(&shard) {
                None => '.',
                Some(sa) => {
                    let c = letter_of
                        .get(sa.owner.name.as_ref())
                        .copied()
                        .unwrap_or('?');
                    if sa.handoff == Handoff::Stable {
                        c
                    } else {
                        c.to_ascii_uppercase()
                    }
                }
            }
        })
        .collect();
    (ring, legend)
}

/// `kshard status`.
pub(crate) fn status(args: &GroupArgs, out: &mut impl Write) -> Result<(), CliError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let view = rt.block_on(async {
        let client = crate::operator::client_from(args.kubeconfig.as_deref()).await?;
        read_group(client, &args.namespace, &args.group).await
    })?;
    if args.json {
        serde_json::to_writer(&mut *out, &view)?;
        writeln!(out)?;
        return Ok(());
    }
    print_status(&view, out)
}

fn print_status(view: &GroupStatusView, out: &mut impl Write) -> Result<(), CliError> {
    writeln!(
        out,
        "group {}/{}  S={} key={}  generation {}{}  coordinator {}  moves in flight {}",
        view.namespace,
        view.group,
        view.shards,
        view.key,
        view.generation,
        if view.paused { " (paused)" } else { "" },
        view.coordinator.as_deref().unwrap_or("-"),
        view.moves_in_flight
    )?;
    writeln!(
        out,
        "{:<24} {:<10} {:>5} {:>8} {:>6}  OWNED SHARDS",
        "MEMBER", "INCARN", "READY", "LEASE", "OWNED"
    )?;
    for m in &view.members {
        let inc: String = m.incarnation.chars().take(8).collect();
        writeln!(
            out,
            "{:<24} {:<10} {:>5} {:>8} {:>6}  {}{}",
            m.name,
            inc,
            if m.ready { "yes" } else { "no" },
            m.lease_age_seconds
                .map_or_else(|| "-".to_owned(), |a| format!("{a:.1}s")),
            m.owned,
            m.owned_shards,
            match (m.expired, m.leaving, m.drained) {
                (true, _, _) => "  (expired)",
                (false, true, _) => "  (leaving)",
                (false, false, true) => "  (drained)",
                (false, false, false) => "",
            }
        )?;
    }
    writeln!(
        out,
        "unowned {} [{}]  multi-owned {} [{}]  owned-not-serving {} [{}]",
        view.unowned_count,
        view.unowned,
        view.multi_owned_count,
        view.multi_owned,
        view.owned_not_serving_count,
        view.owned_not_serving
    )?;
    let legend: Vec<String> = view
        .legend
        .iter()
        .map(|(c, n)| format!("{c}={n}"))
        .collect();
    writeln!(out, "ring 0 |{}| 2^64   {}", view.ring, legend.join(" "))?;
    for m in &view.members {
        if let Some(p) = &m.permission_error {
            writeln!(out, "{}: {p}", m.name)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_member_lease_points_at_the_lease_rbac() {
        let text = no_assignment("widgets", "ops", &[]).to_string();
        assert!(
            text.contains("no member Lease in namespace ops")
                && text.contains("leases in API group coordination.k8s.io")
                && text.contains("deploy/rbac.yaml"),
            "{text}"
        );
    }

    #[test]
    fn members_without_an_assignment_point_at_the_configmap_rbac_and_say_what_they_report() {
        let members = vec![
            (
                "a".to_owned(),
                Some("forbidden: cannot create configmaps in namespace ops".to_owned()),
            ),
            ("b".to_owned(), None),
        ];
        let text = no_assignment("widgets", "ops", &members).to_string();
        assert!(
            text.contains("has members (a, b)") && text.contains("configmaps in API group \"\""),
            "{text}"
        );
        assert!(
            text.ends_with("\n  a: forbidden: cannot create configmaps in namespace ops"),
            "{text}"
        );
    }
}
