//! Kubernetes Events for handoffs, takeovers and alarms, on the member's Lease (core/v1 Events, which
//! every apiserver serves). Fire-and-forget, bounded, and rate-limited per reason: an Event never
//! delays a renewal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::rt::Clock;
use crate::rt::Spawner;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;
use tracing::debug;

/// Warning or Normal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Normal,
    Warning,
}

#[derive(Clone)]
pub(crate) struct Events {
    api: Api<Event>,
    involved: ObjectReference,
    member: String,
    last: Arc<Mutex<BTreeMap<String, Instant>>>,
    spawner: Spawner,
    clock: Clock,
}

const MIN_INTERVAL: Duration = Duration::from_secs(10);

impl Events {
    pub(crate) fn new(
        client: Client,
        namespace: &str,
        lease: &str,
        member: &str,
        spawner: Spawner,
        clock: Clock,
    ) -> Self {
        Events {
            api: Api::namespaced(client, namespace),
            involved: ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                name: Some(lease.into()),
                namespace: Some(namespace.into()),
                ..ObjectReference::default()
            },
            member: member.into(),
            last: Arc::default(),
            spawner,
            clock,
        }
    }

    /// Publish an Event unless one with the same reason went out in the last 10 s.
    pub(crate) fn emit(&self, kind: Kind, reason: &str, message: impl Into<String>) {
        self.emit_about(kind, reason, "", message);
    }

    /// [`Events::emit`], rate-limited per reason *and* `about` (an alarm that names one object — a shard's
    /// key, a member — is never hidden by the same alarm about another).
    pub(crate) fn emit_about(
        &self,
        kind: Kind,
        reason: &str,
        about: &str,
        message: impl Into<String>,
    ) {
        let now = Instant::now();
        {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            let key = format!("{reason}/{about}");
            if last
                .get(&key)
                .is_some_and(|t| now.duration_since(*t) < MIN_INTERVAL)
            {
                return;
            }
            last.insert(key, now);
        }
        let stamp = Time(self.clock.wall_timestamp());
        let name = format!(
            "{}.{:016x}",
            self.involved.name.as_deref().unwrap_or("kube-shard"),
            crate::rt::next_u64()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: self.involved.namespace.clone(),
                ..ObjectMeta::default()
            },
            involved_object: self.involved.clone(),
            reason: Some(reason.to_owned()),
            message: Some(message.into()),
            type_: Some(match kind {
                Kind::Normal => "Normal".into(),
                Kind::Warning => "Warning".into(),
            }),
            source: Some(EventSource {
                component: Some("kube-shard".into()),
                host: Some(self.member.clone()),
            }),
            reporting_component: Some("kube-shard".into()),
            reporting_instance: Some(self.member.clone()),
            first_timestamp: Some(stamp.clone()),
            last_timestamp: Some(stamp),
            count: Some(1),
            ..Event::default()
        };
        let api = self.api.clone();
        self.spawner.spawn(async move {
            match tokio::time::timeout(
                Duration::from_secs(5),
                api.create(&PostParams::default(), &event),
            )
            .await
            {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => debug!(error = %err, "could not publish an Event"),
                Err(_) => debug!("publishing an Event timed out"),
            }
        });
    }
}
