"""The lab's API client: what its errors say, and how long it waits."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from tests.lab.rest import Rest


@pytest.fixture
def silent_server() -> Iterator[Callable[[float], Rest]]:
    """A client (with the given timeout) of a server that takes the connection and never answers, as an API
    server too busy to answer in time looks to the client."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def client(timeout: float) -> Rest:
            rest = Rest(f"http://127.0.0.1:{listener.getsockname()[1]}", Path("ca"), Path("cert"), Path("key"),
                        timeout=timeout)
            rest.session.cert = None  # plain HTTP: no client certificate to load
            return rest

        yield client


def test_a_request_that_times_out_names_itself_and_stays_a_timeout(silent_server: Callable[[float], Rest]) -> None:
    with pytest.raises(requests.Timeout) as raised:
        silent_server(0.3).get("/api/v1/namespaces/slow/pods", limit=5)
    assert "GET /api/v1/namespaces/slow/pods" in str(raised.value)


def test_a_request_may_wait_longer_than_the_clients_timeout(silent_server: Callable[[float], Rest]) -> None:
    # Deleting a collection of 512 pods takes the API server longer than the client's usual 15 s.
    rest = silent_server(0.2)
    started = time.monotonic()
    with pytest.raises(requests.Timeout):
        rest.request("DELETE", "/api/v1/namespaces/wide/pods", timeout=1.0)
    assert time.monotonic() - started >= 1.0


@pytest.fixture
def closing_server() -> Iterator[tuple[Rest, list[str]]]:
    """A client of a server that closes the connection of the first create without answering (as a busy API
    server drops a kept-alive connection as it is reused), then answers 409 to a create, and 200 to a read; and
    the requests it saw."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(f"POST {self.path}")
            if len(seen) == 1:
                self.close_connection = True  # no answer at all
                return
            self._answer(409, {"kind": "Status", "reason": "AlreadyExists"})

        def do_GET(self) -> None:
            seen.append(f"GET {self.path}")
            self._answer(200, {"metadata": {"name": self.path.rsplit("/", 1)[1]}})

        def _answer(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rest = Rest(f"http://127.0.0.1:{server.server_address[1]}", Path("ca"), Path("cert"), Path("key"), timeout=5)
    rest.session.cert = None
    try:
        yield rest, seen
    finally:
        server.shutdown()
        server.server_close()


def test_a_create_whose_connection_closed_unanswered_is_sent_once_more_and_a_conflict_then_read(
        closing_server: tuple[Rest, list[str]]) -> None:
    rest, seen = closing_server
    created = rest.post("/api/v1/namespaces/burst/pods", {"metadata": {"name": "j1"}})
    assert created == {"metadata": {"name": "j1"}}
    assert seen == ["POST /api/v1/namespaces/burst/pods", "POST /api/v1/namespaces/burst/pods",
                    "GET /api/v1/namespaces/burst/pods/j1"]


def test_an_unnamed_create_is_never_sent_twice(closing_server: tuple[Rest, list[str]]) -> None:
    rest, seen = closing_server
    with pytest.raises(requests.ConnectionError):
        rest.post("/api/v1/namespaces/burst/pods", {"metadata": {"generateName": "j-"}})
    assert seen == ["POST /api/v1/namespaces/burst/pods"]
