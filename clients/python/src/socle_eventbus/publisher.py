"""`Client.publish` over one long-lived `PublishStream` per client (each-answer mode).

The calls of every task share the stream: a service that publishes one event per
request handler pays a stream message per event instead of a whole gRPC call. Calls
queue here; one task writes whatever has queued as soon as the stream can take it (the
calls that arrive while it is busy go out together), and a reader matches the broker's
answers, which come in order, to the calls in the order they were written. Each call
gets its own answer or its own error, the stream answering a refused event in place
(`ACK_MODE_EACH_IN_PLACE`):

- a refused event fails its own call, and the stream goes on;
- a stream ended by a request the broker could not read (over its read limit) fails that
  call; the broker read nothing after it, so the calls written after it go again, first
  and in order, on a new stream;
- a stream lost otherwise (connection broken, broker restarting) leaves the fate of the
  unanswered events unknown: a call with an idempotency key is sent again (the broker
  answers a duplicate with the original id), any other fails with `Unavailable`: never
  an answer for an event whose answer was not seen;
- a call whose deadline passes, or whose task is cancelled, before its event was written
  takes it back: it is never sent.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import Deque, Optional, Tuple

import grpc
import grpc.aio

from ._pb import eventbus_pb2 as pb
from ._pb import eventbus_pb2_grpc as pb_grpc
from .errors import EventBusError, Unavailable, from_rpc_error, from_status

# Most events written and not yet answered; past it calls wait here.
MAX_IN_FLIGHT = 4096
# Times an event with an idempotency key is sent again after streams lost under it.
MAX_RESENDS = 3
# First and longest pause between attempts to open a stream again, seconds.
REOPEN_FIRST = 0.02
REOPEN_MAX = 0.5

# Codes the broker ends the stream with when it cannot read its next request (nothing
# after it published); never produced by a connection breaking.
_REFUSALS = frozenset({
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
})


class _Call:
    __slots__ = ("request", "future", "lost")

    def __init__(self, request: pb.PublishRequest, future: "asyncio.Future[pb.PublishResponse]") -> None:
        self.request = request
        self.future = future
        self.lost = 0  # streams lost under it while it was written and unanswered

    def answer(self, response: pb.PublishResponse) -> None:
        if not self.future.done():
            self.future.set_result(response)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class _Stream:
    """An open stream: the call, and what was written on it and not answered yet."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.in_flight: Deque[_Call] = deque()
        self.ended = False
        self.reader: Optional["asyncio.Task[None]"] = None


def unanswered(code: Optional[grpc.StatusCode], details: str) -> EventBusError:
    """The error of a call whose event was written on a stream lost before its answer."""
    name = code.name if code is not None else "UNKNOWN"
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return from_status(code.value[0], details)
    return Unavailable(
        f"UNAVAILABLE: the publish stream was lost before the broker answered this event ({name}: {details}); "
        "it may or may not be published: publish it again (with an idempotency key, to publish it once)",
        grpc.StatusCode.UNAVAILABLE,
    )


class SharedPublisher:
    """The stream `Client.publish` shares, opened with the first call."""

    def __init__(self, bus: pb_grpc.EventBusStub, metadata: Tuple[Tuple[str, str], ...], *,
                 linger: float, reopen_for: float) -> None:
        self._bus = bus
        self._metadata = metadata
        self._linger = linger
        self._reopen_for = reopen_for
        self._waiting: Deque[_Call] = deque()  # not written yet; calls to send again first
        self._wake = asyncio.Event()
        self._room = asyncio.Event()  # set while the stream has room for more in flight
        self._room.set()
        self._stream: Optional[_Stream] = None
        self._task: Optional["asyncio.Task[None]"] = None
        self._closed = False

    async def publish(self, request: pb.PublishRequest, timeout: Optional[float]) -> pb.PublishResponse:
        if self._closed:
            raise Unavailable("UNAVAILABLE: the client is closed", grpc.StatusCode.UNAVAILABLE)
        future: "asyncio.Future[pb.PublishResponse]" = asyncio.get_running_loop().create_future()
        self._waiting.append(_Call(request, future))
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            # A timeout or a cancelled caller cancels the future: not sent if not written yet.
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise EventBusError(f"DEADLINE_EXCEEDED: no answer within {timeout}s",
                                grpc.StatusCode.DEADLINE_EXCEEDED) from None

    async def close(self) -> None:
        """Fails what waits, ends the stream and the task."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        stream, self._stream = self._stream, None
        closed = Unavailable("UNAVAILABLE: the client was closed", grpc.StatusCode.UNAVAILABLE)
        if stream is not None:
            if stream.reader is not None:
                stream.reader.cancel()
            stream.call.cancel()
            for call in stream.in_flight:
                call.fail(closed)
        for call in self._waiting:
            call.fail(closed)
        self._waiting.clear()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting and self._waiting[0].future.done():
                self._waiting.popleft()
            if not self._waiting:
                continue
            stream = self._stream
            if stream is None or stream.ended:
                stream = await self._open()
                if stream is None:
                    continue
            if self._linger > 0 and stream.in_flight:
                await asyncio.sleep(self._linger)
            await self._write(stream)

    async def _write(self, stream: _Stream) -> None:
        """Writes the waiting calls the stream has room for, in order."""
        while self._waiting and not stream.ended:
            if len(stream.in_flight) >= MAX_IN_FLIGHT:
                self._room.clear()
                await self._room.wait()
                continue
            call = self._waiting.popleft()
            if call.future.done():
                continue
            # In flight before the write: its answer may be read before the write returns.
            stream.in_flight.append(call)
            try:
                await stream.call.write(call.request)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
                # The stream ended under the write: the reader says how, for this call too.
                return

    async def _open(self) -> Optional[_Stream]:
        """A new stream for the waiting calls, trying again with backoff while the broker
        is away, up to `reopen_for`; then fails them with the last error."""
        give_up = time.monotonic() + self._reopen_for
        pause = REOPEN_FIRST
        while True:
            call = self._bus.PublishStream(metadata=self._metadata + (("eventbus-ack", "each_in_place"),))
            try:
                # The broker answers an accepted stream's headers at once, and a refused
                # one (credentials, rights) with its status: read which it is before
                # writing, as a write racing that status loses it.
                await asyncio.wait_for(call.initial_metadata(), max(0.001, give_up - time.monotonic()))
                if call.done():
                    code = await call.code()
                    raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                               await call.details() or "")
                stream = _Stream(call)
                stream.reader = asyncio.get_running_loop().create_task(self._read(stream))
                self._stream = stream
                return stream
            except grpc.aio.AioRpcError as e:
                error: EventBusError = from_rpc_error(e)
                if e.code() != grpc.StatusCode.UNAVAILABLE:
                    # Refused (credentials, rights): opening again would be refused too.
                    give_up = time.monotonic()
            except asyncio.TimeoutError:
                error = Unavailable(f"UNAVAILABLE: the broker did not open a publish stream within "
                                    f"{self._reopen_for}s", grpc.StatusCode.UNAVAILABLE)
            call.cancel()
            while self._waiting and self._waiting[0].future.done():
                self._waiting.popleft()
            if not self._waiting:
                return None
            if time.monotonic() + pause >= give_up:
                for waiting in self._waiting:
                    waiting.fail(type(error)(error.message, error.code))
                self._waiting.clear()
                return None
            await asyncio.sleep(pause)
            pause = min(pause * 2, REOPEN_MAX)

    async def _read(self, stream: _Stream) -> None:
        """Answers the calls in the order written; then settles the stream's end."""
        code: Optional[grpc.StatusCode]
        try:
            while True:
                response = await stream.call.read()
                if response is grpc.aio.EOF:
                    code, details = await stream.call.code(), await stream.call.details() or ""
                    if code == grpc.StatusCode.OK:
                        code, details = grpc.StatusCode.UNAVAILABLE, "the broker ended the publish stream"
                    break
                if not stream.in_flight:
                    code, details = grpc.StatusCode.INTERNAL, "the broker answered more events than were sent"
                    break
                call = stream.in_flight.popleft()
                if response.HasField("error"):
                    call.fail(from_status(response.error.code, response.error.message))
                else:
                    call.answer(response)
                if len(stream.in_flight) < MAX_IN_FLIGHT:
                    self._room.set()
        except grpc.aio.AioRpcError as e:
            code, details = e.code(), e.details() or ""
        stream.ended = True
        stream.call.cancel()
        self._lost(stream, code, details)
        self._room.set()
        self._wake.set()

    def _lost(self, stream: _Stream, code: Optional[grpc.StatusCode], details: str) -> None:
        again: Deque[_Call] = deque()
        if code in _REFUSALS and stream.in_flight:
            # The broker could not read the first unanswered event, and read no further.
            assert code is not None
            stream.in_flight.popleft().fail(from_status(code.value[0], details))
            again.extend(stream.in_flight)
        else:
            for call in stream.in_flight:
                if call.request.idempotency_key and call.lost < MAX_RESENDS:
                    call.lost += 1
                    again.append(call)
                else:
                    call.fail(unanswered(code, details))
        stream.in_flight.clear()
        again.extend(self._waiting)
        self._waiting = again
