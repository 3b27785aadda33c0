"""Cluster DNS for the lab's pods, answered straight from the API (as CoreDNS's kubernetes plugin does).

Reading the API on every query keeps names fresh: a pod's name resolves as soon as its IP is in its status.
While the API server cannot answer (a restart), names resolve to their last answer, as CoreDNS answers from
its informer cache through an API server outage; a name never seen gets SERVFAIL.
Names outside ``cluster.local`` get NXDOMAIN at once: the lab never forwards anywhere.
A test can hide a name for its first seconds (:meth:`ClusterResolver.hide`), as a record not yet published
or a DNS server under load does on a real cluster in the first second of a pod's life.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import dataclass, field

from dnslib import QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

from tests.lab.rest import JSON, ApiError, Rest

ZONE = "cluster.local"
TTL = 1
log = logging.getLogger(__name__)


def _selects(selector: dict[str, str] | None, labels: dict[str, str] | None) -> bool:
    if not selector:
        return False
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


def _is_ready(pod: JSON) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _endpoint_pods(service: JSON, pods: list[JSON]) -> list[JSON]:
    """Pods an EndpointSlice would list: selected, with an IP, not terminal, ready unless published anyway."""
    spec = service["spec"]
    publish_not_ready = bool(spec.get("publishNotReadyAddresses"))
    return [
        pod for pod in pods
        if _selects(spec.get("selector"), pod["metadata"].get("labels"))
        and pod.get("status", {}).get("podIP")
        and pod["status"].get("phase") not in ("Succeeded", "Failed")
        and (publish_not_ready or _is_ready(pod))
    ]


@dataclass
class HiddenName:
    """A name answered NXDOMAIN for ``seconds`` from its first query; who was refused, for the test to check."""

    seconds: float
    first_query: float | None = None
    refused_clients: list[str] = field(default_factory=list)

    def refuses(self, now: float) -> bool:
        if self.first_query is None:
            self.first_query = now
        return now < self.first_query + self.seconds


class ClusterResolver(BaseResolver):  # type: ignore[misc]
    def __init__(self, api: Rest) -> None:
        self.api = api
        self._last_answers: dict[tuple[str, bool], list[str] | None] = {}
        # Clients behind kube-proxy (a real node's pods) get a Service's ClusterIP, as from CoreDNS.
        self.proxied_clients: list[ipaddress.IPv4Network] = []
        self._hidden: dict[str, HiddenName] = {}
        self._hidden_lock = threading.Lock()  # the UDP and TCP servers answer from threads of their own

    def hide(self, name: str, seconds: float) -> HiddenName:
        """Answer NXDOMAIN for the fully qualified ``name`` during ``seconds`` from its first query."""
        hidden = HiddenName(seconds)
        with self._hidden_lock:
            self._hidden[name.rstrip(".").lower()] = hidden
        return hidden

    def _refused(self, name: str, client: str | None) -> bool:
        with self._hidden_lock:
            hidden = self._hidden.get(name)
            if hidden is None or not hidden.refuses(time.monotonic()):
                return False
            hidden.refused_clients.append(client or "")
            return True

    def _proxied(self, client: str | None) -> bool:
        return client is not None and any(ipaddress.ip_address(client) in net for net in self.proxied_clients)

    def lookup(self, name: str, client: str | None = None) -> list[str] | None:
        """IPv4 addresses for a cluster name, or None when the name does not exist (or is hidden); the last
        answer while the API server is away."""
        key = (name.rstrip(".").lower(), self._proxied(client))
        if self._refused(key[0], client):
            return None
        try:
            answer = self._lookup(key[0], client)
        except Exception:
            if key not in self._last_answers:
                raise
            return self._last_answers[key]
        self._last_answers[key] = answer
        return answer

    def _lookup(self, name: str, client: str | None) -> list[str] | None:
        if not name.endswith("." + ZONE):
            return None
        labels = name[: -len(ZONE) - 1].split(".")
        if len(labels) == 3 and labels[2] == "pod":
            return [labels[0].replace("-", ".")]
        if labels[-1] != "svc" or len(labels) not in (3, 4):
            return None
        namespace, service_name = labels[-2], labels[-3]
        try:
            service = self.api.get(f"/api/v1/namespaces/{namespace}/services/{service_name}")
            pods = self.api.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        headless = service["spec"].get("clusterIP") in (None, "None")
        endpoints = _endpoint_pods(service, pods)
        if len(labels) == 4:
            if not headless:
                return None
            return [p["status"]["podIP"] for p in endpoints if p["spec"].get("hostname") == labels[0]
                    and p["spec"].get("subdomain") == service_name] or None
        if not headless and self._proxied(client):
            return [service["spec"]["clusterIP"]]
        # Process nodes have no kube-proxy, so there a ClusterIP Service resolves to its ready backends.
        return [p["status"]["podIP"] for p in endpoints]

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        qname = request.q.qname
        try:
            addresses = self.lookup(str(qname), handler.client_address[0])
        except Exception:  # a DNS server must answer; the error is logged, the client gets SERVFAIL
            log.exception("lab DNS lookup of %s failed", qname)
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        if addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype in (QTYPE.A, QTYPE.ANY):
            for address in addresses:
                reply.add_answer(RR(qname, QTYPE.A, rdata=A(address), ttl=TTL))
        # AAAA and other types of existing names: NOERROR without answers (the lab has no IPv6).
        return reply


class ClusterDns:
    """UDP and TCP DNS on the bridge address, port 53, in the root network namespace."""

    def __init__(self, api: Rest, address: str) -> None:
        resolver = self.resolver = ClusterResolver(api)
        quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", logf=lambda _s: None)
        self.address = address
        self.servers = [DNSServer(resolver, address=address, port=53, tcp=tcp, logger=quiet)
                        for tcp in (False, True)]

    def start(self) -> None:
        for server in self.servers:
            server.start_thread()

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
            server.server.server_close()


def resolv_conf(namespace: str, nameserver: str) -> str:
    search = f"{namespace}.svc.{ZONE} svc.{ZONE} {ZONE}"
    return f"search {search}\nnameserver {nameserver}\noptions ndots:5\n"
