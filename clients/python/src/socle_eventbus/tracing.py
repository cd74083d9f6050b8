"""OpenTelemetry, through its API only (the application installs the SDK, its propagator
and its exporter).

Every publish (`Client.publish`, on the shared stream or unary; each event of
`publish_batch`; each request of `publish_stream`) runs in a `send <channel>` span (kind
PRODUCER, a child of the caller's current context), which ends when the broker answers
for the event. The global propagator (`opentelemetry.propagate`, W3C `traceparent` /
`tracestate` and `baggage` unless the application configured another) writes that span's
context into the event's metadata, unless the caller put a `traceparent` there: that one
is kept. eventbusd reads W3C Trace Context only, and hands the keys on with every
delivery.

The `Worker` runs each handler in a `process <channel>` span (kind CONSUMER), current
while the handler runs, whose parent is the context the global propagator reads back from
the delivered event's metadata: the publisher's `send` span.

Without an SDK the API's tracer makes no spans of its own: the `send` span is the
caller's current span if it is a non-recording one with a valid context (a context
received from elsewhere, carried on), else the invalid span, and then nothing is written
into the event and no propagator runs.
"""

from __future__ import annotations

from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator, List, MutableMapping, Optional

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from ._pb import eventbus_pb2 as pb
from ._version import __version__

tracer = trace.get_tracer("socle_eventbus", __version__)
"""The package's tracer (a proxy: the provider the application sets, whenever it does)."""
TRACEPARENT = "traceparent"


def inject_context(metadata: MutableMapping[str, str], span: Span, parent: Optional[Context] = None) -> None:
    """Writes `span`'s context into `metadata` with the global propagator (through a
    carrier dict merged into it), on top of `parent` (default: the current context, whose
    baggage goes along). Nothing when `metadata` has a `traceparent` already (the
    caller's own, kept) or when the span's context is invalid (no SDK, no caller context:
    nothing to carry)."""
    if not span.get_span_context().is_valid or TRACEPARENT in metadata:
        return
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span, parent))
    metadata.update(carrier)


def send_span(req: pb.PublishRequest, parent: Optional[Context] = None) -> Span:
    """The `send` span of publishing `req`, a child of `parent` (default: the current
    context)."""
    span = tracer.start_span(f"send {req.channel}", context=parent, kind=SpanKind.PRODUCER)
    if span.is_recording():
        span.set_attributes({
            "messaging.system": "eventbus",
            "messaging.destination.name": req.channel,
            "messaging.operation.type": "send",
            "messaging.operation.name": "publish",
            "messaging.message.body.size": len(req.payload),
        })
    return span


def start_send(req: pb.PublishRequest, parent: Optional[Context] = None) -> Span:
    """Starts the `send` span of publishing `req` (`send_span`), and puts its context in
    the request's metadata (`inject_context`)."""
    span = send_span(req, parent)
    inject_context(req.metadata, span, parent)
    return span


def end_send(span: Span, answer: Optional[pb.PublishResponse] = None, error: Optional[BaseException] = None) -> None:
    """Ends a `send` span with the broker's answer (its event id), or the error the
    publish failed with (recorded, status ERROR)."""
    if span.is_recording():
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        elif answer is not None:
            span.set_attribute("messaging.message.id", answer.event_id)
    span.end()


def end_sends(spans: List[Span], answers: List[object]) -> None:
    """Ends the `send` spans of a batch with each event's answer (a response or an error)."""
    for span, answer in zip(spans, answers):
        if isinstance(answer, BaseException):
            end_send(span, error=answer)
        else:
            end_send(span, answer if isinstance(answer, pb.PublishResponse) else None)


class StreamSends:
    """The `send` spans of one `publish_stream`'s requests, by position (from 0, in the
    order sent), each ended when the broker answers for its request: an answer in order
    (ack mode each), a refusal at its position, or a running total covering it
    (cumulative, none). The parent of every span is the context current when the stream
    began. Only recording spans are kept: without an SDK a request costs the no-op span."""

    def __init__(self) -> None:
        self._parent = otel_context.get_current()
        self._spans: "OrderedDict[int, Span]" = OrderedDict()
        self._sent = 0
        self._next = 0  # the next position answered in order (ack mode each)

    def start(self, req: pb.PublishRequest) -> pb.PublishRequest:
        """Starts the span of the next request sent; returns the request to send: `req`,
        or a copy carrying the span's context (the caller's requests are left as they
        are, so that one sent again gets a span of its own)."""
        span = send_span(req, self._parent)
        if span.get_span_context().is_valid and TRACEPARENT not in req.metadata:
            sent = pb.PublishRequest()
            sent.CopyFrom(req)
            inject_context(sent.metadata, span, self._parent)
            req = sent
        if span.is_recording():
            self._spans[self._sent] = span
        self._sent += 1
        return req

    def answered(self, response: pb.PublishResponse) -> None:
        """The answer to the next request in order."""
        span = self._spans.pop(self._next, None)
        self._next += 1
        if span is not None:
            end_send(span, response)

    def refused(self, position: int, error: BaseException) -> None:
        """The request at `position` was refused."""
        span = self._spans.pop(position, None)
        if span is not None:
            end_send(span, error=error)

    def covered(self, answered: int) -> None:
        """Running totals: the first `answered` requests are answered (refusals were
        answered on their own before the totals that count them)."""
        spans = self._spans
        while spans:
            position = next(iter(spans))
            if position >= answered:
                break
            end_send(spans.pop(position))

    def failed(self, error: BaseException) -> None:
        """The stream ended (or was closed) before the rest were answered."""
        spans, self._spans = self._spans, OrderedDict()
        for span in spans.values():
            end_send(span, error=error)


@contextmanager
def processing(consumer: str, delivery: pb.Delivery) -> Iterator[Span]:
    """The `process` span of handling `delivery` for `consumer`, current inside the block;
    its parent is the context extracted from the event's metadata (the publisher's `send`
    span), a new trace without one. The caller ends it with `processed`'s outcome; the
    block's end ends it."""
    event = delivery.event
    parent = propagate.extract(event.metadata, context=Context())
    span = tracer.start_span(f"process {event.channel}", context=parent, kind=SpanKind.CONSUMER)
    if span.is_recording():
        span.set_attributes({
            "messaging.system": "eventbus",
            "messaging.destination.name": event.channel,
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.consumer.group.name": consumer,
            "messaging.message.id": event.id,
            "messaging.message.body.size": len(event.payload),
            "messaging.eventbus.attempt": delivery.attempt,
        })
    with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
        yield span


def processed(span: Span, outcome: str, error: Optional[BaseException] = None) -> None:
    """Records a handler's outcome (`ack`, `retry`, `term`) on its `process` span as
    `messaging.eventbus.outcome`; the handler's exception, if it raised, is recorded; any
    outcome but `ack` sets status ERROR."""
    if not span.is_recording():
        return
    span.set_attribute("messaging.eventbus.outcome", outcome)
    if error is not None:
        span.record_exception(error)
    if outcome != "ack":
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}" if error else outcome))
