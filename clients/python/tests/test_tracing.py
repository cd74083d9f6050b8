"""Tracing: the client's spans (kept in memory by the SDK the `spans` fixture installs, as
an application would install its own), the context the events carry to subscribers and
workers, and eventbusd's spans (sent to the test OTLP receiver, `otlp-receiver`) in the
same trace."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN, NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags

from socle_eventbus import Ack, Client, Delivery, InvalidArgument, PublishRefused, Retry, Term, pb, publish_request
from socle_eventbus import tracing as eb_tracing
from socle_eventbus.worker import Worker

from conftest import REPO, Daemon, eventually

RECEIVER = Path(os.environ.get("EVENTBUS_OTLP_RECEIVER", REPO / "target" / "debug" / "otlp-receiver"))
app = trace.get_tracer("app")
OWN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
FAST_RETRY = pb.Backoff(initial_ms=10, multiplier=1.0, max_ms=10)


def hexid(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def ids(traceparent: str) -> Tuple[int, int]:
    """(trace id, parent span id) of a W3C `traceparent`."""
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00" and len(trace_id) == 32 and len(span_id) == 16, traceparent
    return int(trace_id, 16), int(span_id, 16)


def named(spans: InMemorySpanExporter, name: str) -> List[ReadableSpan]:
    return [s for s in spans.get_finished_spans() if s.name == name]


async def finished(spans: InMemorySpanExporter, name: str, count: int) -> List[ReadableSpan]:
    """The `count` finished spans called `name`, once they are (the worker ends a
    `process` span after its handler returned)."""

    async def there() -> bool:
        return len(named(spans, name)) >= count

    await eventually(there, what=f"{count} finished spans {name!r}")
    got = named(spans, name)
    assert len(got) == count, [s.name for s in got]
    return got


async def received(sub: object, first: "asyncio.Future[object]", count: int) -> List[pb.Event]:
    """The first `count` events of a subscription whose first `__anext__` is `first`."""
    events = [await asyncio.wait_for(first, 10)]
    while len(events) < count:
        events.append(await asyncio.wait_for(sub.__anext__(), 10))  # type: ignore[attr-defined]
    for e in events:
        assert isinstance(e, pb.Event), e
    return events  # type: ignore[return-value]


def carried(event: pb.Event, send: ReadableSpan) -> bool:
    """The event carries `send`'s context: its trace, `send` as the parent."""
    return ids(event.metadata["traceparent"]) == (send.context.trace_id, send.context.span_id)


@pytest.mark.parametrize("unary", [False, True], ids=["shared-stream", "unary"])
async def test_a_publish_in_a_span_hands_its_send_span_to_subscribers(
        daemon: Daemon, name: str, spans: InMemorySpanExporter, unary: bool) -> None:
    channel = f"{name}.order"
    async with await Client.connect(daemon.url, unary_publish=unary) as client:
        sub = client.subscribe(f"{name}.>")
        first = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        with app.start_as_current_span("checkout") as checkout:
            answer = await client.publish(channel, "42", metadata={"tenant": "acme"})
        [event] = await received(sub, first, 1)
        await sub.aclose()

    [send] = named(spans, f"send {channel}")
    app_ctx = checkout.get_span_context()
    trace_id, parent_id = ids(event.metadata["traceparent"])
    assert trace_id == app_ctx.trace_id, "the event is in the application's trace"
    assert parent_id == send.context.span_id, "the event's parent is the send span"
    assert event.metadata["tenant"] == "acme", "the caller's metadata is kept"
    assert send.parent is not None and send.parent.span_id == app_ctx.span_id
    assert send.context.trace_id == app_ctx.trace_id
    assert send.kind == SpanKind.PRODUCER
    assert dict(send.attributes or {}) == {
        "messaging.system": "eventbus",
        "messaging.destination.name": channel,
        "messaging.operation.type": "send",
        "messaging.operation.name": "publish",
        "messaging.message.body.size": 2,
        "messaging.message.id": answer.event_id,
    }
    assert send.status.status_code == StatusCode.UNSET


async def test_a_publish_outside_any_span_starts_a_trace(daemon: Daemon, name: str, spans: InMemorySpanExporter) -> None:
    channel = f"{name}.order"
    async with await Client.connect(daemon.url) as client:
        sub = client.subscribe(channel)
        first = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        assert not trace.get_current_span().get_span_context().is_valid
        await client.publish(channel, "42")
        [event] = await received(sub, first, 1)
        await sub.aclose()
    [send] = named(spans, f"send {channel}")
    assert send.parent is None, "a root span"
    assert carried(event, send)


async def test_a_handler_runs_in_a_process_span_child_of_the_publishers_send(
        daemon: Daemon, name: str, spans: InMemorySpanExporter) -> None:
    channel = f"{name}.order"
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(name, [channel])
        with app.start_as_current_span("checkout"):
            answer = await client.publish(channel, "order 42")
        current: List[trace.Span] = []

        async def handle(d: Delivery) -> Ack:
            current.append(trace.get_current_span())
            with app.start_as_current_span("charge"):
                await client.publish(f"{name}.charged", "ok")
            return Ack()

        async with Worker(client, name, handle):
            [process] = await finished(spans, f"process {channel}", 1)

    [send] = named(spans, f"send {channel}")
    assert process.kind == SpanKind.CONSUMER
    assert process.context.trace_id == send.context.trace_id, "the publisher's trace"
    assert process.parent is not None and process.parent.span_id == send.context.span_id, "send is the parent"
    assert process.parent.is_remote
    assert dict(process.attributes or {}) == {
        "messaging.system": "eventbus",
        "messaging.destination.name": channel,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.consumer.group.name": name,
        "messaging.message.id": answer.event_id,
        "messaging.message.body.size": len("order 42"),
        "messaging.eventbus.attempt": 1,
        "messaging.eventbus.outcome": "ack",
    }
    assert process.status.status_code == StatusCode.UNSET
    assert [s.get_span_context().span_id for s in current] == [process.context.span_id], "current in the handler"
    [charge] = named(spans, "charge")
    assert charge.parent is not None and charge.parent.span_id == process.context.span_id, "nested under process"
    [charged] = named(spans, f"send {name}.charged")
    assert charged.context.trace_id == send.context.trace_id, "a publish from the handler continues the trace"
    assert charged.parent is not None and charged.parent.span_id == charge.context.span_id


async def test_each_delivery_attempt_has_its_process_span(daemon: Daemon, name: str, spans: InMemorySpanExporter) -> None:
    """A handler that fails once then succeeds: two `process` spans, children of the same
    `send`; and a terminated event's."""
    order, bad = f"{name}.order", f"{name}.bad"
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(name, [f"{name}.>"], backoff=FAST_RETRY)
        await client.publish(order, "42")
        await client.publish(bad, "?")

        async def handle(d: Delivery) -> object:
            if d.event.channel == bad:
                return Term("unreadable")
            if d.attempt == 1:
                raise RuntimeError("card declined")
            return Ack()

        async with Worker(client, name, handle):
            processes = await finished(spans, f"process {order}", 2)
            [terminated] = await finished(spans, f"process {bad}", 1)

    [send] = named(spans, f"send {order}")
    processes.sort(key=lambda s: (s.attributes or {})["messaging.eventbus.attempt"])
    assert [(p.attributes or {})["messaging.eventbus.attempt"] for p in processes] == [1, 2]
    assert [(p.attributes or {})["messaging.eventbus.outcome"] for p in processes] == ["retry", "ack"]
    for p in processes:
        assert p.context.trace_id == send.context.trace_id
        assert p.parent is not None and p.parent.span_id == send.context.span_id, "both children of the send span"
    failed, succeeded = processes
    assert failed.status.status_code == StatusCode.ERROR and "card declined" in (failed.status.description or "")
    [exception] = [e for e in failed.events if e.name == "exception"]
    assert (exception.attributes or {})["exception.type"] == "RuntimeError"
    assert succeeded.status.status_code == StatusCode.UNSET and not succeeded.events
    assert (terminated.attributes or {})["messaging.eventbus.outcome"] == "term"
    assert terminated.status.status_code == StatusCode.ERROR


async def test_batch_and_stream_events_each_carry_their_own_send_span(
        daemon: Daemon, name: str, spans: InMemorySpanExporter) -> None:
    batch, stream, refused = f"{name}.batch", f"{name}.stream", f"{name}.*"
    requests = [publish_request(stream, str(i)) for i in range(3)]
    async with await Client.connect(daemon.url) as client:
        sub = client.subscribe(f"{name}.>")
        first = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        with app.start_as_current_span("import") as parent:
            results = await client.publish_batch(
                [publish_request(batch, "a"), publish_request(refused, "b"), publish_request(batch, "cc")])
            each = [a async for a in client.publish_stream(requests)]
            # The same requests again: the caller's requests were left without a context.
            cumulative = [a async for a in client.publish_stream(requests + [publish_request(refused)],
                                                                 ack="cumulative", window=2)]
        events = await received(sub, first, 2 + 3 + 3)
        await sub.aclose()

    assert isinstance(results[1], InvalidArgument) and len(each) == 3
    assert [(r.position, type(r.error)) for r in cumulative if isinstance(r, PublishRefused)] == [(3, InvalidArgument)]
    assert all("traceparent" not in r.metadata for r in requests)
    app_ctx = parent.get_span_context()
    sends = named(spans, f"send {batch}") + named(spans, f"send {stream}")
    assert len(sends) == 2 + 3 + 3
    for s in sends:
        assert s.parent is not None and s.parent.span_id == app_ctx.span_id and s.status.status_code == StatusCode.UNSET
    for e in events:
        [own] = [s for s in sends if carried(e, s)]
        assert (own.attributes or {})["messaging.destination.name"] == e.channel
        # Answered one by one: the span knows the event's id (cumulative totals do not say).
        assert (own.attributes or {}).get("messaging.message.id", e.id) == e.id
    assert len({e.metadata["traceparent"] for e in events}) == 8, "one send span per event"
    assert sorted((s.attributes or {})["messaging.message.body.size"] for s in named(spans, f"send {batch}")) == [1, 2]
    answered = [(s.attributes or {}).get("messaging.message.id") for s in named(spans, f"send {stream}")]
    assert sorted(i for i in answered if i) == sorted(r.event_id for r in each)
    rejected = named(spans, f"send {refused}")
    assert len(rejected) == 2, "the batch's refused event and the stream's"
    for s in rejected:
        assert s.status.status_code == StatusCode.ERROR and "InvalidArgument" in (s.status.description or "")


async def test_a_callers_own_traceparent_is_kept(daemon: Daemon, name: str, spans: InMemorySpanExporter) -> None:
    async with await Client.connect(daemon.url) as client:
        sub = client.subscribe(f"{name}.>")
        first = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        own = {"traceparent": OWN, "tracestate": "vendor=1"}
        with app.start_as_current_span("caller") as caller:
            await client.publish(f"{name}.one", "1", metadata=own)
            await client.publish_batch([publish_request(f"{name}.batch", "2", metadata=own)])
            _ = [a async for a in client.publish_stream([publish_request(f"{name}.stream", "3", metadata=own)])]
        events = await received(sub, first, 3)
        await sub.aclose()
    assert sorted(e.channel for e in events) == [f"{name}.batch", f"{name}.one", f"{name}.stream"]
    for e in events:
        assert dict(e.metadata) == own, "kept as the caller gave it"
    sends = [s for s in spans.get_finished_spans() if s.name.startswith(f"send {name}.")]
    assert len(sends) == 3, "the send spans are made all the same"
    assert all(s.parent is not None and s.parent.span_id == caller.get_span_context().span_id for s in sends)


async def test_without_an_sdk_events_carry_nothing(
        daemon: Daemon, name: str, spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch) -> None:
    """The API's no-op tracer, as in an application without the SDK: no span, and nothing
    written into events by any publish path (nor by the worker's handler)."""
    monkeypatch.setattr(eb_tracing, "tracer", trace.NoOpTracer())
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(name, [f"{name}.>"])
        sub = client.subscribe(f"{name}.>")
        first = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        await client.publish(f"{name}.one", "1")
        await client.publish_batch([publish_request(f"{name}.batch", "2")])
        _ = [a async for a in client.publish_stream([publish_request(f"{name}.stream", "3")], ack="cumulative")]
        events = await received(sub, first, 3)
        await sub.aclose()
        seen: List[bool] = []
        done = asyncio.Event()

        async def handle(d: Delivery) -> Ack:
            seen.append(trace.get_current_span().get_span_context().is_valid)
            if len(seen) == 3:
                done.set()
            return Ack()

        async with Worker(client, name, handle):
            await asyncio.wait_for(done.wait(), 20)
    assert [dict(e.metadata) for e in events] == [{}, {}, {}]
    assert seen == [False, False, False]
    assert spans.get_finished_spans() == ()


def test_an_invalid_context_is_not_injected(monkeypatch: pytest.MonkeyPatch) -> None:
    metadata: Dict[str, str] = {}
    eb_tracing.inject_context(metadata, INVALID_SPAN)
    with trace.use_span(INVALID_SPAN):
        eb_tracing.inject_context(metadata, trace.get_current_span())
    assert metadata == {}, "nothing for an invalid context"
    # A context received without an SDK (a non-recording span) is carried on as it is.
    remote = SpanContext(trace_id=0x0AF7651916CD43DD8448EB211C80319C, span_id=0xB7AD6B7169203331,
                         is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    eb_tracing.inject_context(metadata, NonRecordingSpan(remote))
    assert metadata == {"traceparent": OWN}
    kept = {"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}
    eb_tracing.inject_context(kept, NonRecordingSpan(remote))
    assert kept == {"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}
    # The publish path with the API's no-op tracer: outside a span nothing is written; in a
    # received context, that context.
    monkeypatch.setattr(eb_tracing, "tracer", trace.NoOpTracer())
    bare = publish_request("orders.created", "x")
    span = eb_tracing.start_send(bare)
    assert span is INVALID_SPAN and not span.is_recording() and dict(bare.metadata) == {}
    inside = publish_request("orders.created", "x")
    with trace.use_span(NonRecordingSpan(remote)):
        eb_tracing.start_send(inside)
    assert dict(inside.metadata) == {"traceparent": OWN}


# --- the broker's spans in the same trace ---


class Receiver:
    """The test OTLP receiver process, and the spans it printed."""

    def __init__(self) -> None:
        if not RECEIVER.exists():
            pytest.fail(f"{RECEIVER} not found: cargo build -p eventbus-testkit --bin otlp-receiver")
        self.proc = subprocess.Popen([str(RECEIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        first = self.proc.stdout.readline().split()
        assert first[:1] == ["listening"], first
        self.endpoint = first[1]
        self.spans: List[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.spans.append(json.loads(line))

    def named(self, name: str, trace_id: str) -> List[dict]:
        return [s for s in list(self.spans) if s["name"] == name and s["trace_id"] == trace_id]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture
def traced_daemon(tmp_path: Path, receiver: Receiver) -> Iterator[Daemon]:
    d = Daemon(tmp_path, {"EVENTBUS__TELEMETRY__OTLP__ENDPOINT": receiver.endpoint,
                          "EVENTBUS__TELEMETRY__OTLP__EXPORT_INTERVAL_MS": "20"})
    d.start()
    yield d
    d.stop()


async def test_one_trace_from_the_publisher_through_the_broker_to_the_worker(
        traced_daemon: Daemon, receiver: Receiver, name: str, spans: InMemorySpanExporter) -> None:
    channel = f"{name}.order"
    async with await Client.connect(traced_daemon.url) as client:
        await client.create_consumer(name, [f"{name}.>"], backoff=FAST_RETRY)
        with app.start_as_current_span("checkout") as checkout:
            await client.publish(channel, "42")
        attempts: List[int] = []
        done = asyncio.Event()

        async def handle(d: Delivery) -> object:
            with app.start_as_current_span("charge"):
                pass
            attempts.append(d.attempt)
            if d.attempt == 1:
                return Retry(after=0.01)
            done.set()
            return Ack()

        worker = Worker(client, name, handle)
        await worker.start()
        await asyncio.wait_for(done.wait(), 20)
        await worker.stop()

    [send] = named(spans, f"send {channel}")
    trace_id = send.context.trace_id
    assert send.parent is not None and send.parent.span_id == checkout.get_span_context().span_id
    assert send.kind == SpanKind.PRODUCER and (send.attributes or {})["messaging.destination.name"] == channel
    processes = sorted(named(spans, f"process {channel}"), key=lambda s: (s.attributes or {})["messaging.eventbus.attempt"])
    assert [(p.attributes or {})["messaging.eventbus.attempt"] for p in processes] == [1, 2]
    assert [(p.attributes or {})["messaging.eventbus.outcome"] for p in processes] == ["retry", "ack"]
    for p in processes:
        assert p.context.trace_id == trace_id and p.kind == SpanKind.CONSUMER
        assert p.parent is not None and p.parent.span_id == send.context.span_id, "the publisher's span is the parent"
        assert (p.attributes or {})["messaging.consumer.group.name"] == name
    charges = named(spans, "charge")
    assert sorted(c.parent.span_id for c in charges if c.parent) == sorted(p.context.span_id for p in processes)

    # The broker's side of the same trace, as the OTLP receiver got it.
    tid, send_id = hexid(trace_id, 32), hexid(send.context.span_id, 16)

    async def broker_spans() -> bool:
        return len(receiver.named(f"deliver {channel}", tid)) == 2 and bool(receiver.named(f"commit {channel}", tid))

    await eventually(broker_spans, what="the broker's spans")
    [publish] = receiver.named(f"publish {channel}", tid)
    assert publish["parent_span_id"] == send_id and publish["service"] == "eventbusd"
    [commit] = receiver.named(f"commit {channel}", tid)
    assert commit["parent_span_id"] == publish["span_id"]
    delivers = receiver.named(f"deliver {channel}", tid)
    assert sorted(d["attributes"]["eventbus.attempt"] for d in delivers) == ["1", "2"]
    assert all(d["parent_span_id"] == send_id for d in delivers)
