//! eventbusd's own spans, exported with OTLP when `telemetry.otlp.endpoint` is set:
//! `publish`, `commit` (the durable engine's part of a publish), `deliver` (an event
//! handed to a subscription's or a consumer's stream), `push` (a push consumer's POST)
//! and `redrive`. Each is a child of the event's trace context (a publisher's
//! `traceparent`), so that one trace runs from the publisher through the broker to the
//! worker. An event published without a context gets the context of its `publish` span
//! when that span is sampled (`telemetry.sampling.ratio`), so that its deliveries and
//! the workers that handle it join the trace the broker started.
//!
//! Off (the default), [`Spans`] holds nothing and every call returns at its first branch:
//! no clock read, no lookup, no allocation.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use eventbus_core::{Event, PublishInput, Published};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};

use crate::config::TelemetrySettings;
use crate::convert::trace::{self, TRACEPARENT};

/// `messaging.system`: span names and attributes follow OpenTelemetry's messaging
/// conventions.
fn system() -> KeyValue {
    KeyValue::new("messaging.system", "eventbus")
}

/// The broker's spans: a cheap handle, clone it freely. [`Spans::off`] makes none.
#[derive(Clone, Default)]
pub(crate) struct Spans {
    inner: Option<Arc<Exporting>>,
}

struct Exporting {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl std::fmt::Debug for Spans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spans").field("exporting", &self.inner.is_some()).finish()
    }
}

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot export spans to telemetry.otlp.endpoint {endpoint:?}: {source}")]
pub struct SpansError {
    endpoint: String,
    #[source]
    source: opentelemetry_otlp::ExporterBuildError,
}

impl Spans {
    /// No spans.
    pub(crate) fn off() -> Self {
        Self::default()
    }

    /// Spans exported to `settings.otlp.endpoint`, or none when it is empty. Needs a
    /// Tokio runtime (the exporter's gRPC client runs on it).
    pub(crate) fn start(settings: &TelemetrySettings) -> Result<Self, SpansError> {
        let endpoint = settings.otlp.endpoint.trim();
        if endpoint.is_empty() {
            return Ok(Self::off());
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(Duration::from_millis(settings.otlp.timeout_ms))
            .build()
            .map_err(|source| SpansError { endpoint: endpoint.to_owned(), source })?;
        let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sampling.ratio)));
        let resource = Resource::builder().with_service_name(settings.service_name.clone()).build();
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(Duration::from_millis(settings.otlp.export_interval_ms))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batch).build())
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("eventbusd");
        tracing::info!(endpoint, ratio = settings.sampling.ratio, "exporting spans with OTLP");
        Ok(Self { inner: Some(Arc::new(Exporting { provider, tracer })) })
    }

    /// Whether spans are made at all.
    pub(crate) fn enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Sends the spans still buffered; called once at shutdown. The exporter's thread
    /// waits on its gRPC client, which this runtime drives: the wait is not taken on a
    /// runtime thread.
    pub(crate) async fn flush(&self) {
        let Some(inner) = self.inner.clone() else { return };
        match tokio::task::spawn_blocking(move || inner.provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "the last spans could not be exported"),
            Err(err) => tracing::warn!(%err, "the last spans could not be exported"),
        }
    }

    /// Starts the `publish` span of `input`, and gives an event without a trace context
    /// the span's own when it is sampled.
    pub(crate) fn publish(&self, input: &mut PublishInput) -> Option<PublishSpan> {
        let inner = self.inner.as_ref()?;
        let parent = context_of(&input.metadata);
        let start = SystemTime::now();
        let mut span = inner
            .tracer
            .span_builder("publish")
            .with_kind(SpanKind::Server)
            .with_start_time(start)
            .start_with_context(&inner.tracer, &parent);
        if !span.is_recording() {
            return None;
        }
        span.update_name(format!("publish {}", input.channel));
        span.set_attributes([
            system(),
            KeyValue::new("messaging.operation.name", "publish"),
            KeyValue::new("messaging.operation.type", "receive"),
            KeyValue::new("messaging.destination.name", input.channel.clone()),
            KeyValue::new("messaging.message.body.size", input.payload.len() as i64),
        ]);
        if !input.metadata.contains_key(TRACEPARENT) {
            input.metadata.insert(TRACEPARENT.to_owned(), traceparent(span.span_context()));
        }
        let channel = input.channel.clone();
        Some(PublishSpan { span, start, channel, tracer: inner.tracer.clone() })
    }

    /// [`Spans::publish`] for each of `inputs`, in order.
    pub(crate) fn publish_all(&self, inputs: &mut [PublishInput]) -> PublishSpans {
        match self.enabled() {
            true => PublishSpans(inputs.iter_mut().map(|input| self.publish(input)).collect()),
            false => PublishSpans(Vec::new()),
        }
    }

    /// A `deliver` span for each event of `events` that carries a sampled context,
    /// handed to `to` (a subscription's id or a consumer's name): over as it starts, the
    /// event being on its way to the client.
    pub(crate) fn deliver<'a>(&self, to: Recipient<'_>, events: impl IntoIterator<Item = Delivered<'a>>) {
        let Some(inner) = &self.inner else { return };
        for delivered in events {
            let Some(parent) = sampled_context(&delivered.event.metadata) else { continue };
            let mut span = inner
                .tracer
                .span_builder(format!("deliver {}", delivered.event.channel))
                .with_kind(SpanKind::Producer)
                .start_with_context(&inner.tracer, &parent);
            span.set_attributes([
                system(),
                KeyValue::new("messaging.operation.name", "deliver"),
                KeyValue::new("messaging.operation.type", "send"),
                KeyValue::new("messaging.destination.name", delivered.event.channel.clone()),
                KeyValue::new("messaging.message.id", delivered.event.id.to_string()),
                KeyValue::new("messaging.message.body.size", delivered.event.payload.len() as i64),
            ]);
            match to {
                Recipient::Subscription(id) => {
                    span.set_attribute(KeyValue::new("eventbus.subscription.id", id.to_owned()))
                }
                Recipient::Consumer(name) => {
                    span.set_attribute(KeyValue::new("messaging.consumer.group.name", name.to_owned()));
                }
            }
            if let Some(attempt) = delivered.attempt {
                span.set_attribute(KeyValue::new("eventbus.attempt", i64::from(attempt)));
            }
            if delivered.recovered {
                span.set_attribute(KeyValue::new("eventbus.recovered", true));
            }
            span.end();
        }
    }

    /// The `push` span of a push consumer's POST of `event` (attempt `attempt`), if the
    /// event carries a sampled context; ended with [`PushSpan::end`].
    pub(crate) fn push(&self, consumer: &str, endpoint: &url::Url, event: &Event, attempt: u32) -> Option<PushSpan> {
        let inner = self.inner.as_ref()?;
        let parent = sampled_context(&event.metadata)?;
        let mut span = inner
            .tracer
            .span_builder(format!("push {}", event.channel))
            .with_kind(SpanKind::Client)
            .start_with_context(&inner.tracer, &parent);
        span.set_attributes([
            system(),
            KeyValue::new("messaging.operation.name", "push"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.destination.name", event.channel.clone()),
            KeyValue::new("messaging.message.id", event.id.to_string()),
            KeyValue::new("messaging.consumer.group.name", consumer.to_owned()),
            KeyValue::new("eventbus.attempt", i64::from(attempt)),
            KeyValue::new("http.request.method", "POST"),
            KeyValue::new("server.address", endpoint.host_str().unwrap_or_default().to_owned()),
        ]);
        Some(PushSpan(span))
    }

    /// The `redrive` span of an operator's redrive of `consumer`, a child of the
    /// caller's context when it sent one.
    pub(crate) fn redrive<E: std::fmt::Display>(
        &self,
        consumer: &str,
        caller: Option<&trace::TraceContext>,
        redriven: Result<u64, &E>,
    ) {
        let Some(inner) = &self.inner else { return };
        let parent = caller.map(|c| context_from(c.parent(), c.state())).unwrap_or_default();
        let mut span = inner
            .tracer
            .span_builder(format!("redrive {consumer}"))
            .with_kind(SpanKind::Server)
            .start_with_context(&inner.tracer, &parent);
        span.set_attributes([
            system(),
            KeyValue::new("messaging.operation.name", "redrive"),
            KeyValue::new("messaging.consumer.group.name", consumer.to_owned()),
        ]);
        match redriven {
            Ok(count) => span.set_attribute(KeyValue::new("eventbus.redriven", count as i64)),
            Err(refused) => span.set_status(Status::error(refused.to_string())),
        }
        span.end();
    }
}

/// Who a delivery was for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Recipient<'a> {
    Subscription(&'a str),
    Consumer(&'a str),
}

/// One delivered event, as a `deliver` span describes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Delivered<'a> {
    pub(crate) event: &'a Event,
    /// The consumer's delivery attempt (1 for the first).
    pub(crate) attempt: Option<u32>,
    /// Replayed from history to a subscriber that came back.
    pub(crate) recovered: bool,
}

/// A `publish` span, until its answer.
pub(crate) struct PublishSpan {
    span: opentelemetry_sdk::trace::Span,
    start: SystemTime,
    channel: String,
    tracer: SdkTracer,
}

impl PublishSpan {
    /// Ends the span with the publish's answer (`Err`: why it was refused), and
    /// records the durable engine's part as a `commit` child.
    pub(crate) fn end<E: std::fmt::Display>(mut self, answer: Result<&Published, &E>) {
        match answer {
            Ok(published) => {
                self.span.set_attributes([
                    KeyValue::new("messaging.message.id", published.event_id.to_string()),
                    KeyValue::new("eventbus.delivered", i64::from(published.delivered)),
                    KeyValue::new("eventbus.captured", i64::from(published.captured)),
                    KeyValue::new("eventbus.duplicate", published.duplicate),
                ]);
                if let Some(capture) = published.capture {
                    self.commit(capture.after, capture.took, published.captured);
                }
            }
            Err(refused) => self.span.set_status(Status::error(refused.to_string())),
        }
        self.span.end();
    }

    fn commit(&self, after: Duration, took: Duration, captured: u32) {
        let parent = Context::new().with_remote_span_context(self.span.span_context().clone());
        let began = self.start + after;
        let mut span = self
            .tracer
            .span_builder(format!("commit {}", self.channel))
            .with_kind(SpanKind::Internal)
            .with_start_time(began)
            .with_attributes([system(), KeyValue::new("eventbus.captured", i64::from(captured))])
            .start_with_context(&self.tracer, &parent);
        span.end_with_timestamp(began + took);
    }
}

/// The `publish` spans of several events, in their order (empty when off).
pub(crate) struct PublishSpans(Vec<Option<PublishSpan>>);

impl PublishSpans {
    /// Ends each span with its event's answer; events left unanswered (a stream that
    /// stops at the first refusal) end as not published.
    pub(crate) fn end_all<E: std::fmt::Display>(self, answers: &[Result<Published, E>]) {
        let mut answers = answers.iter();
        for span in self.0 {
            let answer = answers.next();
            let Some(span) = span else { continue };
            match answer {
                Some(answer) => span.end(answer.as_ref()),
                None => span.end::<&str>(Err(&"not published: an earlier event of the call was refused")),
            }
        }
    }
}

/// A push consumer's POST, until its answer.
pub(crate) struct PushSpan(opentelemetry_sdk::trace::Span);

impl PushSpan {
    /// Ends it with the endpoint's HTTP status, or why there was none.
    pub(crate) fn end(mut self, status: Result<u16, &str>) {
        match status {
            Ok(code) => {
                self.0.set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
                if !(200..300).contains(&code) {
                    self.0.set_status(Status::error(format!("the endpoint answered {code}")));
                }
            }
            Err(failed) => self.0.set_status(Status::error(failed.to_owned())),
        }
        self.0.end();
    }
}

/// The remote context `metadata` carries, or the empty one.
fn context_of(metadata: &HashMap<String, String>) -> Context {
    match trace::of_event(metadata) {
        Some((parent, state)) => context_from(parent, state),
        None => Context::new(),
    }
}

/// The context of an event whose publisher sampled its trace.
fn sampled_context(metadata: &HashMap<String, String>) -> Option<Context> {
    let context = context_of(metadata);
    context.span().span_context().is_sampled().then_some(context)
}

/// A remote parent from a valid `traceparent` (checked by [`trace::of_event`]).
fn context_from(parent: &str, state: Option<&str>) -> Context {
    let field = |range: std::ops::Range<usize>| parent.get(range).unwrap_or_default();
    let trace_id = TraceId::from_hex(field(3..35)).unwrap_or(TraceId::INVALID);
    let span_id = SpanId::from_hex(field(36..52)).unwrap_or(SpanId::INVALID);
    let flags = u8::from_str_radix(field(53..55), 16).unwrap_or(0) & TraceFlags::SAMPLED.to_u8();
    let state = state.and_then(|s| TraceState::from_str(s).ok()).unwrap_or_default();
    let remote = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state);
    match remote.is_valid() {
        true => Context::new().with_remote_span_context(remote),
        false => Context::new(),
    }
}

/// `00-<trace id>-<span id>-<flags>` of a span the broker started.
fn traceparent(context: &SpanContext) -> String {
    format!("00-{}-{}-{:02x}", context.trace_id(), context.span_id(), context.trace_flags().to_u8())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_becomes_a_remote_parent_and_back() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = context_from(parent, Some("congo=t61rcWkgMzE"));
        let span = context.span();
        let remote = span.span_context();
        assert!(remote.is_valid() && remote.is_remote() && remote.is_sampled());
        assert_eq!(remote.trace_state().get("congo"), Some("t61rcWkgMzE"));
        assert_eq!(traceparent(remote), parent);
        let unsampled = context_from("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", None);
        assert!(!unsampled.span().span_context().is_sampled());
        let metadata = HashMap::from([(TRACEPARENT.to_owned(), parent.replace("-01", "-00"))]);
        assert!(sampled_context(&metadata).is_none(), "an unsampled trace makes no delivery span");
    }

    #[test]
    fn off_makes_no_span_and_leaves_events_alone() {
        let spans = Spans::off();
        let mut input = PublishInput { channel: "orders.created".into(), ..Default::default() };
        assert!(spans.publish(&mut input).is_none());
        assert!(input.metadata.is_empty());
    }
}
