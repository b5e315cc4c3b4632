//! Kubernetes Events for HA transitions (`BecameActive`, `BecameStandby`, `SteppedDown`, `Promoted`, and
//! `HaAlarm`), the mirror's and its duty's (`MirrorStarted`, `MirrorKindStopped`, `MirrorSyncFailed`,
//! `FailbackDivergent`, `FailbackDone`, `Adopted`, `AdoptionFailed`) and a promotion's
//! (`PromotedAcceptingLoss`), on this cluster's HA Lease. Fire-and-forget: an Event never delays a renewal.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tracing::debug;

/// The reasons this module emits.
pub mod reason {
    /// The cluster started acting (its term is held).
    pub const BECAME_ACTIVE: &str = "BecameActive";
    /// The cluster stopped acting (term ended or stepped down).
    pub const BECAME_STANDBY: &str = "BecameStandby";
    /// A leader stepped down (higher epoch, conflict, undecodable Lease, no term).
    pub const STEPPED_DOWN: &str = "SteppedDown";
    /// A candidacy began at a new epoch.
    pub const PROMOTED: &str = "Promoted";
    /// An alarm (undecodable Lease, peer unreadable at start).
    pub const ALARM: &str = "HaAlarm";
    /// The mirror duty started mirroring the peer.
    pub const MIRROR_STARTED: &str = "MirrorStarted";
    /// A mirrored kind stopped (an unparseable resourceVersion, a regression).
    pub const MIRROR_KIND_STOPPED: &str = "MirrorKindStopped";
    /// Failback holds divergent objects (objects only this, the old Active's, cluster has).
    pub const FAILBACK_DIVERGENT: &str = "FailbackDivergent";
    /// Failback finished: every own object is a copy of the new Active's.
    pub const FAILBACK_DONE: &str = "FailbackDone";
    /// Adoption at a new epoch finished; admission opens.
    pub const ADOPTED: &str = "Adopted";
    /// Adoption failed (retried; admission stays closed).
    pub const ADOPTION_FAILED: &str = "AdoptionFailed";
    /// An object went to the mirror's failed list (rate-limited: one per object and ten per kind a
    /// minute).
    pub const MIRROR_SYNC_FAILED: &str = "MirrorSyncFailed";
    /// `promote --token --accept-failed` promoted without objects the mirror had not copied (it names
    /// them).
    pub const PROMOTED_ACCEPTING_LOSS: &str = "PromotedAcceptingLoss";
}

#[derive(Clone)]
pub(crate) struct HaEvents {
    api: Api<Event>,
    involved: ObjectReference,
    cluster: String,
}

impl HaEvents {
    pub(crate) fn new(client: Client, namespace: &str, lease: &str, cluster: &str) -> Self {
        HaEvents {
            api: Api::namespaced(client, namespace),
            involved: ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                name: Some(lease.into()),
                namespace: Some(namespace.into()),
                ..ObjectReference::default()
            },
            cluster: cluster.into(),
        }
    }

    pub(crate) fn emit(&self, warning: bool, reason: &str, message: String) {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}-ha-", self.cluster)),
                namespace: self.involved.namespace.clone(),
                ..ObjectMeta::default()
            },
            involved_object: self.involved.clone(),
            reason: Some(reason.into()),
            message: Some(message),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            source: Some(EventSource {
                component: Some("kube-shard-ha".into()),
                host: Some(self.cluster.clone()),
            }),
            ..Event::default()
        };
        let api = self.api.clone();
        tokio::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &ev).await {
                debug!(error = %e, "HA event not recorded");
            }
        });
    }
}
