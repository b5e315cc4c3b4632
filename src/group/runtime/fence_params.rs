//! The per-shard fence parameters (opt-in, [`ShardGroupBuilder::fence_params`]): the coordinator keeps a
//! ConfigMap with one key per shard (`"17"`), whose value is that shard's current epoch, and writes it
//! **before** the assignment write that activates a new owner. The per-shard fence policy
//! ([`crate::fence_policy`], bound with `paramRef`) then refuses a deposed owner's late write — epoch lower
//! than its shard's — even to objects the new owner never wrote.
//!
//! Values only rise, with one exception: when the assignment write is refused with a conflict (so it
//! committed nothing), the keys raised for it go back to their previous values, conditionally on the
//! ConfigMap being as we left it — an epoch nobody was ever granted must not lock the current owner out.
//! A failed parameter write skips the assignment write of this pass (it is retried on the next one).
//!
//! [`ShardGroupBuilder::fence_params`]: crate::group::ShardGroupBuilder::fence_params

use super::*;
use crate::ownership::AssignmentView;

/// What one publication changed: per key, the value before (`None`: absent) and the value written.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Raised {
    changes: BTreeMap<String, (Option<String>, String)>,
    /// The resourceVersion our write left the ConfigMap at.
    rv: Option<String>,
}

/// Pure: the keys to raise so that every shard of `next` has at least its epoch there. A present value
/// that is not a decimal epoch counts as absent (it is overwritten).
pub(super) fn to_raise(
    published: &BTreeMap<String, String>,
    next: &AssignmentView,
) -> BTreeMap<String, (Option<String>, String)> {
    next.shards
        .iter()
        .filter_map(|(shard, a)| {
            let key = shard.to_string();
            let old = published.get(&key);
            let below = old
                .and_then(|v| v.parse::<u64>().ok())
                .is_none_or(|v| v < a.epoch);
            below.then(|| (key, (old.cloned(), a.epoch.to_string())))
        })
        .collect()
}

/// Pure: `published` with the raised keys put back, where they still hold what we wrote.
pub(super) fn restored(
    published: &BTreeMap<String, String>,
    raised: &Raised,
) -> BTreeMap<String, String> {
    let mut data = published.clone();
    for (key, (before, written)) in &raised.changes {
        if data.get(key) != Some(written) {
            continue;
        }
        match before {
            Some(v) => data.insert(key.clone(), v.clone()),
            None => data.remove(key),
        };
    }
    data
}

impl Runtime {
    /// Before writing `next`: raise the parameter ConfigMap to its epochs. `Err(())`: not published, the
    /// assignment must not be written now. `Ok(None)`: nothing to publish (or the level is off).
    pub(super) async fn publish_fence_params(
        &mut self,
        next: &AssignmentView,
    ) -> Result<Option<Raised>, ()> {
        let Some(name) = self.cfg.fence_params.clone() else {
            return Ok(None);
        };
        let span = info_span!("fence_params", configmap = %name, generation = next.generation);
        async {
            let current = match self.bounded(self.cms.get_opt(&name)).await {
                Ok(c) => c,
                Err(err) => {
                    warn!(error = %err, "cannot read the fence parameter ConfigMap: the assignment waits");
                    return Err(());
                }
            };
            let published = current
                .as_ref()
                .and_then(|c| c.data.clone())
                .unwrap_or_default();
            let changes = to_raise(&published, next);
            if changes.is_empty() {
                return Ok(None);
            }
            let mut data = published;
            for (k, (_, v)) in &changes {
                data.insert(k.clone(), v.clone());
            }
            match self.write_params(&name, current, data).await {
                Ok(rv) => {
                    debug!(keys = changes.len(), "fence parameters raised");
                    Ok(Some(Raised { changes, rv }))
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

    /// The assignment write that `raised` was for committed nothing (a conflict): put the raised keys back.
    pub(super) async fn unpublish_fence_params(&mut self, raised: Raised) {
        let Some(name) = self.cfg.fence_params.clone() else {
            return;
        };
        let current = match self.bounded(self.cms.get_opt(&name)).await {
            Ok(Some(c)) if c.metadata.resource_version == raised.rv => c,
            // changed since (another coordinator): leave it, values only protect
            Ok(_) => return,
            Err(err) => {
                debug!(error = %err, "cannot re-read the fence parameters to restore them");
                return;
            }
        };
        let data = restored(&current.data.clone().unwrap_or_default(), &raised);
        if let Err(err) = self.write_params(&name, Some(current), data).await {
            debug!(error = %err, "could not restore the fence parameters");
        }
    }

    /// Replace (conditional on the resourceVersion read) or create the ConfigMap; its new resourceVersion.
    async fn write_params(
        &self,
        name: &str,
        current: Option<ConfigMap>,
        data: BTreeMap<String, String>,
    ) -> Result<Option<String>, kube::Error> {
        let exists = current.is_some();
        let mut cm = self.group_configmap(name, current);
        cm.data = Some(data);
        let written = if exists {
            self.bounded(self.cms.replace(name, &PostParams::default(), &cm))
                .await?
        } else {
            self.bounded(self.cms.create(&PostParams::default(), &cm))
                .await?
        };
        Ok(written.metadata.resource_version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ownership::ShardAssignment;

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
        let keys: Vec<(&str, Option<&str>, &str)> = raise
            .iter()
            .map(|(k, (b, w))| (k.as_str(), b.as_deref(), w.as_str()))
            .collect();
        assert_eq!(
            keys,
            [
                ("0", Some("5"), "7"),
                ("2", Some("x"), "3"),
                ("3", None, "4")
            ]
        );
        // never lowered
        assert!(to_raise(&data(&[("0", "8")]), &view(&[(0, 7)])).is_empty());
    }

    #[test]
    fn restore_puts_back_only_what_still_holds_our_value() {
        let raised = Raised {
            changes: to_raise(&data(&[("0", "5")]), &view(&[(0, 7), (1, 4), (2, 6)])),
            rv: None,
        };
        // key 2 was raised again by someone else meanwhile
        let now = data(&[("0", "7"), ("1", "4"), ("2", "8")]);
        assert_eq!(restored(&now, &raised), data(&[("0", "5"), ("2", "8")]));
    }
}
