"""Client: publish, publish_stream, subscribe (with gaps after a restart), admin, errors."""

from __future__ import annotations

import asyncio

import pytest

from socle_eventbus import (
    Ack,
    AlreadyExists,
    Client,
    Delivery,
    Gap,
    InvalidArgument,
    NotFound,
    PublishRefused,
    Term,
    Unavailable,
    Worker,
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


async def test_publish_stream_ack_modes_answer_refusals_in_place(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        sub = client.subscribe(f"{name}.*")
        nxt = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        bad = {3: f"{name}.*", 7: ""}
        requests = [publish_request(bad.get(i, f"{name}.ok"), str(i)) for i in range(20)]
        for ack in ("cumulative", "none"):
            answers = [a async for a in client.publish_stream(requests, ack=ack, window=4)]
            refused = [a for a in answers if isinstance(a, PublishRefused)]
            assert [(r.position, type(r.error)) for r in refused] == [(3, InvalidArgument), (7, InvalidArgument)]
            assert f"{name}.*" in refused[0].error.message
            totals = [a for a in answers if isinstance(a, pb.PublishAck)]
            assert answers[-1] is totals[-1] and totals[-1].end, answers
            assert (totals[-1].count, totals[-1].refused, totals[-1].delivered) == (18, 2, 18)
            if ack == "none":
                assert len(totals) == 1 and len(answers) == 3
        got = [await asyncio.wait_for(nxt, 10)]
        while len(got) < 36:
            got.append(await asyncio.wait_for(sub.__anext__(), 10))
        expected = [str(i) for i in range(20) if i not in bad] * 2
        assert [e.payload.decode() for e in got] == expected
        assert got[-1].id == totals[-1].last_event_id
        await sub.aclose()
        with pytest.raises(ValueError, match="ack must be one of"):
            [a async for a in client.publish_stream(requests, ack="sometimes")]


async def test_publish_batch_answers_each_event_in_order(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        sub = client.subscribe(f"{name}.*")
        nxt = asyncio.ensure_future(sub.__anext__())  # the subscription runs while iterated
        await sub.started()
        requests = [publish_request(f"{name}.a", "first"), publish_request(f"{name}.*", "wildcard"),
                    publish_request(f"{name}.b", "last", metadata={"k": "v"})]
        results = await client.publish_batch(requests)
        assert len(results) == 3
        first, refused, last = results
        assert isinstance(first, pb.PublishResponse) and first.event_id and first.delivered_count == 1
        # The refused event's error is returned in its slot, typed; the others are published.
        assert isinstance(refused, InvalidArgument) and f"{name}.*" in refused.message
        assert isinstance(last, pb.PublishResponse) and last.event_id
        received = [await asyncio.wait_for(nxt, 10), await asyncio.wait_for(sub.__anext__(), 10)]
        assert [(e.id, e.payload) for e in received] == [(first.event_id, b"first"), (last.event_id, b"last")]
        assert received[1].metadata["k"] == "v"
        assert await client.publish_batch([]) == []
        await sub.aclose()


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


async def test_consumer_operations(daemon: Daemon, name: str) -> None:
    """docs/consumer-operations.md: pending while paused, resume, redrive by id and the
    oldest, each logged `redriven`; exclusive and linear backoff round-trip."""
    async with await Client.connect(daemon.url) as client:
        linear = pb.Backoff(kind=pb.BACKOFF_KIND_LINEAR)
        info = await client.create_consumer(name, [f"{name}.>"], exclusive=True, backoff=linear)
        assert info.config.exclusive and info.config.backoff.kind == pb.BACKOFF_KIND_LINEAR
        assert (await client.pause(name)).paused
        ids = [(await client.publish(f"{name}.job", str(i).encode())).event_id for i in range(3)]
        page = await client.pending(name, limit=2)
        assert [e.event.id for e in page.entries] == ids[:2] and page.next_page_token
        assert all(e.state == pb.PENDING_STATE_READY and e.attempt == 0 for e in page.entries)
        assert [e.event.id async for e in client.pending_all(name)] == ids

        fixed = {"yet": False}

        async def handle(d: Delivery):  # type: ignore[no-untyped-def]
            return Ack() if fixed["yet"] else Term("bug")

        async def counts(redrivable: int, acked: int) -> bool:
            got = await client.get_consumer(name)
            return (got.redrivable, got.acked) == (redrivable, acked)

        async with Worker(client, name, handle):
            assert not (await client.resume(name)).paused
            await eventually(lambda: counts(3, 0), what="3 dead letters")
            fixed["yet"] = True
            one = await client.redrive(name, [ids[0]])
            assert (one.redriven, one.remaining) == (1, 2)
            again = await client.redrive(name, [ids[0]])
            assert (again.redriven, again.remaining) == (0, 2)
            rest = await client.redrive(name)
            assert (rest.redriven, rest.remaining) == (2, 0)
            await eventually(lambda: counts(0, 3), what="3 acked")
        log = (await client.event_log(name, status=pb.EVENT_STATUS_REDRIVEN)).entries
        assert sorted(e.event_id for e in log) == sorted(ids)
        assert (await client.get_consumer(name)).redriven == 3
        with pytest.raises(InvalidArgument):
            await client.pending(name, page_token="bogus")
        for call in (client.pending, client.redrive, client.pause, client.resume):
            with pytest.raises(NotFound):
                await call(f"{name}-ghost")  # type: ignore[operator]


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
