"""etcd, kube-apiserver, kube-controller-manager and kube-scheduler with free ports.

etcd and the controllers stay on 127.0.0.1. The apiserver listens on the address it is given: the lab bridge's
gateway, so that a real node's pods (in their own network namespaces) reach it through the `kubernetes`
Service, whose endpoints the apiserver then keeps itself (loopback endpoints would be refused).
"""

from __future__ import annotations

import ipaddress
import shutil
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from kubetrain.cli.ports import free_port
from tests.lab.build import ensure_binary
from tests.lab.kubeconfig import write_kubeconfig
from tests.lab.pki import CertFiles, Pki
from tests.lab.procs import ManagedProcess, wait_for
from tests.lab.runpaths import etcd_data_dir

SERVICE_CIDR = "10.0.0.0/24"
# Short, so that a node whose heartbeats stop turns NotReady within ~20 s (kubelet default: 40 s).
NODE_MONITOR_GRACE_S = 16
APISERVER_READY_TIMEOUT = 180.0
# Kubernetes' own gang scheduling (`Lab(gang=True)`): the scheduling.k8s.io/v1beta1 Workload and PodGroup API
# (beta in v1.37, off by default) and its topology constraints (alpha), on every component that reads them.
GANG_FEATURE_GATES = "--feature-gates=GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
GANG_RUNTIME_CONFIG = "--runtime-config=scheduling.k8s.io/v1beta1=true"
FRONT_PROXY_CLIENT = "front-proxy-client"


@dataclass
class Identities:
    admin: Path
    controller_manager: Path
    scheduler: Path


class ControlPlane:
    def __init__(self, run_dir: Path, host: str = "127.0.0.1", *, gang: bool = False,
                 node_monitor_grace_s: int = NODE_MONITOR_GRACE_S, client_qps: int = 0) -> None:
        """``client_qps``: the controller manager's and scheduler's API rate limit (burst twice that), as large
        clusters raise it; 0 keeps their defaults (20 and 50 requests/s)."""
        self.run_dir = run_dir
        self.host = host
        self.gang_flags = [GANG_FEATURE_GATES] if gang else []
        self.node_monitor_grace_s = node_monitor_grace_s
        self.client_qps_flags = ([f"--kube-api-qps={client_qps}", f"--kube-api-burst={2 * client_qps}"]
                                 if client_qps else [])
        self.pki = Pki(run_dir / "pki")
        self.serving = self.pki.apiserver_serving(extra_ips=(host,))
        # The apiserver's identity towards kubelets (`kubectl logs`, `exec`).
        self.kubelet_client = self.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
                                             "system:masters")
        # Its identity towards aggregated API servers (Kueue's visibility API): they trust the user it names in
        # X-Remote-User from this certificate alone (--requestheader-allowed-names), so one CA serves both.
        self.front_proxy_client = self.pki.issue("front-proxy-client", FRONT_PROXY_CLIENT)
        self.sa_keys = self.pki.service_account_keys()
        self.apiserver_port = free_port()
        self.server = f"https://{host}:{self.apiserver_port}"
        self.identities = Identities(
            admin=self._component_kubeconfig("admin", "kubetrain-lab-admin", "system:masters"),
            controller_manager=self._component_kubeconfig(
                "controller-manager", "system:kube-controller-manager"),
            scheduler=self._component_kubeconfig("scheduler", "system:kube-scheduler"),
        )
        self.processes: dict[str, ManagedProcess] = {}

    def _component_kubeconfig(self, stem: str, user: str, group: str | None = None) -> Path:
        files: CertFiles = self.pki.issue(stem, user, group)
        return write_kubeconfig(self.run_dir / f"{stem}.kubeconfig", self.server, self.pki.ca.cert,
                                user=user, cert=files.cert, key=files.key)

    def _process(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.run_dir / "logs" / f"{name}.log")
        self.processes[name] = proc
        proc.start()
        return proc

    # etcd ---------------------------------------------------------------------------------------
    def start_etcd(self) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self.etcd_data = etcd_data_dir(self.run_dir)
        proc = self._process("etcd", [
            str(ensure_binary("etcd")), "--name=lab", f"--data-dir={self.etcd_data}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=lab=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync=true", "--log-level=warn",
        ])
        wait_for(lambda: self._http_ok(f"{self.etcd_url}/health", proc), 30, "etcd /health")

    # kube-apiserver -----------------------------------------------------------------------------
    def apiserver_argv(self) -> list[str]:
        pki = self.pki
        reconciler = "none" if ipaddress.ip_address(self.host).is_loopback else "lease"
        return [
            str(ensure_binary("kube-apiserver")),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={self.host}", f"--secure-port={self.apiserver_port}",
            f"--advertise-address={self.host}", f"--endpoint-reconciler-type={reconciler}",
            f"--tls-cert-file={self.serving.cert}", f"--tls-private-key-file={self.serving.key}",
            f"--client-ca-file={pki.ca.cert}",
            f"--kubelet-certificate-authority={pki.ca.cert}",
            f"--kubelet-client-certificate={self.kubelet_client.cert}",
            f"--kubelet-client-key={self.kubelet_client.key}",
            # Node names are not in DNS; the real kubelet's serving cert names its InternalIP.
            "--kubelet-preferred-address-types=InternalIP",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.sa_keys.cert}",
            f"--service-account-signing-key-file={self.sa_keys.key}",
            "--authorization-mode=Node,RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--cert-dir={self.run_dir / 'apiserver-certs'}",
            "--allow-privileged=true",
            *self._aggregation_flags(),
            "--profiling=false",
            "--v=1",
            *self.gang_flags, *([GANG_RUNTIME_CONFIG] if self.gang_flags else []),
        ]

    def _aggregation_flags(self) -> list[str]:
        """The aggregation layer, as kubeadm sets it up: requests to an APIService are proxied with the front
        proxy's certificate and the caller's identity in headers."""
        return [
            f"--requestheader-client-ca-file={self.pki.ca.cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={self.front_proxy_client.cert}",
            f"--proxy-client-key-file={self.front_proxy_client.key}",
        ]

    def start_apiserver(self) -> None:
        proc = self._process("kube-apiserver", self.apiserver_argv())
        wait_for(lambda: self._https_ok("/readyz", proc), APISERVER_READY_TIMEOUT, "kube-apiserver /readyz",
                 interval=0.25)

    def restart_apiserver(self, grace: float = 2.0) -> None:
        """Fault injection: stop the apiserver (clients see connection errors), start it again.

        The grace is short: a graceful apiserver shutdown drains watches for up to a minute, and a restart
        longer than the node monitor grace period would also make every node NotReady.
        """
        self.processes["kube-apiserver"].stop(grace)
        self.start_apiserver()

    # controllers --------------------------------------------------------------------------------
    def start_controllers(self) -> None:
        cm = str(self.identities.controller_manager)
        self._process("kube-controller-manager", [
            str(ensure_binary("kube-controller-manager")),
            f"--kubeconfig={cm}", f"--authentication-kubeconfig={cm}", f"--authorization-kubeconfig={cm}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            "--leader-elect=false", "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.sa_keys.key}",
            f"--root-ca-file={self.pki.ca.cert}",
            "--controllers=*",
            f"--node-monitor-grace-period={self.node_monitor_grace_s}s", "--node-monitor-period=2s",
            f"--cluster-signing-cert-file={self.pki.ca.cert}",
            f"--cluster-signing-key-file={self.pki.ca.key}",
            "--v=1", *self.gang_flags, *self.client_qps_flags,
        ])
        sched = str(self.identities.scheduler)
        self._process("kube-scheduler", [
            str(ensure_binary("kube-scheduler")),
            f"--kubeconfig={sched}", f"--authentication-kubeconfig={sched}",
            f"--authorization-kubeconfig={sched}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false", "--v=1",
            *self.gang_flags, *self.client_qps_flags,
        ])

    # health -------------------------------------------------------------------------------------
    @staticmethod
    def _http_ok(url: str, proc: ManagedProcess, context: ssl.SSLContext | None = None) -> bool:
        proc.check_alive()
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def _https_ok(self, path: str, proc: ManagedProcess) -> bool:
        admin = self.pki.directory
        context = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        context.load_cert_chain(str(admin / "admin.crt"), str(admin / "admin.key"))
        return self._http_ok(f"{self.server}{path}", proc, context)

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            proc = self.processes.get(name)
            if proc is not None:
                proc.stop(grace=5)
        data = getattr(self, "etcd_data", None)
        if data is not None and data.exists():
            shutil.rmtree(data, ignore_errors=True)
