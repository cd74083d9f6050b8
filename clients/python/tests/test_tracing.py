"""Tracing: the client's spans (kept in memory by the SDK the tests install, as an
application would install its own) and eventbusd's spans (sent to the test OTLP receiver,
`otlp-receiver`), one trace from the publisher's span to the worker's handler."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN, SpanKind

from socle_eventbus import Ack, Client, Delivery, Retry, pb, publish_request
from socle_eventbus import tracing as eb_tracing
from socle_eventbus.worker import Worker

from conftest import REPO, Daemon, eventually

RECEIVER = Path(os.environ.get("EVENTBUS_OTLP_RECEIVER", REPO / "target" / "debug" / "otlp-receiver"))
EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)
app = trace.get_tracer("app")


def hexid(n: int, width: int) -> str:
    return format(n, f"0{width}x")


def named(name: str) -> List[ReadableSpan]:
    return [s for s in EXPORTER.get_finished_spans() if s.name == name]


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
        traced_daemon: Daemon, receiver: Receiver, name: str) -> None:
    EXPORTER.clear()
    channel = f"{name}.order"
    async with await Client.connect(traced_daemon.url) as client:
        await client.create_consumer(name, [f"{name}.>"], backoff=pb.Backoff(initial_ms=10, multiplier=1.0, max_ms=10))
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

    [send] = named(f"send {channel}")
    trace_id = send.context.trace_id
    assert send.parent is not None and send.parent.span_id == checkout.get_span_context().span_id
    assert send.kind == SpanKind.PRODUCER and send.attributes["messaging.destination.name"] == channel
    processes = sorted(named(f"process {channel}"), key=lambda s: s.attributes["messaging.eventbus.attempt"])
    assert [p.attributes["messaging.eventbus.attempt"] for p in processes] == [1, 2]
    assert [p.attributes["messaging.eventbus.outcome"] for p in processes] == ["retry", "ack"]
    for p in processes:
        assert p.context.trace_id == trace_id and p.kind == SpanKind.CONSUMER
        assert p.parent is not None and p.parent.span_id == send.context.span_id, "the publisher's span is the parent"
        assert p.attributes["messaging.consumer.group.name"] == name
    charges = named("charge")
    assert sorted(c.parent.span_id for c in charges) == sorted(p.context.span_id for p in processes)

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


async def test_batches_streams_and_explicit_contexts(daemon: Daemon, name: str) -> None:
    EXPORTER.clear()
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with await Client.connect(daemon.url) as client:
        sub = client.subscribe(f"{name}.>")
        first = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        await client.publish(f"{name}.own", "0", metadata={"traceparent": own})
        with app.start_as_current_span("batching"):
            await client.publish_batch([publish_request(f"{name}.batch", str(i)) for i in range(2)])
            answers = [a async for a in client.publish_stream([publish_request(f"{name}.stream", "s")])]
        assert len(answers) == 1
        events = [await asyncio.wait_for(first, 10)]
        while len(events) < 4:
            events.append(await asyncio.wait_for(sub.__anext__(), 10))
        await sub.aclose()
    got: Dict[str, List[str]] = {}
    for e in events:
        assert isinstance(e, pb.Event), e
        got.setdefault(e.channel, []).append(e.metadata["traceparent"])
    assert got[f"{name}.own"] == [own], "a caller's own context is kept"
    sends = named(f"send {name}.batch")
    assert len(sends) == 2
    expected = sorted(f"00-{hexid(s.context.trace_id, 32)}-{hexid(s.context.span_id, 16)}" for s in sends)
    # The flags are the SDK's (01 sampled, and 02 "random trace id" from newer ones).
    assert sorted(p[:-3] for p in got[f"{name}.batch"]) == expected, "each event of a batch carries its own send span"
    [batching] = named("batching")
    [stream_parent] = got[f"{name}.stream"]
    assert stream_parent.split("-")[2] == hexid(batching.context.span_id, 16), "a stream carries the caller's context"


def test_without_a_valid_span_nothing_is_injected() -> None:
    req = pb.PublishRequest(channel="orders.created")
    with trace.use_span(INVALID_SPAN):
        span = eb_tracing.start_send(req)
    assert span.get_span_context().is_valid, "the SDK makes a root span"
    assert "traceparent" in req.metadata
    # The API alone (no SDK) with no current span: a non-recording span, nothing added.
    bare = pb.PublishRequest(channel="orders.created")
    noop = trace.NoOpTracerProvider().get_tracer("x").start_span("send")
    assert not noop.get_span_context().is_valid
    carrier: Dict[str, str] = {}
    eb_tracing._w3c.inject(carrier, context=trace.set_span_in_context(noop))
    assert carrier == {} and "traceparent" not in bare.metadata
