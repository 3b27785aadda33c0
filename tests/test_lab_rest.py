"""The lab's API client: what its errors say, and how long it waits."""

from __future__ import annotations

import socket
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
