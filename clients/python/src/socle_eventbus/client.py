"""`Client`: one gRPC channel to eventbusd, with publish, subscribe and the admin calls.

Every call carries the bearer token (if any) as `authorization: Bearer <token>` metadata,
and every gRPC failure surfaces as a typed `EventBusError` subclass (errors.py).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import (
    AsyncIterable,
    AsyncIterator,
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

from ._pb import eventbus_pb2 as pb
from ._pb import eventbus_pb2_grpc as pb_grpc
from .errors import EventBusError, ResourceExhausted, Unavailable, from_rpc_error, from_status, is_transient

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
    """Yielded by `Client.subscribe` after a re-subscription: core pub/sub is at most once,
    so events published between `lost_at` and `resumed_at` may have been missed."""

    reason: str
    lost_at: datetime
    resumed_at: datetime
    reconnects: int


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

    def __init__(self, channel: grpc.aio.Channel, token: Optional[str], timeout: Optional[float]) -> None:
        self._channel = channel
        self._metadata: Metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self.bus = pb_grpc.EventBusStub(channel)
        """Raw generated stub of the EventBus service (for what this class does not wrap)."""
        self.admin = pb_grpc.AdminStub(channel)
        """Raw generated stub of the Admin service."""

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
    ) -> "Client":
        """Connects to `url` (`http://host:port`, `https://host:port` for TLS, or `host:port`).

        `token`: bearer token sent with every call. `tls_ca`: PEM (path, str or bytes) of the
        CA that signed the server certificate (default: system roots); `tls_cert`/`tls_key`:
        client certificate for mTLS. `timeout`: default deadline of unary calls, seconds.
        `connect_timeout`: wait this long for the first connection (None: do not wait);
        `Unavailable` when it expires.
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
        client = cls(channel, token, timeout)
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
    ) -> pb.PublishResponse:
        """Publishes one event; answers once it is offered to every subscription and stored
        for every matching durable consumer. `str` payloads are sent as UTF-8."""
        req = publish_request(channel, payload, metadata=metadata, content_type=content_type, source=source,
                              ordering_key=ordering_key, idempotency_key=idempotency_key)
        return await self._unary(self.bus.Publish, req)

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
        unavailable."""
        request = pb.PublishBatchRequest(events=list(requests))
        response = await self._unary(self.bus.PublishBatch, request)
        if len(response.results) != len(request.events):
            raise EventBusError(
                f"PublishBatch of {len(request.events)} events answered with {len(response.results)} results"
            )
        return [from_status(r.error.code, r.error.message) if r.HasField("error") else r for r in response.results]

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
        (docs/limits.md, HTTP/2 framing)."""
        if ack not in ACK_MODES:
            raise ValueError(f"ack must be one of {', '.join(ACK_MODES)}, not {ack!r}")
        room = asyncio.Semaphore(window) if window and ack != "none" else None

        async def paced() -> AsyncIterator[pb.PublishRequest]:
            if isinstance(requests, AsyncIterable):
                async for req in requests:
                    if room is not None:
                        await room.acquire()
                    yield req
            else:
                for req in requests:
                    if room is not None:
                        await room.acquire()
                    yield req

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
                    yield resp.ack
                elif resp.HasField("error"):
                    yield PublishRefused(resp.position, from_status(resp.error.code, resp.error.message))
                else:
                    if room is not None:
                        room.release()
                    yield resp
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

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
    ) -> "Subscription":
        """Subscribes to channels/patterns; iterate the result with `async for`.

        Yields `Event`s, and a `Gap` after each automatic re-subscription (the stream broke:
        broker restart, network, slow-consumer disconnect). With `reconnect=False` the
        failure is raised instead. Ends when the subscription is closed by
        `Admin.Unsubscribe` or `Subscription.aclose()`."""
        if isinstance(channels, str):
            channels = [channels]
        req = pb.SubscribeRequest(channels=list(channels), group=group, queue_capacity=queue_capacity,
                                  overflow=overflow, max_batch=max_batch, name=name)
        return Subscription(self, req, reconnect, backoff)

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
    ) -> pb.ConsumerInfo:
        """Creates a durable consumer (idempotent for an identical definition,
        `AlreadyExists` for a different one). Zero values take the broker defaults;
        `max_attempts=None` → 5, `0` → unlimited. `exclusive`: one attached client
        receives at a time; linear backoff: `pb.Backoff(kind=pb.BACKOFF_KIND_LINEAR, ...)`."""
        return await self._unary(self.admin.CreateConsumer, pb.CreateConsumerRequest(config=consumer_config(
            name, channels, ack_deadline_ms=ack_deadline_ms, max_attempts=max_attempts, backoff=backoff,
            max_in_flight=max_in_flight, dead_letter_channel=dead_letter_channel, exclusive=exclusive)))

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
    return cfg


def _now() -> datetime:
    return datetime.now(timezone.utc)


class Subscription:
    """The async iterator returned by `Client.subscribe`: `Event`s and `Gap`s."""

    def __init__(self, client: Client, request: pb.SubscribeRequest, reconnect: bool, backoff: Backoff) -> None:
        self._client = client
        self._request = request
        self._reconnect = reconnect
        self._backoff = backoff
        self._gen = self._run()
        self.id: Optional[str] = None
        """Id of the current server-side subscription (changes on each re-subscription)."""
        self.reconnects = 0
        """Re-subscriptions made so far."""
        self._started = asyncio.Event()

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

    async def _run(self) -> AsyncIterator[Union[pb.Event, Gap]]:
        lost_at: Optional[datetime] = None
        reason = ""
        failures = 0
        while True:
            call = self._client.bus.Subscribe(self._request, metadata=self._client.metadata)
            try:
                async for resp in call:
                    if resp.HasField("events"):
                        for ev in resp.events.events:
                            yield ev
                    else:
                        self.id = resp.started.subscription_id
                        self._started.set()
                        failures = 0
                        if lost_at is not None:
                            self.reconnects += 1
                            gap = Gap(reason=reason, lost_at=lost_at, resumed_at=_now(), reconnects=self.reconnects)
                            lost_at = None
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


__all__ = ["Client", "Subscription", "Gap", "Backoff", "publish_request", "consumer_config", "EventBusError"]
