"""The lab as one object: control plane, pod network, DNS and process kubelet, started and stopped as one."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil

from tests.lab.build import ensure_binary
from tests.lab.controlplane import ControlPlane
from tests.lab.dns import ClusterDns, HiddenName
from tests.lab.images import REPO, ImageMap
from tests.lab.kubeconfig import write_kubeconfig
from tests.lab.kubelet import Kubelet, node_schedulable
from tests.lab.kueue import Kueue
from tests.lab.kwok import CLIENT_QPS as KWOK_CLIENT_QPS
from tests.lab.kwok import NODE_MONITOR_GRACE_S as KWOK_NODE_MONITOR_GRACE_S
from tests.lab.kwok import Kwok, SimulatedNodes
from tests.lab.network import PodNetwork, remove_network
from tests.lab.podworker import RUN_MARKER
from tests.lab.procs import kill_tree, wait_for
from tests.lab.provisioner import Provisioner
from tests.lab.realnode import RealNode, RealNodeLayout, kill_containers, remove_leftovers
from tests.lab.rest import JSON, Rest
from tests.lab.runpaths import shm_dirs
from tests.lab.versions import cache_root

log = logging.getLogger(__name__)
LAB_HOME = Path(os.environ.get("KUBETRAIN_LAB_HOME", REPO / ".lab"))
STATE_FILE = "state.json"
LAB_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")


class Lab:
    """Start with :meth:`start` (or as a context manager); :meth:`stop` always leaves nothing behind."""

    def __init__(self, run_dir: Path, *, nodes: int = 2, gpus_per_node: int = 0,
                 images: ImageMap | None = None, real_node: bool = False, kueue: bool = False,
                 gang: bool = False, kwok_nodes: int = 0) -> None:
        """``real_node``: also run a real kubelet + containerd node with the project's images (docs/lab.md).
        ``kueue``: also run Kueue's controller manager, its CRDs and webhooks (docs/lab.md, "Kueue").
        ``gang``: serve scheduling.k8s.io/v1beta1 PodGroups, placed whole by kube-scheduler (docs/lab.md).
        ``kwok_nodes``: also that many simulated nodes of 8 GPUs, played by kwok (docs/lab.md, "Simulated nodes")."""
        self.run_dir = run_dir.resolve()
        self.node_count = nodes
        self.with_real_node = real_node
        self.real_node: RealNode | None = None
        self.with_kueue = kueue
        self.with_gang = gang
        self.kueue: Kueue | None = None
        self.kwok_shape = SimulatedNodes(kwok_nodes) if kwok_nodes else None
        self.kwok: Kwok | None = None
        self.gpus_per_node = gpus_per_node
        self.images = images or ImageMap()
        self.control_plane: ControlPlane | None = None
        self.network: PodNetwork | None = None
        self.dns: ClusterDns | None = None
        self.provisioner: Provisioner | None = None
        self.kubelet: Kubelet | None = None

    def __enter__(self) -> Lab:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    # start / stop -------------------------------------------------------------------------------
    def start(self) -> None:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        for name in LAB_BINARIES:
            ensure_binary(name)
        cleanup_stale()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        # The network first: the apiserver listens on the bridge's gateway, where a real node reaches it.
        self.network = PodNetwork.create()
        scale = ({"node_monitor_grace_s": KWOK_NODE_MONITOR_GRACE_S, "client_qps": KWOK_CLIENT_QPS}
                 if self.kwok_shape else {})
        cp = self.control_plane = ControlPlane(self.run_dir, host=self.network.gateway, gang=self.with_gang, **scale)
        cp.start_etcd()
        cp.start_apiserver()
        cp.start_controllers()
        self.api = self.admin_rest()
        self._write_state()
        self.dns = ClusterDns(self.admin_rest(), self.network.gateway, self.run_dir, self.ca_file)
        try:
            self.dns.start()
        finally:
            self._write_state()  # CoreDNS too, so that cleanup_stale can stop it after a crash
        # The default StorageClass and its provisioner: a bare claim binds as on kind or minikube.
        self.provisioner = Provisioner(self.admin_rest, self.run_dir)
        self.provisioner.start()
        # Deviation: one kubelet plays every node with the admin identity, not system:node:<name> certs.
        self.kubelet = Kubelet(self.admin_rest, self.network, self.run_dir, self.images,
                               nodes=self.node_count, gpus_per_node=self.gpus_per_node)
        self.kubelet.start()
        if self.with_real_node:
            self._start_real_node()
        if self.with_kueue:
            self._start_kueue()
        if self.kwok_shape:
            self._start_kwok(self.kwok_shape)
        self.wait_nodes_ready(180)
        self.wait_service_account("default")

    def _start_real_node(self) -> None:
        from tests.lab.oci import ensure_images  # podman builds: only labs with a real node need them

        assert self.network is not None
        self.real_node = RealNode(self.run_dir, self.network, self.cp.pki, self.server,
                                  index=self.node_count, images=list(ensure_images().values()))
        try:
            self.real_node.start()
        finally:
            self._write_state()  # its processes too, so that cleanup_stale can stop them after a crash

    def _start_kueue(self) -> None:
        self.kueue = Kueue(self.run_dir, self.cp.pki, self.admin_rest(), self.cp.host)
        try:
            self.kueue.start()
        finally:
            self._write_state()  # its process too, so that cleanup_stale can stop it after a crash

    def _start_kwok(self, shape: SimulatedNodes) -> None:
        self.kwok = Kwok(self.run_dir, self.admin_rest(), self.kubeconfig, shape)
        try:
            self.kwok.start()
        finally:
            self._write_state()  # its process too, so that cleanup_stale can stop it after a crash

    def admin_rest(self) -> Rest:
        """A fresh JSON client with the admin identity (one per thread that holds long watches)."""
        pki = self.cp.pki
        return Rest(self.cp.server, pki.ca.cert, pki.directory / "admin.crt", pki.directory / "admin.key")

    def _write_state(self) -> None:
        cp = self.control_plane
        assert cp is not None and self.network is not None
        processes = {**cp.processes, **(self.real_node.processes if self.real_node else {}),
                     **(self.kueue.processes if self.kueue else {}), **(self.dns.processes if self.dns else {}),
                     **(self.kwok.processes if self.kwok else {})}
        state = {"pid": os.getpid(), "network": self.network.index, "real_node": self.with_real_node,
                 "processes": {name: p.pid for name, p in processes.items()}}
        (self.run_dir / STATE_FILE).write_text(json.dumps(state))

    def stop(self) -> None:
        """Reverse order; every step runs even when an earlier one fails."""
        steps: list[tuple[str, Callable[[], None]]] = [
            # Another live lab's pods may use a mountpoint we created (rmdir would detach their mounts).
            ("real node", lambda: self.real_node.stop() if self.real_node else None),
            ("kubelet", lambda: self.kubelet.stop(not _other_labs_alive(self.run_dir)) if self.kubelet else None),
            ("provisioner", lambda: self.provisioner.stop() if self.provisioner else None),
            ("dns", lambda: self.dns.stop() if self.dns else None),
            ("kueue", lambda: self.kueue.stop() if self.kueue else None),
            ("kwok", lambda: self.kwok.stop() if self.kwok else None),
            ("control plane", lambda: self.control_plane.stop() if self.control_plane else None),
            ("network", lambda: self.network.down() if self.network else None),
        ]
        errors = []
        for name, step in steps:
            try:
                step()
            except Exception as error:  # keep tearing down; report everything at the end
                log.exception("lab: stopping %s failed", name)
                errors.append(f"{name}: {error}")
        for shm in shm_dirs(self.run_dir):
            shutil.rmtree(shm, ignore_errors=True)
        (self.run_dir / STATE_FILE).unlink(missing_ok=True)
        if errors:
            raise RuntimeError("lab teardown was incomplete: " + "; ".join(errors))

    # readiness ----------------------------------------------------------------------------------
    def _nodes_schedulable(self) -> bool:
        nodes = self.api.get("/api/v1/nodes", labelSelector="kubetrain.dev/lab=true")["items"]
        expected = self.node_count + (1 if self.with_real_node else 0)
        return len(nodes) == expected and all(node_schedulable(n) for n in nodes)

    def wait_service_account(self, namespace: str, name: str = "default", timeout: float = 120) -> None:
        wait_for(lambda: self.api.exists(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"), timeout,
                 f"serviceaccount {namespace}/{name}", interval=0.2)

    # handles for tests and tools ----------------------------------------------------------------
    @property
    def cp(self) -> ControlPlane:
        if self.control_plane is None:
            raise RuntimeError("the lab is not started")
        return self.control_plane

    @property
    def kubeconfig(self) -> Path:
        return self.cp.identities.admin

    @property
    def server(self) -> str:
        return self.cp.server

    @property
    def ca_file(self) -> Path:
        return self.cp.pki.ca.cert

    @property
    def node_names(self) -> list[str]:
        return list(self._kubelet.nodes)

    @property
    def kwok_node_names(self) -> list[str]:
        return self.kwok.node_names if self.kwok else []

    @property
    def _kubelet(self) -> Kubelet:
        if self.kubelet is None:
            raise RuntimeError("the lab is not started")
        return self.kubelet

    def kubectl(self, *args: str, kubeconfig: Path | None = None, check: bool = True,
                stdin: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the lab's kubectl (admin unless another kubeconfig is given); raises on failure if check."""
        argv = [str(ensure_binary("kubectl")), f"--kubeconfig={kubeconfig or self.kubeconfig}", *args]
        result = subprocess.run(argv, capture_output=True, text=True, input=stdin, timeout=timeout,
                                check=False)
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def token_kubeconfig(self, namespace: str, service_account: str, *, duration_s: int = 3600,
                         path: Path | None = None) -> Path:
        """A kubeconfig that authenticates as a ServiceAccount with a TokenRequest token."""
        answer = self.api.post(
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": duration_s}})
        target = path or self.run_dir / f"sa-{namespace}-{service_account}.kubeconfig"
        return write_kubeconfig(target, self.server, self.ca_file, user=f"{namespace}-{service_account}",
                                token=answer["status"]["token"], namespace=namespace)

    def create_volume(self, namespace: str, claim: str, size: str = "1Gi",
                      access_modes: tuple[str, ...] = ("ReadWriteMany",), timeout: float = 120) -> Path:
        """A hostPath PersistentVolume pre-bound to a new claim; returns the host directory behind it."""
        host_dir = self.run_dir / "volumes" / f"{namespace}-{claim}"
        host_dir.mkdir(parents=True, exist_ok=True)
        pv_name = f"lab-{namespace}-{claim}"[:253]
        self.api.post("/api/v1/persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pv_name, "labels": {"kubetrain.dev/lab-namespace": namespace}},
            "spec": {"capacity": {"storage": size}, "accessModes": list(access_modes),
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "",
                     "hostPath": {"path": str(host_dir), "type": "DirectoryOrCreate"},
                     "claimRef": {"namespace": namespace, "name": claim}},
        })
        self.api.post(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims", {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": claim},
            "spec": {"accessModes": list(access_modes), "storageClassName": "", "volumeName": pv_name,
                     "resources": {"requests": {"storage": size}}},
        })

        def bound() -> bool:
            pvc = self.api.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{claim}")
            return bool(pvc.get("status", {}).get("phase") == "Bound")
        wait_for(bound, timeout, f"claim {namespace}/{claim} to bind", interval=0.25)
        return host_dir

    def pod_log(self, namespace: str, name: str, container: str = "trainer") -> Path:
        """The file with the container's stdout and stderr (``kubectl logs`` is not served by the lab)."""
        return self._kubelet.worker(namespace, name).log_path(container)

    def wait_pods_stopped(self, namespace: str, timeout: float = 30) -> None:
        """Wait until the kubelet has stopped every pod of the namespace (processes and sandbox gone)."""
        workers = [w for w in list(self._kubelet.workers.values()) if w.namespace == namespace]
        wait_for(lambda: all(w.finished.is_set() for w in workers), timeout,
                 f"the pods of {namespace} to stop", interval=0.1)

    def pod_processes(self, namespace: str, name: str) -> list[int]:
        return self._kubelet.processes(namespace, name)

    # fault injection ----------------------------------------------------------------------------
    def kill_pod(self, namespace: str, name: str, signum: int = signal.SIGKILL) -> None:
        """Send a signal to the pod's container process groups (exit code then reads 128+signum)."""
        self._kubelet.worker(namespace, name).inject_signal(signum)

    def oom_kill_pod(self, namespace: str, name: str) -> None:
        """Kill the pod's containers as the OOM killer would: exit 137, reason OOMKilled."""
        self._kubelet.worker(namespace, name).inject_signal(signal.SIGKILL, oom=True)

    def hide_dns_name(self, name: str, seconds: float) -> HiddenName:
        """The cluster DNS answers NXDOMAIN for the fully qualified ``name`` during ``seconds`` from its first
        query (a record not yet published); the result lists the clients refused."""
        assert self.dns is not None, "the lab is not started"
        return self.dns.hide(name, seconds)

    def stop_node_heartbeats(self, node: str) -> None:
        self._kubelet.pause_node(node)

    def resume_node_heartbeats(self, node: str, wait_ready: bool = True) -> None:
        self._kubelet.resume_node(node)
        if wait_ready:
            self.wait_nodes_ready()

    def restart_apiserver(self, wait_nodes_ready: bool = True) -> None:
        """Stop and start kube-apiserver; by default return once every node is Ready and untainted again."""
        self.cp.restart_apiserver()
        if wait_nodes_ready:
            self.wait_nodes_ready()

    def wait_nodes_ready(self, timeout: float = 90) -> None:
        """Every lab node Ready, without the not-ready/unreachable taints (e.g. after heartbeats resume)."""
        wait_for(self._nodes_schedulable, timeout, "lab nodes to be Ready and untainted", interval=0.25)

    def node(self, name: str) -> JSON:
        return self.api.get(f"/api/v1/nodes/{name}")


def cleanup_stale(home: Path = LAB_HOME) -> None:
    """Tear down what labs whose owning process died left behind (processes, namespaces, bridge)."""
    if not home.exists():
        return
    for state_file in home.glob(f"*/{STATE_FILE}"):
        state = json.loads(state_file.read_text())
        if _alive(int(state["pid"])):
            continue
        log.warning("lab: cleaning up after dead lab %s", state_file.parent)
        for pid in state.get("processes", {}).values():
            if _is_lab_binary(int(pid)):
                kill_tree(int(pid), grace=2)
        for proc in _processes_of_run(state_file.parent):
            kill_tree(proc.pid, grace=2)
        if state.get("real_node"):
            layout = RealNodeLayout.of(state_file.parent)
            kill_containers(layout)
            remove_leftovers(layout)
        remove_network(int(state["network"]))
        for shm in shm_dirs(state_file.parent):
            shutil.rmtree(shm, ignore_errors=True)
        state_file.unlink(missing_ok=True)


def prune_run_dirs(prefix: str, keep: int = 3, home: Path = LAB_HOME) -> None:
    """Remove the run dirs of finished labs named ``prefix*``, keeping the newest ``keep`` for their logs."""
    finished = [d for d in home.glob(f"{prefix}*") if d.is_dir() and not (d / STATE_FILE).exists()]
    for old in sorted(finished, key=lambda d: d.stat().st_mtime)[:-keep or None]:
        shutil.rmtree(old, ignore_errors=True)


def _processes_of_run(run_dir: Path) -> list[psutil.Process]:
    """Pods (by their environment marker) and helpers like Prometheus (by their arguments) of a run."""
    found = []
    for proc in psutil.process_iter():
        try:
            if (proc.environ().get(RUN_MARKER) == str(run_dir)
                    or (proc.name() == "prometheus" and any(str(run_dir) in a for a in proc.cmdline()))):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _other_labs_alive(run_dir: Path, home: Path = LAB_HOME) -> bool:
    states = [f for f in home.glob(f"*/{STATE_FILE}") if f.parent != run_dir] if home.exists() else []
    return any(_alive(int(json.loads(f.read_text())["pid"])) for f in states)


def _is_lab_binary(pid: int) -> bool:
    """Guard against pid reuse: only processes running one of the cached lab binaries are ours."""
    try:
        return Path(psutil.Process(pid).exe()).is_relative_to(cache_root())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

