"""Client: publish, publish_stream, subscribe (with gaps after a restart), admin, errors."""

from __future__ import annotations

import asyncio

import pytest

from socle_eventbus import (
    AlreadyExists,
    Client,
    Gap,
    InvalidArgument,
    NotFound,
    Unavailable,
    pb,
    publish_request,
)

from conftest import Daemon, eventually


async def test_publish_reaches_a_subscriber(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        sub = client.subscribe(f"{name}.*")
        nxt = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        resp = await client.publish(f"{name}.a", "hello", metadata={"k": "v"}, content_type="text/plain")
        assert resp.event_id and resp.delivered_count == 1
        ev = await asyncio.wait_for(nxt, 10)
        assert isinstance(ev, pb.Event)
        assert (ev.id, ev.channel, ev.payload, ev.metadata["k"], ev.content_type) == (
            resp.event_id, f"{name}.a", b"hello", "v", "text/plain")
        await sub.aclose()


async def test_publish_stream_answers_in_order(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        async def requests():
            for i in range(100):
                yield publish_request(f"{name}.s", str(i).encode())

        answers = [r async for r in client.publish_stream(requests())]
        assert len(answers) == 100 and len({a.event_id for a in answers}) == 100


async def test_errors_are_typed(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        with pytest.raises(InvalidArgument):
            await client.publish("bad..channel", b"x")
        with pytest.raises(NotFound):
            await client.get_consumer(name)
        await client.create_consumer(name, [f"{name}.>"])
        with pytest.raises(AlreadyExists):
            await client.create_consumer(name, [f"{name}.other"])
    with pytest.raises(Unavailable):
        await Client.connect("http://127.0.0.1:1", connect_timeout=0.5)


async def test_admin_calls(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        info = await client.create_consumer(name, [f"{name}.>"], ack_deadline_ms=5000, max_attempts=3)
        assert info.config.name == name and info.config.max_attempts == 3
        await client.publish(f"{name}.x", b"1")
        assert (await client.get_consumer(name)).pending == 1
        assert name in [c.config.name for c in await client.list_consumers()]
        stats = await client.stats()
        assert stats.total_published >= 1 and stats.mode == "in_memory"
        assert f"{name}.x" in [c.channel for c in await client.channels()]
        assert (await client.event_log(name)).entries == []
        await client.delete_consumer(name)
        with pytest.raises(NotFound):
            await client.get_consumer(name)


async def test_unsubscribe_ends_the_iterator(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        sub = client.subscribe(name)
        rest = asyncio.ensure_future(_collect(sub))
        sid = await sub.started()
        assert sid in [s.id for s in await client.subscriptions()]
        await client.unsubscribe(sid)
        assert await asyncio.wait_for(rest, 10) == []


async def test_subscriber_reports_a_gap_after_a_restart(own_daemon: Daemon, name: str) -> None:
    async with await Client.connect(own_daemon.url) as client:
        sub = client.subscribe(name)
        first = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        await client.publish(name, b"before")
        assert (await asyncio.wait_for(first, 10)).payload == b"before"

        own_daemon.restart()
        gap = await asyncio.wait_for(sub.__anext__(), 20)
        assert isinstance(gap, Gap) and gap.reconnects == 1 and gap.resumed_at >= gap.lost_at
        # Re-subscribed: what is published now arrives.
        nxt = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        await client.publish(name, b"after")
        assert (await asyncio.wait_for(nxt, 10)).payload == b"after"
        await sub.aclose()


async def _collect(sub) -> list:  # type: ignore[no-untyped-def]
    return [x async for x in sub]
