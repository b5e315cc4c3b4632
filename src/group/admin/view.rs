//! The group as read from outside it: the assignment, each member's Lease and report, the coordinator.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::ListParams;
use kube::Client;

use super::types::{AdminError, GroupRef};
use crate::group::assignment::{Assignment, Handoff, DATA_KEY};
use crate::group::permission::PERMISSION_ERROR;
use crate::group::report::{lease_age, MemberReport, GROUP_LABEL, INCARNATION, REPORT, ROLE_LABEL};
use crate::shard::ShardSet;

/// One member as its Lease shows it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MemberView {
    /// Its name (the Lease's name without the group's prefix).
    pub name: String,
    /// The incarnation its Lease names.
    pub incarnation: String,
    /// Its report; the default when it has none or it cannot be decoded ([`report_error`](Self::report_error)).
    pub report: MemberReport,
    /// Why its report could not be decoded, if so.
    pub report_error: Option<String>,
    /// Time since its `renewTime` on the reader's wall clock (`None`: never renewed).
    pub lease_age: Option<Duration>,
    /// Its `leaseDurationSeconds` (15 s when unset).
    pub lease_duration: Duration,
    /// Not renewed within its duration: its report is stale and counts for nothing.
    pub expired: bool,
    /// The shards the assignment gives to its name.
    pub owned: ShardSet,
    /// The assignment names another incarnation of it for its shards (a restart not yet seen).
    pub stale_incarnation: bool,
    /// Named in the assignment's drained members.
    pub drained: bool,
    /// A request of the group the API server refuses this member (401, 403), as its Lease says
    /// ([`PERMISSION_ERROR`]).
    pub permission_error: Option<String>,
}

/// A member Lease of a group, read without the assignment (which may be missing).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemberLease {
    /// The member's name (the Lease's name without the group's prefix).
    pub name: String,
    /// A request of the group the API server refuses this member (401, 403), as its Lease says
    /// ([`PERMISSION_ERROR`]).
    pub permission_error: Option<String>,
}

/// A group as read at one moment: the assignment, the coordinator and the members, by name.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct GroupView {
    /// The group.
    pub group: String,
    /// Its namespace.
    pub namespace: String,
    /// The assignment, decoded with the `S` and key it states.
    pub assignment: Assignment,
    /// The holder of the coordinator Lease, if any.
    pub coordinator: Option<String>,
    /// Every member Lease, sorted by name.
    pub members: Vec<MemberView>,
}

impl GroupView {
    /// Read the group `group` in `namespace` on the system clock ([`GroupRef::read`] for another).
    pub async fn read(client: Client, namespace: &str, group: &str) -> Result<Self, AdminError> {
        GroupRef::new(client, namespace, group).read().await
    }

    /// The members renewed within their duration.
    pub fn live(&self) -> impl Iterator<Item = &MemberView> + '_ {
        self.members.iter().filter(|m| !m.expired)
    }

    /// Shards without an owner in the assignment.
    #[must_use]
    pub fn unowned(&self) -> ShardSet {
        self.assignment.unowned()
    }

    /// Shards more than one live member reports admitting.
    #[must_use]
    pub fn multi_admitted(&self) -> ShardSet {
        let mut count: BTreeMap<u32, usize> = BTreeMap::new();
        for m in self.live() {
            for s in m.report.admitted.iter() {
                *count.entry(s).or_default() += 1;
            }
        }
        count
            .into_iter()
            .filter(|(_, n)| *n > 1)
            .map(|(s, _)| s)
            .collect()
    }

    /// Shards owned and not moving in the assignment whose owner (live, by name) does not report serving
    /// them.
    #[must_use]
    pub fn owned_not_serving(&self) -> ShardSet {
        let serving: BTreeMap<&str, &ShardSet> = self
            .live()
            .map(|m| (m.name.as_str(), &m.report.serving))
            .collect();
        self.assignment
            .view
            .shards
            .iter()
            .filter(|(_, sa)| sa.handoff == Handoff::Stable)
            .filter(|(s, sa)| {
                !serving
                    .get(sa.owner.name.as_ref())
                    .is_some_and(|set| set.contains(**s))
            })
            .map(|(s, _)| *s)
            .collect()
    }

    /// Shards the member named `member` owns or is receiving in the assignment.
    #[must_use]
    pub fn holding(&self, member: &str) -> usize {
        self.assignment.holding(member)
    }
}

impl GroupRef {
    /// Read the group: its assignment (refused when absent or undecodable), then its Leases.
    pub async fn read(&self) -> Result<GroupView, AdminError> {
        let (_, assignment) = self.fetch().await?;
        let list = self.list_leases().await?;
        let now_ms = self.now_ms();
        let mut coordinator = None;
        let mut members = Vec::new();
        for lease in &list {
            let labels = lease.metadata.labels.clone().unwrap_or_default();
            if labels.get(ROLE_LABEL).is_some_and(|r| r == "coordinator") {
                coordinator = lease
                    .spec
                    .as_ref()
                    .and_then(|s| s.holder_identity.clone())
                    .filter(|h| !h.is_empty());
                continue;
            }
            if let Some(m) = self.member_view(lease, &assignment, now_ms) {
                members.push(m);
            }
        }
        members.sort_by(|x, y| x.name.cmp(&y.name));
        Ok(GroupView {
            group: self.group.clone(),
            namespace: self.namespace.clone(),
            assignment,
            coordinator,
            members,
        })
    }

    fn member_view(&self, lease: &Lease, a: &Assignment, now_ms: i64) -> Option<MemberView> {
        let prefix = format!("{}-", self.group);
        let name = lease.metadata.name.as_deref()?.strip_prefix(&prefix)?;
        let ann = lease.metadata.annotations.clone().unwrap_or_default();
        let incarnation = ann.get(INCARNATION).cloned().unwrap_or_default();
        let (report, report_error) = match ann.get(REPORT) {
            None => (MemberReport::default(), None),
            Some(t) => match MemberReport::decode(t, a.shards) {
                Ok(r) => (r, None),
                Err(e) => (MemberReport::default(), Some(e.to_string())),
            },
        };
        let (lease_age, lease_duration) = lease_age(lease.spec.as_ref(), now_ms);
        let expired = lease_age.is_none_or(|age| age > lease_duration);
        let owned: ShardSet = a
            .view
            .shards
            .iter()
            .filter(|(_, sa)| sa.owner.name.as_ref() == name)
            .map(|(s, _)| *s)
            .collect();
        let stale_incarnation = a
            .view
            .shards
            .values()
            .any(|sa| sa.owner.name.as_ref() == name && *sa.owner.incarnation != *incarnation);
        Some(MemberView {
            name: name.to_owned(),
            incarnation,
            report,
            report_error,
            lease_age,
            lease_duration,
            expired,
            owned,
            stale_incarnation,
            drained: a.drained.contains(name),
            permission_error: ann.get(PERMISSION_ERROR).cloned(),
        })
    }

    /// The group's member Leases (not the coordinator's), sorted by name, without reading the assignment:
    /// what can be said of a group whose assignment is missing (no member has joined, or none could
    /// write it).
    pub async fn member_leases(&self) -> Result<Vec<MemberLease>, AdminError> {
        let prefix = format!("{}-", self.group);
        let mut members: Vec<MemberLease> = self
            .list_leases()
            .await?
            .iter()
            .filter(|l| {
                let role = l.metadata.labels.as_ref().and_then(|l| l.get(ROLE_LABEL));
                role.is_none_or(|r| r != "coordinator")
            })
            .filter_map(|l| {
                let name = l.metadata.name.as_deref()?.strip_prefix(&prefix)?;
                let ann = l.metadata.annotations.as_ref();
                Some(MemberLease {
                    name: name.to_owned(),
                    permission_error: ann.and_then(|a| a.get(PERMISSION_ERROR)).cloned(),
                })
            })
            .collect();
        members.sort_by(|x, y| x.name.cmp(&y.name));
        Ok(members)
    }

    /// Read only the assignment, decoded with the `S` and key it states.
    pub async fn assignment(&self) -> Result<Assignment, AdminError> {
        Ok(self.fetch().await?.1)
    }

    /// The assignment ConfigMap and what it decodes to; refused when absent or undecodable.
    pub(super) async fn fetch(&self) -> Result<(ConfigMap, Assignment), AdminError> {
        let name = self.assignment_name();
        let cm = self
            .cms
            .get_opt(&name)
            .await
            .map_err(|error| AdminError::Api {
                what: format!("reading {}/{name}", self.namespace),
                error,
            })?
            .ok_or_else(|| AdminError::NoAssignment {
                namespace: self.namespace.clone(),
                name: name.clone(),
                group: self.group.clone(),
            })?;
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(DATA_KEY))
            .ok_or_else(|| AdminError::Undecodable {
                name: name.clone(),
                why: format!("no data key {DATA_KEY:?}"),
            })?;
        let a = Assignment::decode_stated(text).map_err(|e| AdminError::Undecodable {
            name: name.clone(),
            why: e.to_string(),
        })?;
        Ok((cm, a))
    }

    pub(super) async fn list_leases(&self) -> Result<Vec<Lease>, AdminError> {
        let labels = format!("{GROUP_LABEL}={}", self.group);
        self.leases
            .list(&ListParams::default().labels(&labels))
            .await
            .map(|l| l.items)
            .map_err(|error| AdminError::Api {
                what: "listing the group's Leases".to_owned(),
                error,
            })
    }
}
