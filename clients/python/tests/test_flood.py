"""HTTP/2 framing under load: a standard grpcio client streams one small DATA frame per
message, as fast as flow control lets it, and the broker must never cut the connection
(GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames") for it (docs/limits.md)."""

from __future__ import annotations

import asyncio
import grpc
import grpc.aio

from socle_eventbus import pb
from socle_eventbus._pb import eventbus_pb2_grpc as pb_grpc

from conftest import Daemon

CONNECTIONS = 8
PER_CONNECTION = 6000


async def test_many_small_publishes_on_raw_streams_are_all_answered(daemon: Daemon, name: str) -> None:
    # Its own subchannel pool per channel: one TCP connection each, as separate processes
    # would have. A small receive window (no BDP growth) makes the broker's answers wait
    # for the client early, as a busy client's would.
    options = [
        ("grpc.use_local_subchannel_pool", 1),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.lookahead_bytes", 1024),
    ]
    target = daemon.grpc_addr
    sub_channel = grpc.aio.insecure_channel(target, options=options)
    subscriber = pb_grpc.EventBusStub(sub_channel).Subscribe(pb.SubscribeRequest(channels=[f"{name}.>"]))
    first = await subscriber.read()
    assert first.WhichOneof("kind") == "started"
    received = 0

    async def read_events() -> None:
        nonlocal received
        while True:
            msg = await subscriber.read()
            if msg is grpc.aio.EOF:
                return
            received += len(msg.events.events)

    reader = asyncio.ensure_future(read_events())

    async def publisher(i: int) -> int:
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            # Pipelined: every request is written before the first answer is read, so
            # the broker, its answers unread, stops reading while the requests keep
            # coming as far as flow control lets them.
            call = pb_grpc.EventBusStub(channel).PublishStream()
            try:
                for n in range(PER_CONNECTION):
                    await call.write(pb.PublishRequest(channel=f"{name}.c{i}", payload=str(n).encode()))
                await call.done_writing()
            except Exception:  # the call failed: its status says why
                pass
            ok = 0
            try:
                while (resp := await call.read()) is not grpc.aio.EOF:
                    assert resp.event_id
                    ok += 1
            except grpc.aio.AioRpcError:
                pass
            code, details = await call.code(), await call.details()
            assert code == grpc.StatusCode.OK, f"connection {i}: {code} {details!r} after {ok} answers"
            return ok

    try:
        answered = await asyncio.gather(*(publisher(i) for i in range(CONNECTIONS)))
    finally:
        reader.cancel()
        await sub_channel.close()
    assert answered == [PER_CONNECTION] * CONNECTIONS
    assert received > 0
