"""Simulated nodes: kwok's controller in the lab (docs/lab.md, "Simulated nodes").

kwok (``sigs.k8s.io/kwok``, built from its Go module like the lab's other binaries) keeps Node objects alive
(their leases renewed) and plays their pods through *stages*: a bound pod goes Running at once with an IP, a
deleted one is removed, with no process behind either. The lab creates the Nodes (``kwok-node-NNNNN``, with
``nvidia.com/gpu`` capacity and rack/block labels) and writes the stages below; kwok manages only Nodes with
the annotation ``kwok.x-k8s.io/node: fake``, so the process nodes and the real node stay the lab's own.

A test ends a simulated pod's container by annotating the pod with ``kubetrain.dev/kwok-exit-code``: ``0``
succeeds, anything else fails with that exit code (what a kubelet reports for a container that exited).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.lab.build import ensure_binary
from tests.lab.kubelet import node_schedulable
from tests.lab.procs import ManagedProcess, wait_for
from tests.lab.rest import JSON, ApiError, Rest

MANAGED_ANNOTATION = "kwok.x-k8s.io/node"
MANAGED_VALUE = "fake"
KWOK_LABEL = "kubetrain.dev/kwok"
RACK_LABEL = "kubetrain.dev/rack"
BLOCK_LABEL = "kubetrain.dev/block"
EXIT_CODE_ANNOTATION = "kubetrain.dev/kwok-exit-code"
# Pod IPs come from a range no lab network uses (the shared address space of RFC 6598); nothing routes to them.
POD_CIDR = "100.64.0.0/10"
NODE_IP = "100.127.255.254"
# Parallel stage players: kwok's default of 4 leaves a 4,096-pod gang waiting on kwok, not on the control plane.
PLAY_PARALLELISM = 16
CREATE_THREADS = 16
# Each simulated node renews its lease every quarter of this (as a kubelet does); thousands of nodes at the
# kubelet's 40 s would spend the 2-core machine on lease writes (4,096 nodes: 410/s, here 100/s). A lab with
# simulated nodes gives the node monitor a grace period to match (kube-controller-manager's default is 50 s
# for 40 s leases); its fault tests, which need a node turning NotReady within seconds, use labs without kwok.
LEASE_DURATION_S = 160
NODE_MONITOR_GRACE_S = 200
# Thousands of nodes need the controller manager and the scheduler above their default client rate limits (20
# and 50 requests/s: the node lifecycle controller lifts new nodes' not-ready taints at under 5 nodes/s), as
# large clusters and kwok's own clusters raise them; kwok itself has no client limit.
CLIENT_QPS = 1000
READY_TIMEOUT_S = 60
# The slowest rate at which the 2-core machine makes simulated nodes Ready, for the wait's limit.
NODES_READY_PER_S = 20


@dataclass(frozen=True)
class SimulatedNodes:
    """The shape of the simulated part of the cluster."""

    count: int
    gpus_per_node: int = 8
    cpus_per_node: int = 96
    memory: str = "1Ti"
    nodes_per_rack: int = 16
    racks_per_block: int = 8

    def name(self, index: int) -> str:
        return f"kwok-node-{index:05d}"

    def node(self, index: int) -> JSON:
        """The Node object of one simulated node, its capacity in its status (kwok keeps what it finds there)."""
        rack = index // self.nodes_per_rack
        capacity = {"cpu": str(self.cpus_per_node), "memory": self.memory, "pods": "110",
                    "nvidia.com/gpu": str(self.gpus_per_node)}
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": self.name(index),
                "annotations": {MANAGED_ANNOTATION: MANAGED_VALUE, "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": self.name(index), "kubernetes.io/os": "linux",
                           "kubernetes.io/arch": "amd64", KWOK_LABEL: "true", "type": "kwok",
                           RACK_LABEL: f"rack-{rack:04d}", BLOCK_LABEL: f"block-{rack // self.racks_per_block:03d}"},
            },
            "status": {"capacity": capacity, "allocatable": capacity},
        }


def stages() -> list[JSON]:
    """kwok's Stage documents for the lab: nodes become Ready; pods go Running, end on request, and go away."""
    return [_node_ready_stage(), _pod_running_stage(), _pod_exit_stage(), _pod_delete_stage()]


def _stage(name: str, kind: str, match: list[JSON], nxt: JSON) -> JSON:
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name},
            "spec": {"resourceRef": {"apiGroup": "v1", "kind": kind},
                     "selector": {"matchExpressions": match}, "next": nxt}}


def _not_deleted() -> JSON:
    return {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}


def _node_ready_stage() -> JSON:
    template = """\
{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
  message: {{ .message | Quote }}
  reason: {{ .reason | Quote }}
  status: {{ .status | Quote }}
  type: {{ .type | Quote }}
{{ end }}
addresses:
- address: {{ NodeIP | Quote }}
  type: InternalIP
- address: {{ NodeName | Quote }}
  type: Hostname
allocatable:
{{ YAML .status.allocatable 1 }}
capacity:
{{ YAML .status.capacity 1 }}
nodeInfo:
  architecture: amd64
  operatingSystem: linux
  kubeletVersion: {{ printf "kwok-%s" Version | Quote }}
phase: Running
"""
    ready = '.status.conditions.[] | select( .type == "Ready" ) | .status'
    return _stage("lab-node-ready", "Node", [{"key": ready, "operator": "NotIn", "values": ["True"]}],
                  {"statusTemplate": template})


def _pod_running_stage() -> JSON:
    template = """\
{{ $now := Now }}
conditions:
{{ range list "PodScheduled" "Initialized" "ContainersReady" "Ready" }}
- lastTransitionTime: {{ $now | Quote }}
  status: "True"
  type: {{ . }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
{{ with PodIPWith .spec.nodeName false .metadata.uid .metadata.name .metadata.namespace }}
podIP: {{ . | Quote }}
podIPs:
- ip: {{ . | Quote }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""
    return _stage("lab-pod-running", "Pod", [
        _not_deleted(), {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
    ], {"statusTemplate": template})


def _pod_exit_stage() -> JSON:
    template = """\
{{ $now := Now }}
{{ $code := index .metadata.annotations "EXIT_CODE_ANNOTATION" }}
containerStatuses:
{{ range .spec.containers }}
- image: {{ .image | Quote }}
  name: {{ .name | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: {{ $code }}
      reason: {{ if eq $code "0" }}Completed{{ else }}Error{{ end }}
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: {{ if eq $code "0" }}Succeeded{{ else }}Failed{{ end }}
""".replace("EXIT_CODE_ANNOTATION", EXIT_CODE_ANNOTATION)
    return _stage("lab-pod-exit", "Pod", [
        _not_deleted(), {"key": ".status.phase", "operator": "In", "values": ["Running"]},
        {"key": f'.metadata.annotations["{EXIT_CODE_ANNOTATION}"]', "operator": "Exists"},
    ], {"statusTemplate": template})


def _pod_delete_stage() -> JSON:
    return _stage("lab-pod-delete", "Pod", [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
                  {"delete": True})


def configuration() -> JSON:
    return {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
            "options": {"podPlayStageParallelism": PLAY_PARALLELISM, "nodePlayStageParallelism": PLAY_PARALLELISM,
                        "nodeLeaseParallelism": PLAY_PARALLELISM,
                        "nodeLeaseDurationSeconds": LEASE_DURATION_S}}


class Kwok:
    """kwok's controller as a process of a lab, and the simulated Nodes it keeps."""

    def __init__(self, run_dir: Path, rest: Rest, kubeconfig: Path, shape: SimulatedNodes) -> None:
        self.dir = run_dir / "kwok"
        self.rest = rest
        self.kubeconfig = kubeconfig
        self.shape = shape
        self.log_path = run_dir / "logs" / "kwok.log"
        self.process: ManagedProcess | None = None

    @property
    def processes(self) -> dict[str, ManagedProcess]:
        return {"kwok": self.process} if self.process else {}

    @property
    def node_names(self) -> list[str]:
        return [self.shape.name(i) for i in range(self.shape.count)]

    def start(self) -> None:
        binary = ensure_binary("kwok")
        self.dir.mkdir(parents=True, exist_ok=True)
        config = self.dir / "kwok.yaml"
        config.write_text(yaml.safe_dump_all([configuration(), *stages()], sort_keys=False))
        argv = [str(binary), f"--kubeconfig={self.kubeconfig}", f"--config={config}",
                f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}={MANAGED_VALUE}",
                f"--cidr={POD_CIDR}", f"--node-ip={NODE_IP}"]
        # kwok keeps its work files under $HOME/.kwok: one per lab, never shared.
        self.process = ManagedProcess("kwok", argv, self.log_path, env={**os.environ, "HOME": str(self.dir)})
        self.process.start()
        self._create_nodes()
        wait_for(self._all_ready, READY_TIMEOUT_S + self.shape.count / NODES_READY_PER_S,
                 f"{self.shape.count} simulated nodes Ready", interval=1.0)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=5)

    def _create_nodes(self) -> None:
        def create(index: int) -> None:
            try:
                self.rest.post("/api/v1/nodes", self.shape.node(index))
            except ApiError as error:
                if error.status != 409:
                    raise
        with ThreadPoolExecutor(CREATE_THREADS) as pool:
            list(pool.map(create, range(self.shape.count)))

    def _all_ready(self) -> bool:
        assert self.process is not None
        self.process.check_alive()
        return ready_count(self.rest) >= self.shape.count


def ready_count(rest: Rest) -> int:
    """How many simulated nodes are Ready and untainted (listed in pages, as at scale one must)."""
    count, token = 0, ""
    while True:
        page = rest.get("/api/v1/nodes", labelSelector=f"{KWOK_LABEL}=true", limit=500,
                        **({"continue": token} if token else {}))
        count += sum(1 for node in page["items"] if node_schedulable(node))
        token = page["metadata"].get("continue", "")
        if not token:
            return count

