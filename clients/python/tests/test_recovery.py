"""Recovery on channels with history: the subscription tracks the last position per
channel and re-subscribes with `since`; a `Gap` only when recovery was incomplete."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Iterator, List, Optional, Set, Tuple, Union

import pytest

from socle_eventbus import Client, Gap, InvalidArgument, Since, Subscription, pb, publish_request
from socle_eventbus.client import MAX_SINCE_CHANNELS

from conftest import Daemon

HISTORY = "eventbus:\n  history:\n    - channels: \"hist.>\"\n      size: 1000\n"

Item = Union[pb.Event, Gap]


def history_daemon(workdir: Path) -> Daemon:
    config = workdir / "history.yaml"
    config.write_text(HISTORY)
    return Daemon(workdir, env={"EVENTBUS_CONFIG": str(config)})


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """A daemon keeping the history of `hist.>`, for the tests that do not restart it."""
    d = history_daemon(tmp_path_factory.mktemp("history"))
    d.start()
    yield d
    d.stop()


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[Daemon]:
    d = history_daemon(tmp_path)
    d.start()
    yield d
    d.stop()


async def take(sub: Subscription, count: int, first: "Optional[asyncio.Future[Item]]" = None,
               timeout: float = 20.0) -> List[Item]:
    """The next `count` items (a pending `__anext__` future first, if given)."""
    deadline = time.monotonic() + timeout
    out: List[Item] = []
    if first is not None:
        out.append(await asyncio.wait_for(first, timeout))
    while len(out) < count:
        out.append(await asyncio.wait_for(sub.__anext__(), max(0.1, deadline - time.monotonic())))
    return out


async def live(sub: Subscription) -> "asyncio.Future[Item]":
    """Starts iterating and waits until the subscription is live; the future is its first item."""
    nxt = asyncio.ensure_future(sub.__anext__())
    await sub.started()
    return nxt


def payloads(items: List[Item]) -> List[int]:
    assert all(isinstance(i, pb.Event) for i in items), [i for i in items if isinstance(i, Gap)]
    return [int(i.payload) for i in items]  # type: ignore[union-attr]


class Proxy:
    """A TCP relay in front of a daemon: `cut()` drops every connection (a network failure)
    and refuses new ones until `restore()`."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.up = True
        self.server: Optional[asyncio.base_events.Server] = None
        self.conns: Set[asyncio.StreamWriter] = set()
        self.tasks: Set["asyncio.Task[None]"] = set()

    @property
    def url(self) -> str:
        assert self.server is not None
        return "http://127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]

    async def __aenter__(self) -> "Proxy":
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        self.cut()
        await asyncio.gather(*self.tasks, return_exceptions=True)  # their connections are gone

    def cut(self) -> None:
        self.up = False
        for w in list(self.conns):
            w.transport.abort()
        self.conns.clear()

    def restore(self) -> None:
        self.up = True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if not self.up:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.transport.abort()
            return
        self.conns.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


async def test_in_memory_restart_loses_history_so_a_gap_is_reported(restartable: Daemon, name: str) -> None:
    channel = f"hist.{name}.a"
    async with await Client.connect(restartable.url) as client:
        sub = client.subscribe(f"hist.{name}.>")
        first = await live(sub)
        assert sub.recovered is False and sub.started_at is not None
        for i in (1, 2, 3):
            await client.publish(channel, str(i))
        assert payloads(await take(sub, 3, first)) == [1, 2, 3]
        before = sub.positions[channel]
        assert before.offset == 3 and before.epoch

        restartable.restart()  # in_memory: the history is gone, with its epoch
        gap = await asyncio.wait_for(sub.__anext__(), 30)
        assert isinstance(gap, Gap) and gap.reconnects == 1 and sub.recovered is False
        nxt = asyncio.ensure_future(sub.__anext__())
        await sub.started()
        await client.publish(channel, "4")
        after = await asyncio.wait_for(nxt, 10)
        assert isinstance(after, pb.Event) and after.payload == b"4"
        assert after.position.epoch != before.epoch and after.position.offset == 1
        # Another epoch replaces the tracked position.
        assert (sub.positions[channel].epoch, sub.positions[channel].offset) == (after.position.epoch, 1)
        await sub.aclose()


async def test_resubscribing_with_since_recovers_every_event_once_in_order(shared: Daemon, name: str) -> None:
    a, b, c = (f"hist.{name}.{x}" for x in "abc")
    async with await Client.connect(shared.url) as client:
        sub = client.subscribe(f"hist.{name}.>")
        first = await live(sub)
        for seq, channel in ((1, a), (2, b), (3, a)):
            await client.publish(channel, str(seq))
        assert payloads(await take(sub, 3, first)) == [1, 2, 3]
        await sub.aclose()
        since = sub.since
        assert {ch: (p.offset) for ch, p in since.positions.items()} == {a: 2, b: 1}
        assert since.time is not None

        # Missed while away: more on the tracked channels, and a first event on `c`
        # (untracked: recovered from the time the subscription first started).
        for seq, channel in ((4, a), (5, b), (6, c)):
            await client.publish(channel, str(seq))

        again = client.subscribe(f"hist.{name}.>", since=since)
        first = await live(again)
        assert again.recovered is True
        for seq, channel in ((7, b), (8, c)):
            await client.publish(channel, str(seq))
        assert payloads(await take(again, 5, first)) == [4, 5, 6, 7, 8]
        assert {ch: p.offset for ch, p in again.positions.items()} == {a: 3, b: 3, c: 2}
        await again.aclose()

        # The other forms of `since`: positions as (epoch, offset), and a time.
        epoch = again.positions[a].epoch
        from_pair = client.subscribe(a, since={a: (epoch, 1)})
        first = await live(from_pair)
        assert from_pair.recovered is True
        assert payloads(await take(from_pair, 2, first)) == [3, 4]
        await from_pair.aclose()
        assert sub.started_at is not None
        from_time = client.subscribe(f"hist.{name}.>", since=sub.started_at)
        first = await live(from_time)
        assert from_time.recovered is True
        assert payloads(await take(from_time, 8, first)) == [1, 2, 3, 4, 5, 6, 7, 8]
        await from_time.aclose()

        # An exact channel starts from its latest position, received or not.
        exact = client.subscribe(b)
        first = await live(exact)
        assert {ch: p.offset for ch, p in exact.positions.items()} == {b: 3}
        await client.publish(b, "9")
        assert payloads(await take(exact, 1, first)) == [9]
        assert exact.positions[b].offset == 4
        await exact.aclose()


async def test_since_is_checked(shared: Daemon, name: str) -> None:
    async with await Client.connect(shared.url) as client:
        with pytest.raises(ValueError, match="group"):
            client.subscribe(f"hist.{name}.>", group="g", since=Since(positions={f"hist.{name}.a": ("e", 1)}))
        with pytest.raises(ValueError, match="timezone"):
            client.subscribe(f"hist.{name}.>", since=datetime.now())
        outside = client.subscribe(f"hist.{name}.a", since={f"hist.{name}.b": ("e", 1)})
        with pytest.raises(InvalidArgument, match="covers"):  # the broker's check
            await asyncio.wait_for(outside.__anext__(), 10)


async def test_over_the_since_limit_the_oldest_channels_resume_by_time_without_copies(
        shared: Daemon, name: str) -> None:
    channels = [f"hist.{name}.{i}" for i in range(MAX_SINCE_CHANNELS + 6)]
    async with await Client.connect(shared.url) as client:
        sub = client.subscribe(f"hist.{name}.>")
        first = await live(sub)
        for chunk in range(0, len(channels), 500):
            await client.publish_batch([publish_request(ch, "0") for ch in channels[chunk:chunk + 500]])
        assert len(await take(sub, len(channels), first)) == len(channels)
        await sub.aclose()
        # The 6 channels updated first are left out of `since` and resumed by time: their
        # events already yielded come again from the broker, and are skipped here.
        await client.publish(channels[0], "1")
        await client.publish(channels[-1], "2")
        again = client.subscribe(f"hist.{name}.>", since=sub.since)
        first = await live(again)
        assert again.recovered is True
        await client.publish(channels[1], "3")
        got = await take(again, 3, first)
        assert [(e.channel, int(e.payload)) for e in got] == [  # type: ignore[union-attr]
            (channels[0], 1), (channels[-1], 2), (channels[1], 3)]
        await again.aclose()


async def test_a_network_break_is_recovered_without_a_gap(shared: Daemon, name: str) -> None:
    a, b = f"hist.{name}.a", f"hist.{name}.b"
    async with Proxy(shared.grpc_addr) as proxy, await Client.connect(shared.url) as publisher, \
            await Client.connect(proxy.url) as client:
        sub = client.subscribe(f"hist.{name}.>")
        first = await live(sub)
        await publisher.publish(a, "1")
        await publisher.publish(b, "2")
        got = await take(sub, 2, first)

        proxy.cut()  # the subscriber is cut off; what is published now is missed...
        for seq, channel in ((3, a), (4, b), (5, a)):
            await publisher.publish(channel, str(seq))
        nxt = asyncio.ensure_future(sub.__anext__())
        proxy.restore()  # ... and recovered when it re-subscribes by itself
        await publisher.publish(b, "6")  # live, or recovered: either way once
        got += await take(sub, 4, nxt, timeout=30)
        assert payloads(got) == [1, 2, 3, 4, 5, 6]
        assert sub.reconnects == 1 and sub.recovered is True
        await sub.aclose()


async def test_resubscribing_while_events_are_published_loses_and_repeats_nothing(shared: Daemon, name: str) -> None:
    total = 600
    channels = [f"hist.{name}.{i}" for i in range(3)]
    async with await Client.connect(shared.url) as client:
        sub = client.subscribe(f"hist.{name}.>")
        first: "Optional[asyncio.Future[Item]]" = await live(sub)

        async def publish() -> None:
            for seq in range(1, total + 1):
                await client.publish(channels[seq % 3], str(seq))

        publisher = asyncio.ensure_future(publish())
        received: List[int] = []
        rounds: List[Tuple[int, Optional[bool]]] = []
        try:
            # Read a few events, leave, come back with `since`, while the publisher runs.
            for _ in range(6):
                received += payloads(await take(sub, 40, first))
                await sub.aclose()
                sub = client.subscribe(f"hist.{name}.>", since=sub.since)
                first = await live(sub)
                rounds.append((len(received), sub.recovered))
            received += payloads(await take(sub, total - len(received), first, timeout=60))
        finally:
            await sub.aclose()
            await publisher
        # Every event exactly once, and each channel's in publish order (the order the
        # broker keeps; across channels, one recovered and one live event may swap at
        # the seam).
        assert sorted(received) == list(range(1, total + 1)), received
        for channel in range(3):
            mine = [seq for seq in received if seq % 3 == channel]
            assert mine == sorted(mine), (channel, mine)
        assert all(recovered for _, recovered in rounds), rounds
