//! OpenTelemetry through `tracing`: a publish runs in a `send <channel>` span (kind
//! producer) whose context goes into the event's metadata as W3C `traceparent` and
//! `tracestate` (the events of a publish stream carry the caller's context); the [`Worker`](crate::Worker) runs each handler in a
//! `process <channel>` span (kind consumer) whose parent is that context, so that the
//! handler's own spans and the events it publishes continue the publisher's trace.
//!
//! The spans are `tracing` spans: they reach OpenTelemetry through the application's
//! `tracing-opentelemetry` layer and SDK, as the OpenTelemetry conventions ask of a
//! library. Without that layer no context is made and nothing is added to events,
//! unless the caller is inside an OpenTelemetry context of its own (then that one is
//! handed on). The broker reads W3C Trace Context only, so the context is written in
//! that format whatever propagator the application installed.

use std::collections::HashMap;
use std::str::FromStr;

use eventbus_proto::pb;
use opentelemetry::Context;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::Outcome;

/// The W3C header, and the event metadata key that carries it.
pub(crate) const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// The `send` span of publishing `request`; its context is put in the request's
/// metadata unless the caller put a `traceparent` there.
pub(crate) fn send(request: &mut pb::PublishRequest) -> tracing::Span {
    let span = tracing::info_span!(
        "send",
        otel.name = %format_args!("send {}", request.channel),
        otel.kind = "producer",
        otel.status_code = Empty,
        messaging.system = "eventbus",
        messaging.operation.type = "send",
        messaging.operation.name = "publish",
        messaging.destination.name = %request.channel,
        messaging.message.body.size = request.payload.len(),
        messaging.message.id = Empty,
    );
    if !request.metadata.contains_key(TRACEPARENT) {
        // Without a tracing-opentelemetry layer the span has no context of its own: the
        // caller's OpenTelemetry context, if any, is handed on instead.
        let _entered = span.enter();
        carry_current(&mut request.metadata);
    }
    span
}

/// Puts the caller's current context (its `tracing` span's, else its OpenTelemetry
/// one) in `metadata`, unless a `traceparent` is there: for the events of a publish
/// stream, which answers them in bulk rather than each in a span of its own.
pub(crate) fn carry_current(metadata: &mut HashMap<String, String>) {
    if metadata.contains_key(TRACEPARENT) {
        return;
    }
    let span = tracing::Span::current();
    let own = (!span.is_disabled()).then(|| span.context()).filter(|c| c.span().span_context().is_valid());
    inject(&own.unwrap_or_else(Context::current), metadata);
}

/// Ends a `send` span with the broker's answer.
pub(crate) fn sent<E: std::fmt::Display>(span: &tracing::Span, answer: Result<&pb::PublishResponse, &E>) {
    if span.is_disabled() {
        return;
    }
    match answer {
        Ok(published) => {
            span.record("messaging.message.id", published.event_id.as_str());
        }
        Err(err) => {
            span.record("otel.status_code", "ERROR");
            span.set_attribute("error.message", err.to_string());
        }
    }
}

/// The `process` span of a worker's handling of `event` for `consumer`, a child of
/// the publisher's context when the event carries one.
pub(crate) fn process(consumer: &str, event: &pb::Event, attempt: u32) -> tracing::Span {
    let span = tracing::info_span!(
        "process",
        otel.name = %format_args!("process {}", event.channel),
        otel.kind = "consumer",
        otel.status_code = Empty,
        messaging.system = "eventbus",
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = %event.channel,
        messaging.consumer.group.name = consumer,
        messaging.message.id = %event.id,
        messaging.message.body.size = event.payload.len(),
        messaging.eventbus.attempt = attempt,
        messaging.eventbus.outcome = Empty,
    );
    if !span.is_disabled()
        && let Some(parent) = extract(&event.metadata)
    {
        // Refused only by a span no layer records, which has no parent to set.
        let _ = span.set_parent(parent);
    }
    span
}

/// Records a handler's outcome on its `process` span.
pub(crate) fn processed(span: &tracing::Span, outcome: &Outcome) {
    if span.is_disabled() {
        return;
    }
    let (name, failed) = match outcome {
        Outcome::Ack => ("ack", false),
        Outcome::Retry { .. } => ("retry", true),
        Outcome::Term(_) => ("term", true),
    };
    span.record("messaging.eventbus.outcome", name);
    if failed {
        span.record("otel.status_code", "ERROR");
    }
}

/// Writes `context`'s span, when it has a valid one, as W3C Trace Context.
fn inject(context: &Context, metadata: &mut HashMap<String, String>) {
    let span = context.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return;
    }
    let flags = sc.trace_flags().to_u8() & TraceFlags::SAMPLED.to_u8();
    metadata.insert(TRACEPARENT.to_owned(), format!("00-{}-{}-{flags:02x}", sc.trace_id(), sc.span_id()));
    let state = sc.trace_state().header();
    if !state.is_empty() {
        metadata.insert(TRACESTATE.to_owned(), state);
    }
}

/// The remote context an event's W3C `traceparent` names, if valid.
pub(crate) fn extract(metadata: &HashMap<String, String>) -> Option<Context> {
    let parent = metadata.get(TRACEPARENT)?.trim();
    let mut fields = parent.split('-');
    let (version, trace, span, flags) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    let well_formed = version.len() == 2
        && version != "ff"
        && (version != "00" || fields.next().is_none())
        && trace.len() == 32
        && span.len() == 16
        && flags.len() == 2
        && [trace, span, flags].iter().all(|f| f.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    if !well_formed {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8();
    let state = metadata.get(TRACESTATE).and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        TraceFlags::new(flags),
        true,
        state,
    );
    context.is_valid().then(|| Context::new().with_remote_span_context(context))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_context_goes_out_and_comes_back_as_w3c_trace_context() {
        let metadata = HashMap::from([
            (TRACEPARENT.to_owned(), PARENT.to_owned()),
            (TRACESTATE.to_owned(), "congo=t61rcWkgMzE".to_owned()),
        ]);
        let context = extract(&metadata).unwrap();
        let mut out = HashMap::new();
        inject(&context, &mut out);
        assert_eq!(out, metadata);
    }

    #[test]
    fn malformed_contexts_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            let metadata = HashMap::from([(TRACEPARENT.to_owned(), bad.to_owned())]);
            assert!(extract(&metadata).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn without_a_context_nothing_is_added() {
        let mut request = pb::PublishRequest { channel: "orders.created".into(), ..Default::default() };
        let _span = send(&mut request);
        assert!(request.metadata.is_empty(), "{:?}", request.metadata);
    }
}
