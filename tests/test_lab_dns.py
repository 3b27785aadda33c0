"""The lab's cluster DNS: CoreDNS answers from its informer cache through an API server outage, and the front
that pods query refuses a hidden name for its first seconds and forwards everything else."""

from __future__ import annotations

import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSServer

from kubetrain.cli.ports import free_port
from tests.lab.dns import HidingFront
from tests.lab.lab import Lab
from tests.lab.pods import headless_service, pod_manifest, wait_pod
from tests.lab.procs import wait_for
from tests.lab.rest import JSON

NAME = "job-0.job.ns.svc.cluster.local"


class FixedAnswers(BaseResolver):  # type: ignore[misc]
    """The upstream for the front's unit tests: one address for every cluster.local name, NXDOMAIN otherwise."""

    def resolve(self, request: DNSRecord, _handler: object) -> DNSRecord:
        reply = request.reply()
        if str(request.q.qname).rstrip(".").endswith("cluster.local"):
            reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A("10.0.0.7"), ttl=5))
        else:
            reply.header.rcode = RCODE.NXDOMAIN
        return reply


@pytest.fixture
def upstream() -> Iterator[tuple[str, int]]:
    port = free_port()
    servers = [DNSServer(FixedAnswers(), address="127.0.0.1", port=port, tcp=tcp) for tcp in (False, True)]
    for server in servers:
        server.start_thread()
    yield "127.0.0.1", port
    for server in servers:
        server.stop()
        server.server.server_close()


def _ask(front: HidingFront, name: str, client: str, protocol: str = "udp") -> DNSRecord:
    handler = SimpleNamespace(client_address=(client, 40000), protocol=protocol)
    return front.resolve(DNSRecord.question(name), handler)


def _addresses(reply: DNSRecord) -> list[str]:
    return [str(rr.rdata) for rr in reply.rr if rr.rtype == QTYPE.A]


def test_a_hidden_name_is_nxdomain_for_its_first_seconds_then_forwarded(
        upstream: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("tests.lab.dns.time.monotonic", lambda: clock[0])
    front = HidingFront(upstream)
    hidden = front.hide(NAME, seconds=5)
    clock[0] = 250.0  # the window starts at the first query, not when the name was hidden
    assert _ask(front, NAME.upper() + ".", "10.0.0.7").header.rcode == RCODE.NXDOMAIN
    clock[0] = 254.9
    assert _ask(front, NAME, "10.0.0.8", "tcp").header.rcode == RCODE.NXDOMAIN
    assert _addresses(_ask(front, "job.ns.svc.cluster.local", "10.0.0.8")) == ["10.0.0.7"], "others forwarded"
    clock[0] = 255.0
    assert _addresses(_ask(front, NAME, "10.0.0.7")) == ["10.0.0.7"]
    assert _addresses(_ask(front, NAME, "10.0.0.7", "tcp")) == ["10.0.0.7"]
    assert hidden.refused_clients == ["10.0.0.7", "10.0.0.8"]


def test_the_upstreams_answer_is_passed_on_and_its_absence_is_servfail(
        upstream: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tests.lab.dns.UPSTREAM_TIMEOUT_S", 0.5)
    assert _ask(HidingFront(upstream), "example.com", "10.0.0.7").header.rcode == RCODE.NXDOMAIN
    nobody = HidingFront(("127.0.0.1", free_port()))
    assert _ask(nobody, NAME, "10.0.0.7").header.rcode == RCODE.SERVFAIL


# -- CoreDNS in the lab ----------------------------------------------------------------------------------------

def _lookup(lab: Lab, name: str) -> tuple[int, list[str]]:
    """Ask the lab's DNS on the bridge address, where pods ask: (rcode, addresses)."""
    assert lab.network is not None
    reply = DNSRecord.parse(DNSRecord.question(name).send(lab.network.gateway, 53, timeout=5))
    return reply.header.rcode, sorted(_addresses(reply))


def _serve_pod(lab: Lab, namespace: str, service: str) -> str:
    """A headless Service that publishes not-ready addresses and one pod behind it, as the operator makes
    them; returns the pod's IP."""
    lab.api.post(f"/api/v1/namespaces/{namespace}/services", headless_service(service, {"app": service}, {"p": 80}))
    pod: JSON = pod_manifest(f"{service}-0", ["python"], ["-c", "import time; time.sleep(600)"],
                             labels={"app": service}, hostname=f"{service}-0", subdomain=service)
    lab.api.post(f"/api/v1/namespaces/{namespace}/pods", pod)
    return str(wait_pod(lab.api, namespace, f"{service}-0", ("Running",))["status"]["podIP"])


def _api_down(lab: Lab) -> bool:
    try:
        lab.api.get("/version")
    except OSError:  # requests' ConnectionError is an OSError
        return True
    return False


@pytest.mark.lab
def test_names_resolve_through_an_api_server_restart_and_new_ones_after_it(lab: Lab, namespace: str) -> None:
    before_ip = _serve_pod(lab, namespace, "before")
    hostname = f"before-0.before.{namespace}.svc.cluster.local"
    wait_for(lambda: _lookup(lab, hostname) == (RCODE.NOERROR, [before_ip]), 60,
             f"{hostname} in CoreDNS", interval=0.2)
    apiserver = lab.cp.processes["kube-apiserver"]
    apiserver.stop(grace=2)
    try:
        assert _api_down(lab)
        # Names never asked before: the stand-in answered SERVFAIL for those during an outage.
        assert _lookup(lab, f"before.{namespace}.svc.cluster.local") == (RCODE.NOERROR, [before_ip])
        assert _lookup(lab, "kubernetes.default.svc.cluster.local") == (RCODE.NOERROR, ["10.0.0.1"])
        assert _lookup(lab, hostname) == (RCODE.NOERROR, [before_ip])
        pod_name = before_ip.replace(".", "-") + f".{namespace}.pod.cluster.local"
        assert _lookup(lab, pod_name) == (RCODE.NOERROR, [before_ip])
        assert _lookup(lab, f"nothing.{namespace}.svc.cluster.local")[0] == RCODE.NXDOMAIN
        assert _lookup(lab, "example.com")[0] == RCODE.NXDOMAIN, "nothing is forwarded out of the lab"
    finally:
        lab.cp.start_apiserver()
    lab.wait_nodes_ready()

    after_ip = _serve_pod(lab, namespace, "after")
    started = time.monotonic()
    name = f"after-0.after.{namespace}.svc.cluster.local"
    # CoreDNS's watches reconnect with client-go's backoff (up to 30 s after a long outage).
    wait_for(lambda: _lookup(lab, name) == (RCODE.NOERROR, [after_ip]), 90, f"{name} after the restart",
             interval=0.5)
    print(f"{name} resolved {time.monotonic() - started:.1f} s after its pod ran")
    assert _lookup(lab, hostname) == (RCODE.NOERROR, [before_ip])
