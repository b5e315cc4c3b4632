//! The per-shard fence parameters (opt-in, [`ShardGroupBuilder::fence_params`]): the coordinator keeps a
//! ConfigMap with one key per shard (`"17"`), whose value is that shard's current epoch, and writes it
//! **before** the assignment write that activates a new owner, so the per-shard fence policy
//! ([`crate::fence_policy`]) refuses a deposed owner's late write even to objects the new owner never wrote.
//!
//! A published key never decreases, even when its assignment write fails; a key left above its shard's
//! epoch is repaired by a re-grant at a new epoch within about a lease period. A failed parameter write
//! skips the assignment write of this pass.
//!
//! See `docs/fence-policy.md#the-per-shard-level---params`.
//!
//! [`ShardGroupBuilder::fence_params`]: crate::group::ShardGroupBuilder::fence_params

use super::*;
use crate::group::coordinator::Observed;
use crate::ownership::state::{AssignmentView, Handoff};

/// Pure: the keys to raise so that every shard of `next` has at least its epoch there. A present value
/// that is not a decimal epoch counts as absent (it is overwritten). Never lowers a key.
pub(super) fn to_raise(
    published: &BTreeMap<String, String>,
    next: &AssignmentView,
) -> BTreeMap<String, String> {
    next.shards
        .iter()
        .filter_map(|(shard, a)| {
            let key = shard.to_string();
            let below = published
                .get(&key)
                .and_then(|v| v.parse::<u64>().ok())
                .is_none_or(|v| v < a.epoch);
            below.then(|| (key, a.epoch.to_string()))
        })
        .collect()
}

/// Pure: for each stable shard of a live owner whose published key is above its epoch in `current`, mark
/// it stale in the owner's report, seen at the key's generation — the step then re-grants it to the same
/// owner at a new epoch above the key (`coordinator::stale_regrant`, `stale_floor`). A key no step can
/// pass (a generation step is at most `MAX_GENERATION_STEP`, and members refuse more) is not marked: a
/// re-grant could never reach it, and marking it every pass would only climb generations. The shards
/// marked, and the keys out of reach (shard, key).
pub(super) fn mark_overshoot(
    current: &AssignmentView,
    floors: &BTreeMap<u32, u64>,
    members: &mut [Observed],
    now_ms: u64,
) -> (Vec<u32>, Vec<(u32, u64)>) {
    let mut marked = Vec::new();
    let mut out_of_reach = Vec::new();
    for (shard, a) in &current.shards {
        let Some(&floor) = floors.get(shard) else {
            continue;
        };
        if floor <= a.epoch || a.handoff != Handoff::Stable {
            continue;
        }
        if !crate::group::coordinator::reachable(current.generation, floor, now_ms) {
            out_of_reach.push((*shard, floor));
            continue;
        }
        let Some(m) = members.iter_mut().find(|m| m.id == a.owner && m.live()) else {
            continue;
        };
        let Some(r) = m.report.as_mut() else {
            continue;
        };
        r.stale.insert(*shard);
        r.applied_generation = r.applied_generation.max(a.epoch);
        r.seen_generation = r.seen_generation.max(floor);
        marked.push(*shard);
    }
    (marked, out_of_reach)
}

impl Runtime {
    /// Before writing `next`: raise the parameter ConfigMap to its epochs. `Err(())`: not published, the
    /// assignment must not be written now.
    pub(super) async fn publish_fence_params(&mut self, next: &AssignmentView) -> Result<(), ()> {
        let Some(name) = self.cfg.fence_params.clone() else {
            return Ok(());
        };
        let span = info_span!("fence_params", configmap = %name, generation = next.generation);
        async {
            let read = match self.coordination.fence_floors.this_pass.take() {
                Some(c) => Ok(c),
                None => {
                    let (api, access) = (self.cms.clone(), self.configmap_named("get", name.clone()));
                    self.checked(access, api.get_opt(&name)).await
                }
            };
            let current = match read {
                Ok(c) => c,
                Err(err) => {
                    warn!(error = %err, "cannot read the fence parameter ConfigMap: the assignment waits");
                    return Err(());
                }
            };
            let mut data = current
                .as_ref()
                .and_then(|c| c.data.clone())
                .unwrap_or_default();
            self.coordination.fence_floors.read(&data);
            let changes = to_raise(&data, next);
            if changes.is_empty() {
                return Ok(());
            }
            data.extend(changes.clone());
            if !self.renew_between().await {
                return Err(());
            }
            match self.write_params(&name, current, data).await {
                Ok(()) => {
                    self.coordination.fence_floors.learn(&changes);
                    debug!(keys = changes.len(), "fence parameters raised");
                    Ok(())
                }
                Err(err) => {
                    warn!(error = %err, "fence parameter write failed: the assignment waits");
                    Err(())
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Before a pass: shards whose published key is above their committed epoch (a raise for an
    /// assignment write that failed) are marked for a re-grant above it ([`mark_overshoot`]). The
    /// parameters are re-read at most once per `lease_duration`.
    pub(super) async fn repair_fence_overshoot(
        &mut self,
        current: &AssignmentView,
        members: &mut [Observed],
        now: Instant,
    ) {
        let Some(name) = self.cfg.fence_params.clone() else {
            return;
        };
        let due = self
            .coordination
            .fence_floors
            .read_at
            .is_none_or(|t| now.duration_since(t) >= self.cfg.lease_duration);
        self.coordination.fence_floors.this_pass = None;
        if due {
            let (api, access) = (self.cms.clone(), self.configmap_named("get", name.clone()));
            match self.checked(access, api.get_opt(&name)).await {
                Ok(c) => {
                    self.coordination.fence_floors.read_at = Some(now);
                    self.coordination
                        .fence_floors
                        .read(&c.as_ref().and_then(|c| c.data.clone()).unwrap_or_default());
                    self.coordination.fence_floors.this_pass = Some(c);
                }
                Err(err) => debug!(error = %err, "cannot re-read the fence parameters"),
            }
        }
        let now_ms = self.clock().wall_ms();
        let (marked, out_of_reach) = mark_overshoot(
            current,
            &self.coordination.fence_floors.by_shard,
            members,
            now_ms,
        );
        if !marked.is_empty() {
            warn!(
                shards = ?marked,
                "fence parameters above the committed epochs (an assignment write failed after raising them): re-granting these shards to their owners above the published epochs"
            );
        }
        for (shard, key) in out_of_reach {
            if self.coordination.fence_floors.alarmed.insert((shard, key)) {
                let text = format!(
                    "fence parameter key \"{shard}\" = {key} in ConfigMap {name} is more than a day above the assignment's generation {} or the wall clock: no re-grant can reach it, so the owner's fenced writes to shard {shard} are refused until the key is corrected (keys never decrease on their own; an edit or a copy from another group put it there)",
                    current.generation
                );
                error!(shard, key, "ALARM: {text}");
                self.events.emit_about(
                    Kind::Warning,
                    "FenceKeyOutOfReach",
                    &format!("{shard}={key}"),
                    text,
                );
            }
        }
    }

    /// Replace (conditional on the resourceVersion read) or create the ConfigMap.
    async fn write_params(
        &mut self,
        name: &str,
        current: Option<ConfigMap>,
        data: BTreeMap<String, String>,
    ) -> Result<(), kube::Error> {
        let exists = current.is_some();
        let mut cm = self.group_configmap(name, current);
        cm.data = Some(data);
        let api = self.cms.clone();
        if exists {
            let access = self.configmap_named("update", name.to_owned());
            self.checked(access, api.replace(name, &PostParams::default(), &cm))
                .await?;
        } else {
            let access = self.configmap_named("create", name.to_owned());
            self.checked(access, api.create(&PostParams::default(), &cm))
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::report::MemberReport;
    use crate::ownership::state::ShardAssignment;

    fn view(epochs: &[(u32, u64)]) -> AssignmentView {
        let owner = MemberId::new("m", "1");
        epochs.iter().fold(AssignmentView::new(1), |v, (s, e)| {
            v.with(*s, ShardAssignment::owned(owner.clone(), *e))
        })
    }

    fn data(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn raises_only_lower_absent_or_malformed_keys() {
        let published = data(&[("0", "5"), ("1", "9"), ("2", "x")]);
        let raise = to_raise(&published, &view(&[(0, 7), (1, 9), (2, 3), (3, 4)]));
        assert_eq!(raise, data(&[("0", "7"), ("2", "3"), ("3", "4")]));
        // never lowered
        assert!(to_raise(&data(&[("0", "8")]), &view(&[(0, 7)])).is_empty());
    }

    fn observed(name: &str, alive: bool) -> Observed {
        Observed {
            id: MemberId::new(name, "1"),
            alive,
            expired: false,
            gone: false,
            report: Some(MemberReport::default()),
            joined: 0,
            joining: false,
        }
    }

    #[test]
    fn overshoot_marks_stable_shards_of_live_owners_only() {
        let (m, n) = (MemberId::new("m", "1"), MemberId::new("n", "1"));
        let current = AssignmentView::new(50)
            .with(0, ShardAssignment::owned(m.clone(), 10)) // key 20 above: marked
            .with(1, ShardAssignment::owned(m.clone(), 30)) // key 20 below: fine
            .with(
                2,
                ShardAssignment::owned(m.clone(), 10).with_handoff(Handoff::Draining {
                    id: 4,
                    to: n.clone(),
                }),
            ) // a move completes above the key anyway
            .with(3, ShardAssignment::owned(n, 10)); // n is not live
        let floors: BTreeMap<u32, u64> = [(0, 20), (1, 20), (2, 20), (3, 20)].into();
        let mut members = vec![observed("m", true), observed("n", false)];
        assert_eq!(
            mark_overshoot(&current, &floors, &mut members, 0).0,
            vec![0]
        );
        let r = members[0].report.as_ref().unwrap();
        assert!(r.stale.contains(0) && !r.stale.contains(1));
        assert_eq!((r.applied_generation, r.seen_generation), (10, 20));
        assert!(members[1].report.as_ref().unwrap().stale.is_empty());
    }
}
