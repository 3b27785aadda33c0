"""The lab's cluster DNS answers from the API, and from its last answers while the API server is away."""

from __future__ import annotations

from typing import Any

import pytest

from tests.lab.dns import ClusterResolver
from tests.lab.rest import ApiError


class FakeApi:
    """Stands in for the lab's REST client: a Service and its pods, or an API server that is down."""

    def __init__(self) -> None:
        self.down = False
        self.objects: dict[str, Any] = {
            "/api/v1/namespaces/ns/services/job": {"spec": {"clusterIP": "None", "selector": {"job": "j"},
                                                            "publishNotReadyAddresses": True}},
            "/api/v1/namespaces/ns/pods": {"items": [{
                "metadata": {"labels": {"job": "j"}}, "spec": {"hostname": "job-0", "subdomain": "job"},
                "status": {"podIP": "10.0.0.7", "phase": "Running"}}]},
        }

    def get(self, path: str) -> Any:
        if self.down:
            raise ConnectionError("connection refused")
        if path not in self.objects:
            raise ApiError(404, "not found", path)
        return self.objects[path]


def test_a_name_resolves_to_its_last_answer_while_the_api_server_restarts() -> None:
    api = FakeApi()
    resolver = ClusterResolver(api)  # type: ignore[arg-type]
    name = "job-0.job.ns.svc.cluster.local."
    assert resolver.lookup(name) == ["10.0.0.7"]
    api.down = True
    assert resolver.lookup(name) == ["10.0.0.7"], "CoreDNS answers from its cache through an outage"
    with pytest.raises(ConnectionError):
        resolver.lookup("other-0.job.ns.svc.cluster.local.")  # never seen: SERVFAIL
    api.down = False
    api.objects["/api/v1/namespaces/ns/pods"]["items"][0]["status"]["podIP"] = "10.0.0.9"
    assert resolver.lookup(name) == ["10.0.0.9"], "fresh again once the API answers"


def test_a_missing_service_is_nxdomain_not_a_stale_answer() -> None:
    api = FakeApi()
    resolver = ClusterResolver(api)  # type: ignore[arg-type]
    assert resolver.lookup("nothing.ns.svc.cluster.local.") is None


def test_a_hidden_name_is_nxdomain_for_its_first_seconds_then_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("tests.lab.dns.time.monotonic", lambda: clock[0])
    resolver = ClusterResolver(FakeApi())  # type: ignore[arg-type]
    hidden = resolver.hide("job-0.job.ns.svc.cluster.local", seconds=5)
    name = "JOB-0.job.ns.svc.cluster.local."
    clock[0] = 250.0  # the window starts at the first query, not when the name was hidden
    assert resolver.lookup(name, "10.0.0.7") is None
    clock[0] = 254.9
    assert resolver.lookup(name, "10.0.0.8") is None
    assert resolver.lookup("job.ns.svc.cluster.local.") == ["10.0.0.7"], "other names still answer"
    clock[0] = 255.0
    assert resolver.lookup(name, "10.0.0.7") == ["10.0.0.7"]
    assert hidden.refused_clients == ["10.0.0.7", "10.0.0.8"]
