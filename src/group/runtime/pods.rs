//! Evidence that a member is gone from its Pod (`kube-shard.io/pod` on its Lease): once a member's Lease
//! has expired, the coordinator reads the Pod it published; deleted (404) or replaced (another uid under
//! the name) confirms the member gone, like a deleted Lease. A restart of every replica under new Pod
//! names then needs no takeover per dead member, so none waits for the takeover budget (which limits
//! churn after correlated transient failures: a member whose Pod still exists gets no such evidence, and
//! is taken over at the budget's pace as before). Each suspect's Pod is read at most once a lease period.
//! Reading Pods is optional: a refusal (401, 403) is logged once and the evidence is not used; any other
//! failure is retried a lease period later.

use k8s_openapi::api::core::v1::Pod;

use super::*;
use crate::group::config::PodRef;
use crate::group::report::POD;

/// What a Pod read says of a member (pure).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum PodEvidence {
    /// The Pod is gone, or another Pod has its name: the member's process is gone.
    Gone,
    /// The member's Pod exists: no evidence.
    Present,
}

/// Judge a read of `pod` (`Ok(None)`: 404).
pub(super) fn judge(pod: &PodRef, read: Option<&Pod>) -> PodEvidence {
    match read.and_then(|p| p.metadata.uid.as_deref()) {
        Some(uid) if uid == pod.uid => PodEvidence::Present,
        // 404, another uid under the name, or a Pod without a uid (never served so)
        _ => PodEvidence::Gone,
    }
}

impl Runtime {
    /// Read the Pod of every expired member not yet gone that published one (at most once a pass each),
    /// and mark those whose Pod is gone.
    pub(super) async fn confirm_pods_gone(&mut self, now: Instant) {
        if self.observations.pods_forbidden {
            return;
        }
        let expiry = self.cfg.lease_duration + self.cfg.takeover_grace;
        let suspects: Vec<(String, PodRef)> = self
            .observations
            .observed
            .iter()
            .filter(|(_, o)| {
                o.id != self.me
                    && !o.role_coordinator
                    && !o.taken_over
                    && !o.pod_gone
                    && o.deleted_at.is_none()
                    && now.duration_since(o.last_change) >= expiry
                    && o.pod_read_at
                        .is_none_or(|t| now.duration_since(t) >= self.cfg.lease_duration)
            })
            .filter_map(|(name, o)| {
                let text = o.lease.metadata.annotations.as_ref()?.get(POD)?;
                Some((name.clone(), PodRef::parse(text)?))
            })
            .collect();
        for (lease, pod) in suspects {
            let api: Api<Pod> = Api::namespaced(self.leases.clone().into_client(), &pod.namespace);
            if let Some(o) = self.observations.observed.get_mut(&lease) {
                o.pod_read_at = Some(now);
            }
            let read = self.bounded(api.get_opt(&pod.name)).await;
            match read {
                Ok(p) => {
                    if judge(&pod, p.as_ref()) == PodEvidence::Gone {
                        info!(lease = %lease, pod = %pod.text(), "a member's Pod is gone: the member is gone");
                        if let Some(o) = self.observations.observed.get_mut(&lease) {
                            o.pod_gone = true;
                        }
                        self.observations.last_membership_change = now;
                    }
                }
                Err(kube::Error::Api(s)) if matches!(s.code, 401 | 403) => {
                    warn!(namespace = %pod.namespace, error = %s.message, "reading members' Pods is refused: a restart of every replica is taken over at the takeover budget's pace (grant `get` on pods to confirm dead members gone)");
                    self.observations.pods_forbidden = true;
                    return;
                }
                Err(e) => {
                    debug!(pod = %pod.text(), error = %e, "reading a member's Pod failed; next pass")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn only_the_members_own_pod_alive_is_no_evidence() {
        let r = PodRef::new("ops", "widgets-7f9c-abcde", "u-1");
        assert_eq!(judge(&r, Some(&pod("u-1"))), PodEvidence::Present);
        assert_eq!(judge(&r, Some(&pod("u-2"))), PodEvidence::Gone, "replaced");
        assert_eq!(judge(&r, None), PodEvidence::Gone, "deleted");
    }

    #[test]
    fn a_hostile_pod_annotation_is_no_pod() {
        for bad in [
            "",
            "ops/name",
            "ops//uid",
            "Ops/name/uid",
            "ops/na me/uid",
            &format!("ops/{}/uid", "n".repeat(500)),
        ] {
            assert_eq!(PodRef::parse(bad), None, "{bad:?}");
        }
        let ok = PodRef::parse("ops/widgets-0/0c9e-11").unwrap();
        assert_eq!(ok.text(), "ops/widgets-0/0c9e-11");
    }
}
