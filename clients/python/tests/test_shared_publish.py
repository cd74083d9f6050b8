"""`Client.publish` over the client's shared `PublishStream`: each of many concurrent calls
gets its own answer or its own error, in order per caller, through a refusal, a deadline
and a broker restart."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Dict, List, Tuple

import pytest

from socle_eventbus import Client, EventBusError, InvalidArgument, pb
from socle_eventbus.errors import is_transient

from conftest import Daemon, eventually


class Collected:
    """A live subscription and the events it has received so far."""

    def __init__(self, client: Client, pattern: str) -> None:
        self.sub = client.subscribe(pattern)
        self.events: List[pb.Event] = []
        self._task = asyncio.ensure_future(self._collect())

    async def _collect(self) -> None:
        async for item in self.sub:
            if isinstance(item, pb.Event):
                self.events.append(item)

    async def started(self) -> "Collected":
        await self.sub.started()
        return self

    async def received(self, n: int) -> List[pb.Event]:
        async def enough() -> bool:
            return len(self.events) >= n

        await eventually(enough, what=f"{n} events")
        return self.events[:n]

    async def close(self) -> None:
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        await self.sub.aclose()


async def subscribed(client: Client, pattern: str) -> Collected:
    return await Collected(client, pattern).started()


async def test_a_thousand_concurrent_calls_each_get_the_answer_to_their_own_event(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(f"{name}-audit", f"{name}.>")
        sub = await subscribed(client, f"{name}.>")
        n = 1000

        async def call(i: int) -> Tuple[int, pb.PublishResponse]:
            key = ""
            payload = str(i)
            if i % 100 == 1:
                key = f"key-{i}"
            if i % 100 == 2:  # the same key as the call before: its duplicate
                key, payload = f"key-{i - 1}", str(i - 1)
            return i, await client.publish(f"{name}.{int(payload) % 7}", payload, idempotency_key=key)

        answers = await asyncio.gather(*(call(i) for i in range(n)))
        duplicates = [i for i, a in answers if a.duplicate]
        assert len(duplicates) == n // 100, duplicates
        events = {e.id: e for e in await sub.received(n - n // 100)}
        assert len(events) == n - n // 100
        for i, answer in answers:
            expected = i - 1 if i % 100 == 2 else i
            event = events[answer.event_id]
            assert event.payload == str(expected).encode(), f"call {i} answered with another call's id"
            assert event.channel == f"{name}.{expected % 7}"
            assert answer.captured_count == (0 if answer.duplicate else 1), f"call {i}"
        await sub.close()


async def test_a_refused_event_fails_its_own_call_and_the_others_are_published(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        sub = await subscribed(client, f"{name}.>")
        n = 300
        bad = n // 2
        channels = [f"{name}..bad" if i == bad else f"{name}.{i}" for i in range(n)]
        answers = await asyncio.gather(*(client.publish(c, str(i)) for i, c in enumerate(channels)),
                                       return_exceptions=True)
        for i, answer in enumerate(answers):
            if i == bad:
                assert isinstance(answer, InvalidArgument) and f"{name}..bad" in str(answer), answer
            else:
                assert isinstance(answer, pb.PublishResponse), (i, answer)
        events = {e.id: e for e in await sub.received(n - 1)}
        for i, answer in enumerate(answers):
            if i != bad:
                assert events[answer.event_id].payload == str(i).encode(), f"call {i}"
        await sub.close()


async def test_each_caller_s_events_keep_their_order(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        sub = await subscribed(client, f"{name}.>")
        callers, each = 16, 50

        async def caller(c: int) -> None:
            for i in range(each):
                await client.publish(f"{name}.{c}", str(i))

        async def pipelined() -> None:  # does not wait for one call before the next
            await asyncio.gather(*(client.publish(f"{name}.pipelined", str(i)) for i in range(each)))

        await asyncio.gather(*(caller(c) for c in range(callers)), pipelined())
        per_caller: Dict[str, List[str]] = {}
        for e in await sub.received((callers + 1) * each):
            per_caller.setdefault(e.channel, []).append(e.payload.decode())
        assert len(per_caller) == callers + 1
        for channel, payloads in per_caller.items():
            assert payloads == [str(i) for i in range(each)], channel
        await sub.close()


async def test_a_call_s_deadline_holds_and_the_other_calls_keep_their_answers(daemon: Daemon, name: str) -> None:
    # A "broker" that takes connections and never answers.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    try:
        client = await Client.connect(f"http://127.0.0.1:{silent.getsockname()[1]}", connect_timeout=None)
        start = time.monotonic()
        with pytest.raises(EventBusError) as raised:
            await client.publish(f"{name}.x", "x", timeout=0.2)
        assert raised.value.code is not None and raised.value.code.name == "DEADLINE_EXCEEDED"
        assert time.monotonic() - start < 2, "the deadline held"
        await client.close()
    finally:
        silent.close()

    # On a real broker, callers that give up at once leave the others' answers intact.
    async with await Client.connect(daemon.url) as client:
        sub = await subscribed(client, f"{name}.>")

        async def call(i: int):  # type: ignore[no-untyped-def]
            if i % 2 == 0:
                try:
                    return await client.publish(f"{name}.x", str(i), timeout=0.000001)
                except EventBusError:
                    return None
            return await client.publish(f"{name}.x", str(i))

        answers = await asyncio.gather(*(call(i) for i in range(400)))
        kept = [(i, a.event_id) for i, a in enumerate(answers) if a is not None]
        assert len(kept) >= 200
        marker = (await client.publish(f"{name}.end", "end")).event_id

        async def marker_seen() -> bool:
            return any(e.id == marker for e in sub.events)

        await eventually(marker_seen, what="the marker")
        payloads: Dict[str, bytes] = {e.id: e.payload for e in sub.events}
        for i, event_id in kept:
            assert payloads.get(event_id) == str(i).encode(), f"call {i}"
        await sub.close()


async def test_a_broker_restart_mid_flight_answers_no_false_ok_and_loses_no_keyed_event(
        own_daemon: Daemon, name: str) -> None:
    async with await Client.connect(own_daemon.url) as client:
        await client.create_consumer("audit", f"{name}.>")
        tasks, each = 8, 60
        answered = 0
        ok: List[Tuple[str, str]] = []

        async def publisher(t: int) -> None:
            nonlocal answered
            keyed = t < tasks
            for i in range(each):
                try:
                    answer = await client.publish(f"{name}.{t}", f"{t}-{i}",
                                                  idempotency_key=f"{t}-{i}" if keyed else "")
                    ok.append((f"{t}-{i}", answer.event_id))
                except EventBusError as e:
                    assert not keyed, f"a keyed call failed: {e}"
                    assert is_transient(e), f"a retryable error: {e}"
                answered += 1

        running = asyncio.gather(*(publisher(t) for t in range(tasks * 2)))

        async def in_flight() -> bool:
            return answered >= 200

        await eventually(in_flight, what="calls in flight")
        await asyncio.to_thread(own_daemon.restart)
        await asyncio.wait_for(running, 30)
        stored = {e.event.id: e.event.payload.decode() async for e in client.pending_all("audit")}
        for payload, event_id in ok:
            assert stored.get(event_id) == payload, f"answered OK but not stored: {payload} ({event_id})"
        payloads = set(stored.values())
        for t in range(tasks):
            for i in range(each):
                assert f"{t}-{i}" in payloads, f"keyed event {t}-{i} lost"


async def test_unary_publish_stays_an_option(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url, unary_publish=True, publish_linger=0.001) as client:
        first = await client.publish(f"{name}.x", "1")
        with pytest.raises(InvalidArgument):
            await client.publish(f"{name}..x", "2")
        assert first.event_id
    async with await Client.connect(daemon.url, publish_linger=0.002) as client:
        answers = await asyncio.gather(*(client.publish(f"{name}.l", str(i)) for i in range(100)))
        assert len({a.event_id for a in answers}) == 100
