"""Cluster DNS for the lab's pods: CoreDNS with its ``kubernetes`` plugin, as every cluster runs it.

CoreDNS (built from its Go module, tests/lab/build.py) answers ``cluster.local`` from its informer cache, so
names keep resolving through an API server outage and new ones appear once its watches resync. It runs as
its own ServiceAccount with the ClusterRole of CoreDNS's own deployment, on a free loopback port. Pods reach
it through a thin front on the bridge address, port 53, which forwards every query unchanged and exists for
fault injection only: :meth:`ClusterDns.hide` answers NXDOMAIN for a name during its first seconds, as a
record not yet published or a DNS server under load does on a real cluster, and records who was refused.
Names outside the cluster get NXDOMAIN from CoreDNS at once: nothing is routed out of the lab.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from dnslib import RCODE, DNSError, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer

from kubetrain.cli.ports import free_port
from tests.lab.build import ensure_binary
from tests.lab.kubeconfig import write_kubeconfig
from tests.lab.procs import ManagedProcess, answers_ok, wait_for
from tests.lab.rest import JSON, ApiError, Rest

ZONE = "cluster.local"
NAMESPACE = "kube-system"
ACCOUNT = "coredns"
# The lab's certificates live 30 days (tests/lab/pki.py); CoreDNS's token as long.
TOKEN_LIFETIME_S = 30 * 24 * 3600
READY_TIMEOUT_S = 120.0
# Longer than CoreDNS needs to answer from its cache; short enough that a client's own retry still helps.
UPSTREAM_TIMEOUT_S = 4.0
log = logging.getLogger(__name__)

# As coredns/deployment's kubernetes/coredns.yaml.sed installs CoreDNS's identity.
CLUSTER_ROLE: JSON = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
    "metadata": {"name": "system:coredns", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
    "rules": [
        {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
         "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ],
}
CLUSTER_ROLE_BINDING: JSON = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
    "metadata": {"name": "system:coredns", "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
    "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
}


def corefile(port: int, ready_port: int, kubeconfig: Path) -> str:
    """The deployment's Corefile for the lab: no ``forward`` (nothing outside the lab is reachable; other
    names get NXDOMAIN at once), no ``cache`` (a record appears as soon as the informer sees it, and an
    answer during an outage comes from the informer, not a response cache), no ``reload`` (never edited).
    Two server blocks because ``template`` runs before ``kubernetes`` in a block (plugin.cfg order)."""
    return (
        f"{ZONE}:{port} in-addr.arpa:{port} ip6.arpa:{port} {{\n"
        "    bind 127.0.0.1\n"
        "    errors\n"
        f"    ready 127.0.0.1:{ready_port}\n"
        f"    kubernetes {ZONE} in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {kubeconfig}\n"
        "        pods insecure\n"
        "    }\n"
        "    loadbalance\n"
        "}\n"
        f".:{port} {{\n"
        "    bind 127.0.0.1\n"
        "    errors\n"
        "    template ANY ANY {\n"
        "        rcode NXDOMAIN\n"
        "    }\n"
        "}\n"
    )


class CoreDns:
    """The CoreDNS process, as its own ServiceAccount, listening on 127.0.0.1:``port`` (UDP and TCP)."""

    def __init__(self, api: Rest, ca_file: Path, run_dir: Path) -> None:
        self.api = api
        self.ca_file = ca_file
        self.dir = run_dir / "coredns"
        self.log_path = run_dir / "logs" / "coredns.log"
        self.port, self.ready_port = free_port(), free_port()
        self.process: ManagedProcess | None = None

    def start(self) -> None:
        binary = ensure_binary("coredns")
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "Corefile"
        config.write_text(corefile(self.port, self.ready_port, self._service_account_kubeconfig()))
        self.process = ManagedProcess("coredns", [str(binary), "-conf", str(config)], self.log_path)
        self.process.start()
        # /ready answers 200 once the kubernetes plugin has synced its informers.
        wait_for(self._ready, READY_TIMEOUT_S, "CoreDNS /ready (its informers synced)", interval=0.2)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=5)

    def _service_account_kubeconfig(self) -> Path:
        """CoreDNS's own identity: its ServiceAccount and ClusterRole, a TokenRequest token."""
        _create(self.api, f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT}})
        _create(self.api, "/apis/rbac.authorization.k8s.io/v1/clusterroles", CLUSTER_ROLE)
        _create(self.api, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", CLUSTER_ROLE_BINDING)
        answer = self.api.post(
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{ACCOUNT}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": TOKEN_LIFETIME_S}})
        return write_kubeconfig(self.dir / "coredns.kubeconfig", self.api.server, self.ca_file,
                                user=f"{NAMESPACE}-{ACCOUNT}", token=answer["status"]["token"])

    def _ready(self) -> bool:
        assert self.process is not None
        self.process.check_alive()
        return answers_ok(f"http://127.0.0.1:{self.ready_port}/ready")


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


class HidingFront(BaseResolver):  # type: ignore[misc]
    """Forwards each query to the upstream (CoreDNS) over the protocol it came by, except hidden names."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._hidden: dict[str, HiddenName] = {}
        self._hidden_lock = threading.Lock()  # the UDP and TCP servers answer from threads of their own

    def hide(self, name: str, seconds: float) -> HiddenName:
        """Answer NXDOMAIN for the fully qualified ``name`` during ``seconds`` from its first query."""
        hidden = HiddenName(seconds)
        with self._hidden_lock:
            self._hidden[name.rstrip(".").lower()] = hidden
        return hidden

    def refused(self, name: str, client: str) -> bool:
        with self._hidden_lock:
            hidden = self._hidden.get(name.rstrip(".").lower())
            if hidden is None or not hidden.refuses(time.monotonic()):
                return False
            hidden.refused_clients.append(client)
            return True

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        if self.refused(str(request.q.qname), handler.client_address[0]):
            reply = request.reply()
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        try:
            answer = request.send(*self.upstream, tcp=handler.protocol == "tcp", timeout=UPSTREAM_TIMEOUT_S)
            return DNSRecord.parse(answer)
        except (OSError, DNSError) as error:  # a DNS server must answer: the client gets SERVFAIL
            log.warning("lab DNS: upstream %s:%d failed for %s: %s", *self.upstream, request.q.qname, error)
            reply = request.reply()
            reply.header.rcode = RCODE.SERVFAIL
            return reply


class ClusterDns:
    """CoreDNS, and the front that pods query: UDP and TCP on the bridge address, port 53."""

    def __init__(self, api: Rest, address: str, run_dir: Path, ca_file: Path) -> None:
        self.address = address
        self.coredns = CoreDns(api, ca_file, run_dir)
        self.front = HidingFront(("127.0.0.1", self.coredns.port))
        quiet = DNSLogger(log="-request,-reply,-truncated,-error,-recv,-send,-data", logf=lambda _s: None)
        self.servers = [DNSServer(self.front, address=address, port=53, tcp=tcp, logger=quiet)
                        for tcp in (False, True)]

    @property
    def processes(self) -> dict[str, ManagedProcess]:
        process = self.coredns.process
        return {"coredns": process} if process else {}

    def start(self) -> None:
        self.coredns.start()
        for server in self.servers:
            server.start_thread()

    def hide(self, name: str, seconds: float) -> HiddenName:
        return self.front.hide(name, seconds)

    def stop(self) -> None:
        for server in self.servers:
            if getattr(server, "thread", None) is not None:  # shutdown() waits for a serve loop forever
                server.stop()
            server.server.server_close()
        self.coredns.stop()


def _create(api: Rest, path: str, body: JSON) -> None:
    try:
        api.post(path, body)
    except ApiError as error:
        if error.status != 409:  # already there: a restarted lab's etcd is fresh, so only a retry
            raise


def resolv_conf(namespace: str, nameserver: str) -> str:
    search = f"{namespace}.svc.{ZONE} svc.{ZONE} {ZONE}"
    return f"search {search}\nnameserver {nameserver}\noptions ndots:5\n"
