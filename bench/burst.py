"""5,000 small jobs created in a burst on simulated nodes (issue 30): how fast their pods go Running against a plain
client, what the operator holds and spends with them all present against Kubeflow's training operator, and one
job's first reconcile with them present against with none.

The lab is one of its own with enough simulated nodes (kwok, tests/lab/kwok.py) for one 1-GPU pod per job, so
that no process runs behind a pod and what is measured is the operators and the control plane. Each side gets
its own namespace, deleted and gone before the next side starts; every side creates its jobs (or, for the plain
client, each job's Service and pod) with the same 16 requests at a time, and its pods are followed with one
watch of its namespace (frontier.PodWatch).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from bench.cluster import Cluster, bare_objects
from bench.frontier import CLIENT_CONNECTIONS, PodWatch, Watched, all_running, delete_pods
from bench.peer import MIB, PeerOperator, Side, kubeflow_side, kubetrain_side, start_peer, trainingjob_spec
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median, percentile
from bench.scale import FirstPhases, first_status_seconds

__all__ = ["BENCHMARKS"]

Json = Any
BURST_JOBS = 5000
QUICK_JOBS = 200
GPU = "nvidia.com/gpu"
GPUS_PER_KWOK_NODE = 8  # tests.lab.kwok.SimulatedNodes' default
NODE_SLACK = 1.1  # a tenth more GPUs than pods: the last pods do not wait for the scheduler to find the last GPUs
# With every job Running, the operators are held this long before their memory is read: one resync interval of
# kubetrain's (OperatorConfig.resync_interval), so that every job has been reconciled again in it.
HOLD_S = 30.0
SAMPLES, QUICK_SAMPLES = 50, 10

BURST_RATE = FigureSpec("scale.burst_pods_per_s_ratio", "x", Goal(
    ">=", 0.8, f"pods/s from the first create of {BURST_JOBS} one-node TrainingJobs (1 GPU each, on simulated nodes, "
               f"{CLIENT_CONNECTIONS} creates at a time) to all their pods Running, against a plain client creating "
               "each job's Service and pod the same way (issue 30)"))
BURST_RSS = FigureSpec("scale.burst_rss_ratio", "x", Goal(
    "<=", 1.0, f"resident memory of the operator with its {BURST_JOBS} jobs present and Running, kubetrain over "
               "Kubeflow's training operator given the same burst as one-replica PyTorchJobs (issue 30)"))
BURST_CPU = FigureSpec("scale.burst_cpu_ratio", "x", Goal(
    "<=", 1.0, f"CPU seconds of the operator process from the first create of its {BURST_JOBS} jobs to every one "
               f"Running, plus {HOLD_S:.0f} s held with them all present, kubetrain over Kubeflow (issue 30)"))
RECONCILE_P99 = FigureSpec("scale.reconcile_p99_5000_ratio", "x", Goal(
    "<=", 2.0, f"p99 from `create TrainingJob` to its first status while {BURST_JOBS} running jobs are present, "
               "against the same with none (issue 30)"))
FIGURES = (BURST_RATE, BURST_RSS, BURST_CPU, RECONCILE_P99)


@dataclass
class OperatorRun:
    """One operator's burst: seconds to every pod Running and to every job saying so, what it spent, what it held."""

    running_s: float
    jobs_running_s: float
    burst_cpu_s: float  # the operator's CPU seconds from the first create to every job Running
    hold_cpu_s: float  # and during the HOLD_S that followed
    rss: int  # its resident memory at the end of the hold
    # kubetrain's own API calls from the first create to every job Running, by "verb resource" (empty for Kubeflow)
    calls: Counter[str] = field(default_factory=Counter)

    @property
    def cpu_s(self) -> float:
        return self.burst_cpu_s + self.hold_cpu_s


def is_running(job: Json) -> bool:
    """kubetrain: phase Running; Kubeflow: a Running condition that is True."""
    status = job.get("status") or {}
    if status.get("phase") == "Running":
        return True
    return any(c.get("type") == "Running" and c.get("status") == "True" for c in status.get("conditions") or [])


def jobs_running(count: int) -> Callable[[list[Json]], bool]:
    return lambda jobs: sum(1 for job in jobs if is_running(job)) >= count


def one_gpu(side: Side) -> Side:
    """The side's jobs asking for one GPU, which only the simulated nodes have (the lab's process nodes none)."""
    def body(name: str, nodes: int, suspend: bool) -> Json:
        job: Json = side.body(name, nodes, suspend)
        if "pytorchReplicaSpecs" in job["spec"]:
            for replica in job["spec"]["pytorchReplicaSpecs"].values():
                for container in replica["template"]["spec"]["containers"]:
                    container["resources"]["requests"][GPU] = container["resources"]["limits"][GPU] = "1"
        else:
            job["spec"]["gpusPerNode"] = 1
        return job
    return replace(side, body=body)


def plain_spec() -> Json:
    """The spec whose Service and pod the plain client creates: the pod kubetrain's operator makes of its jobs
    here (bare_objects leaves out the in-place rule, as the operator does on nodes that do not declare it)."""
    return trainingjob_spec(1) | {"gpusPerNode": 1}


def _timeout(jobs: int) -> float:
    """Seconds allowed for one burst (or its sweep) of ``jobs`` jobs: far beyond 5 pods/s."""
    return 300.0 + jobs / 5


def create_concurrently(jobs: int, create: Callable[[int], object]) -> None:
    """``create(0)`` ... ``create(jobs - 1)``, CLIENT_CONNECTIONS at a time (the operator's own limit)."""
    with concurrent.futures.ThreadPoolExecutor(CLIENT_CONNECTIONS) as pool:
        list(pool.map(create, range(jobs)))


@contextlib.contextmanager
def burst_namespace(ctx: Context, lab: Cluster, key: str, jobs: int) -> Iterator[tuple[str, PodWatch]]:
    """A namespace of its own for one side's burst, its pods followed by one watch; swept, and gone, on exit."""
    namespace = lab.namespace(f"burst-{key}")
    pods = PodWatch(lab, namespace)
    try:
        ctx.log(f"burst of {jobs} one-node jobs, {key}")
        yield namespace, pods
    finally:
        try:
            _sweep(ctx, lab, namespace, pods, jobs)
        finally:
            pods.stop()


def plain_burst(ctx: Context, lab: Cluster, jobs: int) -> float:
    """Seconds from the plain client's first create of each job's Service and pod to every pod Running."""
    with burst_namespace(ctx, lab, "plain", jobs) as (namespace, pods):
        objects = [bare_objects(f"j{number}", namespace, plain_spec()) for number in range(jobs)]
        t0 = time.monotonic()
        create_concurrently(jobs, lambda number: lab.create_objects(namespace, objects[number]))
        return pods.wait(f"plain: {jobs} pods Running", all_running(jobs, _any), _timeout(jobs)) - t0


def operator_burst(ctx: Context, lab: Cluster, side: Side, jobs: int,
                   while_present: Callable[[], None] = lambda: None, *,
                   calls: Callable[[], Counter[str]] = Counter) -> OperatorRun:
    """The burst of an operator's jobs, then HOLD_S with every job Running; ``while_present`` runs after that,
    with every job still there. ``calls``: the operator's API calls so far, where it counts them."""
    with burst_namespace(ctx, lab, side.key, jobs) as (namespace, pods):
        statuses = Watched(lab, side.plural.format(ns=namespace))
        try:
            cpu0, calls0 = side.cpu_s(), calls()
            t0 = time.monotonic()
            create_concurrently(jobs, lambda number: side.create(lab, namespace, f"j{number}", 1))
            running = pods.wait(f"{side.key}: {jobs} pods Running", all_running(jobs, _any), _timeout(jobs)) - t0
            every_job = statuses.wait(f"{side.key}: {jobs} jobs Running", jobs_running(jobs), _timeout(jobs)) - t0
            cpu1, made = side.cpu_s(), calls() - calls0
            ctx.log(f"{side.key}: every job Running; holding {HOLD_S:.0f} s")
            time.sleep(HOLD_S)
            measured = OperatorRun(running, every_job, cpu1 - cpu0, side.cpu_s() - cpu1, side.rss(), made)
        finally:
            statuses.stop()
        while_present()
        return measured


def kubetrain_calls(lab: Cluster) -> Counter[str]:
    """The operator's own API calls so far, any answer, by "verb resource" (its kubetrain_api_requests_total; kopf's
    watches and event posts are not in it)."""
    from prometheus_client.parser import text_string_to_metric_families

    calls: Counter[str] = Counter()
    for family in text_string_to_metric_families(lab.operator.metrics()):
        for sample in family.samples:
            if sample.name == "kubetrain_api_requests_total":
                calls[f"{sample.labels['verb']} {sample.labels['resource']}"] += int(sample.value)
    return calls


def per_job(calls: Counter[str], jobs: int) -> str:
    """``2.00 calls a job: create pods 1.00, create services 1.00``, most first."""
    parts = ", ".join(f"{what} {count / jobs:.2f}" for what, count in calls.most_common())
    return f"{calls.total() / jobs:.2f} calls a job: {parts}"


def _any(_: Json) -> bool:
    return True


def _sweep(ctx: Context, lab: Cluster, namespace: str, pods: PodWatch, jobs: int) -> None:
    """Delete the namespace and wait until it is gone: the namespace controller's sweep of thousands of jobs,
    Services and events would otherwise run into the next side."""
    from tests.lab.procs import wait_for

    ctx.log(f"deleting namespace {namespace}")
    lab.lab.api.delete(f"/api/v1/namespaces/{namespace}")  # first: nothing new can be made in it from now on
    delete_pods(lab, pods, _any)  # one request each: a collection of thousands outlasts a request's timeout
    wait_for(lambda: not lab.lab.api.exists(f"/api/v1/namespaces/{namespace}"), _timeout(jobs),
             f"namespace {namespace} to be gone", interval=1.0)


def reconcile_samples(ctx: Context, phases: FirstPhases, jobs: Any, prefix: str) -> list[float]:
    """Seconds from create to first status of new unplaceable jobs, one after another (scale.py's measure)."""
    samples = QUICK_SAMPLES if ctx.quick else SAMPLES
    ctx.log(f"{samples} jobs' first reconcile ({prefix})")
    return first_status_seconds(jobs, phases, prefix, samples)


def burst_bench(ctx: Context) -> list[Figure]:
    jobs = QUICK_JOBS if ctx.quick else BURST_JOBS
    lab = Cluster(ctx, kwok_nodes=math.ceil(jobs * NODE_SLACK / GPUS_PER_KWOK_NODE))
    try:
        lab.start()
        return _measure(ctx, lab, jobs)
    finally:
        lab.stop()


def _measure(ctx: Context, lab: Cluster, jobs: int) -> list[Figure]:
    """One job's first reconcile alone first; then Kubeflow, alone with its jobs and stopped after them (it
    caches every pod and Service of the cluster: the other sides' would count in its memory); then the plain
    client and kubetrain back to back, and one job's first reconcile with kubetrain's jobs present."""
    from tests.lab.jobs import Jobs

    reconcile = Jobs(lab.lab, lab.namespace("reconcile"))
    phases = FirstPhases(lab, reconcile.base)
    present: list[float] = []
    try:
        first_status_seconds(reconcile, phases, "warm-up", 1)  # the operator's first job pays for its warm-up
        alone = reconcile_samples(ctx, phases, reconcile, "alone")
        theirs, peer_error = kubeflow_burst(ctx, lab, jobs)
        plain = plain_burst(ctx, lab, jobs)
        ours = operator_burst(ctx, lab, one_gpu(kubetrain_side(lab)), jobs, lambda: present.extend(
            reconcile_samples(ctx, phases, reconcile, "present")), calls=lambda: kubetrain_calls(lab))
    finally:
        phases.stop()
    peer_figures = (_peer_figures(ours, theirs) if theirs is not None
                    else [spec.failed(peer_error) for spec in (BURST_RSS, BURST_CPU)])
    return [_rate_figure(ours, plain, theirs, jobs), *peer_figures, _reconcile_figure(present, alone, jobs)]


def kubeflow_burst(ctx: Context, lab: Cluster, jobs: int) -> tuple[OperatorRun | None, str]:
    """Kubeflow's burst, or why it could not run: its figures are then left out, the others still measured."""
    stale = ctx.cache.pop("peer", None)  # the run's peer benchmark's, serving the run's shared lab
    if isinstance(stale, PeerOperator):
        stale.stop()
    try:
        peer = start_peer(ctx, lab)
    except Exception as error:
        return None, f"Kubeflow's training operator did not start: {type(error).__name__}: {error}"[:300]
    try:
        return operator_burst(ctx, lab, one_gpu(kubeflow_side(peer)), jobs), ""
    except Exception as error:
        return None, f"Kubeflow's burst: {type(error).__name__}: {error}"[:300]
    finally:
        peer.stop()  # before the other sides: it would cache their pods and Services too
        ctx.cache.pop("peer", None)


def _rate_figure(ours: OperatorRun, plain_s: float, theirs: OperatorRun | None, jobs: int) -> Figure:
    kubeflow = f"; Kubeflow {jobs / theirs.running_s:.1f} pods/s ({theirs.running_s:.1f} s)" if theirs else ""
    return BURST_RATE.measured(
        plain_s / ours.running_s,
        f"kubetrain {jobs / ours.running_s:.1f} pods/s ({ours.running_s:.1f} s; every job's status Running at "
        f"{ours.jobs_running_s:.1f} s) / plain client {jobs / plain_s:.1f} pods/s ({plain_s:.1f} s){kubeflow}; "
        f"{jobs} one-node jobs, {CLIENT_CONNECTIONS} creates at a time; kubetrain's own {per_job(ours.calls, jobs)} "
        "(the plain client: 2)",
        kubetrain_pods_per_s=jobs / ours.running_s, plain_pods_per_s=jobs / plain_s, jobs=jobs,
        kubetrain_calls_per_job=ours.calls.total() / jobs)


def _peer_figures(ours: OperatorRun, theirs: OperatorRun) -> list[Figure]:
    def cpu(run: OperatorRun) -> str:
        return (f"{run.cpu_s:.1f} s ({run.burst_cpu_s:.1f} in the {run.jobs_running_s:.1f} s to all Running + "
                f"{run.hold_cpu_s:.1f} in {HOLD_S:.0f} s held)")

    return [
        BURST_RSS.measured(ours.rss / theirs.rss, f"kubetrain {ours.rss / MIB:.0f} MiB / Kubeflow "
                                                  f"{theirs.rss / MIB:.0f} MiB with every job Running, after "
                                                  f"{HOLD_S:.0f} s", kubetrain_mib=ours.rss / MIB,
                           kubeflow_mib=theirs.rss / MIB),
        BURST_CPU.measured(ours.cpu_s / theirs.cpu_s, f"kubetrain {cpu(ours)} / Kubeflow {cpu(theirs)}",
                           kubetrain_cpu_s=ours.cpu_s, kubeflow_cpu_s=theirs.cpu_s,
                           kubetrain_hold_cpu_s=ours.hold_cpu_s, kubeflow_hold_cpu_s=theirs.hold_cpu_s)]


def _reconcile_figure(present: list[float], alone: list[float], jobs: int) -> Figure:
    busy, idle = percentile(present, 99), percentile(alone, 99)
    return RECONCILE_P99.measured(
        busy / idle, f"p99 {busy * 1000:.0f} ms with {jobs} running jobs / {idle * 1000:.0f} ms with none (p50 "
                     f"{median(present) * 1000:.0f} / {median(alone) * 1000:.0f} ms); {len(present)} jobs each",
        present_p99_s=busy, alone_p99_s=idle)


BENCHMARKS = (
    Benchmark("scale.burst", f"{BURST_JOBS} one-node jobs in a burst on simulated nodes: pods/s vs a plain client, "
                             "memory and CPU vs Kubeflow, a job's first reconcile vs none present", FIGURES,
              burst_bench, needs_lab=True),
)
