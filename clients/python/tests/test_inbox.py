"""Inbox, against the PostgreSQL on 127.0.0.1:5432 (a schema of its own per
test). Without PostgreSQL the tests are skipped with a notice, unless
EVENTBUS_REQUIRE_POSTGRES=1."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, AsyncIterator

import psycopg
import pytest

from socle_eventbus import Ack, Delivery, Event, Retry
from socle_eventbus.inbox import Inbox

CONNINFO = os.environ.get("EVENTBUS_TEST_POSTGRES", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
INBOX_SQL = Path(__file__).resolve().parents[2] / "sql" / "inbox.sql"


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    try:
        admin = await psycopg.AsyncConnection.connect(CONNINFO, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as err:
        if os.environ.get("EVENTBUS_REQUIRE_POSTGRES") == "1":
            raise
        pytest.skip(f"NOTICE: no PostgreSQL at {CONNINFO} ({err}): the inbox tests were SKIPPED")
    name = f"inbox_{uuid.uuid4().hex[:12]}"
    await admin.execute(f"create schema {name}")
    await admin.execute(f"set search_path to {name}")
    await admin.execute(INBOX_SQL.read_text())
    await admin.execute("create table effects (event_id text)")
    try:
        yield name
    finally:
        await admin.execute(f"drop schema {name} cascade")
        await admin.close()


def conninfo(schema: str) -> str:
    return f"{CONNINFO} options=-csearch_path={schema}"


def delivery(event_id: str, attempt: int = 1) -> Delivery:
    return Delivery(event=Event(id=event_id, channel="orders.created", payload=b"{}"), attempt=attempt)


async def effects(schema: str) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(conninfo(schema)) as conn:
        cur = await conn.execute("select event_id from effects order by event_id")
        return [row[0] for row in await cur.fetchall()]


async def test_a_redelivered_event_has_its_side_effect_once(schema: str) -> None:
    calls = []

    async def handle(d: Delivery, conn: psycopg.AsyncConnection[Any]) -> Ack:
        calls.append(d.attempt)
        await conn.execute("insert into effects (event_id) values (%s)", (d.event.id,))
        return Ack()

    inbox = Inbox(conninfo(schema), "billing", handle)
    assert isinstance(await inbox(delivery("e1")), Ack)
    # The ack was lost: the broker delivers it again. Acked, handler not run again.
    assert isinstance(await inbox(delivery("e1", attempt=2)), Ack)
    assert calls == [1]
    assert await effects(schema) == ["e1"]
    # Another consumer has its own marks.
    other = Inbox(conninfo(schema), "audit", handle)
    assert isinstance(await other(delivery("e1")), Ack)
    assert calls == [1, 1]


async def test_a_failing_handler_rolls_back_its_side_effect_and_its_mark(schema: str) -> None:
    attempts = []

    async def handle(d: Delivery, conn: psycopg.AsyncConnection[Any]) -> Any:
        attempts.append(d.attempt)
        await conn.execute("insert into effects (event_id) values (%s)", (d.event.id,))
        if d.attempt == 1:
            return Retry(after=0.1)
        if d.attempt == 2:
            raise RuntimeError("bank is down")
        return None

    inbox = Inbox(conninfo(schema), "billing", handle)
    assert await inbox(delivery("e2", attempt=1)) == Retry(after=0.1)
    with pytest.raises(RuntimeError):
        await inbox(delivery("e2", attempt=2))
    assert await effects(schema) == [], "nothing committed by the failed attempts"
    assert isinstance(await inbox(delivery("e2", attempt=3)), Ack)
    assert attempts == [1, 2, 3]
    assert await effects(schema) == ["e2"]


def test_the_table_name_is_checked() -> None:
    async def handle(d: Delivery, conn: Any) -> Ack:
        return Ack()

    with pytest.raises(ValueError):
        Inbox("", "billing", handle, table="inbox; drop table x")
