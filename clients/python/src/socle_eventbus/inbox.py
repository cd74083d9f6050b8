"""Inbox deduplication on PostgreSQL (docs/outbox-inbox.md).

`Inbox` wraps a `Worker` handler: in one transaction it records the event id in
`eventbus_inbox` (DDL: `clients/sql/inbox.sql`) and runs the handler with that
transaction's connection, so the side effect and the "already processed" mark commit
together. An event whose id is already recorded for the consumer is acknowledged without
running the handler again (a redelivery after a lost ack). A handler that does not
acknowledge (`Retry`, `Term`, or an exception) rolls back both.

Needs `psycopg` 3 (`pip install "./clients/python[postgres]"`).
"""

from __future__ import annotations

import re
from typing import Any, AsyncContextManager, Awaitable, Callable, Union

from ._pb import eventbus_pb2 as pb
from .worker import Ack, Outcome

try:  # optional dependency: only this module needs it
    import psycopg
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError('socle_eventbus.inbox needs psycopg 3: pip install "socle-eventbus[postgres]"') from err

InboxHandler = Callable[[pb.Delivery, "psycopg.AsyncConnection[Any]"], Awaitable[Outcome]]
"""A handler given the delivery and the connection whose transaction is open."""

ConnectionSource = Union[str, Callable[[], AsyncContextManager["psycopg.AsyncConnection[Any]"]]]
"""A conninfo string (one connection per event), or a callable returning an async
context manager that yields a connection, such as `psycopg_pool.AsyncConnectionPool.connection`."""

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}(\.[A-Za-z_][A-Za-z0-9_]{0,62})?$")


class Inbox:
    """A `Worker` handler that runs `handler` at most once per event id and consumer."""

    def __init__(self, connections: ConnectionSource, consumer: str, handler: InboxHandler,
                 *, table: str = "eventbus_inbox") -> None:
        if not _IDENTIFIER.match(table):
            raise ValueError(f"inbox table {table!r} is not a plain [schema.]name identifier")
        if not consumer:
            raise ValueError("the inbox needs the consumer's name")
        self._connections = connections
        self._consumer = consumer
        self._handler = handler
        self._insert = f"insert into {table} (consumer, event_id) values (%s, %s) on conflict do nothing"

    def _connect(self) -> AsyncContextManager["psycopg.AsyncConnection[Any]"]:
        if isinstance(self._connections, str):
            return _Connection(self._connections)
        return self._connections()

    async def __call__(self, delivery: pb.Delivery) -> Outcome:
        async with self._connect() as conn:
            async with conn.transaction() as tx:
                cur = await conn.execute(self._insert, (self._consumer, delivery.event.id))
                if cur.rowcount == 0:
                    return Ack()  # processed before: its mark is committed
                outcome = await self._handler(delivery, conn)
                if outcome is not None and not isinstance(outcome, Ack):
                    raise psycopg.Rollback(tx)  # no side effect, no mark: it comes again
            return outcome if outcome is not None else Ack()


class _Connection:
    """One connection for one event, closed afterwards."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._conn: "psycopg.AsyncConnection[Any] | None" = None

    async def __aenter__(self) -> "psycopg.AsyncConnection[Any]":
        self._conn = await psycopg.AsyncConnection.connect(self._conninfo)
        return self._conn

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self._conn.close()
