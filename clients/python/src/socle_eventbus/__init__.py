"""Socle EventBus client for asyncio.

- `Client`: connect (token, TLS), `publish`, `publish_batch`, `publish_stream` (ack modes
  each, cumulative, none), `subscribe` (reconnects by itself, recovers what it missed on
  channels with history, and yields a `Gap` when it could not; `since=` resumes from a
  `Since`), admin calls.
- `Worker`: the push worker for durable consumers (handler → `Ack` / `Retry` / `Term`).
- `socle_eventbus.inbox.Inbox` (extra `postgres`, psycopg 3): a handler wrapper that
  records each event id in `eventbus_inbox` in the handler's own transaction.
- Errors: `EventBusError` and one subclass per gRPC status code callers branch on.
- Tracing (`socle_eventbus.tracing`, the OpenTelemetry API only): each publish runs in a
  `send <channel>` span whose context the event carries in its metadata, and the
  `Worker` runs each handler in a `process <channel>` span, its child.
- `pb`: the message classes generated from `proto/eventbus/v1/eventbus.proto` when the
  package was built (`pb.Event`, `pb.DeadLetter`, ...).
"""

from ._pb import eventbus_pb2 as pb
from ._version import __version__
from .client import Backoff, Client, Gap, PublishRefused, Since, Subscription, consumer_config, publish_request
from .errors import (
    AlreadyExists,
    EventBusError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from .worker import Ack, Retry, Term, Worker, WorkerStats

Event = pb.Event
Delivery = pb.Delivery
DeadLetter = pb.DeadLetter

__all__ = [
    "pb", "Event", "Delivery", "DeadLetter",
    "Client", "Subscription", "Gap", "Since", "Backoff", "PublishRefused", "publish_request", "consumer_config",
    "Worker", "WorkerStats", "Ack", "Retry", "Term",
    "EventBusError", "Unauthenticated", "PermissionDenied", "NotFound", "AlreadyExists",
    "InvalidArgument", "Unavailable", "ResourceExhausted",
]
