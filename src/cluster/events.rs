//! Posting Events: one note limit and one way to log a refusal, for every component.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

/// Post an Event about `object` (logged when it cannot be posted).
pub async fn post(recorder: &Recorder, object: &ObjectReference, type_: EventType, reason: &str, action: &str, note: &str) {
    let ev = Event { type_, reason: reason.into(), note: Some(event_note(note)), action: action.into(), secondary: None };
    if let Err(e) = recorder.publish(&ev, object).await {
        tracing::warn!(object = object.name.as_deref().unwrap_or(""), reason, error = %e, "could not post the event");
    }
}

/// The API server refuses an Event whose note is over 1 KiB (and with it the Event): a longer
/// note is cut on a character boundary, marked with an ellipsis.
fn event_note(note: &str) -> String {
    const MAX_NOTE_BYTES: usize = 1024;
    if note.len() <= MAX_NOTE_BYTES {
        return note.to_string();
    }
    let mut end = MAX_NOTE_BYTES - '…'.len_utf8();
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &note[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_notes_fit_the_api_servers_limit() {
        assert_eq!(event_note("short"), "short");
        let exact = "x".repeat(1024);
        assert_eq!(event_note(&exact), exact);
        for long in ["y".repeat(5000), "é".repeat(3000)] {
            let n = event_note(&long);
            assert!(n.len() <= 1024 && n.len() > 1000 && n.ends_with('…'), "{} bytes", n.len());
        }
    }
}
