"""`Client`: one gRPC channel to eventbusd, with publish, subscribe and the admin calls.

Every call carries the bearer token (if any) as `authorization: Bearer <token>` metadata,
and every gRPC failure surfaces as a typed `EventBusError` subclass (errors.py).
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import (
    AsyncIterable,
    AsyncIterator,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import grpc
import grpc.aio
from google.protobuf.timestamp_pb2 import Timestamp

from ._pb import eventbus_pb2 as pb
from ._pb import eventbus_pb2_grpc as pb_grpc
from .errors import EventBusError, ResourceExhausted, Unavailable, from_rpc_error, from_status, is_transient
from . import tracing
from .publisher import SharedPublisher

Payload = Union[bytes, str]
PemSource = Union[str, bytes, Path, None]
Metadata = Tuple[Tuple[str, str], ...]

# The channel reconnects by itself; keep its own backoff short so that our capped
# backoff (subscribe, Worker) decides how fast we come back after a broker restart.
_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 30000),
    ("grpc.keepalive_timeout_ms", 10000),
]


@dataclass(frozen=True)
class Gap:
    """Yielded by `Client.subscribe` after a re-subscription that could not recover
    everything (channels without history, history trimmed or lost, or a `group`): events
    published between `lost_at` and `resumed_at` may have been missed."""

    reason: str
    lost_at: datetime
    resumed_at: datetime
    reconnects: int


PositionLike = Union[pb.EventPosition, Tuple[str, int]]
"""A channel position: a `pb.EventPosition` or an `(epoch, offset)` pair."""
TimeLike = Union[datetime, Timestamp]
"""A point in time: a timezone-aware `datetime` or a protobuf `Timestamp`."""

# Most channels one `SubscribeRequest.since` may name (the broker's limit).
MAX_SINCE_CHANNELS = 1024


@dataclass(frozen=True)
class Since:
    """Where a subscription resumes from (`SubscribeRequest.since`): the events after
    each channel's position in `positions`, and, for the subscription's other channels
    that keep history, those published at or after `time`. `Subscription.since` is the
    point a subscription has reached (its `time` a `Timestamp`, to the nanosecond), to
    pass to a later `Client.subscribe(since=...)`."""

    positions: Mapping[str, PositionLike] = field(default_factory=dict)
    time: Optional[TimeLike] = None


# What a `publish_stream` waits for, by name (the `ack` argument).
ACK_MODES = {"each": pb.ACK_MODE_EACH, "cumulative": pb.ACK_MODE_CUMULATIVE, "none": pb.ACK_MODE_NONE}


@dataclass(frozen=True)
class PublishRefused:
    """Yielded by `Client.publish_stream` with `ack="cumulative"` or `"none"`: the request
    at `position` (counted from 0, in the order sent) was refused with `error`; the ones
    after it were published all the same."""

    position: int
    error: EventBusError


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter (seconds), for reconnecting."""

    initial: float = 0.1
    max: float = 5.0
    multiplier: float = 2.0

    def delay(self, attempt: int) -> float:
        """Delay before reconnect number `attempt` (1-based), ±20% jitter."""
        base = min(self.max, self.initial * self.multiplier ** max(0, attempt - 1))
        return base * random.uniform(0.8, 1.2)


def _read_pem(src: PemSource) -> Optional[bytes]:
    if src is None:
        return None
    if isinstance(src, bytes):
        return src
    text = str(src)
    if "-----BEGIN" in text:
        return text.encode()
    return Path(text).read_bytes()


def _target(url: str) -> Tuple[str, bool]:
    """`http://h:p` / `https://h:p` / `h:p` → (target, tls)."""
    if url.startswith("https://"):
        return url[len("https://"):].rstrip("/"), True
    if url.startswith("http://"):
        return url[len("http://"):].rstrip("/"), False
    return url.rstrip("/"), False


def _payload(payload: Payload) -> bytes:
    return payload.encode() if isinstance(payload, str) else bytes(payload)


def publish_request(
    channel: str,
    payload: Payload = b"",
    *,
    metadata: Optional[Mapping[str, str]] = None,
    content_type: str = "",
    source: str = "",
    ordering_key: str = "",
    idempotency_key: str = "",
) -> pb.PublishRequest:
    """A `PublishRequest` (for `Client.publish_stream` and `Client.publish_batch`); a `str`
    payload is sent as UTF-8."""
    return pb.PublishRequest(
        channel=channel,
        payload=_payload(payload),
        metadata=dict(metadata or {}),
        content_type=content_type,
        source=source,
        ordering_key=ordering_key,
        idempotency_key=idempotency_key,
    )


class Client:
    """A connection to eventbusd. Create with `await Client.connect(url)`; close with
    `await client.close()` or `async with`. Cheap to share between tasks."""

    def __init__(self, channel: grpc.aio.Channel, token: Optional[str], timeout: Optional[float], *,
                 unary_publish: bool = False, publish_linger: float = 0.0, reopen_for: float = 10.0) -> None:
        self._channel = channel
        self._metadata: Metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self.bus = pb_grpc.EventBusStub(channel)
        """Raw generated stub of the EventBus service (for what this class does not wrap)."""
        self.admin = pb_grpc.AdminStub(channel)
        """Raw generated stub of the Admin service."""
        self._publisher: Optional[SharedPublisher] = None if unary_publish else SharedPublisher(
            self.bus, self._metadata, linger=publish_linger, reopen_for=reopen_for)

    @classmethod
    async def connect(
        cls,
        url: str,
        token: Optional[str] = None,
        tls_ca: PemSource = None,
        tls_cert: PemSource = None,
        tls_key: PemSource = None,
        *,
        timeout: Optional[float] = 30.0,
        connect_timeout: Optional[float] = 10.0,
        unary_publish: bool = False,
        publish_linger: float = 0.0,
    ) -> "Client":
        """Connects to `url` (`http://host:port`, `https://host:port` for TLS, or `host:port`).

        `token`: bearer token sent with every call. `tls_ca`: PEM (path, str or bytes) of the
        CA that signed the server certificate (default: system roots); `tls_cert`/`tls_key`:
        client certificate for mTLS. `timeout`: default deadline of unary calls and of each
        `publish`, seconds. `connect_timeout`: wait this long for the first connection (None:
        do not wait); `Unavailable` when it expires; also how long publishes wait for the
        broker to come back when their shared stream cannot be opened again (default 10 s).

        `publish` shares one `PublishStream` between concurrent calls (see `publish`);
        `unary_publish=True` makes one unary `Publish` call per event instead.
        `publish_linger`: seconds the shared stream waits for more calls to send together
        while earlier ones are unanswered (default 0: each call is sent at once).
        """
        target, tls = _target(url)
        if tls or tls_ca is not None or tls_cert is not None:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read_pem(tls_ca),
                private_key=_read_pem(tls_key),
                certificate_chain=_read_pem(tls_cert),
            )
            channel = grpc.aio.secure_channel(target, creds, options=_CHANNEL_OPTIONS)
        else:
            channel = grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)
        client = cls(channel, token, timeout, unary_publish=unary_publish, publish_linger=publish_linger,
                     reopen_for=connect_timeout if connect_timeout is not None else 10.0)
        if connect_timeout is not None:
            try:
                await asyncio.wait_for(channel.channel_ready(), connect_timeout)
            except asyncio.TimeoutError:
                await channel.close()
                raise Unavailable(f"UNAVAILABLE: cannot connect to {url} within {connect_timeout}s",
                                  grpc.StatusCode.UNAVAILABLE) from None
        return client

    async def close(self) -> None:
        """Closes the channel; open streams end."""
        if self._publisher is not None:
            await self._publisher.close()
        await self._channel.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def metadata(self) -> Metadata:
        """Call metadata (the bearer token), for calls made on the raw stubs."""
        return self._metadata

    async def _unary(self, method, request):  # type: ignore[no-untyped-def]
        try:
            return await method(request, metadata=self._metadata, timeout=self._timeout)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None

    # --- publishing ---

    async def publish(
        self,
        channel: str,
        payload: Payload = b"",
        *,
        metadata: Optional[Mapping[str, str]] = None,
        content_type: str = "",
        source: str = "",
        ordering_key: str = "",
        idempotency_key: str = "",
        timeout: Optional[float] = None,
    ) -> pb.PublishResponse:
        """Publishes one event; answers once it is offered to every subscription and stored
        for every matching durable consumer. `str` payloads are sent as UTF-8.

        Concurrent calls share one `PublishStream` per client: each call is sent as soon as
        the stream can take it, together with the calls that came meanwhile, and gets its own
        answer or its own error (a refused event fails its own call only). Should the stream
        be lost before an event is answered, the call raises `Unavailable` (the event may or
        may not be published), unless it has an `idempotency_key`: then it is sent again, and
        the broker answers a duplicate with the original id. `timeout` (seconds; default the
        client's): past it the call raises `EventBusError` with code DEADLINE_EXCEEDED, and
        an event not yet sent is never sent. `Client.connect(unary_publish=True)` makes one
        unary `Publish` call per event instead.

        The call runs in an OpenTelemetry `send <channel>` span whose context the event
        carries in its metadata (unless `metadata` has a `traceparent`: kept); see
        `socle_eventbus.tracing`."""
        req = publish_request(channel, payload, metadata=metadata, content_type=content_type, source=source,
                              ordering_key=ordering_key, idempotency_key=idempotency_key)
        span = tracing.start_send(req)
        try:
            if self._publisher is None:
                answer = await self._unary(self.bus.Publish, req)
            else:
                answer = await self._publisher.publish(req, self._timeout if timeout is None else timeout)
        except BaseException as e:
            tracing.end_send(span, error=e)
            raise
        tracing.end_send(span, answer)
        return answer

    async def publish_batch(
        self, requests: Iterable[pb.PublishRequest]
    ) -> List[Union[pb.PublishResponse, EventBusError]]:
        """Publishes several events in one call (`PublishBatch`, see `publish_request`): the
        call's cost is shared by its events, many times cheaper than one `publish` each.
        Events are published in their order (as on one stream) and their durable captures
        share one commit.

        Returns one result per request, in the same order: the `PublishResponse`, or, for
        an event the broker refused (bad channel, payload too large, no right on its
        channel...), the typed error (e.g. `InvalidArgument`), returned, not raised: the
        other events are published all the same. Raises only for the whole batch: more
        than the broker's `eventbus.max_publish_batch` events (`InvalidArgument`), over its
        read limit or the caller's rate (`ResourceExhausted`), bad credentials, broker
        unavailable.

        Each event runs in a `send <channel>` span of its own (ended with its own result),
        whose context it carries, as with `publish`."""
        request = pb.PublishBatchRequest(events=list(requests))
        spans = [tracing.start_send(event) for event in request.events]
        try:
            response = await self._unary(self.bus.PublishBatch, request)
            if len(response.results) != len(request.events):
                raise EventBusError(
                    f"PublishBatch of {len(request.events)} events answered with {len(response.results)} results"
                )
        except BaseException as e:
            tracing.end_sends(spans, [e] * len(spans))
            raise
        answers = [from_status(r.error.code, r.error.message) if r.HasField("error") else r for r in response.results]
        tracing.end_sends(spans, answers)
        return answers

    async def publish_stream(
        self,
        requests: Union[AsyncIterable[pb.PublishRequest], Iterable[pb.PublishRequest]],
        *,
        window: Optional[int] = 1024,
        ack: str = "each",
    ) -> AsyncIterator[Union[pb.PublishResponse, pb.PublishAck, PublishRefused]]:
        """Publishes a stream of requests (see `publish_request`), pipelined on one stream.
        What it yields depends on `ack`, what the publisher waits for:

        - `"each"` (default): one `PublishResponse` per request, in order. An invalid
          request ends the stream with its error (earlier events stay published).
        - `"cumulative"`: a `PublishAck` (running totals: `count` accepted, `refused`,
          `last_event_id`...) per chunk of requests the broker read, and a
          `PublishRefused` for each refused request, the others published all the same.
        - `"none"`: only the `PublishRefused`s, then the final `PublishAck`.

        With `"cumulative"` and `"none"` the last item is a `PublishAck` with `end` set:
        the stream's totals. At most `window` requests are unanswered at a time (None: no
        bound); with `"none"` nothing is answered before the end, so the window does not
        apply and HTTP/2 flow control alone paces the sender.

        The window bounds what a fast producer keeps queued, here and on the broker: past
        the broker's HTTP/2 stream window the sends wait on flow control anyway, and a
        connection whose streams together leave too many small frames unread is cut
        (docs/limits.md, HTTP/2 framing).

        Each request runs in a `send <channel>` span of its own, a child of the context
        current when the stream begins, ended when the broker answers for it (its
        response, its refusal, or the totals that cover it); the request sent is a copy
        carrying the span's context (unless it has a `traceparent`: sent as it is)."""
        if ack not in ACK_MODES:
            raise ValueError(f"ack must be one of {', '.join(ACK_MODES)}, not {ack!r}")
        room = asyncio.Semaphore(window) if window and ack != "none" else None

        # Each request runs in its own `send` span, a child of the caller's context now,
        # ended when the broker answers for it.
        sends = tracing.StreamSends()

        async def paced() -> AsyncIterator[pb.PublishRequest]:
            if isinstance(requests, AsyncIterable):
                async for req in requests:
                    if room is not None:
                        await room.acquire()
                    yield sends.start(req)
            else:
                for req in requests:
                    if room is not None:
                        await room.acquire()
                    yield sends.start(req)

        metadata = self._metadata if ack == "each" else self._metadata + (("eventbus-ack", ack),)
        call = self.bus.PublishStream(paced(), metadata=metadata)
        covered = 0  # requests answered so far, for the window
        try:
            async for resp in call:
                if resp.HasField("ack"):
                    answered = resp.ack.count + resp.ack.refused
                    for _ in range(answered - covered if room is not None else 0):
                        room.release()
                    covered = max(covered, answered)
                    sends.covered(answered)
                    yield resp.ack
                elif resp.HasField("error"):
                    refused = PublishRefused(resp.position, from_status(resp.error.code, resp.error.message))
                    sends.refused(refused.position, refused.error)
                    yield refused
                else:
                    if room is not None:
                        room.release()
                    sends.answered(resp)
                    yield resp
        except grpc.aio.AioRpcError as e:
            err = from_rpc_error(e)
            sends.failed(err)
            raise err from None
        finally:
            call.cancel()
            # Closed by the caller (or cancelled) before the rest were answered.
            sends.failed(EventBusError("CANCELLED: the publish stream was closed before the broker answered "
                                       "this request", grpc.StatusCode.CANCELLED))

    # --- subscribing ---

    def subscribe(
        self,
        channels: Union[str, Sequence[str]],
        *,
        group: str = "",
        queue_capacity: int = 0,
        overflow: int = pb.OVERFLOW_POLICY_UNSPECIFIED,
        max_batch: int = 0,
        name: str = "",
        reconnect: bool = True,
        backoff: Backoff = Backoff(),
        since: Union[Since, Mapping[str, PositionLike], TimeLike, None] = None,
    ) -> "Subscription":
        """Subscribes to channels/patterns; iterate the result with `async for`.

        Yields `Event`s. When the stream breaks (broker restart, network, slow-consumer
        disconnect) it re-subscribes by itself, asking the broker for what it missed on
        the channels that keep history (from the last position received per channel);
        when that recovery is incomplete, or with a `group`, it yields a `Gap` first.
        With `reconnect=False` the failure is raised instead. Ends when the subscription
        is closed by `Admin.Unsubscribe` or `Subscription.aclose()`.

        `since`: start by recovering from there: a `Since`, a mapping of channel →
        position (`pb.EventPosition` or `(epoch, offset)`: the last event already had),
        or a time (`datetime` with a timezone, or `Timestamp`). Not with `group`.
        `Subscription.recovered` then tells whether everything asked for was
        recovered."""
        if isinstance(channels, str):
            channels = [channels]
        if isinstance(since, (datetime, Timestamp)):
            since = Since(time=since)
        elif isinstance(since, Mapping):
            since = Since(positions=since)
        elif since is not None and not isinstance(since, Since):
            raise TypeError(f"since must be a Since, a mapping of positions or a time, not {type(since).__name__}")
        if since is not None and group:
            raise ValueError("since cannot be used with a group: its members share the events")
        req = pb.SubscribeRequest(channels=list(channels), group=group, queue_capacity=queue_capacity,
                                  overflow=overflow, max_batch=max_batch, name=name)
        return Subscription(self, req, reconnect, backoff, since)

    # --- admin ---

    async def stats(self) -> pb.GetStatsResponse:
        """Broker-wide totals."""
        return await self._unary(self.admin.GetStats, pb.GetStatsRequest())

    async def channels(self) -> List[pb.ChannelStats]:
        """Channels seen, with counters."""
        return list((await self._unary(self.admin.ListChannels, pb.ListChannelsRequest())).channels)

    async def subscriptions(self) -> List[pb.SubscriptionInfo]:
        """Open subscriptions."""
        return list((await self._unary(self.admin.ListSubscriptions, pb.ListSubscriptionsRequest())).subscriptions)

    async def unsubscribe(self, subscription_id: str) -> None:
        """Closes a subscription (its stream ends normally)."""
        await self._unary(self.admin.Unsubscribe, pb.UnsubscribeRequest(subscription_id=subscription_id))

    async def create_consumer(
        self,
        name: str,
        channels: Union[str, Sequence[str]],
        *,
        ack_deadline_ms: int = 0,
        max_attempts: Optional[int] = None,
        backoff: Optional[pb.Backoff] = None,
        max_in_flight: int = 0,
        dead_letter_channel: str = "",
        exclusive: bool = False,
        push: Optional[pb.PushConfig] = None,
    ) -> pb.ConsumerInfo:
        """Creates a durable consumer (idempotent for an identical definition,
        `AlreadyExists` for a different one). Zero values take the broker defaults;
        `max_attempts=None` → 5, `0` → unlimited. `exclusive`: one attached client
        receives at a time; linear backoff: `pb.Backoff(kind=pb.BACKOFF_KIND_LINEAR, ...)`.
        `push`: the broker itself POSTs the events to an HTTP endpoint,
        `pb.PushConfig(url=..., secret=...)` (docs/push.md)."""
        return await self._unary(self.admin.CreateConsumer, pb.CreateConsumerRequest(config=consumer_config(
            name, channels, ack_deadline_ms=ack_deadline_ms, max_attempts=max_attempts, backoff=backoff,
            max_in_flight=max_in_flight, dead_letter_channel=dead_letter_channel, exclusive=exclusive,
            push=push)))

    async def get_consumer(self, name: str) -> pb.ConsumerInfo:
        """A consumer's state; `NotFound` when unknown."""
        return await self._unary(self.admin.GetConsumer, pb.GetConsumerRequest(name=name))

    async def list_consumers(self) -> List[pb.ConsumerInfo]:
        """Every consumer's state."""
        return list((await self._unary(self.admin.ListConsumers, pb.ListConsumersRequest())).consumers)

    async def delete_consumer(self, name: str) -> None:
        """Deletes a consumer, its events and its log."""
        await self._unary(self.admin.DeleteConsumer, pb.DeleteConsumerRequest(name=name))

    async def event_log(
        self, consumer: str, *, status: int = pb.EVENT_STATUS_UNSPECIFIED, limit: int = 0, page_token: str = ""
    ) -> pb.ListEventLogResponse:
        """One page of a consumer's terminal log (oldest first); see `event_log_all`."""
        return await self._unary(self.admin.ListEventLog, pb.ListEventLogRequest(
            consumer=consumer, status=status, limit=limit, page_token=page_token))

    async def event_log_all(
        self, consumer: str, *, status: int = pb.EVENT_STATUS_UNSPECIFIED
    ) -> AsyncIterator[pb.EventLogEntry]:
        """Every entry of a consumer's terminal log, following the pages."""
        token = ""
        while True:
            page = await self.event_log(consumer, status=status, limit=1000, page_token=token)
            for entry in page.entries:
                yield entry
            token = page.next_page_token
            if not token:
                return

    async def pending(self, consumer: str, *, limit: int = 0, page_token: str = "") -> pb.ListPendingResponse:
        """One page of a consumer's unfinished events, oldest first, each with its
        attempt, next delivery, failures and `state` (`pb.PENDING_STATE_*`); `limit` 0 =
        100, at most 1,000. See `pending_all`."""
        return await self._unary(self.admin.ListPending, pb.ListPendingRequest(
            consumer=consumer, limit=limit, page_token=page_token))

    async def pending_all(self, consumer: str) -> AsyncIterator[pb.PendingEntry]:
        """Every unfinished event of a consumer, following the pages."""
        token = ""
        while True:
            page = await self.pending(consumer, limit=1000, page_token=token)
            for entry in page.entries:
                yield entry
            token = page.next_page_token
            if not token:
                return

    async def redrive(
        self, consumer: str, event_ids: Sequence[str] = (), *, limit: int = 0
    ) -> pb.RedriveResponse:
        """Puts dead-lettered events back to the consumer with attempts reset: those
        named, or with none named the oldest `limit` (0 = 10,000). Answers `redriven`
        and `remaining` (dead letters still kept for redrive)."""
        return await self._unary(self.admin.RedriveDeadLetters, pb.RedriveRequest(
            consumer=consumer, event_ids=list(event_ids), limit=limit))

    async def pause(self, name: str) -> pb.ConsumerInfo:
        """Stops delivery: events are still captured; attached clients stay and may ack."""
        return await self._unary(self.admin.PauseConsumer, pb.PauseConsumerRequest(name=name))

    async def resume(self, name: str) -> pb.ConsumerInfo:
        """Delivers again after `pause`."""
        return await self._unary(self.admin.ResumeConsumer, pb.ResumeConsumerRequest(name=name))


def consumer_config(
    name: str,
    channels: Union[str, Sequence[str]],
    *,
    ack_deadline_ms: int = 0,
    max_attempts: Optional[int] = None,
    backoff: Optional[pb.Backoff] = None,
    max_in_flight: int = 0,
    dead_letter_channel: str = "",
    exclusive: bool = False,
    push: Optional[pb.PushConfig] = None,
) -> pb.ConsumerConfig:
    """A `ConsumerConfig` (for `create_consumer` or `Worker(create_if_missing=...)`)."""
    if isinstance(channels, str):
        channels = [channels]
    cfg = pb.ConsumerConfig(name=name, channels=list(channels), ack_deadline_ms=ack_deadline_ms,
                            max_in_flight=max_in_flight, dead_letter_channel=dead_letter_channel,
                            exclusive=exclusive)
    if max_attempts is not None:
        cfg.max_attempts = max_attempts
    if backoff is not None:
        cfg.backoff.CopyFrom(backoff)
    if push is not None:
        cfg.push.CopyFrom(push)
    return cfg


def _now() -> datetime:
    return datetime.now(timezone.utc)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _to_timestamp(t: TimeLike) -> Timestamp:
    if isinstance(t, Timestamp):
        out = Timestamp()
        out.CopyFrom(t)
        return out
    if not isinstance(t, datetime):
        raise TypeError(f"a time must be a datetime or a Timestamp, not {type(t).__name__}")
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError("a since time must carry a timezone (e.g. datetime.now(timezone.utc))")
    delta = t - _EPOCH
    return Timestamp(seconds=delta.days * 86400 + delta.seconds, nanos=delta.microseconds * 1000)


def _to_datetime(ts: Timestamp) -> datetime:
    return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)


def _to_position(p: PositionLike) -> pb.EventPosition:
    if isinstance(p, pb.EventPosition):
        out = pb.EventPosition()
        out.CopyFrom(p)
        return out
    epoch, offset = p
    if not isinstance(epoch, str) or not isinstance(offset, int) or offset < 0:
        raise TypeError(f"a position is a pb.EventPosition or an (epoch: str, offset: int) pair, not {p!r}")
    return pb.EventPosition(epoch=epoch, offset=offset)


class Subscription:
    """The async iterator returned by `Client.subscribe`: `Event`s and `Gap`s.

    It tracks, per channel that keeps history, the position of the last event it
    yielded, and re-subscribes from there after a break (see `since`)."""

    def __init__(
        self,
        client: Client,
        request: pb.SubscribeRequest,
        reconnect: bool,
        backoff: Backoff,
        since: Optional[Since] = None,
    ) -> None:
        self._client = client
        self._request = request
        self._reconnect = reconnect
        self._backoff = backoff
        self._gen = self._run()
        self.id: Optional[str] = None
        """Id of the current server-side subscription (changes on each re-subscription)."""
        self.reconnects = 0
        """Re-subscriptions made so far."""
        self.recovered: Optional[bool] = None
        """`SubscriptionStarted.recovered` of the current server-side subscription: True
        when it was asked to recover (a `since`, or a re-subscription) and everything
        asked for was; False otherwise; None before the first start."""
        self._started = asyncio.Event()
        # Last position per channel, the most recently updated last.
        self._positions: "OrderedDict[str, pb.EventPosition]" = OrderedDict()
        for channel, position in (since.positions.items() if since is not None else ()):
            self._positions[channel] = _to_position(position)
        self._since_time: Optional[Timestamp] = (
            _to_timestamp(since.time) if since is not None and since.time is not None else None)
        self._first_started_at: Optional[Timestamp] = None
        # Tracked channels left out of the current request's `since` (over the broker's
        # limit): resumed by time, so what was already yielded is skipped here.
        self._unsent: FrozenSet[str] = frozenset()

    def __aiter__(self) -> "Subscription":
        return self

    async def __anext__(self) -> Union[pb.Event, Gap]:
        return await self._gen.__anext__()

    async def aclose(self) -> None:
        """Ends the subscription (cancels the stream)."""
        await self._gen.aclose()

    async def started(self) -> str:
        """Waits until the subscription is live (events published from now on are
        delivered) and returns its id. Needs the iterator to be consumed concurrently —
        or call it after the first `__anext__` is pending."""
        await self._started.wait()
        assert self.id is not None
        return self.id

    @property
    def positions(self) -> Dict[str, pb.EventPosition]:
        """Per channel that keeps history, the position of the last event yielded (or,
        for a channel with none yet, its latest position when the subscription started)."""
        return {channel: _to_position(p) for channel, p in self._positions.items()}

    @property
    def started_at(self) -> Optional[datetime]:
        """Broker time when the subscription first went live; None before."""
        return _to_datetime(self._first_started_at) if self._first_started_at is not None else None

    @property
    def since(self) -> Since:
        """Where this subscription stands: what a re-subscription asks to recover from
        (`positions`, and for other channels with history the time it first started, or
        the `since` time it was given). Pass it to `Client.subscribe(since=...)` to carry
        on later from here."""
        time = self._resume_time()
        return Since(positions=self.positions, time=_to_timestamp(time) if time is not None else None)

    def _resume_time(self) -> Optional[Timestamp]:
        return self._since_time if self._since_time is not None else self._first_started_at

    def _next_request(self) -> pb.SubscribeRequest:
        """The request of the next (re-)subscription: with `since` unless in a group."""
        req = pb.SubscribeRequest()
        req.CopyFrom(self._request)
        self._unsent = frozenset()
        if req.group:
            return req
        sent = list(self._positions.items())[-MAX_SINCE_CHANNELS:]
        for channel, position in sent:
            req.since.positions[channel].CopyFrom(position)
        time = self._resume_time()
        if time is not None:
            req.since.timestamp.CopyFrom(time)
        if len(sent) < len(self._positions):
            self._unsent = frozenset(self._positions) - {channel for channel, _ in sent}
        return req

    def _track(self, event: pb.Event) -> bool:
        """Records the event's position; False for a copy of one already yielded."""
        if not event.HasField("position"):
            return True
        position = event.position
        had = self._positions.get(event.channel)
        if had is not None and had.epoch == position.epoch and position.offset <= had.offset:
            return event.channel not in self._unsent
        self._positions[event.channel] = _to_position(position)
        self._positions.move_to_end(event.channel)
        return True

    def _on_started(self, req: pb.SubscribeRequest, started: pb.SubscriptionStarted) -> None:
        self.id = started.subscription_id
        self.recovered = started.recovered
        if self._first_started_at is None and started.HasField("started_at"):
            self._first_started_at = Timestamp()
            self._first_started_at.CopyFrom(started.started_at)
        # A channel not recovered by time starts from its latest position then.
        if not req.since.HasField("timestamp"):
            for channel, position in started.positions.items():
                if channel not in self._positions:
                    self._positions[channel] = _to_position(position)

    async def _run(self) -> AsyncIterator[Union[pb.Event, Gap]]:
        lost_at: Optional[datetime] = None
        reason = ""
        failures = 0
        while True:
            req = self._next_request()
            call = self._client.bus.Subscribe(req, metadata=self._client.metadata)
            try:
                async for resp in call:
                    if resp.HasField("events"):
                        for ev in resp.events.events:
                            if self._track(ev):
                                yield ev
                    else:
                        self._on_started(req, resp.started)
                        self._started.set()
                        failures = 0
                        if lost_at is not None:
                            self.reconnects += 1
                            gap = Gap(reason=reason, lost_at=lost_at, resumed_at=_now(), reconnects=self.reconnects)
                            lost_at = None
                            if not resp.started.recovered:
                                yield gap
                return  # ended with OK: unsubscribed
            except grpc.aio.AioRpcError as e:
                err = from_rpc_error(e)
                if not self._reconnect or not (is_transient(err) or isinstance(err, ResourceExhausted)):
                    raise err from None
                if lost_at is None and self.id is not None:  # a gap only once we had started
                    lost_at = _now()
                    reason = err.message
            finally:
                call.cancel()
            self._started.clear()
            failures += 1
            await asyncio.sleep(self._backoff.delay(failures))


__all__ = ["Client", "Subscription", "Gap", "Since", "MAX_SINCE_CHANNELS", "Backoff", "publish_request",
           "consumer_config", "EventBusError"]
