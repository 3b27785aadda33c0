"""The operator at scale on the lab: one 512-node job, and a job's first reconcile while 200 others are there.

Both against baselines measured on the same lab in the same run: the same 512 pods created by a plain
client with the operator's own concurrency, and the same reconcile with no other job present. The pods of
these jobs never run (a nodeSelector no node has): what is measured is the operator, not 2 cores starting
hundreds of processes.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from bench.cluster import Cluster, bare_objects, cluster, job_spec
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median, percentile

__all__ = ["BENCHMARKS"]

Json = Any
WIDE_NODES = 512
BACKGROUND_JOBS = 200
NOWHERE = {"bench.kubetrain.io/nowhere": "true"}  # no lab node has this label: pods stay Pending
CLIENT_CONNECTIONS = 16  # the operator's own limit (OperatorConfig.api_connections)


def _unplaceable(nodes: int) -> Json:
    return job_spec("print('never runs')", nodes) | {"scheduling": {"nodeSelector": NOWHERE}}


WIDE_JOB = FigureSpec(
    "operator.wide_job_creation_ratio", "x",
    Goal("<=", 1.25, f"from `create TrainingJob` of {WIDE_NODES} nodes to all its pods created, against the "
                     f"same {WIDE_NODES} pods (and Service) created by a plain client with the operator's "
                     f"{CLIENT_CONNECTIONS} concurrent requests: the operator may add a quarter (its watch, "
                     "one reconcile, the status write)"))


def wide_job_bench(ctx: Context) -> list[Figure]:
    lab = cluster(ctx)
    from tests.lab.jobs import Jobs

    namespace = lab.namespace("wide")
    jobs = Jobs(lab.lab, namespace)
    nodes, rounds = (64, 1) if ctx.quick else (WIDE_NODES, 3)
    spec = _unplaceable(nodes)
    job_s: list[float] = []
    bare_s: list[float] = []
    try:
        ctx.log("warm-up: a 2-node job and its bare pods (not counted)")
        jobs.create("warm", _unplaceable(2))
        lab.wait_count(namespace, "kubetrain.io/job-name=warm", 2)
        lab.create_objects(namespace, bare_objects("warm-bare", namespace, _unplaceable(2)), CLIENT_CONNECTIONS)
        for number in range(rounds):  # alternating, so that a slow spell hits both
            ctx.log(f"round {number}: a TrainingJob of {nodes} nodes, then the same pods from a plain client")
            job_s.append(_timed_job(lab, jobs, f"wide-{number}", spec))
            bare_s.append(_timed_bare(lab, namespace, f"bare-{number}", spec))
    finally:
        lab.delete_namespace(namespace)
    return [WIDE_JOB.measured(
        median(job_s) / median(bare_s),
        f"job p50 {median(job_s):.2f} s / plain client p50 {median(bare_s):.2f} s for {nodes} pods; {rounds} "
        "rounds each", job_s=median(job_s), bare_s=median(bare_s), pods=nodes)]


def _timed_job(lab: Cluster, jobs: Any, name: str, spec: Json) -> float:
    selector = f"kubetrain.io/job-name={name}"
    t0 = time.monotonic()
    jobs.create(name, spec)
    seconds = lab.wait_count(jobs.namespace, selector, spec["nodes"]) - t0
    lab.lab.api.delete(f"{jobs.base}/{name}")
    lab.delete_pods(jobs.namespace, selector)
    lab.wait_no_pods(jobs.namespace, selector, timeout=300)
    return seconds


def _timed_bare(lab: Cluster, namespace: str, name: str, spec: Json) -> float:
    selector = f"bench.kubetrain.io/bare={name}"
    objects = bare_objects(name, namespace, spec)
    t0 = time.monotonic()
    lab.create_objects(namespace, objects, CLIENT_CONNECTIONS)
    seconds = lab.wait_count(namespace, selector, spec["nodes"]) - t0
    lab.delete_pods(namespace, selector)
    lab.wait_no_pods(namespace, selector, timeout=300)
    return seconds


BUSY_RECONCILE = FigureSpec(
    "operator.reconcile_p99_busy_ratio", "x",
    Goal("<=", 2.0, f"p99 from `create TrainingJob` to its first status (pods created, phase Pending) while "
                    f"{BACKGROUND_JOBS} other jobs are present and reconciled, against the same with none: "
                    "the operator's index and per-job reconciles keep one job's latency from growing with "
                    "the others"))


def busy_reconcile_bench(ctx: Context) -> list[Figure]:
    lab = cluster(ctx)
    from tests.lab.jobs import Jobs

    samples = 10 if ctx.quick else 50
    background = 50 if ctx.quick else BACKGROUND_JOBS
    namespace = lab.namespace("busy")
    jobs = Jobs(lab.lab, namespace)
    phases = FirstPhases(lab, jobs.base)
    try:
        first_status_seconds(jobs, phases, "warm-up", 1)  # the operator's first job pays for its warm-up
        ctx.log(f"{samples} jobs' first reconcile, no other job present")
        idle = first_status_seconds(jobs, phases, "idle", samples)
        ctx.log(f"creating {background} background jobs, and waiting until each has its first status")
        for number in range(background):
            jobs.create(f"background-{number}", _unplaceable(1))
        for number in range(background):
            phases.wait(f"background-{number}", timeout=300)
        time.sleep(SETTLE_S)
        ctx.log(f"{samples} jobs' first reconcile, {background} others present")
        busy = first_status_seconds(jobs, phases, "busy", samples)
    finally:
        phases.stop()
        lab.delete_namespace(namespace)
    ratio = percentile(busy, 99) / percentile(idle, 99)
    return [BUSY_RECONCILE.measured(
        ratio, f"p99 {percentile(busy, 99) * 1000:.0f} ms with {background} jobs / {percentile(idle, 99) * 1000:.0f} "
               f"ms alone (p50 {median(busy) * 1000:.0f} / {median(idle) * 1000:.0f} ms); {samples} jobs each",
        busy_p99_s=percentile(busy, 99), idle_p99_s=percentile(idle, 99))]


# The background jobs' own reconciles are over once each has a status; their events and the API server's
# follow-up work (endpoint slices of the Services) may still be in flight for a moment.
SETTLE_S = 2.0


class FirstPhases:
    """When each job of one namespace first showed a phase in its status: the time of that watch event, from a
    watch opened before the jobs are created (a 10 ms status poll added 100 requests a second to the load
    being measured)."""

    def __init__(self, lab: Cluster, path: str) -> None:
        self._seen: dict[str, float] = {}
        self._changed = threading.Condition()
        self._stopped = False
        self.error: Exception | None = None
        from tests.lab.jobs import list_version

        version = list_version(lab.lab.api, path)
        threading.Thread(target=self._follow, args=(lab, path, version), daemon=True).start()

    def _follow(self, lab: Cluster, path: str, version: str) -> None:
        try:
            while not self._stopped:  # a watch ends at its timeout: go on from the last version seen
                for event in lab.lab.api.watch(path, version):
                    job = event["object"]
                    version = job["metadata"]["resourceVersion"]
                    if event["type"] in ("ADDED", "MODIFIED") and (job.get("status") or {}).get("phase"):
                        with self._changed:
                            self._seen.setdefault(job["metadata"]["name"], time.monotonic())
                            self._changed.notify_all()
        except Exception as error:  # reported by wait()
            with self._changed:
                self.error = error
                self._changed.notify_all()

    def wait(self, name: str, timeout: float = 60) -> float:
        """The monotonic time of the job's first phase; raises what the watch met, or TimeoutError."""
        with self._changed:
            if not self._changed.wait_for(lambda: name in self._seen or self.error is not None, timeout):
                raise TimeoutError(f"{name}: no phase in its status after {timeout} s")
            if name not in self._seen:
                raise RuntimeError(f"the watch of the jobs failed: {self.error}")
            return self._seen[name]

    def stop(self) -> None:
        self._stopped = True  # the thread ends with its current watch (a daemon: it never holds the exit)


def first_status_seconds(jobs: Any, phases: FirstPhases, prefix: str, samples: int) -> list[float]:
    """For each of ``samples`` new one-node jobs, created one after another, seconds from create to the
    status with its phase."""
    seconds = []
    for number in range(samples):
        name = f"{prefix}-{number}"
        t0 = time.monotonic()
        jobs.create(name, _unplaceable(1))
        seconds.append(phases.wait(name) - t0)
    return seconds


BENCHMARKS = (
    Benchmark("operator.wide", f"a {WIDE_NODES}-node job's pods created vs the same pods from a plain client",
              (WIDE_JOB,), wide_job_bench, needs_lab=True),
    Benchmark("operator.busy", f"a job's first reconcile with {BACKGROUND_JOBS} other jobs present vs alone",
              (BUSY_RECONCILE,), busy_reconcile_bench, needs_lab=True),
)
