"""What the operator costs the API server per job, counted by the API server itself: the requests it dispatched
under the chart's FlowSchema, which matches only the operator's ServiceAccount (tests/lab/chart.operator_requests).

A lab of its own with simulated nodes (kwok): one-node jobs started, left running, each restarted once and
deleted, the operator's requests counted in each stretch; its memory read before and with the jobs present.
docs/scale.md builds its estimates of a 100,000-job cluster on these figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.cluster import Cluster, job_spec
from bench.frontier import ATTEMPT_LABEL, JOB_LABEL, PodWatch, all_running, none_left
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal

__all__ = ["BENCHMARKS"]

Json = Any
JOBS, QUICK_JOBS = 200, 20
STEADY_S, QUICK_STEADY_S = 120.0, 30.0
KWOK_NODES = 64  # 8 GPUs each: room for 512 one-GPU pods
SETTLE_S = 15.0  # after a start or restart: the status writes and events that follow it
CREATE_GAP_S = 0.02  # the jobs are created one after another, as a queue of users would
MIB = 1024 * 1024

# A plain client needs 2 requests to start such a job (its Service and its pod) and 2 to restart it (delete and
# create the pod). The operator also writes the status the user reads (Pending, Running) and an event at each
# step: 2 writes and 2 events per job on top.
START_REQUESTS = FigureSpec(
    "scale.start_requests_ratio", "x",
    Goal("<=", 4.0, "the operator's API requests to start a one-node job (create → Running, settled), against the "
                    "2 a plain client makes for the same objects: its status writes and events may double them, "
                    "and reads on top must stay rare (issue 30, point 5)"))
RESTART_REQUESTS = FigureSpec(
    "scale.restart_requests_ratio", "x",
    Goal("<=", 4.0, "the operator's API requests for one gang restart of a one-node job (its pod failed → the "
                    "next attempt's pod Running, settled), against the 2 of a plain delete and create"))
STEADY_REQUESTS = FigureSpec(
    "scale.steady_requests_per_job_minute", "req/min",
    Goal("<=", 0.5, "requests a minute per running job that changes nothing, above the operator's idle rate: "
                    "100,000 such jobs may cost the API server at most about 830 requests a second"))
STORED_PER_JOB = FigureSpec(
    "scale.stored_per_job", "KiB",
    Goal("<=", 40.0, "the API objects a running one-node job keeps (the job with its status, its pod, Service, "
                     "EndpointSlice and events, as JSON): 100,000 jobs within half of etcd's recommended 8 GiB"))
MEMORY_PER_JOB = FigureSpec(
    "scale.memory_per_job", "KiB",
    Goal("<=", 64.0, "the operator's RSS growth per running one-node job: 100,000 jobs within about 6 GiB"))


@dataclass
class Counted:
    """Requests the operator made in each stretch of the run, and its RSS before and with the jobs."""

    jobs: int
    idle_per_s: float = 0.0
    idle_cpu: float = 0.0  # the operator's CPU seconds a second
    start: int = 0
    steady_per_s: float = 0.0
    steady_cpu: float = 0.0
    restart: int = 0
    rss_idle: int = 0
    rss_jobs: int = 0
    stored: dict[str, int] = field(default_factory=dict)  # bytes of JSON by kind, all jobs together


def costs_bench(ctx: Context) -> list[Figure]:
    jobs, steady_s = (QUICK_JOBS, QUICK_STEADY_S) if ctx.quick else (JOBS, STEADY_S)
    lab = Cluster(ctx, kwok_nodes=KWOK_NODES)
    try:
        lab.start()
        watch = PodWatch(lab, lab.namespace("costs"))
        try:
            counted = _count(ctx, lab, watch, jobs, steady_s)
        finally:
            watch.stop()
    finally:
        lab.stop()
    return _figures(counted, steady_s)


def _count(ctx: Context, lab: Cluster, watch: PodWatch, jobs: int, steady_s: float) -> Counted:
    from tests.lab.chart import operator_requests
    from tests.lab.jobs import Jobs

    client, api = Jobs(lab.lab, watch.namespace), lab.lab
    counted = Counted(jobs, rss_idle=_rss(lab))
    ctx.log(f"the idle operator's requests over {steady_s:.0f} s")
    counted.idle_per_s, counted.idle_cpu = _rates(lab, steady_s)
    ctx.log(f"{jobs} one-node jobs created and Running")
    counted.start = _requests_for(lambda: _start(client, watch, jobs), lambda: operator_requests(api))
    ctx.log(f"the {jobs} running jobs left alone for {steady_s:.0f} s")
    counted.steady_per_s, counted.steady_cpu = _rates(lab, steady_s)
    counted.rss_jobs = _rss(lab)
    counted.stored = _stored(lab, watch.namespace)
    ctx.log(f"each job's pod failed once: {jobs} gang restarts")
    counted.restart = _requests_for(lambda: _restart(lab, watch, jobs), lambda: operator_requests(api))
    for number in range(jobs):
        api.api.delete(f"{client.base}/job-{number}")
    watch.wait("the jobs' pods gone", none_left(lambda pod: JOB_LABEL in pod["metadata"].get("labels", {})))
    return counted


def _start(client: Any, watch: PodWatch, jobs: int) -> None:
    spec = job_spec("import time; time.sleep(86400)", 1) | {"gpusPerNode": 1}
    for number in range(jobs):
        client.create(f"job-{number}", spec)
        time.sleep(CREATE_GAP_S)
    watch.wait(f"{jobs} pods Running", all_running(jobs, lambda pod: JOB_LABEL in pod["metadata"].get("labels", {})))


def _restart(lab: Cluster, watch: PodWatch, jobs: int) -> None:
    from tests.lab.kwok import EXIT_CODE_ANNOTATION

    for number in range(jobs):
        lab.lab.api.merge_patch(f"{watch.path}/job-{number}-0",
                                {"metadata": {"annotations": {EXIT_CODE_ANNOTATION: "1"}}})
    watch.wait(f"{jobs} pods of attempt 1 Running", all_running(
        jobs, lambda pod: pod["metadata"].get("labels", {}).get(ATTEMPT_LABEL) == "1"))


def _requests_for(work: Callable[[], None], count: Callable[[], int]) -> int:
    """Requests during ``work`` and the SETTLE_S after it."""
    before = count()
    work()
    time.sleep(SETTLE_S)
    return int(count() - before)


STORED_KINDS = {"trainingjobs": "/apis/kubetrain.io/v1alpha1/namespaces/{}/trainingjobs",
                "pods": "/api/v1/namespaces/{}/pods", "services": "/api/v1/namespaces/{}/services",
                "endpointslices": "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices",
                "events": "/api/v1/namespaces/{}/events"}


def _stored(lab: Cluster, namespace: str) -> dict[str, int]:
    """Bytes of JSON of each kind of object in the jobs' namespace (etcd keeps custom resources as JSON, and
    core kinds as protobuf, smaller: an upper estimate)."""
    import json

    return {kind: sum(len(json.dumps(item)) for item in lab.lab.api.get(path.format(namespace))["items"])
            for kind, path in STORED_KINDS.items()}


def _rates(lab: Cluster, seconds: float) -> tuple[float, float]:
    """The operator's requests a second and CPU seconds a second over ``seconds``."""
    from tests.lab.chart import operator_requests

    requests, cpu = operator_requests(lab.lab), _cpu(lab)
    time.sleep(seconds)
    return (operator_requests(lab.lab) - requests) / seconds, (_cpu(lab) - cpu) / seconds


def _process(lab: Cluster) -> Any:
    import psutil

    return psutil.Process(lab.operator.process.pid)


def _cpu(lab: Cluster) -> float:
    times = _process(lab).cpu_times()
    return float(times.user + times.system)


def _rss(lab: Cluster) -> int:
    return int(_process(lab).memory_info().rss)


def _figures(counted: Counted, steady_s: float) -> list[Figure]:
    jobs = counted.jobs
    idle_during = counted.idle_per_s * SETTLE_S  # what the idle operator would have sent in that time anyway
    start = (counted.start - idle_during) / jobs
    restart = (counted.restart - idle_during) / jobs
    steady = (counted.steady_per_s - counted.idle_per_s) * 60 / jobs
    grown = max(counted.rss_jobs - counted.rss_idle, 0) / 1024 / jobs
    stored = sum(counted.stored.values()) / 1024 / jobs
    by_kind = ", ".join(f"{kind} {size / 1024 / jobs:.1f}" for kind, size in counted.stored.items())
    return [
        START_REQUESTS.measured(start / 2, f"{start:.1f} requests per job start over {jobs} jobs (idle rate "
                                           f"{counted.idle_per_s:.2f}/s taken off)", per_job=start, jobs=jobs),
        RESTART_REQUESTS.measured(restart / 2, f"{restart:.1f} requests per gang restart over {jobs} jobs",
                                  per_job=restart, jobs=jobs),
        STEADY_REQUESTS.measured(steady, f"{counted.steady_per_s:.2f} requests/s with {jobs} running jobs over "
                                         f"{steady_s:.0f} s, {counted.idle_per_s:.2f}/s idle; operator CPU "
                                         f"{counted.steady_cpu * 100:.1f} % of a core ({counted.idle_cpu * 100:.1f} "
                                         "% idle)", jobs=jobs, idle_per_s=counted.idle_per_s,
                                 steady_cpu=counted.steady_cpu, idle_cpu=counted.idle_cpu),
        STORED_PER_JOB.measured(stored, f"KiB per job: {by_kind}", jobs=jobs),
        MEMORY_PER_JOB.measured(grown, f"RSS {counted.rss_idle / MIB:.0f} MiB idle, {counted.rss_jobs / MIB:.0f} "
                                       f"MiB with {jobs} running jobs", jobs=jobs),
    ]


BENCHMARKS = (
    Benchmark("scale.costs", "the operator's API requests and memory per job, counted by the API server",
              (START_REQUESTS, RESTART_REQUESTS, STEADY_REQUESTS, STORED_PER_JOB, MEMORY_PER_JOB), costs_bench,
              needs_lab=True),
)
