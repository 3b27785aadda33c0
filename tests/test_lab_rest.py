"""The lab's API client: what its errors say."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import requests

from tests.lab.rest import Rest


def test_a_request_that_times_out_names_itself_and_stays_a_timeout() -> None:
    # A server that takes the connection and never answers, as an API server in a slow spell may.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        rest = Rest(f"http://127.0.0.1:{port}", Path("ca"), Path("cert"), Path("key"), timeout=0.3)
        rest.session.cert = None  # plain HTTP: no client certificate to load
        with pytest.raises(requests.Timeout) as raised:
            rest.get("/api/v1/namespaces/slow/pods", limit=5)
    assert "GET /api/v1/namespaces/slow/pods" in str(raised.value)


def test_a_request_may_wait_longer_than_the_clients_timeout() -> None:
    # Deleting a collection of 512 pods takes the API server longer than the client's usual 15 s.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        rest = Rest(f"http://127.0.0.1:{listener.getsockname()[1]}", Path("ca"), Path("cert"), Path("key"),
                    timeout=0.2)
        rest.session.cert = None
        started = time.monotonic()
        with pytest.raises(requests.Timeout):
            rest.request("DELETE", "/api/v1/namespaces/wide/pods", timeout=1.0)
    assert time.monotonic() - started >= 1.0
