//! Renewals run beside everything else this task awaits.
//!
//! Each renewal (of our own Lease, and of the coordinator Lease) is a request future of its own, kept in
//! [`Runtime::beside`] and polled wherever the task waits — the main loop and every request of a pass
//! ([`Runtime::bounded`]) — and its answer is applied the moment it arrives. With answers taking `L`,
//! renewals start every `max(retry_period, L)`, so the fence never lapses while
//! `2·L < renew_deadline − fence_margin`, whatever a pass does.
//!
//! See "A slow API" in `docs/protocol.md#the-recovery-paths-owners-change-only-by-fact-never-by-inference`.

use futures::future::BoxFuture;

use super::answers::{Beside, MemberAnswer, MemberRenewal};
use super::*;

/// A request's answer within `limit`, or a timeout error.
pub(super) async fn limited<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service("request timed out".into())),
    }
}

impl Runtime {
    /// One request of a longer sequence, bounded by [`timeout`](Self::timeout), with the renewals that
    /// fall due meanwhile running beside it. If our Lease or the coordinator role was lost while it was in
    /// flight, its answer is replaced by an error: the caller treats it as unknown and stops.
    pub(super) async fn bounded<T>(
        &mut self,
        fut: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, kube::Error> {
        let (had_lease, was_leader) = (self.membership.own.is_some(), self.election.leader);
        let out = self.drive(limited(self.timeout(), fut)).await;
        if (had_lease && self.membership.own.is_none()) || (was_leader && !self.election.leader) {
            return Err(kube::Error::Service(
                "our Lease or the coordinator role was lost while the request was in flight".into(),
            ));
        }
        out
    }

    /// Await `fut` while the renewals that fall due run beside it.
    pub(super) async fn drive<F: std::future::Future>(&mut self, fut: F) -> F::Output {
        tokio::pin!(fut);
        loop {
            self.start_due(Instant::now());
            let next = self.next_due();
            tokio::select! {
                biased; // the request's answer first, then renewal answers, then the timer
                out = &mut fut => return out,
                Some(done) = self.beside.next(), if !self.beside.is_empty() => self.beside_done(done),
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }

    /// Wait until no renewal of our own Lease is in flight (before deleting it, say), applying answers.
    pub(super) async fn settle_renewal(&mut self) {
        self.wait_beside(true, false).await;
    }

    /// Wait until no write of the kinds named is in flight, applying answers (and starting what falls due).
    pub(super) async fn wait_beside(&mut self, member: bool, coordinator: bool) {
        loop {
            let busy = (member && self.membership.renewal_in_flight)
                || (coordinator && self.election.elect_in_flight);
            if !busy {
                return;
            }
            self.start_due(Instant::now());
            let next = self.next_due();
            tokio::select! {
                biased; // an answer before the timer that would only start the next renewal
                done = self.beside.next() => match done {
                    Some(done) => self.beside_done(done),
                    None => {
                        self.membership.renewal_in_flight = false;
                        self.election.elect_in_flight = false;
                    }
                },
                _ = tokio::time::sleep_until(next) => {}
            }
        }
    }

    /// Start the renewals that are due and not in flight.
    pub(super) fn start_due(&mut self, now: Instant) {
        if self.member_renewal_due(now) {
            self.start_renewal(true);
        }
        if self.coordinator_renewal_due(now) {
            self.start_coordinator_renewal();
        }
    }

    fn member_renewal_due(&self, now: Instant) -> bool {
        self.membership.own.is_some()
            && !self.exiting
            && !self.membership.renewal_in_flight
            && self
                .membership
                .renewal_started
                .is_none_or(|t| now.duration_since(t) >= self.cfg.retry_period)
    }

    fn coordinator_renewal_due(&self, now: Instant) -> bool {
        self.election.leader
            && self.membership.own.is_some()
            && !self.leaving
            && !self.election.elect_in_flight
            && self
                .election
                .elected_at
                .is_none_or(|t| now.duration_since(t) >= self.cfg.retry_period)
    }

    /// When the next renewal falls due (far ahead if none can).
    pub(super) fn next_due(&self) -> Instant {
        let far = Instant::now() + self.cfg.lease_duration;
        let member =
            (self.membership.own.is_some() && !self.membership.renewal_in_flight && !self.exiting)
                .then(|| {
                    self.membership
                        .renewal_started
                        .map(|t| t + self.cfg.retry_period)
                })
                .flatten();
        let coordinator = (self.election.leader && !self.election.elect_in_flight)
            .then(|| self.election.elected_at.map(|t| t + self.cfg.retry_period))
            .flatten();
        [member, coordinator]
            .into_iter()
            .flatten()
            .fold(far, Instant::min)
    }

    /// Send a renewal of our Lease (if none is in flight). `retry`: a conflict that is not a takeover is
    /// tried again at once with what we read back.
    pub(super) fn start_renewal(&mut self, retry: bool) {
        let Some(own) = self.membership.own.clone() else {
            return;
        };
        if self.membership.renewal_in_flight || self.exiting {
            return;
        }
        let start = self.ownership.inner.clock.now();
        let t0 = Instant::now();
        let body = self.lease_body(Some(&own));
        let report = body
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REPORT).cloned())
            .unwrap_or_default();
        let api = self.leases.clone();
        let name = self.cfg.member_lease();
        let (write_limit, read_limit) = (self.renewal_timeout(), self.timeout());
        let incarnation = self.me.incarnation.to_string();
        self.membership.renewal_in_flight = true;
        self.membership.renewal_started = Some(t0);
        let fut: BoxFuture<'static, Beside> = Box::pin(async move {
            let pp = PostParams::default();
            let answer = match limited(write_limit, api.replace(&name, &pp, &body)).await {
                Ok(l) => MemberAnswer::Written(l),
                Err(err) if is_conflict(&err) => {
                    MemberAnswer::Conflict(limited(read_limit, api.get_opt(&name)).await)
                }
                Err(err) => MemberAnswer::Failed(err),
            };
            Beside::Member(MemberRenewal {
                incarnation,
                start,
                t0,
                report,
                retry,
                answer,
            })
        });
        self.beside.push(fut);
    }

    /// Apply an answer that arrived beside.
    pub(super) fn beside_done(&mut self, done: Beside) {
        match done {
            Beside::Member(r) => {
                self.membership.renewal_in_flight = false;
                self.renewal_answered(r);
            }
            Beside::Coordinator(w) => {
                self.election.elect_in_flight = false;
                self.coordinator_written(w);
            }
        }
    }
}
