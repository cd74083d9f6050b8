"""Worker behaviour against a real daemon."""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Dict, List

from prometheus_client import CollectorRegistry

from socle_eventbus import Ack, Client, Delivery, Retry, Term, Worker, pb, publish_request

from conftest import Daemon, eventually


async def publish_n(client: Client, channel: str, n: int) -> List[str]:
    async def reqs():
        for i in range(n):
            yield publish_request(channel, str(i))

    return [r.event_id async for r in client.publish_stream(reqs())]


async def settled(client: Client, consumer: str) -> bool:
    info = await client.get_consumer(consumer)
    return info.pending == 0 and info.in_flight == 0


async def test_all_events_handled_once_and_acked_with_concurrency_8(daemon: Daemon, name: str) -> None:
    n = 400
    registry = CollectorRegistry()
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(name, [f"{name}.>"])
        ids = await publish_n(client, f"{name}.e", n)
        seen: Dict[str, int] = collections.Counter()
        running = peak = 0

        async def handle(d: Delivery) -> Ack:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.001)
            seen[d.event.id] += 1
            running -= 1
            return Ack()

        worker = Worker(client, name, handle, concurrency=8, registry=registry)
        await worker.start()
        await eventually(lambda: settled(client, name), what="all acked")
        await worker.stop()

        assert sorted(seen) == sorted(ids) and set(seen.values()) == {1}
        assert peak == 8
        info = await client.get_consumer(name)
        assert (info.acked, info.redelivered, info.dead_lettered) == (n, 0, 0)
        st = worker.stats()
        assert (st.processed, st.failed, st.retried, st.in_flight) == (n, 0, 0, 0)
        labels = {"consumer": name}
        assert registry.get_sample_value("socle_push_worker_processed_total", labels) == n
        assert registry.get_sample_value("socle_push_worker_failed_total", labels) == 0
        assert registry.get_sample_value("socle_push_worker_in_flight", labels) == 0
        assert registry.get_sample_value("socle_push_worker_handle_seconds_count", labels) == n


async def test_fails_twice_then_succeeds_acked_at_attempt_3_after_the_backoff(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(name, [name], backoff=pb.Backoff(initial_ms=200, multiplier=2.0, max_ms=1000))
        (event_id,) = await publish_n(client, name, 1)
        attempts: List[tuple] = []
        errors: List[tuple] = []

        async def handle(d: Delivery) -> None:
            attempts.append((d.attempt, time.monotonic()))
            if d.attempt < 3:
                raise RuntimeError(f"flaky {d.attempt}")

        worker = Worker(client, name, handle, concurrency=8,
                        on_error=lambda ev, err, attempt: errors.append((ev.id, str(err), attempt)))
        async with worker:
            await eventually(lambda: settled(client, name), what="acked")

        assert [a for a, _ in attempts] == [1, 2, 3]
        # Redelivered after the consumer's backoff: 200 ms, then 400 ms.
        assert attempts[1][1] - attempts[0][1] >= 0.18
        assert attempts[2][1] - attempts[1][1] >= 0.38
        assert errors == [(event_id, "flaky 1", 1), (event_id, "flaky 2", 2)]
        (entry,) = (await client.event_log(name)).entries
        assert entry.status == pb.EVENT_STATUS_COMPLETED and entry.attempts == 3
        assert [f.reason for f in entry.failures] == ["RuntimeError: flaky 1", "RuntimeError: flaky 2"]
        st = worker.stats()
        assert (st.processed, st.failed, st.retried) == (1, 2, 2)


async def test_always_failing_goes_to_the_dead_letter_channel_with_its_reasons(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(name, [f"{name}.>"], max_attempts=3,
                                     backoff=pb.Backoff(initial_ms=20, multiplier=1.0, max_ms=20))
        dlq = client.subscribe(f"dlq.{name}.>")
        letters = asyncio.ensure_future(dlq.__anext__())
        await dlq.started()
        (failing,) = await publish_n(client, f"{name}.pay", 1)

        async def handle(d: Delivery) -> None:
            raise ValueError(f"boom {d.attempt}")

        async with Worker(client, name, handle):
            letter = await asyncio.wait_for(letters, 20)
        assert letter.channel == f"dlq.{name}.pay"
        assert letter.content_type == "application/x-protobuf; type=eventbus.v1.DeadLetter"
        dead = pb.DeadLetter.FromString(letter.payload)
        assert (dead.event.id, dead.consumer, dead.attempts) == (failing, name, 3)
        assert [f.reason for f in dead.failures] == ["ValueError: boom 1", "ValueError: boom 2", "ValueError: boom 3"]
        (entry,) = (await client.event_log(name, status=pb.EVENT_STATUS_DEAD_LETTERED)).entries
        assert entry.event_id == failing
        await dlq.aclose()


async def test_term_and_retry_after(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(name, [f"{name}.>"])
        dlq = client.subscribe(f"dlq.{name}.>")
        letters = asyncio.ensure_future(dlq.__anext__())
        await dlq.started()
        await client.publish(f"{name}.term", b"")
        await client.publish(f"{name}.retry", b"")
        seen: List[tuple] = []

        async def handle(d: Delivery):  # type: ignore[no-untyped-def]
            seen.append((d.event.channel, d.attempt, time.monotonic()))
            if d.event.channel.endswith("term"):
                return Term("invalid order")
            return Retry(after=0.05) if d.attempt == 1 else Ack()

        async with Worker(client, name, handle) as worker:
            dead = pb.DeadLetter.FromString((await asyncio.wait_for(letters, 20)).payload)
            await eventually(lambda: settled(client, name), what="settled")
        assert (dead.attempts, [f.reason for f in dead.failures]) == (1, ["invalid order"])
        retries = [t for c, _, t in seen if c.endswith("retry")]
        assert len(retries) == 2 and retries[1] - retries[0] >= 0.04  # Retry(after) beats the 1 s backoff
        assert retries[1] - retries[0] < 0.9
        st = worker.stats()
        assert (st.processed, st.failed, st.retried, st.terminated) == (1, 2, 1, 1)
        await dlq.aclose()


async def test_a_long_handler_is_not_redelivered_while_it_runs(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(name, [name], ack_deadline_ms=600)
        await publish_n(client, name, 1)
        attempts: List[int] = []

        async def handle(d: Delivery) -> None:
            attempts.append(d.attempt)
            await asyncio.sleep(2.0)  # more than three ack deadlines

        async with Worker(client, name, handle, concurrency=2):
            await eventually(lambda: settled(client, name), what="acked")
        assert attempts == [1]
        info = await client.get_consumer(name)
        assert (info.acked, info.redelivered) == (1, 0)


async def test_stop_lets_running_handlers_finish_and_the_rest_is_redelivered(daemon: Daemon, name: str) -> None:
    n = 40
    async with await Client.connect(daemon.url) as client:
        # One attempt allowed: handing back what no handler started must not count one
        # (it would be dead-lettered).
        await client.create_consumer(name, [f"{name}.>"], max_attempts=1)
        ids = await publish_n(client, f"{name}.e", n)
        started: List[str] = []
        finished: List[str] = []
        four_running = asyncio.Event()
        release = asyncio.Event()

        async def slow(d: Delivery) -> None:
            started.append(d.event.id)
            if len(started) == 4:
                four_running.set()
            await release.wait()
            finished.append(d.event.id)

        first = Worker(client, name, slow, concurrency=4, shutdown_timeout=10)
        await first.start()
        await asyncio.wait_for(four_running.wait(), 10)
        assert first.backlog() > 0
        stopping = asyncio.ensure_future(first.stop())
        await asyncio.sleep(0)  # stop() has begun: no new handler starts
        release.set()
        await asyncio.wait_for(stopping, 10)
        assert sorted(finished) == sorted(started) and len(started) == 4
        assert first.stats().processed == 4

        rest: List[str] = []
        attempts: List[int] = []

        async def fast(d: Delivery) -> None:
            rest.append(d.event.id)
            attempts.append(d.attempt)

        async with Worker(client, name, fast, concurrency=8):
            await eventually(lambda: settled(client, name), what="rest handled")
        assert sorted(finished + rest) == sorted(ids)  # nothing lost, nothing twice
        assert set(attempts) == {1}, "handed back unstarted: no attempt counted"
        info = await client.get_consumer(name)
        assert (info.acked, info.dead_lettered, info.redelivered) == (n, 0, 0)


async def test_stop_timeout_cancels_stuck_handlers_and_nacks_them(daemon: Daemon, name: str) -> None:
    async with await Client.connect(daemon.url) as client:
        await client.create_consumer(name, [name])
        (event_id,) = await publish_n(client, name, 1)
        stuck = asyncio.Event()

        async def hang(d: Delivery) -> None:
            stuck.set()
            await asyncio.Event().wait()

        w = Worker(client, name, hang, shutdown_timeout=0.2)
        await w.start()
        await asyncio.wait_for(stuck.wait(), 10)
        await asyncio.wait_for(w.stop(), 10)
        got: List[Delivery] = []

        async def ok(d: Delivery) -> None:
            got.append(d)

        async with Worker(client, name, ok):
            await eventually(lambda: settled(client, name), what="redelivered and acked")
        assert [(d.event.id, d.attempt) for d in got] == [(event_id, 2)]
        (entry,) = (await client.event_log(name)).entries
        assert [f.reason for f in entry.failures] == ["worker shutdown"]


async def test_worker_reconnects_after_a_daemon_restart_and_finishes(own_daemon: Daemon, name: str) -> None:
    n = 300
    async with await Client.connect(own_daemon.url) as client:
        await client.create_consumer(name, [f"{name}.>"])
        ids = await publish_n(client, f"{name}.e", n)
        seen: Dict[str, int] = collections.Counter()
        hooks: List[str] = []

        async def handle(d: Delivery) -> None:
            await asyncio.sleep(0.002)
            seen[d.event.id] += 1

        worker = Worker(client, name, handle, concurrency=8, on_start=lambda: hooks.append("start"),
                        on_stop=lambda: hooks.append("stop"))
        await worker.start()
        await eventually(lambda: _true(len(seen) >= n // 3), what="a third handled")
        own_daemon.restart()  # kill -9, then the same port and data directory
        await eventually(lambda: _true(set(seen) == set(ids)), timeout=30, what="every event handled")
        await eventually(lambda: settled(client, name), timeout=30, what="all acked")
        await worker.stop()
        assert worker.connects >= 2
        assert hooks == ["start", "stop"]
        assert (await client.get_consumer(name)).dead_lettered == 0


async def _true(value: bool) -> bool:
    return value
