//! What holds or lifts admission besides ownership: the legacy leader gate, and immediate warm/activation
//! for members without read streams.

use super::*;

impl Runtime {
    /// Members without read streams have nothing to sync: warm and activation are immediate.
    /// Judged on each use: a watcher registered after the runtime started has its barrier awaited.
    pub(super) fn vacuous_progress(&self) {
        if !self.ownership.inner.readers.is_empty() {
            return;
        }
        let snap = self.ownership.snapshot();
        for (shard, st) in snap.state().shards() {
            match st {
                ShardState::Incoming {
                    move_id,
                    warm: false,
                } => {
                    self.ownership
                        .apply_event(OwnEvent::Warm { shard, move_id });
                }
                ShardState::Activating { epoch } => {
                    self.ownership
                        .apply_event(OwnEvent::Activated { shard, epoch });
                }
                _ => {}
            }
        }
    }

    /// While a legacy leader-election Lease has a live holder, hold admission (unless in shadow mode,
    /// which holds it anyway).
    pub(super) async fn check_legacy_leader(&mut self) {
        let Some(spec) = self.cfg.legacy_leader_lease.clone() else {
            return;
        };
        let (ns, name) = match spec.split_once('/') {
            Some((ns, name)) => (ns.to_owned(), name.to_owned()),
            None => (self.cfg.namespace.clone(), spec.clone()),
        };
        let api: Api<Lease> = Api::namespaced(self.leases.clone().into_client(), &ns);
        let now = Instant::now();
        let read = self.bounded(api.get_opt(&name)).await;
        if read.is_ok() && self.gates.legacy_alarm {
            info!(lease = %spec, "the legacy leader lease can be read again");
            self.gates.legacy_alarm = false;
        }
        let live = match read {
            Ok(Some(l)) => {
                let spec = l.spec.unwrap_or_default();
                let renew = spec.renew_time.map(|t| t.0.to_string());
                let duration =
                    Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
                let changed_at = match &self.gates.legacy {
                    Some((seen, at)) if *seen == renew => *at,
                    _ => now,
                };
                self.gates.legacy = Some((renew, changed_at));
                spec.holder_identity.is_some_and(|h| !h.is_empty())
                    && now.duration_since(changed_at) < duration
            }
            Ok(None) => false,
            // cannot tell: fail closed, hold until a read shows no live holder
            Err(err) => {
                if !self.gates.legacy_alarm {
                    error!(lease = %spec, error = %err, "ALARM: cannot read the legacy leader lease: admitting nothing until a read shows no live holder");
                    self.events.emit(
                        Kind::Warning,
                        "LegacyLeaderUnknown",
                        format!(
                            "cannot read {spec}: admitting nothing until it can be read: {err}"
                        ),
                    );
                    self.gates.legacy_alarm = true;
                }
                true
            }
        };
        self.gates.legacy_live = live;
        self.update_hold();
    }

    /// Hold admission for whichever cause applies, the strongest first: shadow mode, a member of another
    /// build in the group, a live legacy leader. Lifting the last cause re-enqueues every owned shard.
    pub(super) fn update_hold(&mut self) {
        let want = if self.cfg.shadow {
            Some(Hold::Shadow)
        } else if !self.observations.foreign_formats.is_empty() {
            Some(Hold::ForeignFormat)
        } else if self.gates.legacy_live {
            Some(Hold::LegacyLeader)
        } else {
            None
        };
        // only this runtime's own bits: the HA gate's bit is its own (a gate clears only its own); set
        // before clearing, so no moment shows none of them while one still applies
        let bits = [
            (Hold::Shadow, self.cfg.shadow),
            (
                Hold::ForeignFormat,
                !self.observations.foreign_formats.is_empty(),
            ),
            (Hold::LegacyLeader, self.gates.legacy_live),
        ];
        for on in [true, false] {
            for (h, want_on) in bits {
                if want_on == on {
                    self.ownership.set_hold(h, on);
                }
            }
        }
        let had = self.gates.hold;
        if had == want {
            return;
        }
        match (had, want) {
            (_, Some(Hold::LegacyLeader)) => {
                info!("a legacy leader holds its lease: admitting nothing until it is gone")
            }
            (_, Some(Hold::ForeignFormat)) => {
                warn!(
                    "a member of another build is in the group: admitting nothing until it is gone"
                )
            }
            (Some(Hold::LegacyLeader), None) => {
                info!("the legacy leader is gone: admitting owned shards");
                self.events.emit(
                    Kind::Normal,
                    "LegacyLeaderGone",
                    "the legacy leader lease has no live holder: admitting".to_owned(),
                );
            }
            (Some(_), None) => info!("admission hold lifted: admitting owned shards"),
            _ => {}
        }
        self.gates.hold = want;
    }
}
