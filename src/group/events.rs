//! Kubernetes Events for handoffs, takeovers and alarms, regarding the member's Lease: `events.k8s.io/v1`
//! Events published through kube's [`Recorder`], so the group needs one RBAC rule (`create` and `patch` on
//! `events` in API group `events.k8s.io`). Fire-and-forget, bounded, and rate-limited per reason (and
//! subject): an Event never delays a renewal. The same note again after the rate limit continues the
//! Event as a series (the Recorder's patch); a new note is a new Event.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::rt::Spawner;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::Client;
use tokio::time::Instant;
use tracing::debug;

/// Warning or Normal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Normal,
    Warning,
}

/// The reporting controller every Event names.
const CONTROLLER: &str = "kube-shard";
/// At most one Event per reason (and subject) this often.
const MIN_INTERVAL: Duration = Duration::from_secs(10);
/// events.k8s.io/v1 refuses a longer `note`.
const MAX_NOTE: usize = 1024;
/// How long one publication may take.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// The last Event of one reason and subject: when, its note, and the recorder that keeps its series.
struct Sent {
    at: Instant,
    note: String,
    recorder: Recorder,
}

#[derive(Clone)]
pub(crate) struct Events {
    client: Client,
    reporter: Reporter,
    regarding: ObjectReference,
    last: Arc<Mutex<BTreeMap<String, Sent>>>,
    spawner: Spawner,
}

impl Events {
    /// Events regarding the Lease `lease` in `namespace`, reported by `member`.
    pub(crate) fn new(
        client: Client,
        namespace: &str,
        lease: &str,
        member: &str,
        spawner: Spawner,
    ) -> Self {
        Events {
            client,
            reporter: Reporter {
                controller: CONTROLLER.into(),
                instance: Some(member.into()),
            },
            regarding: ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                name: Some(lease.into()),
                namespace: Some(namespace.into()),
                ..ObjectReference::default()
            },
            last: Arc::default(),
            spawner,
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
        let note = truncate(message.into(), MAX_NOTE);
        let Some(recorder) = self.recorder_for(&format!("{reason}/{about}"), &note) else {
            return;
        };
        let event = Event {
            type_: match kind {
                Kind::Normal => EventType::Normal,
                Kind::Warning => EventType::Warning,
            },
            reason: reason.to_owned(),
            note: Some(note),
            action: reason.to_owned(),
            secondary: None,
        };
        let regarding = self.regarding.clone();
        self.spawner.spawn(async move {
            let published = recorder.publish(&event, &regarding);
            match tokio::time::timeout(PUBLISH_TIMEOUT, published).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => debug!(error = %err, "could not publish an Event"),
                Err(_) => debug!("publishing an Event timed out"),
            }
        });
    }

    /// The recorder to publish `note` under `key` with, unless one went out under `key` within the rate
    /// limit: the last one's (a series) when the note is the same, else a fresh one (a new Event).
    fn recorder_for(&self, key: &str, note: &str) -> Option<Recorder> {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(sent) = last.get_mut(key) {
            if now.duration_since(sent.at) < MIN_INTERVAL {
                return None;
            }
            sent.at = now;
            if sent.note == note {
                return Some(sent.recorder.clone());
            }
        }
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        let sent = Sent {
            at: now,
            note: note.to_owned(),
            recorder: recorder.clone(),
        };
        last.insert(key.to_owned(), sent);
        Some(recorder)
    }
}

/// `text` cut to at most `max` bytes, on a character boundary, marked with `…` when cut.
fn truncate(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let mut end = max - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_notes_are_cut_to_what_the_api_accepts() {
        assert_eq!(truncate("short".into(), MAX_NOTE), "short");
        let long = "é".repeat(700);
        let cut = truncate(long, MAX_NOTE);
        assert!(cut.len() <= MAX_NOTE && cut.ends_with('…'), "{}", cut.len());
    }
}
