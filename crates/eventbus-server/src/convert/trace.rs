//! W3C Trace Context across the broker: a publisher's `traceparent` and `tracestate`
//! (gRPC request metadata, HTTP request headers) are kept in the event's metadata
//! under the same keys — unless the event carries its own — so that every delivery
//! hands them on (`Subscribe`, `Consume`, Server-Sent Events, history, redelivery,
//! dead letters, redrive, Redis), and a push request carries them as its own headers.

use std::collections::HashMap;

/// The W3C `traceparent` header, and the metadata key that keeps it.
pub(crate) const TRACEPARENT: &str = "traceparent";
/// The W3C `tracestate` header, and the metadata key that keeps it.
pub(crate) const TRACESTATE: &str = "tracestate";
/// Longest `tracestate` kept (the W3C bound: 32 members of up to 256 bytes and commas).
const MAX_TRACESTATE: usize = 8192;

/// A caller's trace context, from its request's headers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TraceContext {
    parent: String,
    state: Option<String>,
}

impl TraceContext {
    /// The context `header` (a lookup of the request's headers) gives, if it gives a
    /// valid `traceparent`; an invalid one is ignored with its `tracestate`, as the
    /// W3C recommendation asks of a receiver.
    pub(crate) fn from_headers<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Option<Self> {
        let parent = header(TRACEPARENT).map(str::trim).filter(|p| valid_traceparent(p))?;
        let state = header(TRACESTATE).map(str::trim).filter(|s| !s.is_empty() && s.len() <= MAX_TRACESTATE);
        Some(Self { parent: parent.to_owned(), state: state.map(str::to_owned) })
    }

    /// From HTTP request headers.
    pub(crate) fn from_http(headers: &axum::http::HeaderMap) -> Option<Self> {
        Self::from_headers(|name| headers.get(name).and_then(|v| v.to_str().ok()))
    }

    /// From gRPC request metadata.
    pub(crate) fn from_grpc(metadata: &tonic::metadata::MetadataMap) -> Option<Self> {
        Self::from_headers(|name| metadata.get(name).and_then(|v| v.to_str().ok()))
    }

    /// The `traceparent`.
    pub(crate) fn parent(&self) -> &str {
        &self.parent
    }

    /// The `tracestate`, if one came with it.
    pub(crate) fn state(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// Keeps this context in an event's `metadata`, unless the event has a context of
    /// its own (a `traceparent` key: the publisher's client put it there per event).
    pub(crate) fn keep_in(&self, metadata: &mut HashMap<String, String>) {
        if metadata.contains_key(TRACEPARENT) {
            return;
        }
        metadata.insert(TRACEPARENT.to_owned(), self.parent.clone());
        if let Some(state) = &self.state {
            metadata.insert(TRACESTATE.to_owned(), state.clone());
        }
    }
}

/// The context an event carries, to hand on as request headers: its `traceparent`
/// when valid, and its `tracestate` with it.
pub(crate) fn of_event(metadata: &HashMap<String, String>) -> Option<(&str, Option<&str>)> {
    let parent = metadata.get(TRACEPARENT).map(String::as_str).filter(|p| valid_traceparent(p))?;
    Some((parent, metadata.get(TRACESTATE).map(String::as_str)))
}

/// `version-traceid-parentid-flags` in lower-case hex (2-32-16-2), a version other
/// than `ff`, ids not all zeros; a later version may add fields after a dash.
fn valid_traceparent(value: &str) -> bool {
    let bytes = value.as_bytes();
    let hex =
        |range: std::ops::Range<usize>| bytes[range].iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b));
    let nonzero = |range: std::ops::Range<usize>| bytes[range].iter().any(|b| *b != b'0');
    bytes.len() >= 55
        && hex(0..2)
        && &bytes[0..2] != b"ff"
        && (bytes.len() == 55 || (&bytes[0..2] != b"00" && bytes[55] == b'-'))
        && bytes[2] == b'-'
        && hex(3..35)
        && nonzero(3..35)
        && bytes[35] == b'-'
        && hex(36..52)
        && nonzero(36..52)
        && bytes[52] == b'-'
        && hex(53..55)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn context(parent: &str, state: Option<&str>) -> Option<TraceContext> {
        TraceContext::from_headers(|name| match name {
            TRACEPARENT => Some(parent),
            TRACESTATE => state,
            _ => None,
        })
    }

    #[test]
    fn a_valid_traceparent_is_kept_with_its_tracestate() {
        let ctx = context(PARENT, Some("congo=t61rcWkgMzE")).unwrap();
        let mut metadata = HashMap::from([("tenant".to_owned(), "acme".to_owned())]);
        ctx.keep_in(&mut metadata);
        assert_eq!(metadata[TRACEPARENT], PARENT);
        assert_eq!(metadata[TRACESTATE], "congo=t61rcWkgMzE");
        assert_eq!(metadata["tenant"], "acme");
        assert_eq!(of_event(&metadata), Some((PARENT, Some("congo=t61rcWkgMzE"))));
    }

    #[test]
    fn an_event_keeps_its_own_context() {
        let own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        let mut metadata = HashMap::from([(TRACEPARENT.to_owned(), own.to_owned())]);
        context(PARENT, Some("a=b")).unwrap().keep_in(&mut metadata);
        assert_eq!(metadata[TRACEPARENT], own);
        assert!(!metadata.contains_key(TRACESTATE), "a tracestate belongs with its traceparent");
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        let bad = [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ];
        for value in bad {
            assert_eq!(context(value, Some("a=b")), None, "{value:?}");
        }
        // A later version may carry more fields.
        assert!(context("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more", None).is_some());
        let no_state = context(PARENT, Some(&"x".repeat(MAX_TRACESTATE + 1))).unwrap();
        assert_eq!(no_state.state, None, "an oversized tracestate is dropped");
    }
}
