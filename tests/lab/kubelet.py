"""The process kubelet: registers the lab's nodes, keeps their Leases fresh, runs their pods as processes."""

from __future__ import annotations

import datetime
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.lab.images import ImageMap
from tests.lab.network import PodNetwork
from tests.lab.podworker import PodWorker, now, pod_processes, signal_pod
from tests.lab.rest import JSON, ApiError, Rest
from tests.lab.runpaths import emptydir_root

log = logging.getLogger(__name__)
LEASE_RENEW_S = 2.0
NODE_STATUS_S = 10.0
WATCH_WINDOW_S = 5  # short watches so that stop() is prompt; resumed from the last resourceVersion
LEASE_DURATION_S = 40
LEASE_NS = "kube-node-lease"


def micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class NodeInfo:
    name: str
    index: int
    ip: str
    pod_cidr: str
    allocatable: dict[str, str]
    paused: bool = False
    heartbeat_failed: bool = False
    last_status: float = 0.0
    uid: str = ""
    extra_labels: dict[str, str] = field(default_factory=dict)


UNHEALTHY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def node_schedulable(node: JSON) -> bool:
    """Ready, without the taints of a node that is not (a fresh node keeps `not-ready` until the node lifecycle
    controller lifts it)."""
    return (not any(t["key"] in UNHEALTHY_TAINTS for t in node["spec"].get("taints") or [])
            and any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or []))

class Kubelet:
    def __init__(self, rest: Callable[[], Rest], network: PodNetwork, run_dir: Path, images: ImageMap, *,
                 nodes: int, gpus_per_node: int, cpu: str = "16", memory: str = "64Gi") -> None:
        self.api = rest()  # shared by the pod workers
        self._watch_api = rest()  # long-lived watch streams get their own connections
        self._heartbeat_api = rest()
        self.network = network
        self.run_dir = run_dir
        self.images = images
        self.shm_root = emptydir_root(run_dir)
        self.nodes: dict[str, NodeInfo] = {}
        for index in range(nodes):
            name = f"lab-node-{index}"
            allocatable = {"cpu": cpu, "memory": memory, "pods": "110", "ephemeral-storage": "100Gi",
                           "nvidia.com/gpu": str(gpus_per_node)}
            self.nodes[name] = NodeInfo(name, index, network.node_ip(index), network.pod_cidr(index),
                                        allocatable)
        self.workers: dict[str, PodWorker] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._mountpoints: list[Path] = []
        self._mount_lock = threading.Lock()

    # lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        for node in self.nodes.values():
            self._register(node)
        for target, name in ((self._heartbeats, "lab-heartbeats"), (self._watch_pods, "lab-pod-watch")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, remove_mountpoints: bool = True) -> None:
        self._stop.set()
        for worker in list(self.workers.values()):
            worker.remove()
        for worker in list(self.workers.values()):
            worker.thread.join(timeout=15)
        for thread in self._threads:
            thread.join(timeout=WATCH_WINDOW_S + 20)
        for worker in list(self.workers.values()):
            signal_pod(worker.uid, signal.SIGKILL)
        if remove_mountpoints:
            self._remove_mountpoints()

    # nodes --------------------------------------------------------------------------------------
    def _node_status(self, node: NodeInfo) -> JSON:
        stamp = now()

        def condition(kind: str, status: str, reason: str, message: str) -> JSON:
            return {"type": kind, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}

        return {
            "capacity": node.allocatable, "allocatable": node.allocatable,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory",
                          "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure",
                          "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID",
                          "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady",
                          "kubelet is posting ready status (kubetrain lab)"),
            ],
            "addresses": [{"type": "InternalIP", "address": node.ip},
                          {"type": "Hostname", "address": node.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": node.name, "systemUUID": node.name, "bootID": node.name,
                "kernelVersion": "lab", "osImage": "kubetrain lab (process kubelet)",
                "containerRuntimeVersion": "lab://processes", "kubeletVersion": "v1.37.2-lab",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        }

    def _register(self, node: NodeInfo) -> None:
        body: JSON = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name, "labels": {
                "kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "lab",
                "kubetrain.dev/lab": "true", **node.extra_labels}},
            "spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]},
            "status": self._node_status(node),
        }
        created = self.api.post("/api/v1/nodes", body)
        node.uid = created["metadata"]["uid"]
        self._post_node_status(node)
        self._renew_lease(node)

    def _post_node_status(self, node: NodeInfo) -> None:
        self._heartbeat_api.merge_patch(f"/api/v1/nodes/{node.name}/status",
                                        {"status": self._node_status(node)})
        node.last_status = datetime.datetime.now().timestamp()

    def _renew_lease(self, node: NodeInfo) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases"
        try:
            self._heartbeat_api.merge_patch(f"{path}/{node.name}", {"spec": {"renewTime": micro_now(),
                                                                  "holderIdentity": node.name}})
        except ApiError as error:
            if error.status != 404:
                raise
            self._heartbeat_api.post(path, {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": node.name, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": node.uid}]},
                "spec": {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_DURATION_S,
                         "renewTime": micro_now()},
            })

    def _heartbeats(self) -> None:
        while not self._stop.wait(LEASE_RENEW_S):
            for node in list(self.nodes.values()):
                if node.paused:
                    continue
                try:
                    self._renew_lease(node)
                    # After a failed heartbeat, post Ready at once: the node may have been marked Unknown.
                    stale = datetime.datetime.now().timestamp() - node.last_status > NODE_STATUS_S
                    if stale or node.heartbeat_failed:
                        self._post_node_status(node)
                    node.heartbeat_failed = False
                except (ApiError, requests.RequestException) as error:
                    node.heartbeat_failed = True
                    log.warning("node %s: heartbeat failed: %s", node.name, error)

    def pause_node(self, name: str) -> None:
        """Fault injection: the node stops renewing its Lease and posting status, like a lost machine."""
        self.nodes[name].paused = True

    def resume_node(self, name: str) -> None:
        node = self.nodes[name]
        node.paused = False
        self._renew_lease(node)
        self._post_node_status(node)

    # pods ---------------------------------------------------------------------------------------
    def _watch_pods(self) -> None:
        while not self._stop.is_set():
            try:
                listing = self._watch_api.get("/api/v1/pods")
                seen = set()
                for pod in listing["items"]:
                    seen.add(pod["metadata"]["uid"])
                    self._dispatch(pod)
                for uid, worker in list(self.workers.items()):
                    if uid not in seen:
                        worker.remove()
                version = listing["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    for event in self._watch_api.watch("/api/v1/pods", version, WATCH_WINDOW_S):
                        obj = event["object"]
                        if event["type"] == "ERROR":
                            raise ApiError(int(obj.get("code", 500)), str(obj.get("message")), "watch pods")
                        version = obj["metadata"]["resourceVersion"]
                        if event["type"] == "DELETED":
                            gone = self.workers.get(obj["metadata"]["uid"])
                            if gone is not None:
                                gone.remove()
                        elif event["type"] in ("ADDED", "MODIFIED"):
                            self._dispatch(obj)
            except (ApiError, requests.RequestException, ValueError) as error:
                # 410 Gone or an apiserver restart: list again and carry on.
                log.info("pod watch restarts: %s", error)
                self._stop.wait(0.5)

    def _dispatch(self, pod: JSON) -> None:
        node = self.nodes.get(pod["spec"].get("nodeName", ""))
        if node is None or self._stop.is_set():
            return
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if worker is None:
            worker = PodWorker(self, pod, node)
            self.workers[uid] = worker
            worker.start()
        else:
            worker.update(pod)

    def make_mountpoint(self, target: str, *, is_file: bool = False) -> None:
        """Create a missing mountPath on the host (recorded, removed at stop if still empty).

        ``is_file``: the target is a file to bind a file onto (the termination message path).
        """
        path = Path(target)
        with self._mount_lock:
            missing = []
            while not path.exists():
                missing.append(path)
                path = path.parent
            for item in reversed(missing):
                if is_file and item == Path(target):
                    item.touch()
                else:
                    item.mkdir(exist_ok=True)
                self._mountpoints.append(item)

    def _remove_mountpoints(self) -> None:
        for path in reversed(self._mountpoints):
            try:
                if path.is_dir():
                    path.rmdir()
                elif path.stat().st_size == 0:
                    path.unlink()
            except OSError as error:
                log.warning("lab mountpoint %s not removed: %s", path, error)

    # lookups and faults -------------------------------------------------------------------------
    def worker(self, namespace: str, name: str) -> PodWorker:
        for worker in list(self.workers.values()):
            if (worker.namespace, worker.name) == (namespace, name) and not worker.finished.is_set():
                return worker
        matches = [w for w in list(self.workers.values()) if (w.namespace, w.name) == (namespace, name)]
        if not matches:
            raise KeyError(f"pod {namespace}/{name} is not on a lab node (yet)")
        return matches[-1]

    def processes(self, namespace: str, name: str) -> list[int]:
        return [p.pid for p in pod_processes(self.worker(namespace, name).uid)]
