"""`Worker`: the push worker for a durable consumer, so nobody hand-writes the
Consume loop.

Layout of a running worker:
- one Consume stream at a time (`_session`): attach, then a reader that queues deliveries
  locally (at most `concurrency + queue_capacity` are ever held: that is the
  `max_in_flight` asked for at attach, so the broker never sends more);
- `concurrency` handler tasks taking deliveries from the local queue;
- a sender batching acks (flushed when `ack_batch` ids are waiting or `ack_interval`
  after the first one) and sending nacks, terms and extends;
- an extender that sends `Extend` for every held event (queued or running) older than
  half the consumer's ack deadline, so long handlers are not redelivered meanwhile.
On a broken stream it reconnects with capped exponential backoff; events queued but not
started are dropped (the broker released them), acks of handlers still running are sent
late on the next stream (a late ack still completes the event).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import weakref
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Dict, List, Optional, Set, Union

import grpc
import grpc.aio
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ._pb import eventbus_pb2 as pb
from . import tracing
from .client import Backoff, Client
from .errors import EventBusError, from_rpc_error, is_transient

log = logging.getLogger("socle_eventbus.worker")

SHUTDOWN_REASON = "worker shutdown"
# Handlers still running at the shutdown timeout are nacked for redelivery after this
# delay rather than the backoff, long enough that the broker has seen this stream close
# first, so they go to another client rather than back to us.
SHUTDOWN_NACK_DELAY_MS = 100
# How long a stopping worker waits for the broker's `drained` (a broker that predates
# it never sends one).
DRAINED_TIMEOUT = 5.0


@dataclass(frozen=True)
class Ack:
    """Handler outcome: done, acknowledge (returning None means the same)."""


@dataclass(frozen=True)
class Retry:
    """Handler outcome: failed, redeliver after `after` seconds (None: the consumer's backoff)."""

    after: Optional[float] = None


@dataclass(frozen=True)
class Term:
    """Handler outcome: give up now, dead-letter the event with this reason."""

    reason: str = ""


Outcome = Union[Ack, Retry, Term, None]


def _outcome(out: object, err: Optional[BaseException]) -> str:
    """A handler's result as its `process` span names it."""
    if err is None and (out is None or type(out) is Ack):
        return "ack"
    return "term" if err is None and isinstance(out, Term) else "retry"

Handler = Callable[[pb.Delivery], Awaitable[Outcome]]
Hook = Callable[..., Any]


@dataclass(frozen=True)
class WorkerStats:
    """Counters since the worker was created."""

    processed: int
    """Handler runs that ended in Ack."""
    failed: int
    """Handler runs that raised or returned Retry/Term."""
    retried: int
    """Failed runs nacked for redelivery (raised or Retry)."""
    terminated: int
    """Failed runs dead-lettered at once (Term)."""
    in_flight: int
    """Handlers running now."""


class _Metrics(Collector):
    """One per registry: the counters and gauge read the live workers' stats when scraped
    (no per-event cost); the histogram is observed per run."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.workers: "weakref.WeakSet[Worker]" = weakref.WeakSet()
        self.handle_seconds = Histogram(
            "socle_push_worker_handle_seconds", "Time spent in the handler, per run.", ["consumer"], registry=registry
        )
        registry.register(self)

    def describe(self):  # type: ignore[no-untyped-def]
        return [
            CounterMetricFamily("socle_push_worker_processed", "Handler runs that ended in Ack.", labels=["consumer"]),
            CounterMetricFamily("socle_push_worker_failed", "Handler runs that raised or returned Retry/Term.",
                                labels=["consumer"]),
            GaugeMetricFamily("socle_push_worker_in_flight", "Handlers running now.", labels=["consumer"]),
        ]

    def collect(self):  # type: ignore[no-untyped-def]
        processed = CounterMetricFamily("socle_push_worker_processed", "Handler runs that ended in Ack.",
                                        labels=["consumer"])
        failed = CounterMetricFamily("socle_push_worker_failed", "Handler runs that raised or returned Retry/Term.",
                                     labels=["consumer"])
        in_flight = GaugeMetricFamily("socle_push_worker_in_flight", "Handlers running now.", labels=["consumer"])
        totals: Dict[str, List[int]] = {}
        for w in list(self.workers):
            t = totals.setdefault(w.consumer, [0, 0, 0])
            t[0] += w._processed
            t[1] += w._failed
            t[2] += w._in_flight
        for consumer, (p, f, i) in sorted(totals.items()):
            processed.add_metric([consumer], p)
            failed.add_metric([consumer], f)
            in_flight.add_metric([consumer], i)
        return [processed, failed, in_flight]


_METRICS: "weakref.WeakKeyDictionary[CollectorRegistry, _Metrics]" = weakref.WeakKeyDictionary()


def _metrics_for(registry: CollectorRegistry) -> _Metrics:
    m = _METRICS.get(registry)
    if m is None:
        m = _METRICS[registry] = _Metrics(registry)
    return m


class Worker:
    """Runs `handler` for each event of the durable consumer `consumer`.

    ```
    worker = Worker(client, "billing", handle, concurrency=16)
    await worker.start()   # or: async with worker: ...
    ...
    await worker.stop()    # graceful: running handlers finish (up to shutdown_timeout)
    ```

    `handler(delivery)` gets a `Delivery` (`.event`, `.attempt` 1-based, `.deadline`) and
    returns `Ack()`/None, `Retry(after=None)` or `Term(reason)`; an exception means retry
    (nack with the exception as the reason; the consumer's backoff applies).

    Options: `concurrency` handlers at once; `queue_capacity` deliveries held locally
    beyond those running (default 4 × concurrency, at least 256);
    `shutdown_timeout` seconds `stop()` waits for running handlers; `create_if_missing`
    a `ConsumerConfig` to create the consumer on attach; `registry` a prometheus_client
    `CollectorRegistry` for the `socle_push_worker_*` metrics (label `consumer`);
    `backoff` for reconnecting; `ack_batch`/`ack_interval` for batching acks.

    Hooks (plain or async functions): `on_start()`, `on_success(delivery)`,
    `on_error(event, error, attempt)` (error: the exception, or the Retry/Term returned),
    `on_stop()`. A failing hook is logged, never fatal.
    """

    def __init__(
        self,
        client: Client,
        consumer: str,
        handler: Optional[Handler] = None,
        *,
        concurrency: int = 16,
        queue_capacity: Optional[int] = None,
        shutdown_timeout: float = 30.0,
        create_if_missing: Optional[pb.ConsumerConfig] = None,
        registry: Optional[CollectorRegistry] = None,
        backoff: Backoff = Backoff(),
        max_batch: int = 256,
        ack_batch: int = 512,
        ack_interval: float = 0.005,
        on_start: Optional[Hook] = None,
        on_success: Optional[Hook] = None,
        on_error: Optional[Hook] = None,
        on_stop: Optional[Hook] = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.consumer = consumer
        self.handler = handler
        self.concurrency = concurrency
        self.queue_capacity = queue_capacity if queue_capacity is not None else max(256, 4 * concurrency)
        self.shutdown_timeout = shutdown_timeout
        self.create_if_missing = create_if_missing
        self.backoff = backoff
        self.max_batch = max_batch
        self.ack_batch = ack_batch
        self.ack_interval = ack_interval
        self.on_start, self.on_success, self.on_error, self.on_stop = on_start, on_success, on_error, on_stop
        self.info: Optional[pb.ConsumerInfo] = None
        """The consumer as the broker described it on the last attach."""
        self.connects = 0
        """Successful attaches so far (1 + reconnects)."""

        self._processed = self._failed = self._retried = self._terminated = self._in_flight = 0
        self._queue: "asyncio.Queue[Optional[pb.Delivery]]" = asyncio.Queue()
        # Event id → monotonic time it was received or last extended: every delivery not yet
        # answered (queued or running). Drives Extend, and the nacks at shutdown.
        self._held: Dict[str, float] = {}
        # Held events a handler has started (the rest of `held` is handed back at stop).
        self._started: Set[str] = set()
        self._drained = asyncio.Event()
        self._acks: List[str] = []
        self._controls: List[pb.ConsumeRequest] = []
        self._send_wakeup = asyncio.Event()
        self._write_lock = asyncio.Lock()
        self._call: Optional[grpc.aio.StreamStreamCall] = None
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._attached = asyncio.Event()
        self._task: Optional["asyncio.Task[None]"] = None
        self._workers: List["asyncio.Task[None]"] = []
        self._ack_deadline = 30.0
        self._histogram = None
        if registry is not None:
            m = _metrics_for(registry)
            m.workers.add(self)
            self._histogram = m.handle_seconds.labels(consumer)

    # --- public API ---

    def stats(self) -> WorkerStats:
        return WorkerStats(self._processed, self._failed, self._retried, self._terminated, self._in_flight)

    def backlog(self) -> int:
        """Deliveries received and waiting locally for a free handler."""
        return 0 if self._stopping else self._queue.qsize()

    async def start(self) -> None:
        """Starts the worker in a background task and waits for the first attach (raises
        if attaching fails with a non-transient error, e.g. NotFound or Unauthenticated)."""
        if self._task is not None:
            raise RuntimeError("worker already started")
        self._task = asyncio.get_running_loop().create_task(self.run(), name=f"worker-{self.consumer}")
        attached = asyncio.ensure_future(self._attached.wait())
        await asyncio.wait({self._task, attached}, return_when=asyncio.FIRST_COMPLETED)
        attached.cancel()
        if self._task.done():
            self._task.result()

    async def wait(self) -> None:
        """Waits until the worker ends (after `stop()`, or a fatal error which is raised)."""
        if self._task is not None:
            await asyncio.shield(self._task)

    async def stop(self) -> None:
        """Graceful stop: takes no more events, hands back those no handler started (no
        attempt counted: another worker gets them at once), waits up to
        `shutdown_timeout` for running handlers (their acks are sent), nacks those still
        running, closes the stream, runs on_stop."""
        self._stopping = True
        self._stop_event.set()
        if self._task is not None:
            try:
                await asyncio.shield(self._task)
            except EventBusError:
                pass

    async def __aenter__(self) -> "Worker":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def run(self) -> None:
        """Runs until `stop()`; raises on a non-transient error (the consumer does not
        exist, bad credentials, permission denied)."""
        if self.handler is None:
            raise ValueError("Worker needs a handler")
        self._workers = [asyncio.ensure_future(self._work()) for _ in range(self.concurrency)]
        await self._hook(self.on_start)
        failures = 0
        session: Optional["asyncio.Task[None]"] = None
        try:
            while not self._stopping:
                session = asyncio.ensure_future(self._session())
                stop_wait = asyncio.ensure_future(self._stop_event.wait())
                await asyncio.wait({session, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                if not session.done():
                    break  # stop(): drained below while the stream is still open
                try:
                    session.result()
                except EventBusError as e:
                    if not is_transient(e):
                        raise
                    log.warning("consumer %s: stream broken (%s), reconnecting", self.consumer, e)
                if self._stopping:
                    break
                failures = 1 if self._attached.is_set() else failures + 1
                try:
                    await asyncio.wait_for(self._stop_event.wait(), self.backoff.delay(failures))
                except asyncio.TimeoutError:
                    pass
        finally:
            self._stopping = True
            await self._drain(session)
            await self._hook(self.on_stop)

    # --- internals ---

    async def _hook(self, hook: Optional[Hook], *args: Any) -> None:
        if hook is None:
            return
        try:
            r = hook(*args)
            if inspect.isawaitable(r):
                await r
        except Exception:  # a hook must never break the worker
            log.exception("consumer %s: hook %s failed", self.consumer, getattr(hook, "__name__", hook))

    async def _session(self) -> None:
        """One Consume stream: attach, read deliveries until it ends."""
        self._attached.clear()
        call = self.client.bus.Consume(metadata=self.client.metadata)
        sender = extender = None
        try:
            attach = pb.Attach(consumer=self.consumer, max_in_flight=self.concurrency + self.queue_capacity,
                               max_batch=self.max_batch)
            if self.create_if_missing is not None:
                attach.create_if_missing.CopyFrom(self.create_if_missing)
            await call.write(pb.ConsumeRequest(attach=attach))
            first = await call.read()
            if first is grpc.aio.EOF:
                raise EventBusError(f"consume stream for {self.consumer} ended before attached",
                                    grpc.StatusCode.UNAVAILABLE)
            self.info = first.attached.consumer
            self._ack_deadline = (self.info.config.ack_deadline_ms or 30000) / 1000.0
            self._call = call
            self.connects += 1
            self._attached.set()
            sender = asyncio.ensure_future(self._sender(call))
            extender = asyncio.ensure_future(self._extender())
            self._send_wakeup.set()  # late acks from a previous stream
            queue, held = self._queue, self._held
            mono = time.monotonic
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    break
                kind = resp.WhichOneof("kind")
                if kind == "drained":
                    self._drained.set()
                    continue
                if self._stopping:
                    # Sent before the broker read our drain: back unstarted.
                    ids = [d.event.id for d in resp.deliveries.deliveries]
                    if ids:
                        self._control(pb.ConsumeRequest(release=pb.Release(event_ids=ids)))
                    continue
                now = mono()
                for d in resp.deliveries.deliveries:
                    held[d.event.id] = now
                    queue.put_nowait(d)
        except grpc.aio.AioRpcError as e:
            if self._stopping and e.code() == grpc.StatusCode.CANCELLED:
                return
            raise from_rpc_error(e) from None
        finally:
            self._call = None
            for t in (sender, extender):
                if t is not None:
                    t.cancel()
            if not self._stopping:
                # Queued, not started: the broker released them when the stream broke.
                while not self._queue.empty():
                    d = self._queue.get_nowait()
                    if d is not None:
                        self._held.pop(d.event.id, None)
            call.cancel()

    async def _work(self) -> None:
        queue, held, handler = self._queue, self._held, self.handler
        assert handler is not None
        hist = self._histogram
        clock = time.perf_counter
        while True:
            d = await queue.get()
            if d is None:
                return
            if self._stopping:
                continue  # left in `held`: handed back by _drain
            self._started.add(d.event.id)
            self._in_flight += 1
            t0 = clock()
            err: Optional[BaseException] = None
            with tracing.processing(self.consumer, d) as span:
                try:
                    out = await handler(d)
                except asyncio.CancelledError:
                    self._in_flight -= 1
                    self._started.discard(d.event.id)
                    raise
                except Exception as e:  # the handler's failure: retry
                    out, err = None, e
                tracing.processed(span, _outcome(out, err), err)
            self._in_flight -= 1
            if hist is not None:
                hist.observe(clock() - t0)
            eid = d.event.id
            held.pop(eid, None)
            self._started.discard(eid)
            if err is None and (out is None or type(out) is Ack):
                self._processed += 1
                acks = self._acks
                acks.append(eid)
                if len(acks) == 1 or len(acks) >= self.ack_batch:
                    self._send_wakeup.set()
                if self.on_success is not None:
                    await self._hook(self.on_success, d)
                continue
            self._failed += 1
            if err is not None or isinstance(out, Retry):
                self._retried += 1
                if err is not None:
                    reason, delay = f"{type(err).__name__}: {err}", 0
                else:
                    after = out.after  # type: ignore[union-attr]
                    reason = "retry requested"
                    delay = 0 if after is None else max(1, int(after * 1000))
                self._control(pb.ConsumeRequest(nack=pb.Nack(event_id=eid, reason=reason, delay_ms=delay)))
            elif isinstance(out, Term):
                self._terminated += 1
                self._control(pb.ConsumeRequest(term=pb.Term(event_id=eid, reason=out.reason or "terminated")))
            else:
                self._retried += 1
                err = TypeError(f"handler returned {out!r}, expected Ack, Retry, Term or None")
                self._control(pb.ConsumeRequest(nack=pb.Nack(event_id=eid, reason=str(err))))
            if self.on_error is not None:
                await self._hook(self.on_error, d.event, err if err is not None else out, d.attempt)

    def _control(self, req: pb.ConsumeRequest) -> None:
        self._controls.append(req)
        self._send_wakeup.set()

    async def _sender(self, call: grpc.aio.StreamStreamCall) -> None:
        wakeup = self._send_wakeup
        while True:
            await wakeup.wait()
            wakeup.clear()
            if not self._controls and len(self._acks) < self.ack_batch:
                await asyncio.sleep(self.ack_interval)
            await self._flush(call)

    async def _flush(self, call: grpc.aio.StreamStreamCall) -> None:
        """Sends every waiting ack and control message. On a write failure they stay
        queued for the next stream (the reader sees the broken stream)."""
        async with self._write_lock:
            while self._controls or self._acks:
                if self._controls:
                    controls, self._controls = self._controls, []
                    for i, req in enumerate(controls):
                        try:
                            await call.write(req)
                        except BaseException:
                            self._controls[:0] = controls[i:]
                            raise
                if self._acks:
                    acks, self._acks = self._acks, []
                    for i in range(0, len(acks), 1024):
                        try:
                            await call.write(pb.ConsumeRequest(ack=pb.Ack(event_ids=acks[i:i + 1024])))
                        except BaseException:
                            self._acks[:0] = acks[i:]
                            raise

    async def _extender(self) -> None:
        held = self._held
        while True:
            half = self._ack_deadline / 2
            await asyncio.sleep(max(0.05, self._ack_deadline / 4))
            now = time.monotonic()
            due = [eid for eid, t in held.items() if now - t >= half]
            if due:
                for eid in due:
                    held[eid] = now
                for i in range(0, len(due), 1024):
                    self._controls.append(pb.ConsumeRequest(extend=pb.Extend(event_ids=due[i:i + 1024])))
                self._send_wakeup.set()

    async def _drain(self, session: Optional["asyncio.Task[None]"]) -> None:
        """Shutdown: what no handler started is handed back (no attempt counted), the
        handlers finish (bounded), those still running are nacked, the stream closed."""
        call = self._call
        unstarted = [eid for eid in self._held if eid not in self._started]
        for eid in unstarted:
            del self._held[eid]
        if call is not None:
            self._control(pb.ConsumeRequest(release=pb.Release(event_ids=unstarted, drain=True)))
        for _ in self._workers:
            self._queue.put_nowait(None)
        if self._workers:
            done, pending = await asyncio.wait(self._workers, timeout=self.shutdown_timeout)
            for t in pending:
                t.cancel()
            if pending:
                log.warning("consumer %s: %d handlers still running after %.1fs, cancelled",
                            self.consumer, len(pending), self.shutdown_timeout)
                await asyncio.wait(pending)
        call = self._call
        if call is not None:
            try:
                await asyncio.wait_for(self._drained.wait(), DRAINED_TIMEOUT)
            except asyncio.TimeoutError:
                log.debug("consumer %s: no `drained` from the broker", self.consumer)
            for eid in list(self._held):
                self._controls.append(pb.ConsumeRequest(
                    nack=pb.Nack(event_id=eid, reason=SHUTDOWN_REASON, delay_ms=SHUTDOWN_NACK_DELAY_MS)))
            self._held.clear()
            try:
                await self._flush(call)
                await call.done_writing()
            except Exception as e:  # the stream broke meanwhile: the broker releases them
                log.debug("consumer %s: flush at shutdown failed: %s", self.consumer, e)
        if session is not None and not session.done():
            # The broker ends the stream once it has read our last request: every ack and
            # nack sent is then applied.
            try:
                await asyncio.wait_for(asyncio.shield(session), 5.0)
            except (asyncio.TimeoutError, EventBusError):
                session.cancel()
            except BaseException:
                pass
