"""Kubeflow's training operator side by side with kubetrain, on the same lab in the same run.

The peer is Kubeflow's training operator v1.9.4, built from its Go module as the lab builds its own binaries
(tests/lab/build.py, cached under ~/.cache/kubetrain-lab) and run as a process against the lab's control plane
with only the PyTorchJob scheme, its client rate limit raised (its best settings, not its defaults), its
webhook configuration absent (the cert rotator still needs its Secret) and every port a free one.

Both operators get the same work in interleaved rounds: a job of N pods (a PyTorchJob of a Master and N-1
Workers against a TrainingJob of ``nodes: N``), a burst of two-pod jobs, suspended jobs by the hundred. Their
pods are equally cheap: one tiny image whose ``sleep`` is what both run (kubetrain's pods start ``torchrun``,
which in that image drops its own flags and execs the job's command, so ``spec.command`` runs as it is).
Every figure is a ratio kubetrain / Kubeflow.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.cluster import Cluster, cluster
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median

__all__ = ["BENCHMARKS", "PeerOperator", "count_status_writes", "kubeflow_side", "kubetrain_side", "pytorchjob",
           "trainingjob_spec"]

Json = Any
MIB = 1024 * 1024
TINY_IMAGE = "bench.kubetrain.io/tiny:1"
COMMAND = ("sleep", "3600")
CPU, MEMORY = "10m", "32Mi"
PEER_NAMESPACE = "kubeflow-bench"  # the peer's own namespace: its webhook cert Secret lives there
PEER_SECRET = "training-operator-webhook-cert"
PEER_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")  # fixed in the peer's code (pkg/cert)
PEER_QPS = 200
PEER_THREADS = 4
KUBEFLOW = "/apis/kubeflow.org/v1"
KUBETRAIN = "/apis/kubetrain.io/v1alpha1"
PEER_CRD = "pytorchjobs.kubeflow.org"
BURST_JOBS = 50


# what both operators are given ------------------------------------------------------------------------
def trainingjob_spec(nodes: int, *, suspend: bool = False) -> Json:
    return {
        "image": TINY_IMAGE, "command": list(COMMAND), "nodes": nodes, "procsPerNode": 1,
        "resources": {"cpu": CPU, "memory": MEMORY, "sharedMemory": "1Mi"},
        "runPolicy": {"terminationGracePeriodSeconds": 5, "suspend": suspend},
    }


def pytorchjob(name: str, nodes: int, *, suspend: bool = False) -> Json:
    """A PyTorchJob of one Master and ``nodes - 1`` Workers running the same command in the same image."""
    def replicas(count: int) -> Json:
        container = {"name": "pytorch", "image": TINY_IMAGE, "command": list(COMMAND),
                     "resources": {"requests": {"cpu": CPU, "memory": MEMORY},
                                   "limits": {"memory": MEMORY}}}
        return {"replicas": count, "restartPolicy": "Never",
                "template": {"spec": {"terminationGracePeriodSeconds": 5, "containers": [container]}}}
    specs = {"Master": replicas(1)}
    if nodes > 1:
        specs["Worker"] = replicas(nodes - 1)
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": name},
            "spec": {"runPolicy": {"suspend": suspend}, "pytorchReplicaSpecs": specs}}


def plain_pod(name: str) -> Json:
    """What a plain client creates for the baseline: the same container, nothing else."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"bench.kubetrain.io/plain": "1"}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5, "containers": [
                {"name": "main", "image": TINY_IMAGE, "command": list(COMMAND),
                 "resources": {"requests": {"cpu": CPU, "memory": MEMORY}, "limits": {"memory": MEMORY}}}]}}


def mount_secret(data: dict[str, str], directory: Path) -> None:
    """A Secret's (base64) data as files in ``directory``, as a secret volume shows it to a container."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in sorted(data.items(), key=lambda item: item[0] == "tls.crt"):  # the file waited for, last
        (directory / key).write_bytes(base64.b64decode(value))
        (directory / key).chmod(0o600)


# the peer's process -----------------------------------------------------------------------------------
class PeerOperator:
    """Kubeflow's training operator as a child process with its log in a file."""

    def __init__(self, binary: Path, kubeconfig: Path, log_path: Path) -> None:
        from kubetrain.cli.ports import free_port

        self.binary = binary
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.ports = {"metrics": free_port(), "probe": free_port(), "webhook": free_port()}
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [str(self.binary), f"--kubeconfig={self.kubeconfig}", "--enable-scheme=pytorchjob",
                f"--kube-api-qps={PEER_QPS}", f"--kube-api-burst={PEER_QPS}",
                f"--controller-threads={PEER_THREADS}", "--leader-elect=false",
                f"--metrics-bind-address=127.0.0.1:{self.ports['metrics']}",
                f"--health-probe-bind-address=127.0.0.1:{self.ports['probe']}",
                f"--webhook-server-port={self.ports['webhook']}", "--zap-devel=false", "--zap-log-level=info"]

    def start(self, secret: Callable[[], dict[str, str]], timeout: float = 90) -> None:
        """Start it, then do what the kubelet does for its pod: mount its cert Secret (once its cert rotator
        has filled it) at the directory its webhook server reads."""
        env = os.environ | {"MY_POD_NAMESPACE": PEER_NAMESPACE}
        shutil.rmtree(PEER_CERT_DIR, ignore_errors=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(self.argv(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while not (data := secret()).get("tls.crt"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the peer's cert Secret still empty after {timeout} s; see {self.log_path}")
            time.sleep(0.2)
        mount_secret(data, PEER_CERT_DIR)
        while not self.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the peer operator not ready after {timeout} s; see {self.log_path}")
            time.sleep(0.2)

    def ready(self) -> bool:
        """Its /readyz answers once its certs are in place, and its controllers start right after."""
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"the peer operator exited with {self.process.returncode}; see {self.log_path}")
        try:
            url = f"http://127.0.0.1:{self.ports['probe']}/readyz"
            with urllib.request.urlopen(url, timeout=1) as answer:
                return bool(answer.status == 200) and "Starting workers" in self.log_path.read_text(errors="replace")
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        from tests.lab.procs import stop_group

        if self.process is not None:
            stop_group(self.process)
        shutil.rmtree(PEER_CERT_DIR, ignore_errors=True)  # its "secret volume": a CA key, not to be left behind


def start_peer(ctx: Context, lab: Cluster) -> PeerOperator:
    """Build (once) and start the peer on the run's lab, with its CRD, namespace and cert Secret."""
    found = ctx.cache.get("peer")
    if isinstance(found, PeerOperator):
        return found
    from tests.lab.build import ensure_peer_binary, peer_module_dir
    from tests.lab.chart import wait_crd_established

    started = time.monotonic()
    binary = ensure_peer_binary()
    crd = peer_module_dir() / "manifests" / "base" / "crds" / "kubeflow.org_pytorchjobs.yaml"
    ctx.log(f"peer binary {binary} ({binary.stat().st_size / MIB:.0f} MiB) ready in "
            f"{time.monotonic() - started:.0f} s")
    lab.lab.kubectl("apply", "--server-side", "-f", str(crd))
    api = lab.lab.api
    wait_crd_established(lab.lab, PEER_CRD)
    api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PEER_NAMESPACE}})
    api.post(f"/api/v1/namespaces/{PEER_NAMESPACE}/secrets", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": PEER_SECRET}})
    peer = PeerOperator(binary, lab.lab.kubeconfig, lab.run_dir / "kubeflow-training-operator.log")
    ctx.cache["peer"] = peer
    ctx.on_close(peer.stop)
    peer.start(lambda: api.get(f"/api/v1/namespaces/{PEER_NAMESPACE}/secrets/{PEER_SECRET}").get("data") or {})
    ctx.log(f"peer operator up (pid {peer.process.pid if peer.process else '?'})")
    return peer


def install_tiny_image(ctx: Context, lab: Cluster) -> None:
    """Map the tiny image in the lab's kubelet, ahead of its catch-all entry (pods resolve it at start)."""
    from tests.lab.images import exec_only_image

    lab.lab.images.put_first(TINY_IMAGE, exec_only_image(ctx.workdir / "tiny-image"))


# the two operators, as the bench drives them -----------------------------------------------------------
@dataclass
class Side:
    """One operator: how its jobs are created and deleted, how its pods are labelled, which process it is."""

    key: str
    label: str  # the pod label naming the job
    plural: str  # the job resource's path under its group and namespace
    body: Callable[[str, int, bool], Json]
    pid: Callable[[], int]

    def create(self, lab: Cluster, namespace: str, name: str, nodes: int, suspend: bool = False) -> Json:
        created: Json = lab.lab.api.post(f"{self.plural.format(ns=namespace)}", self.body(name, nodes, suspend))
        return created

    @property
    def resource(self) -> str:
        """The job resource's plural name (as the API server's metrics label it)."""
        return self.plural.rsplit("/", 1)[1]

    def delete(self, lab: Cluster, namespace: str, name: str) -> None:
        lab.lab.api.delete(f"{self.plural.format(ns=namespace)}/{name}")
        selector = f"{self.label}={name}"
        lab.delete_pods(namespace, selector)
        lab.wait_no_pods(namespace, selector)

    def process(self) -> Any:
        import psutil

        return psutil.Process(self.pid())

    def rss(self) -> int:
        return int(self.process().memory_info().rss)

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the operator process has used so far."""
        times = self.process().cpu_times()
        return float(times.user + times.system)


def sides(lab: Cluster, peer: PeerOperator) -> tuple[Side, Side]:
    return kubetrain_side(lab), kubeflow_side(peer)


def _pid_of(process: Any) -> Callable[[], int]:
    return lambda: int(process.process.pid)


def kubetrain_side(lab: Cluster) -> Side:
    """kubetrain's side alone (bench/burst.py measures it before the peer is started)."""
    def kubetrain_body(name: str, nodes: int, suspend: bool) -> Json:
        return {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
                "spec": trainingjob_spec(nodes, suspend=suspend)}

    return Side("kubetrain", "kubetrain.io/job-name", KUBETRAIN + "/namespaces/{ns}/trainingjobs",
                kubetrain_body, _pid_of(lab.operator))


def kubeflow_side(peer: PeerOperator) -> Side:
    return Side("kubeflow", "training.kubeflow.org/job-name", KUBEFLOW + "/namespaces/{ns}/pytorchjobs",
                lambda name, nodes, suspend: pytorchjob(name, nodes, suspend=suspend), _pid_of(peer))


class PodClock:
    """When ``count`` pods of ``selector`` first all exist, then all are Running: the time of the watch event
    that completed each, from a watch opened before the work starts (a poll every 25 ms both blurred
    figures of about 0.1 s and loaded the machine with lists)."""

    def __init__(self, lab: Cluster, namespace: str, selector: str, count: int) -> None:
        self.count, self.what = count, f"{count} pods {selector} Running in {namespace}"
        self.created: float | None = None
        self.running: float | None = None
        self.error: Exception | None = None
        self._done = threading.Event()
        path = f"/api/v1/namespaces/{namespace}/pods"
        version = lab.lab.api.get(path, labelSelector=selector)["metadata"]["resourceVersion"]
        watched = f"{path}?{urllib.parse.urlencode({'labelSelector': selector})}"
        threading.Thread(target=self._follow, args=(lab, watched, version), daemon=True).start()

    def _follow(self, lab: Cluster, path: str, version: str) -> None:
        phases: dict[str, str | None] = {}
        try:
            while True:  # a watch ends at its timeout: go on from the last version seen
                for event in lab.lab.api.watch(path, version):
                    pod = event["object"]
                    version = pod["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK" and self._saw(phases, event["type"], pod, time.monotonic()):
                        return
        except Exception as error:  # reported by wait()
            self.error = error
            self._done.set()

    def _saw(self, phases: dict[str, str | None], kind: str, pod: Json, now: float) -> bool:
        name = pod["metadata"]["name"]
        if kind == "DELETED" or pod["metadata"].get("deletionTimestamp"):
            phases.pop(name, None)
        else:
            phases[name] = (pod.get("status") or {}).get("phase")
        if len(phases) >= self.count and self.created is None:
            self.created = now
        if len(phases) >= self.count and all(phase == "Running" for phase in phases.values()):
            self.running = now
            self._done.set()
        return self._done.is_set()

    def wait(self, timeout: float = 180) -> tuple[float, float]:
        """Both monotonic times; raises what the watch met, or TimeoutError."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.what}: not after {timeout} s")
        if self.error is not None or self.created is None or self.running is None:
            raise RuntimeError(f"{self.what}: the watch failed: {self.error}")
        return self.created, self.running


# objects a job makes ---------------------------------------------------------------------------------
def namespaced_resources(lab: Cluster) -> list[tuple[str, str]]:
    """(list path template, kind) of every namespaced resource that can be listed, from discovery."""
    api = lab.lab.api
    groups = ["/api/v1"] + [f"/apis/{g['preferredVersion']['groupVersion']}"
                            for g in api.get("/apis")["groups"]]
    found = []
    for base in groups:
        for resource in api.get(base)["resources"]:
            if resource["namespaced"] and "/" not in resource["name"] and "list" in resource.get("verbs", []) \
                    and resource["kind"] != "Event":
                found.append((f"{base}/namespaces/{{ns}}/{resource['name']}", resource["kind"]))
    return found


def owned_objects(lab: Cluster, namespace: str, uid: str, resources: Sequence[tuple[str, str]]) -> Counter[str]:
    """Objects of the namespace with ``uid`` among their owners, by kind (events are not counted)."""
    kinds: Counter[str] = Counter()
    for path, kind in resources:
        for item in lab.lab.api.get(path.format(ns=namespace))["items"]:
            if any(ref.get("uid") == uid for ref in item["metadata"].get("ownerReferences") or []):
                kinds[kind] += 1
    return kinds


def describe_kinds(kinds: Counter[str]) -> str:
    """``2 pods, 1 service`` style, pods and services first."""
    order = sorted(kinds, key=lambda k: ({"Pod": 0, "Service": 1}.get(k, 2), k))
    return ", ".join(f"{kinds[k]} {k}" for k in order) or "none"


# the measures ----------------------------------------------------------------------------------------
@dataclass
class Timings:
    created: list[float]
    running: list[float]


def startup_rounds(ctx: Context, lab: Cluster, both: Sequence[Side], nodes: int, *, rounds: int,
                   objects: dict[str, Counter[str]]) -> dict[str, Timings]:
    """Round 0 warms up; then each round runs one job per operator, their order alternating."""
    namespaces = {side.key: lab.namespace(f"{side.key}-{nodes}") for side in both}
    timings = {side.key: Timings([], []) for side in both}
    resources = namespaced_resources(lab) if nodes == 2 else []
    try:
        for number in range(rounds + 1):
            ctx.log(f"peer: {nodes}-pod jobs, round {number}{' (warm-up)' if number == 0 else ''}")
            for side in (both if number % 2 else list(reversed(both))):
                namespace, name = namespaces[side.key], f"n{nodes}-{number}"
                clock = PodClock(lab, namespace, f"{side.label}={name}", nodes)
                t0 = time.monotonic()
                job = side.create(lab, namespace, name, nodes)
                created, running = clock.wait()
                if number > 0:
                    timings[side.key].created.append(created - t0)
                    timings[side.key].running.append(running - t0)
                if resources and number == 1:
                    time.sleep(1.0)  # anything made after the pods (a status Service, a PDB) counts too
                    objects[side.key] = owned_objects(lab, namespace, job["metadata"]["uid"], resources)
                side.delete(lab, namespace, name)
    finally:
        for namespace in namespaces.values():
            lab.delete_namespace(namespace)
    return timings


@dataclass
class Burst:
    seconds: float  # from the first create to every pod Running
    rss: int | None = None  # the operator's then
    cpu_s: float | None = None  # CPU seconds the operator used meanwhile
    status_writes: int | None = None  # of its jobs' status, as the API server counted them


def status_writes(lab: Cluster, resource: str) -> int:
    """Writes of the status of ``resource`` the API server has served so far (see count_status_writes)."""
    rest = lab.lab.api
    answer = rest.session.get(f"{rest.server}/metrics", verify=rest.verify, timeout=rest.timeout)
    answer.raise_for_status()
    return count_status_writes(answer.text, resource)


def count_status_writes(exposition: str, resource: str) -> int:
    """PATCHes and PUTs of ``resource``'s status subresource (whatever their answer) in the API server's
    ``apiserver_request_total``, from its metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    return int(sum(sample.value for family in text_string_to_metric_families(exposition)
                   if family.name == "apiserver_request" for sample in family.samples
                   if sample.name == "apiserver_request_total" and sample.labels.get("resource") == resource
                   and sample.labels.get("subresource") == "status" and sample.labels.get("verb") in ("PATCH", "PUT")))


def burst(ctx: Context, lab: Cluster, side: Side | None, jobs: int) -> Burst:
    """Create ``jobs`` two-pod jobs (or, with no side, the same number of pods by hand) at once."""
    key = side.key if side else "plain"
    namespace = lab.namespace(f"burst-{key}")
    try:
        ctx.log(f"peer: burst of {jobs} two-pod jobs, {key}")
        clock = PodClock(lab, namespace, side.label if side else "bench.kubetrain.io/plain", 2 * jobs)
        cpu0 = side.cpu_s() if side else 0.0
        writes0 = status_writes(lab, side.resource) if side else 0
        t0 = time.monotonic()
        for number in range(jobs):
            if side is None:
                for index in range(2):
                    lab.lab.api.post(f"/api/v1/namespaces/{namespace}/pods", plain_pod(f"p{number}-{index}"))
            else:
                side.create(lab, namespace, f"b{number}", 2)
        _, running = clock.wait(timeout=300)
        if side is None:
            return Burst(running - t0)
        return Burst(running - t0, side.rss(), side.cpu_s() - cpu0, status_writes(lab, side.resource) - writes0)
    finally:
        lab.delete_namespace(namespace, until_gone=True)


def many_jobs(ctx: Context, lab: Cluster, both: Sequence[Side], count: int) -> dict[str, int]:
    """RSS of each operator once it has seen ``count`` suspended jobs of its own (created alternately)."""
    namespaces = {side.key: lab.namespace(f"many-{side.key}") for side in both}
    try:
        ctx.log(f"peer: {count} suspended jobs per operator")
        for number in range(count):
            for side in both:
                side.create(lab, namespaces[side.key], f"s{number}", 2, suspend=True)
        for side in both:
            wait_all_suspended(lab, side, namespaces[side.key], count)
        time.sleep(2.0)  # let caches and queues settle
        return {side.key: side.rss() for side in both}
    finally:
        for namespace in namespaces.values():
            lab.delete_namespace(namespace)


def is_suspended(job: Json) -> bool:
    """kubetrain: phase Suspended; Kubeflow: a Suspended condition that is True."""
    status = job.get("status") or {}
    if status.get("phase") == "Suspended":
        return True
    return any(c.get("type") == "Suspended" and c.get("status") == "True" for c in status.get("conditions") or [])


def wait_all_suspended(lab: Cluster, side: Side, namespace: str, count: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        items = lab.lab.api.get(side.plural.format(ns=namespace))["items"]
        done = sum(is_suspended(job) for job in items)
        if done >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{side.key}: {done}/{count} jobs suspended after {timeout} s")
        time.sleep(1.0)


# figures ---------------------------------------------------------------------------------------------
def _time_spec(nodes: int, until: str) -> FigureSpec:
    return FigureSpec(
        f"peer.{until}_{nodes}node_ratio", "x",
        Goal("<=", 1.0, f"p50 from creating the job to all {nodes} of its pods {until.replace('_', ' ')}, "
                        f"kubetrain (TrainingJob, nodes: {nodes}) over Kubeflow's training operator (PyTorchJob, "
                        f"Master + {nodes - 1} Worker(s)), interleaved on the same lab: at least as fast"))


STARTUP = {(nodes, until): _time_spec(nodes, until) for nodes in (2, 8) for until in ("created", "running")}
BURST = FigureSpec("peer.burst_pods_per_s_ratio", "x", Goal(
    ">=", 1.0, f"pods/s from the first create of {BURST_JOBS} two-pod jobs to all their pods Running, kubetrain "
               "over Kubeflow (client raised to 200 requests/s), the median of each round's ratio (the two sides "
               "run back to back, each after the previous burst's namespace is gone); a plain client creating the "
               "same pods is the cluster's own ceiling (in the detail)"))
RSS_IDLE = FigureSpec("peer.rss_idle_ratio", "x", Goal(
    "<=", 1.0, "resident memory of the operator process before the peer's work, kubetrain over Kubeflow"))
RSS_BURST = FigureSpec("peer.rss_after_burst_ratio", "x", Goal(
    "<=", 1.0, "resident memory right after the burst, kubetrain over Kubeflow"))
RSS_MANY = FigureSpec("peer.rss_many_jobs_ratio", "x", Goal(
    "<=", 1.0, "resident memory with hundreds of suspended jobs present (Kubeflow's informer caches grow with "
               "objects), kubetrain over Kubeflow"))
OBJECTS = FigureSpec("peer.objects_per_job_ratio", "x", Goal(
    "<=", 1.0, "objects a 2-node job owns (pods, services, others; events not counted), kubetrain over "
               "Kubeflow"))
FIGURES = (*STARTUP.values(), BURST, RSS_IDLE, RSS_BURST, RSS_MANY, OBJECTS)


def _guarded(specs: Sequence[FigureSpec], measure: Callable[[], list[Figure]]) -> list[Figure]:
    """The measure's figures, or each of ``specs`` failed with the reason: one failure spoils no other."""
    try:
        return measure()
    except Exception as error:
        return [spec.failed(f"{type(error).__name__}: {error}"[:300]) for spec in specs]


def startup_figures(ctx: Context, lab: Cluster, both: Sequence[Side], nodes: int,
                    objects: dict[str, Counter[str]]) -> list[Figure]:
    rounds = 3 if ctx.quick else 9
    timings = startup_rounds(ctx, lab, both, nodes, rounds=rounds, objects=objects)
    ours, theirs = timings["kubetrain"], timings["kubeflow"]
    figures = []
    for until, mine, peer in (("created", ours.created, theirs.created), ("running", ours.running, theirs.running)):
        figures.append(STARTUP[(nodes, until)].measured(
            median(mine) / median(peer),
            f"kubetrain p50 {median(mine):.2f} s (max {max(mine):.2f}) / Kubeflow p50 {median(peer):.2f} s "
            f"(max {max(peer):.2f}); {rounds} interleaved rounds",
            kubetrain_p50_s=median(mine), kubeflow_p50_s=median(peer)))
    return figures


def burst_figures(ctx: Context, lab: Cluster, both: Sequence[Side]) -> list[Figure]:
    rounds = 1 if ctx.quick else 5  # an odd count: the median is one round's, outliers drop out
    seconds: dict[str, list[float]] = {"kubetrain": [], "kubeflow": [], "plain": []}
    cpu: dict[str, list[float]] = {"kubetrain": [], "kubeflow": []}
    writes: dict[str, list[int]] = {"kubetrain": [], "kubeflow": []}
    rss: dict[str, int] = {}
    for number in range(rounds):
        order: list[Side | None] = [*both, None] if number % 2 else [*reversed(both), None]
        for side in order:
            measured = burst(ctx, lab, side, BURST_JOBS)
            seconds[side.key if side else "plain"].append(measured.seconds)
            if (side is not None and measured.rss is not None and measured.cpu_s is not None
                    and measured.status_writes is not None):
                rss[side.key] = max(rss.get(side.key, 0), measured.rss)
                cpu[side.key].append(measured.cpu_s)
                writes[side.key].append(measured.status_writes)
    pods = 2 * BURST_JOBS
    rate = {key: pods / median(values) for key, values in seconds.items()}
    # Each round's ratio, of two bursts minutes apart at most: a slow spell of the machine weighs on both.
    pairs = list(zip(seconds["kubetrain"], seconds["kubeflow"], strict=True))
    paired = median([theirs / ours for ours, theirs in pairs])
    per_job = {key: median(counts) / BURST_JOBS for key, counts in writes.items()}
    rounds_s = "; ".join(f"{ours:.1f}/{theirs:.1f}" for ours, theirs in pairs)
    return [
        BURST.measured(paired,
                       f"kubetrain {rate['kubetrain']:.1f} pods/s ({median(seconds['kubetrain']):.1f} s) / Kubeflow "
                       f"{rate['kubeflow']:.1f} pods/s ({median(seconds['kubeflow']):.1f} s), median of the rounds' "
                       f"ratios (s: {rounds_s}); plain client {rate['plain']:.1f} pods/s "
                       f"({median(seconds['plain']):.1f} s); {pods} pods, {rounds} round(s); operator CPU "
                       f"{median(cpu['kubetrain']):.1f} s / {median(cpu['kubeflow']):.1f} s; status writes per job "
                       f"{per_job['kubetrain']:.2f} / {per_job['kubeflow']:.2f}",
                       kubetrain_pods_per_s=rate["kubetrain"], kubeflow_pods_per_s=rate["kubeflow"],
                       plain_pods_per_s=rate["plain"], kubetrain_status_writes_per_job=per_job["kubetrain"],
                       kubeflow_status_writes_per_job=per_job["kubeflow"]),
        _rss_figure(RSS_BURST, rss, "after the burst"),
    ]


def _rss_figure(spec: FigureSpec, rss: dict[str, int], when: str) -> Figure:
    ours, theirs = rss["kubetrain"] / MIB, rss["kubeflow"] / MIB
    return spec.measured(ours / theirs, f"kubetrain {ours:.0f} MiB / Kubeflow {theirs:.0f} MiB {when}",
                         kubetrain_mib=ours, kubeflow_mib=theirs)


def objects_figure(objects: dict[str, Counter[str]]) -> list[Figure]:
    if set(objects) != {"kubetrain", "kubeflow"}:
        return [OBJECTS.failed("not counted: the 2-node rounds did not get to it")]
    ours, theirs = sum(objects["kubetrain"].values()), sum(objects["kubeflow"].values())
    return [OBJECTS.measured(ours / theirs, f"kubetrain {describe_kinds(objects['kubetrain'])} / Kubeflow "
                                            f"{describe_kinds(objects['kubeflow'])}",
                             kubetrain_objects=ours, kubeflow_objects=theirs)]


def peer_bench(ctx: Context) -> list[Figure]:
    lab = cluster(ctx)
    # Both operators start fresh: in a full run kubetrain's has served the other lab benchmarks (a 512-pod job,
    # 250 jobs) by now, and its memory would carry their high-water mark into the peer's figures.
    lab.operator.stop()
    lab.operator.start()
    peer = start_peer(ctx, lab)
    install_tiny_image(ctx, lab)
    both = sides(lab, peer)
    idle = {side.key: side.rss() for side in both}
    objects: dict[str, Counter[str]] = {}
    figures = []
    for nodes in (2, 8):
        figures += _guarded([STARTUP[(nodes, "created")], STARTUP[(nodes, "running")]],
                            partial(startup_figures, ctx, lab, both, nodes, objects))
    figures += _guarded([BURST, RSS_BURST], lambda: burst_figures(ctx, lab, both))
    figures.append(_rss_figure(RSS_IDLE, idle, "idle (before the peer's work)"))
    count = 200 if ctx.quick else 1000
    figures += _guarded([RSS_MANY], lambda: [_rss_figure(RSS_MANY, many_jobs(ctx, lab, both, count),
                                                         f"with {count} suspended jobs each")])
    return figures + objects_figure(objects)


BENCHMARKS = (
    Benchmark("peer", "kubetrain against Kubeflow's training operator v1.9.4 on the same lab, interleaved",
              FIGURES, peer_bench, needs_lab=True),
)
