//! A group as the demo and the end-to-end suite judge it: read through the library's reader
//! (`group::admin::GroupView`), with the sets their scenarios wait on.

use std::collections::{BTreeMap, BTreeSet};

use kube::Client;
use kube_shard::group::admin::GroupView;
use kube_shard::group::assignment::Assignment;
use kube_shard::group::report::MemberReport;
use kube_shard::ownership::MemberId;
use kube_shard::{ShardCount, ShardSet};

/// The assignment, the member Leases and the coordinator at one moment.
#[derive(Clone, Debug)]
pub struct GroupSnap {
    /// `S` (the group's, when the assignment could not be read).
    pub shards: ShardCount,
    pub assignment: Option<Assignment>,
    /// name → (incarnation, report; `None` when its report could not be decoded)
    pub members: BTreeMap<String, (String, Option<MemberReport>)>,
    /// The coordinator's name (without its incarnation).
    pub coordinator: Option<String>,
}

impl GroupSnap {
    /// Nothing read yet.
    #[must_use]
    pub fn empty(shards: ShardCount) -> Self {
        GroupSnap {
            shards,
            assignment: None,
            members: BTreeMap::new(),
            coordinator: None,
        }
    }

    /// The group `group` in `namespace` now; empty before it has an assignment (or when it cannot be
    /// read).
    pub async fn read(client: Client, namespace: &str, group: &str, shards: ShardCount) -> Self {
        let mut g = GroupSnap::empty(shards);
        if let Ok(v) = GroupView::read(client, namespace, group).await {
            // the holder may be `name` or `name/incarnation`
            g.coordinator = v
                .coordinator
                .map(|h| h.split('/').next().unwrap_or_default().to_owned());
            for m in v.members {
                let report = m.report_error.is_none().then_some(m.report);
                g.members.insert(m.name, (m.incarnation, report));
            }
            g.shards = v.assignment.shards;
            g.assignment = Some(v.assignment);
        }
        g
    }

    /// Shard → owner name.
    #[must_use]
    pub fn owners(&self) -> Vec<Option<String>> {
        let mut v = vec![None; self.shards.get() as usize];
        if let Some(a) = &self.assignment {
            for (shard, sa) in &a.view.shards {
                if let Some(slot) = v.get_mut(*shard as usize) {
                    *slot = Some(sa.owner.name.to_string());
                }
            }
        }
        v
    }

    /// The owner of `shard`.
    #[must_use]
    pub fn owner(&self, shard: u32) -> Option<&MemberId> {
        self.assignment
            .as_ref()
            .and_then(|a| a.view.shards.get(&shard))
            .map(|sa| &sa.owner)
    }

    /// The epoch of `shard`.
    #[must_use]
    pub fn epoch(&self, shard: u32) -> Option<u64> {
        self.assignment
            .as_ref()
            .and_then(|a| a.view.shards.get(&shard))
            .map(|sa| sa.epoch)
    }

    /// The shards the assignment gives to the member named `name`.
    #[must_use]
    pub fn owned_by(&self, name: &str) -> BTreeSet<u32> {
        self.assignment
            .as_ref()
            .map(|a| {
                a.view
                    .shards
                    .iter()
                    .filter(|(_, sa)| sa.owner.name.as_ref() == name)
                    .map(|(s, _)| *s)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The shards `names` admit, as published in their Leases.
    #[must_use]
    pub fn admitted_by(&self, names: &[String]) -> BTreeSet<u32> {
        names
            .iter()
            .filter_map(|n| self.members.get(n))
            .filter_map(|(_, r)| r.as_ref())
            .flat_map(|r| r.admitted.iter().collect::<Vec<_>>())
            .collect()
    }

    /// The member id (name/incarnation) a Lease names.
    #[must_use]
    pub fn member_id(&self, name: &str) -> Option<MemberId> {
        self.members
            .get(name)
            .map(|(inc, _)| MemberId::new(name, inc.as_str()))
    }

    /// Shards whose owner (by name) differs in `after`.
    #[must_use]
    pub fn moved(&self, after: &GroupSnap) -> u64 {
        let b = self.owners();
        b.iter()
            .zip(after.owners())
            .filter(|(b, a)| **b != *a)
            .count() as u64
    }

    /// The least any plan must move from these owners to the members `next` (equal weights): the
    /// library's [`optimal_moves`](kube_shard::group::optimal_moves), counting the shards of members not
    /// in `next` and unowned shards. `None` when the library finds no optimum for the input.
    #[must_use]
    pub fn optimal_moves(&self, next: &[String]) -> Option<u64> {
        let ids: Vec<MemberId> = next
            .iter()
            .map(|n| {
                self.member_id(n)
                    .unwrap_or_else(|| MemberId::new(n.as_str(), "joining"))
            })
            .collect();
        let owners = self.assignment.iter().flat_map(Assignment::owners);
        kube_shard::group::optimal_moves(self.shards, owners, ids.iter().map(|m| (m, 1)))
    }

    /// Settled over exactly `live`: every shard owned by a live member at its current incarnation, no
    /// moves, every live member applied the assignment and admits exactly what it owns (and owns
    /// something, when there are at least as many shards as members).
    #[must_use]
    pub fn settled(&self, live: &[String]) -> bool {
        let Some(a) = &self.assignment else {
            return false;
        };
        if a.view.shards.len() != self.shards.get() as usize || a.moves_in_flight() != 0 {
            return false;
        }
        let owners_live = a.view.shards.values().all(|sa| {
            let name = sa.owner.name.as_ref();
            live.iter().any(|l| l == name)
                && matches!(self.members.get(name),
                    Some((inc, _)) if inc.as_str() == sa.owner.incarnation.as_ref())
        });
        let every_one_some = (self.shards.get() as usize) >= live.len();
        owners_live
            && live.iter().all(|name| {
                let owned: ShardSet = self.owned_by(name).into_iter().collect();
                matches!(self.members.get(name), Some((_, Some(r)))
                    if !(owned.is_empty() && every_one_some)
                        && r.applied_generation == a.view.generation
                        && r.admitted == owned)
            })
    }

    /// One line for a failure message: generation, shards assigned, moves, coordinator, members.
    #[must_use]
    pub fn describe(&self) -> String {
        let a = self.assignment.as_ref();
        let members: Vec<String> = self
            .members
            .iter()
            .map(|(n, (inc, r))| {
                let owned = self.owned_by(n).len();
                match r {
                    Some(r) => format!(
                        "{n}/{inc} owns {owned} admits {} applied {}",
                        r.admitted.len(),
                        r.applied_generation
                    ),
                    None => format!("{n}/{inc} owns {owned}, no report"),
                }
            })
            .collect();
        format!(
            "generation {:?}, shards assigned {:?}, moves in flight {:?}, coordinator {:?}, members [{}]",
            a.map(|a| a.view.generation),
            a.map(|a| a.view.shards.len()),
            a.map(Assignment::moves_in_flight),
            self.coordinator,
            members.join("; ")
        )
    }
}
