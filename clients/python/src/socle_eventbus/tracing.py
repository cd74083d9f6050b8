"""OpenTelemetry, through its API only (the application installs the SDK and exporter).

A publish runs in a `send <channel>` span (kind PRODUCER) whose context the event carries
as W3C `traceparent` / `tracestate` in its metadata (unless the caller put a
`traceparent` there); the `Worker` runs each handler in a `process <channel>` span (kind
CONSUMER), current while the handler runs, whose parent is that context. The broker reads
W3C Trace Context only, so the context is written in that format whatever propagator the
application configured. Without an SDK the API's spans record nothing and carry the
caller's context on, if there is one: nothing else is added to events.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ._pb import eventbus_pb2 as pb

_tracer = trace.get_tracer("socle_eventbus", "0.1.0")
_w3c = TraceContextTextMapPropagator()
TRACEPARENT = "traceparent"


def start_send(req: pb.PublishRequest) -> Span:
    """Starts the `send` span of publishing `req`, and puts its context in the request's
    metadata unless the caller gave one."""
    span = _tracer.start_span(f"send {req.channel}", kind=SpanKind.PRODUCER)
    if span.is_recording():
        span.set_attributes({
            "messaging.system": "eventbus",
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.destination.name": req.channel,
            "messaging.message.body.size": len(req.payload),
        })
    if TRACEPARENT not in req.metadata and span.get_span_context().is_valid:
        carrier: dict[str, str] = {}
        _w3c.inject(carrier, context=trace.set_span_in_context(span))
        for key, value in carrier.items():
            req.metadata[key] = value
    return span


def end_send(span: Span, answer: Optional[pb.PublishResponse] = None, error: Optional[BaseException] = None) -> None:
    """Ends a `send` span with the broker's answer, or the error the call raised."""
    if span.is_recording():
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        elif answer is not None:
            span.set_attribute("messaging.message.id", answer.event_id)
    span.end()


def end_sends(spans: list[Span], answers: list[object]) -> None:
    """Ends the `send` spans of a batch with each event's answer (a response or an error)."""
    for span, answer in zip(spans, answers):
        if isinstance(answer, BaseException):
            end_send(span, error=answer)
        else:
            end_send(span, answer if isinstance(answer, pb.PublishResponse) else None)


@contextmanager
def processing(consumer: str, delivery: pb.Delivery) -> Iterator[Span]:
    """The `process` span of handling `delivery` for `consumer`, current inside the block;
    a child of the publisher's context when the event carries one."""
    event = delivery.event
    parent = _w3c.extract(event.metadata) if TRACEPARENT in event.metadata else otel_context.Context()
    span = _tracer.start_span(f"process {event.channel}", context=parent, kind=SpanKind.CONSUMER)
    if span.is_recording():
        span.set_attributes({
            "messaging.system": "eventbus",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": event.channel,
            "messaging.consumer.group.name": consumer,
            "messaging.message.id": event.id,
            "messaging.message.body.size": len(event.payload),
            "messaging.eventbus.attempt": delivery.attempt,
        })
    with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        yield span


def processed(span: Span, outcome: str, error: Optional[BaseException] = None) -> None:
    """Records a handler's outcome (`ack`, `retry`, `term`) on its `process` span."""
    if not span.is_recording():
        return
    span.set_attribute("messaging.eventbus.outcome", outcome)
    if error is not None:
        span.record_exception(error)
    if outcome != "ack":
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}" if error else outcome))


def current_carrier() -> dict[str, str]:
    """The caller's current context as W3C headers (empty without one), for the events
    of a publish stream."""
    carrier: dict[str, str] = {}
    _w3c.inject(carrier)
    return carrier
