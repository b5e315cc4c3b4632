//! The assignment's intent fields written from outside the group, with a compare-and-swap beside the
//! coordinator's: pins, pause, drained members. Owners, epochs and handoffs are never touched, and nothing
//! is written over an assignment a live member has already gone past.

use kube::api::PostParams;
use kube::Client;

use super::types::{AdminError, Edit, GroupRef};
use crate::group::assignment::{Assignment, DATA_KEY};
use crate::group::report::{applied_above, live_reports};

/// Attempts before giving up on concurrent writers.
const ATTEMPTS: usize = 20;

/// Apply `edit` to the group `group` in `namespace` on the system clock ([`GroupRef::edit`] for another);
/// returns the assignment as written.
pub async fn edit(
    client: Client,
    namespace: &str,
    group: &str,
    edit: Edit,
) -> Result<Assignment, AdminError> {
    GroupRef::new(client, namespace, group).edit(edit).await
}

impl GroupRef {
    /// Apply `edit`: read the assignment, refuse when it cannot be decoded or a live member reports a
    /// higher generation applied (a rolled-back assignment), change the intent field, take the next
    /// generation ([`Assignment::next_generation`], capped), and replace conditionally on the
    /// resourceVersion read; on a conflict, read again. Returns the assignment as written.
    pub async fn edit(&self, edit: Edit) -> Result<Assignment, AdminError> {
        check(&edit)?;
        let name = self.assignment_name();
        for _ in 0..ATTEMPTS {
            let (mut cm, mut a) = self.fetch().await?;
            self.refuse_rolled_back(&a).await?;
            apply(&mut a, &edit)?;
            a.view.generation =
                Assignment::next_generation(a.view.generation, self.clock.wall_ms());
            cm.data
                .get_or_insert_with(Default::default)
                .insert(DATA_KEY.to_owned(), a.encode());
            match self.cms.replace(&name, &PostParams::default(), &cm).await {
                Ok(_) => return Ok(a),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(error) => {
                    return Err(AdminError::Api {
                        what: format!("writing {name}"),
                        error,
                    })
                }
            }
        }
        Err(AdminError::Conflicts { name })
    }

    /// Refused, with the coordinator's alarm text, while a live member (its Lease renewed within its
    /// duration) reports a higher generation applied than the stored one.
    async fn refuse_rolled_back(&self, a: &Assignment) -> Result<(), AdminError> {
        let leases = self.list_leases().await?;
        let live = live_reports(&leases, self.now_ms(), a.shards);
        match applied_above(
            a.view.generation,
            live.iter().map(|(n, r)| (n.as_str(), r)),
            self.clock.wall_ms(),
        ) {
            Some((lease, applied)) => Err(AdminError::RolledBack {
                stored: a.view.generation,
                applied,
                lease,
            }),
            None => Ok(()),
        }
    }
}

/// Member names are Lease-name suffixes: 1 to 253 characters.
fn check(edit: &Edit) -> Result<(), AdminError> {
    match edit {
        Edit::Pin { member, .. } | Edit::Drain(member) | Edit::Undrain(member)
            if member.is_empty() || member.len() > 253 =>
        {
            Err(AdminError::MemberName)
        }
        _ => Ok(()),
    }
}

/// The edit on the decoded assignment: intent fields only.
fn apply(a: &mut Assignment, edit: &Edit) -> Result<(), AdminError> {
    match edit {
        Edit::Pin { shard, .. } | Edit::Unpin(shard) if *shard >= a.shards.get() => {
            return Err(AdminError::ShardOutOfRange {
                shard: *shard,
                shards: a.shards.get(),
            })
        }
        Edit::Pin { shard, member } => {
            a.pins.insert(*shard, member.clone());
        }
        Edit::Unpin(shard) => {
            a.pins.remove(shard);
        }
        Edit::Pause => a.paused = true,
        Edit::Resume => a.paused = false,
        Edit::Drain(member) => {
            a.drained.insert(member.clone());
        }
        Edit::Undrain(member) => {
            a.drained.remove(member);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hash::ShardKey;
    use crate::ownership::MemberId;
    use crate::shard::ShardCount;

    fn owned() -> Assignment {
        let mut a = Assignment::empty(ShardCount::new(4).unwrap(), ShardKey::Uid);
        for s in 0..4 {
            a.view = a.view.clone().with(
                s,
                crate::group::assignment::ShardAssignment::owned(MemberId::new("a", "1"), 3),
            );
        }
        a
    }

    #[test]
    fn an_edit_changes_intent_fields_only() {
        let before = owned();
        for e in [
            Edit::Pin {
                shard: 2,
                member: "b".into(),
            },
            Edit::Unpin(2),
            Edit::Pause,
            Edit::Resume,
            Edit::Drain("a".into()),
            Edit::Undrain("a".into()),
        ] {
            let mut a = before.clone();
            apply(&mut a, &e).unwrap();
            assert_eq!(
                a.view, before.view,
                "{e:?} touched owners, epochs or handoffs"
            );
            assert_eq!(a.next_move_id, before.next_move_id);
        }
    }

    #[test]
    fn bad_edits_are_refused_before_any_request() {
        let mut a = owned();
        let out = Edit::Pin {
            shard: 4,
            member: "b".into(),
        };
        assert!(matches!(
            apply(&mut a, &out),
            Err(AdminError::ShardOutOfRange {
                shard: 4,
                shards: 4
            })
        ));
        assert!(matches!(
            check(&Edit::Drain(String::new())),
            Err(AdminError::MemberName)
        ));
        assert!(matches!(
            check(&Edit::Undrain("x".repeat(254))),
            Err(AdminError::MemberName)
        ));
        assert!(check(&Edit::Pause).is_ok());
    }
}
