//! The coordinator Lease: acquire, renew, release, and the term published to singleton work.

use futures::future::BoxFuture;

use super::answers::Beside;
use super::answers::{CoordinatorWrite, Written};
use super::beside::limited;
use super::*;

impl Runtime {
    /// The resourceVersions of our recent writes to the coordinator Lease (newest last). A watch event
    /// carrying an older one of them arrives after we observed the newer write's response: applying it
    /// would make the next write conflict (resourceVersions are opaque, so we never compare them).
    pub(super) fn superseded_by_our_write(&self, l: &Lease) -> bool {
        if l.metadata.name.as_deref() != Some(self.cfg.coordinator_lease().as_str()) {
            return false;
        }
        let Some(rv) = l.metadata.resource_version.as_deref() else {
            return false;
        };
        let pos = self
            .election
            .coordinator_writes
            .iter()
            .position(|w| w == rv);
        pos.is_some_and(|p| p + 1 < self.election.coordinator_writes.len())
    }

    pub(super) fn wrote_coordinator_lease(&mut self, l: &Lease) {
        if let Some(rv) = l.metadata.resource_version.clone() {
            if self.election.coordinator_writes.len() >= 8 {
                self.election.coordinator_writes.pop_front();
            }
            self.election.coordinator_writes.push_back(rv);
        }
    }

    /// Not the coordinator (any more): end our term first, so singleton work stops before anyone else
    /// could acquire the Lease.
    pub(super) fn step_down(&mut self) {
        if self.election.leader {
            info!("stepped down as coordinator");
        }
        self.election.leader = false;
        if self.election.term.take().is_some() {
            self.election.leadership.send_replace(None);
        }
    }

    /// Acquire the coordinator Lease (or step down), and wait for the answer; while we hold it, its
    /// renewals run beside the pass when due and are not waited for.
    pub(super) async fn elect(&mut self) {
        if self.election.leader && self.membership.own.is_some() && !self.leaving {
            self.start_due(Instant::now());
            return;
        }
        self.wait_beside(false, true).await;
        self.start_coordinator_renewal();
        self.wait_beside(false, true).await;
    }

    /// Send the coordinator Lease write that is due, to be answered beside whatever we await
    /// (`beside.rs`); or step down (and hand the Lease back when leaving) when we may not hold it.
    pub(super) fn start_coordinator_renewal(&mut self) {
        if self.election.elect_in_flight {
            return;
        }
        if let Some(fut) = self.coordinator_request() {
            self.election.elect_in_flight = true;
            self.beside.push(fut);
        }
    }

    fn coordinator_request(&mut self) -> Option<BoxFuture<'static, Beside>> {
        let name = self.cfg.coordinator_lease();
        let holder_me = format!("{}/{}", self.me.name, self.me.incarnation);
        let now = Instant::now();
        // a Lease seen deleted is absent: create it again, never replace a copy of what is gone
        let observed = self
            .observations
            .observed
            .get(&name)
            .filter(|o| o.deleted_at.is_none());
        let current = observed.map(|o| o.lease.clone());
        let held_by_me = observed.is_some_and(|o| o.holder.as_deref() == Some(&holder_me));
        if self.membership.own.is_none() || self.leaving {
            let was_leader = self.election.leader;
            self.step_down();
            if was_leader && held_by_me {
                return Some(self.release_request(current?));
            }
            return None;
        }
        let expired = observed.is_none_or(|o| {
            o.holder.is_none() || now.duration_since(o.last_change) >= self.cfg.lease_duration
        });
        if !(held_by_me || expired) {
            self.step_down();
            return None;
        }
        let prev_term = current
            .as_ref()
            .and_then(|l| {
                l.metadata
                    .annotations
                    .as_ref()?
                    .get(TERM_ANNOTATION)?
                    .parse()
                    .ok()
            })
            .unwrap_or(0u64);
        // a new term on every acquisition, and after our own term lapsed (each run of singleton work has
        // its own term)
        let renewing = held_by_me
            && self
                .election
                .term
                .is_some_and(|t| t.is_valid_on(self.clock()) && t.term == prev_term);
        let term = if renewing {
            prev_term
        } else {
            let now_ms = self.clock().wall_ms();
            Assignment::next_generation(prev_term, now_ms)
        };
        let mut lease = current.clone().unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(self.cfg.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec::default()),
        });
        let labels = lease.metadata.labels.get_or_insert_with(Default::default);
        labels.insert(GROUP_LABEL.into(), self.cfg.group.clone());
        labels.insert(ROLE_LABEL.into(), "coordinator".into());
        lease
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(TERM_ANNOTATION.into(), term.to_string());
        let stamp = self.stamp();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if !held_by_me {
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            spec.acquire_time = Some(stamp.clone());
        }
        spec.holder_identity = Some(holder_me);
        spec.lease_duration_seconds = Some(self.cfg.lease_duration.as_secs().max(1) as i32);
        spec.renew_time = Some(stamp);
        // both clocks, read before the request: a suspend while it is in flight counts against the term
        let start = self.clock().now();
        self.election.elected_at = Some(now);
        let (api, limit) = (self.leases.clone(), self.timeout());
        let incarnation = self.me.incarnation.to_string();
        let verb = if current.is_some() {
            "update"
        } else {
            "create"
        };
        Some(Box::pin(async move {
            let pp = PostParams::default();
            let result = match current {
                None => limited(limit, api.create(&pp, &lease)).await,
                Some(_) => limited(limit, api.replace(&name, &pp, &lease)).await,
            };
            Beside::Coordinator(CoordinatorWrite {
                incarnation,
                verb,
                what: Written::Elect {
                    term,
                    renewing,
                    start,
                    now,
                },
                result,
            })
        }))
    }

    /// Apply the answer to a coordinator Lease write.
    pub(super) fn coordinator_written(&mut self, w: CoordinatorWrite) {
        let name = self.cfg.coordinator_lease();
        let ours = w.incarnation == *self.me.incarnation;
        self.noted(self.lease_named(w.verb, name.clone()), &w.result);
        match (w.what, w.result) {
            (Written::Release, Ok(l)) => {
                info!("released the coordinator lease");
                self.wrote_coordinator_lease(&l);
                self.observe_lease(l);
            }
            (Written::Release, Err(err)) => {
                debug!(error = %err, "could not release the coordinator lease");
            }
            (Written::Elect { .. }, Ok(l))
                if !ours || self.membership.own.is_none() || self.leaving =>
            {
                // taken over (or leaving) while it was in flight: not ours to hold; it expires
                self.wrote_coordinator_lease(&l);
                self.observe_lease(l);
            }
            (
                Written::Elect {
                    term,
                    renewing,
                    start,
                    ..
                },
                Ok(l),
            ) => {
                if !self.election.leader {
                    info!(term, "became the coordinator");
                    self.events.emit(
                        Kind::Normal,
                        "Coordinator",
                        format!("became the coordinator (term {term})"),
                    );
                }
                self.election.leader = true;
                // valid for less than anyone else waits before acquiring (lease_duration)
                let life = self
                    .cfg
                    .renew_deadline
                    .saturating_sub(self.cfg.fence_margin);
                if !renewing && self.election.term.is_some() {
                    info!(term, "our previous term lapsed: a new term");
                }
                let t = LeaderTerm::started(term, start, life);
                self.election.term = Some(t);
                self.election.leadership.send_replace(Some(t));
                self.wrote_coordinator_lease(&l);
                self.observe_lease(l);
            }
            (Written::Elect { now, .. }, Err(err)) => {
                debug!(error = %err, "coordinator lease not acquired");
                if is_not_found(&err) {
                    if let Some(o) = self.observations.observed.get_mut(&name) {
                        o.deleted_at.get_or_insert(now);
                    }
                }
                if ours {
                    self.step_down();
                }
            }
        }
    }

    /// A leaving coordinator hands the Lease back (holder cleared, conditional on what we last saw), so the
    /// next coordinator need not wait for it to expire.
    fn release_request(&mut self, mut lease: Lease) -> BoxFuture<'static, Beside> {
        let name = self.cfg.coordinator_lease();
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        let (api, limit) = (self.leases.clone(), self.timeout());
        let incarnation = self.me.incarnation.to_string();
        Box::pin(async move {
            let result = limited(limit, api.replace(&name, &PostParams::default(), &lease)).await;
            Beside::Coordinator(CoordinatorWrite {
                incarnation,
                verb: "update",
                what: Written::Release,
                result,
            })
        })
    }
}
