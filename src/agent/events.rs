//! The agent's Events on its Node: what a person reading `kubectl describe node` sees of each
//! reconcile (Applied, Drained, EvictionBlocked, a failure's reason, …). Best-effort: an Event
//! that cannot be written is logged, never a reason to fail a reconcile.

use kube::runtime::events::{Event, EventType};
use tracing::warn;

use super::reconcile::{content_hash, Reconciler};

impl Reconciler {
    pub(super) async fn event(&self, type_: EventType, reason: &str, note: &str) {
        let event = reconcile_event(type_, reason, note);
        if let Err(e) = self.recorder.publish(&event, &self.node_ref).await {
            warn!(error = %e, "could not publish an event");
        }
    }

    /// Publish an Event without waiting for it, for the last word of a reconcile: the loop is
    /// then free for the next change at once. Events are best-effort either way (a failure is
    /// logged); this one is sent after the state it reports.
    pub(super) fn event_in_background(&self, type_: EventType, reason: &str, note: &str) {
        let event = reconcile_event(type_, reason, note);
        let (recorder, node_ref) = (self.recorder.clone(), self.node_ref.clone());
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &node_ref).await {
                warn!(error = %e, "could not publish an event");
            }
        });
    }
}

fn reconcile_event(type_: EventType, reason: &str, note: &str) -> Event {
    let note: String = note.chars().take(1000).collect();
    Event {
        type_,
        reason: reason.to_string(),
        action: event_action("Reconcile", &note),
        note: Some(note),
        secondary: None,
    }
}

/// The Event's `action`: `what` and a short hash of the note. kube-runtime's Recorder folds
/// events with the same type, action and reason into one series and keeps the first note, so
/// with a fixed action a second `Applied` (another profile) showed the first one's note. With
/// the note's hash in the action, only repeats of the same message become a series (as
/// client-go's correlator, which keys on the message too).
pub fn event_action(what: &str, note: &str) -> String {
    format!("{what}-{:.12}", content_hash(note))
}
