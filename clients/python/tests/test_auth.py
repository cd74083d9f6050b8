"""Bearer-token authentication: the token is sent as `authorization: Bearer`."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import pytest

from socle_eventbus import Client, Unauthenticated, Worker

from conftest import Daemon

TOKEN = "s3cret-token-for-tests"


@pytest.fixture(scope="module")
def auth_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    workdir = tmp_path_factory.mktemp("auth")
    principals = workdir / "principals.yaml"
    principals.write_text(
        "principals:\n"
        "  - name: tester\n"
        f"    token_sha256: {hashlib.sha256(TOKEN.encode()).hexdigest()}\n"
        "    permissions:\n"
        "      publish: { allow: ['>'] }\n"
        "      subscribe: { allow: ['>'] }\n"
        "      consumers: { allow: ['*'] }\n"
        "      manage_consumers: ['*']\n"
    )
    d = Daemon(workdir, env={"EVENTBUS__AUTH__ENABLED": "true", "EVENTBUS__AUTH__PRINCIPALS_FILE": str(principals)})
    d.start()
    yield d
    d.stop()


async def test_with_the_token_calls_work(auth_daemon: Daemon, name: str) -> None:
    async with await Client.connect(auth_daemon.url, token=TOKEN) as client:
        assert (await client.publish(name, b"x")).event_id
        await client.create_consumer(name, [name])
        async with Worker(client, name, _noop) as worker:
            assert worker.info is not None and worker.info.owner == "tester"


@pytest.mark.parametrize("token", [None, "wrong-token"])
async def test_without_a_valid_token_unauthenticated(auth_daemon: Daemon, name: str, token: str) -> None:
    async with await Client.connect(auth_daemon.url, token=token) as client:
        with pytest.raises(Unauthenticated):
            await client.publish(name, b"x")
        with pytest.raises(Unauthenticated):
            async for _ in client.subscribe(name):
                pass
        with pytest.raises(Unauthenticated):
            await Worker(client, name, _noop).start()


async def _noop(d: object) -> None:
    return None
