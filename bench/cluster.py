"""The operator on the lab (a real control plane and process kubelet, see docs/lab.md): how fast it gets a
job's pods running, how fast it restarts a gang, and how much memory it holds, each against a baseline
measured on the same lab in the same run: bare pods, the job's own first start, a bare kopf process.

One lab serves every benchmark here: started on first use (2 nodes, the CRD applied, the operator running
as a process with the chart's identity, as the operator tests run it) and stopped when the run ends, on
errors too (:meth:`bench.registry.Context.close`).
"""

from __future__ import annotations

import compileall
import concurrent.futures
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median, percentile

__all__ = ["BENCHMARKS", "Cluster", "cluster"]

Json = Any
REPO = Path(__file__).resolve().parent.parent
CRD = REPO / "crds" / "trainingjobs.kubetrain.io.yaml"
POLL_S = 0.05
DELETE_COLLECTION_TIMEOUT_S = 120.0  # seconds for one request deleting many pods (see Cluster.delete_pods)
SLEEPER = "import time; time.sleep(600)"  # a worker that runs until it is stopped
RUN_DIR_PREFIX = "bench-"


class Cluster:
    """The lab with the CRD and the operator; :meth:`stop` leaves nothing running."""

    def __init__(self, ctx: Context, *, kueue: bool = False, gang: bool = False, kwok_nodes: int = 0,
                 real_node: bool = False) -> None:
        """``kueue``: a lab of its own with Kueue running (bench/kueue.py): Kueue's webhooks see every pod.
        ``gang``: a lab of its own serving scheduling.k8s.io/v1beta1 PodGroups (bench/gang.py).
        ``kwok_nodes``: a lab of its own with that many simulated nodes (bench/frontier.py).
        ``real_node``: a lab of its own whose one node is the real kubelet + containerd (bench/inplace.py)."""
        from tests.lab.lab import LAB_HOME

        self.ctx = ctx
        self.kueue = kueue
        self.gang = gang
        self.kwok_nodes = kwok_nodes
        self.real_node = real_node
        kind = "kueue-" if kueue else "gang-" if gang else "kwok-" if kwok_nodes else "real-" if real_node else ""
        self.run_dir = LAB_HOME / f"{RUN_DIR_PREFIX}{kind}{os.getpid()}"
        self.lab: Any = None
        self.operator: Any = None

    def start(self) -> None:
        from tests.lab.chart import install_identity, wait_crd_established
        from tests.lab.lab import LAB_HOME, Lab
        from tests.lab.operator_process import OperatorProcess

        _prune_old_run_dirs(LAB_HOME)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        extras = ((", Kueue" if self.kueue else "") + (", PodGroups" if self.gang else "")
                  + (f", {self.kwok_nodes} simulated nodes" if self.kwok_nodes else ""))
        nodes = "the real node" if self.real_node else "2 nodes"
        self.ctx.log(f"starting the lab ({nodes}{extras}) in {self.run_dir}")
        self._keep_lab_log()
        started = time.monotonic()
        lab = Lab(self.run_dir, nodes=0 if self.real_node else 2, gpus_per_node=0, kueue=self.kueue, gang=self.gang,
                  kwok_nodes=self.kwok_nodes, real_node=self.real_node)
        lab.start()  # stops what it started if it fails
        self.lab = lab
        self.lab.kubectl("apply", "--server-side", "-f", str(CRD))
        wait_crd_established(self.lab)
        _, kubeconfig = install_identity(self.lab)
        compile_operator()
        # The operator as a user runs it: its default progress interval, not the tests' 2 s.
        self.operator = OperatorProcess(kubeconfig, self.run_dir / "operator.log",
                                        ("--all-namespaces", *self._trainer_image()), progress_interval=None)
        self.operator.start()
        self.ctx.log(f"lab and operator up in {time.monotonic() - started:.0f} s")

    def _trainer_image(self) -> tuple[str, ...]:
        """The real node runs the trainer image built here (never pulled: no registry)."""
        if not self.real_node:
            return ()
        from tests.lab.oci import IMAGES

        return (f"--trainer-image={IMAGES['trainer'].removeprefix('docker.io/')}",)

    def _keep_lab_log(self) -> None:
        """The lab's own log (its kubelets: pod starts, kills, final deletes) in the run directory, for a run that
        went wrong: the bench shows only its own progress notes."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(self.run_dir / "lab.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
        lab_logger = logging.getLogger("tests.lab")
        lab_logger.setLevel(logging.INFO)
        lab_logger.addHandler(handler)

    def stop(self) -> None:
        try:
            if self.operator is not None:
                self.operator.stop()
        finally:
            if self.lab is not None:
                self.ctx.log("stopping the lab")
                self.lab.stop()

    # namespaces and objects ------------------------------------------------------------------------
    def namespace(self, prefix: str) -> str:
        name = f"bench-{prefix}-{uuid.uuid4().hex[:5]}"
        self.lab.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        self.lab.wait_service_account(name)
        return name

    def delete_namespace(self, name: str, *, until_gone: bool = False) -> None:
        """Delete it; its pods are gone on return. ``until_gone``: also wait for the namespace controller's
        sweep of everything else (jobs, Services, endpoints, events), which otherwise runs into the next
        measurement and slows whichever side comes next."""
        from tests.lab.namespaces import delete_namespace
        from tests.lab.procs import wait_for

        delete_namespace(self.lab, name)
        if until_gone:
            wait_for(lambda: not self.lab.api.exists(f"/api/v1/namespaces/{name}"), 180, f"namespace {name} to be gone",
                     interval=0.25)

    def pods(self, namespace: str, selector: str) -> list[Json]:
        pods: list[Json] = self.lab.api.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)["items"]
        return pods

    def wait_running(self, namespace: str, selector: str, count: int, timeout: float = 120,
                     accept: Callable[[Json], bool] = lambda _: True) -> float:
        """Poll until ``count`` accepted pods match ``selector``, all Running; returns time.monotonic() then."""
        deadline = time.monotonic() + timeout
        while True:
            pods = [p for p in self.pods(namespace, selector)
                    if accept(p) and not p["metadata"].get("deletionTimestamp")]
            if len(pods) == count and all(p.get("status", {}).get("phase") == "Running" for p in pods):
                return time.monotonic()
            if time.monotonic() > deadline:
                phases = {p["metadata"]["name"]: p.get("status", {}).get("phase") for p in pods}
                raise TimeoutError(f"{count} pods {selector} Running in {namespace}: not after {timeout} s; "
                                   f"saw {phases}")
            time.sleep(POLL_S)

    def wait_count(self, namespace: str, selector: str, count: int, timeout: float = 300) -> float:
        """Poll until ``count`` pods match ``selector`` (created, whatever their phase); time.monotonic() then."""
        deadline = time.monotonic() + timeout
        while (found := len(self.pods(namespace, selector))) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{found}/{count} pods {selector} in {namespace} after {timeout} s")
            time.sleep(POLL_S)
        return time.monotonic()

    def create_objects(self, namespace: str, objects: list[Json], concurrency: int = 1) -> None:
        """Post a Service and pods (as ``bare_objects`` makes them): the Service (and a PodGroup) first, then the
        pods, ``concurrency`` requests at a time."""
        from kubetrain.core import api

        service, *pods = objects
        self.lab.api.post(f"/api/v1/namespaces/{namespace}/services", service)
        for group in [p for p in pods if p["kind"] == api.PODGROUP.KIND]:
            self.lab.api.post(f"/apis/{group['apiVersion']}/namespaces/{namespace}/podgroups", group)
        self.create_pods(namespace, [p for p in pods if p["kind"] == "Pod"], concurrency)

    def create_pods(self, namespace: str, pods: list[Json], concurrency: int = 1) -> None:
        """Post the pods, ``concurrency`` requests at a time."""
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda pod: self.lab.api.post(f"/api/v1/namespaces/{namespace}/pods", pod), pods))

    def delete_pods(self, namespace: str, selector: str) -> None:
        """Delete the pods of ``selector`` at once (not waiting for the garbage collector)."""
        # The API server deletes a collection one pod at a time before it answers: 512 pods can take more than
        # the client's default 15 s on 2 busy cores, hence DELETE_COLLECTION_TIMEOUT_S.
        self.lab.api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods", params={"labelSelector": selector},
                             timeout=DELETE_COLLECTION_TIMEOUT_S)

    def wait_gone(self, namespace: str, selector: str, timeout: float = 60, poll: float = 0.2) -> float:
        """Poll until no pod matches ``selector`` in the API; time.monotonic() then."""
        deadline = time.monotonic() + timeout
        while pods := self.pods(namespace, selector):
            if time.monotonic() > deadline:
                raise TimeoutError(f"pods {selector} in {namespace} still there after {timeout} s: "
                                   + "; ".join(_pod_summary(pod) for pod in pods) + f" (lab log: {self.run_dir})")
            time.sleep(poll)
        return time.monotonic()

    def wait_no_pods(self, namespace: str, selector: str, timeout: float = 60) -> None:
        """Every pod of ``selector`` gone from the API and its processes stopped by the kubelet."""
        self.wait_gone(namespace, selector, timeout)
        self.lab.wait_pods_stopped(namespace, timeout=timeout)


def _pod_summary(pod: Json) -> str:
    """A pod's name, phase, deletion time and container states: why it is not gone."""
    meta, status = pod["metadata"], pod.get("status", {})
    states = ",".join(next(iter(c.get("state") or {"unknown": {}})) for c in status.get("containerStatuses", []))
    return (f"{meta['name']} {status.get('phase', '?')}, deletionTimestamp {meta.get('deletionTimestamp', '-')}, "
            f"containers {states or '-'}")


def cluster(ctx: Context) -> Cluster:
    """The run's one lab, started on first use; stopped by ``ctx.close()``."""
    found = ctx.cache.get("cluster")
    if found is None:
        if os.geteuid() != 0:
            raise RuntimeError("the lab needs root (network namespaces, a bridge, mounts)")
        found = Cluster(ctx)
        ctx.cache["cluster"] = found
        ctx.on_close(found.stop)
        found.start()
    assert isinstance(found, Cluster)
    return found


def compile_operator() -> None:
    """Byte-compile the operator's modules, as pip does at install (and the image has them). With
    PYTHONDONTWRITEBYTECODE set (as on this machine) a changed module would otherwise be compiled at every start
    of the operator, and the compiler's garbage would count in its memory (0.8 MB at import)."""
    compileall.compile_dir(REPO / "operator" / "kubetrain", quiet=2)


def _prune_old_run_dirs(home: Path, keep: int = 2) -> None:
    """Remove run directories of earlier benchmark labs that ended (no state file), keeping the newest few
    for their logs."""
    finished = [d for d in home.glob(f"{RUN_DIR_PREFIX}*") if d.is_dir() and not (d / "state.json").exists()]
    for old in sorted(finished, key=lambda d: d.stat().st_mtime)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def job_spec(code: str, nodes: int) -> Json:
    """The operator tests' small job: ``python -c code`` under torchrun, one process per pod."""
    return {
        "nodes": nodes,
        "procsPerNode": 1,
        "resources": {"cpu": "100m", "memory": "512Mi", "sharedMemory": "64Mi"},
        "command": ["python", "-c", code],
        "runPolicy": {"terminationGracePeriodSeconds": 5},
    }


def bare_objects(name: str, namespace: str, spec: Json, *, gang: bool = False) -> list[Json]:
    """The Service and pods the operator would create for a job ``name``, created by hand instead: the same
    command, image, resources and pod spec, with labels renamed so that the operator never sees them (and the
    operator's spread over machines selecting the renamed ones, so the scheduler weighs the same pods). ``gang``:
    the attempt's PodGroup too (after the Service), and the pods in it. The pods restart in place only on the
    real node: the process and simulated nodes declare no such feature, so the operator leaves the rule out there
    (and the scheduler would place a pod with it nowhere)."""
    from kubetrain.core.manifests import build_pod, build_pod_group, build_service
    from kubetrain.core.spec import parse

    body = {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    job = parse(body)
    group = [build_pod_group(job, 0)] if gang else []
    pods = [build_pod(job, index, 0, gang=gang, nodes_restart_in_place=False) for index in range(job.spec.nodes)]
    objects = [build_service(job), *group, *pods]
    label = {"bench.kubetrain.io/bare": name}
    for obj in objects:
        metadata = obj["metadata"]
        metadata.pop("ownerReferences", None)
        metadata["labels"] = dict(label)
    objects[0]["spec"]["selector"] = dict(label)
    for pod in pods:  # the operator's spread over machines, selecting these pods as it selects the job's
        anti = pod["spec"].get("affinity", {}).get("podAntiAffinity", {})
        for term in anti.get("preferredDuringSchedulingIgnoredDuringExecution", []):
            term["podAffinityTerm"]["labelSelector"] = {"matchLabels": dict(label)}
    return objects


TIME_TO_RUNNING = FigureSpec(
    "operator.time_to_running_ratio", "x",
    Goal("<=", 1.5, "from `create TrainingJob` to all its pods Running, against the same pods (and Service) "
                    "created directly, which is the cluster's own pod start-up; the operator's part (watch "
                    "event, reconcile, status write, creates) may add at most half of that. Kubernetes' "
                    "pod start-up SLO is p99 5 s (ANCHORS)"))


def time_to_running_bench(ctx: Context) -> list[Figure]:
    lab = cluster(ctx)
    from tests.lab.jobs import Jobs

    namespace = lab.namespace("start")
    jobs = Jobs(lab.lab, namespace)
    nodes, rounds = 2, ctx.rounds(quick=3, full=7)
    spec = job_spec(SLEEPER, nodes)
    job_s: list[float] = []
    bare_s: list[float] = []

    def job_round(name: str) -> float:
        selector = f"kubetrain.io/job-name={name}"
        t0 = time.monotonic()
        jobs.create(name, spec)
        seconds = lab.wait_running(namespace, selector, nodes) - t0
        lab.lab.api.delete(f"{jobs.base}/{name}")
        lab.delete_pods(namespace, selector)
        lab.wait_no_pods(namespace, selector)
        return seconds

    def bare_round(name: str) -> float:
        selector = f"bench.kubetrain.io/bare={name}"
        objects = bare_objects(name, namespace, spec)
        t0 = time.monotonic()
        lab.create_objects(namespace, objects)
        seconds = lab.wait_running(namespace, selector, nodes) - t0
        lab.lab.api.delete(f"/api/v1/namespaces/{namespace}/services/{name}")
        lab.delete_pods(namespace, selector)
        lab.wait_no_pods(namespace, selector)
        return seconds

    try:
        # Round 0 warms up both paths (the operator's first reconcile, the kubelet's first pod of a
        # namespace) and is not counted; then the two alternate, so that a slow spell hits both.
        for number in range(rounds + 1):
            ctx.log(f"time to running, round {number}{' (warm-up)' if number == 0 else ''}: "
                    f"TrainingJob of {nodes} pods, then bare Service + {nodes} pods")
            job_time, bare_time = job_round(f"job-{number}"), bare_round(f"bare-{number}")
            if number > 0:
                job_s.append(job_time)
                bare_s.append(bare_time)
    finally:
        lab.delete_namespace(namespace)
    ratio = median(job_s) / median(bare_s)
    return [TIME_TO_RUNNING.measured(
        ratio, f"job p50 {median(job_s):.2f} s p90 {percentile(job_s, 90):.2f} s / bare pods p50 "
               f"{median(bare_s):.2f} s p90 {percentile(bare_s, 90):.2f} s; the operator adds "
               f"{median(job_s) - median(bare_s):.2f} s; {rounds} rounds of {nodes} pods",
        job_p50_s=median(job_s), job_p90_s=percentile(job_s, 90), bare_p50_s=median(bare_s),
        bare_p90_s=percentile(bare_s, 90))]


GANG_RESTART = FigureSpec(
    "operator.gang_restart_ratio", "x",
    Goal("<=", 1.5, "from SIGKILL of one worker to every pod of the next attempt Running, against what a "
                    "restart cannot avoid, measured in the same round: deleting the same pods bare (SIGTERM, "
                    "torchrun's agent shuts down, the kubelet confirms) plus the job's first start; the "
                    "operator's part (noticing the failure, the deletes, the creates) may add half"))


def gang_restart_bench(ctx: Context) -> list[Figure]:
    lab = cluster(ctx)
    from kubetrain.core import api
    from tests.lab.jobs import Jobs

    namespace = lab.namespace("restart")
    jobs = Jobs(lab.lab, namespace)
    nodes, rounds = 2, ctx.rounds(quick=1, full=3)
    first_s: list[float] = []
    restart_s: list[float] = []
    delete_s: list[float] = []
    try:
        for number in range(rounds):
            name = f"gang-{number}"
            selector = f"{api.LABEL.JOB_NAME}={name}"
            ctx.log(f"gang restart: TrainingJob {name} ({nodes} pods), then SIGKILL {name}-1")
            t0 = time.monotonic()
            jobs.create(name, job_spec(SLEEPER, nodes))
            first_s.append(lab.wait_running(namespace, selector, nodes) - t0)
            jobs.wait_phase(name, "Running")  # the operator has seen attempt 0 running
            t_kill = time.monotonic()
            lab.lab.kill_pod(namespace, f"{name}-1", signal.SIGKILL)
            restart_s.append(lab.wait_running(
                namespace, selector, nodes,
                accept=lambda p: p["metadata"]["labels"].get(api.LABEL.ATTEMPT) == "1") - t_kill)
            lab.lab.api.delete(f"{jobs.base}/{name}")
            lab.delete_pods(namespace, selector)
            lab.wait_no_pods(namespace, selector)
            delete_s.append(_bare_deletion_seconds(lab, namespace, f"bare-{number}", nodes))
    finally:
        lab.delete_namespace(namespace)
    floors = [first + delete for first, delete in zip(first_s, delete_s, strict=True)]
    ratios = [r / f for r, f in zip(restart_s, floors, strict=True)]
    return [GANG_RESTART.measured(
        median(ratios), f"kill to attempt 1 running p50 {median(restart_s):.2f} s / (bare pods deleted p50 "
                        f"{median(delete_s):.2f} s + first start p50 {median(first_s):.2f} s); "
                        f"{median(restart_s) / median(first_s):.2f}x the first start alone; {rounds} job(s) of "
                        f"{nodes} pods", restart_p50_s=median(restart_s), first_p50_s=median(first_s),
        delete_p50_s=median(delete_s))]


def _bare_deletion_seconds(lab: Cluster, namespace: str, name: str, nodes: int) -> float:
    """Seconds from deleting the job's pods, created bare and Running, until they are gone from the API."""
    selector = f"bench.kubetrain.io/bare={name}"
    lab.create_objects(namespace, bare_objects(name, namespace, job_spec(SLEEPER, nodes)))
    lab.wait_running(namespace, selector, nodes)
    time.sleep(1)  # torchrun's agent is up and its worker started, as in the job's round
    t0 = time.monotonic()
    lab.delete_pods(namespace, selector)
    seconds = lab.wait_gone(namespace, selector, poll=POLL_S) - t0
    lab.lab.api.delete(f"/api/v1/namespaces/{namespace}/services/{name}")
    lab.wait_no_pods(namespace, selector)
    return seconds


MEMORY = FigureSpec(
    "operator.memory_ratio", "x",
    Goal("<=", 1.5, "resident memory of the operator after it ran the jobs above, against a bare process "
                    "that only imports kopf (without the optional kubernetes client, as the operator runs): "
                    "that import dominates a kopf operator's memory (ANCHORS), so kubetrain's own code, its "
                    "API calls, status and metrics may add at most half"))


def memory_bench(ctx: Context) -> list[Figure]:
    import psutil

    lab = cluster(ctx)  # run after the other lab benchmarks: the operator has handled their jobs by now
    operator_rss = psutil.Process(lab.operator.process.pid).memory_info().rss
    bare_rss = _rss_after_import("kopf")
    imports_rss = _rss_after_import("kopf, kubetrain.controller.handlers, kubetrain.controller.operator_main")
    mib = 1024 * 1024
    return [MEMORY.measured(operator_rss / bare_rss,
                            f"operator {operator_rss / mib:.0f} MiB / `import kopf` {bare_rss / mib:.0f} "
                            f"MiB RSS; importing the operator's modules alone takes {imports_rss / mib:.0f} MiB",
                            operator_mib=operator_rss / mib, bare_mib=bare_rss / mib, imports_mib=imports_rss / mib)]


def _rss_after_import(modules: str) -> int:
    """Resident bytes of a fresh Python process once it has imported ``modules``."""
    import psutil

    probe = subprocess.Popen(
        [sys.executable, "-c", f"import sys; import {modules}; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert probe.stdout is not None and probe.stdin is not None
        if probe.stdout.readline().strip() != "ready":
            raise RuntimeError(f"a process importing {modules} did not start")
        rss: int = psutil.Process(probe.pid).memory_info().rss
        probe.stdin.close()
        probe.wait(timeout=30)
        return rss
    finally:
        if probe.poll() is None:
            probe.kill()
            probe.wait()


BENCHMARKS = (
    Benchmark("operator.start", "TrainingJob to pods Running vs the same pods created directly",
              (TIME_TO_RUNNING,), time_to_running_bench, needs_lab=True),
    Benchmark("operator.restart", "SIGKILL of a worker to the next attempt Running vs the first start",
              (GANG_RESTART,), gang_restart_bench, needs_lab=True),
    Benchmark("operator.memory", "operator RSS vs a process importing kopf and kubernetes",
              (MEMORY,), memory_bench, needs_lab=True),
)
