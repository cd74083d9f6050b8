"""A push consumer created from Python: the broker POSTs to a standard-library endpoint."""

from __future__ import annotations

import hashlib
import hmac
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from socle_eventbus import Client, pb

from conftest import Daemon, eventually


def endpoint() -> "tuple[HTTPServer, List[Dict[str, object]]]":
    """An HTTP server on a free loopback port that records each request and answers 204."""
    received: List[Dict[str, object]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append({"headers": dict(self.headers), "body": body})
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, received


@pytest.fixture
def local_daemon(tmp_path: Path) -> Iterator[Daemon]:
    """A daemon that may push to loopback, which push.deny_networks refuses by default:
    the endpoint below listens on 127.0.0.1, as in local development."""
    d = Daemon(tmp_path, env={"EVENTBUS__PUSH__ALLOW_NETWORKS": "127.0.0.0/8"})
    d.start()
    yield d
    d.stop()


async def test_the_broker_pushes_signed_events_to_an_http_endpoint(local_daemon: Daemon, name: str) -> None:
    daemon = local_daemon
    server, received = endpoint()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/hook"
        async with await Client.connect(daemon.url) as client:
            info = await client.create_consumer(name, f"{name}.>", push=pb.PushConfig(url=url, secret="k"))
            assert info.config.push.url == url
            assert info.config.push.secret == "(redacted)"
            published = await client.publish(f"{name}.created", b'{"n":1}', content_type="application/json")

            async def acked() -> bool:
                return (await client.get_consumer(name)).acked == 1

            await eventually(acked, what="the push to be acked")
        headers, body = received[0]["headers"], received[0]["body"]
        assert isinstance(headers, dict) and isinstance(body, bytes)
        assert headers["eventbus-id"] == published.event_id
        assert body == b'{"n":1}'
        t, _, sig = headers["eventbus-signature"].removeprefix("t=").partition(",v1=")
        assert hmac.compare_digest(sig, hmac.new(b"k", t.encode() + b"." + body, hashlib.sha256).hexdigest())
    finally:
        server.shutdown()
