"""The operator's own Prometheus metrics (prefix kubetrain_), served on --metrics-port."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kubetrain.core.api import Phase
from kubetrain.core.goodput import BUCKETS

__all__ = [
    "JOBS",
    "JOB_GOODPUT",
    "POD_CREATIONS",
    "RECONCILE_DURATION",
    "RECONCILE_ERRORS",
    "RESTARTS",
    "TIME_TO_RUNNING",
    "JobGoodput",
    "set_job_phases",
]

RECONCILE_DURATION = Histogram(
    "kubetrain_reconcile_duration_seconds", "Time to reconcile one TrainingJob, by trigger.", ["handler"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RECONCILE_ERRORS = Counter("kubetrain_reconcile_errors", "Reconciles that raised, by trigger.", ["handler"])
JOBS = Gauge("kubetrain_jobs", "TrainingJobs seen by this operator, by phase.", ["phase"])
TIME_TO_RUNNING = Histogram(
    "kubetrain_time_to_running_seconds", "From job creation to all pods running (first attempt).",
    buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
)
POD_CREATIONS = Counter("kubetrain_pod_creations", "Pods created by the operator.")
RESTARTS = Counter("kubetrain_restarts", "Gang restarts, by reason.", ["reason"])
POD_REPLACEMENTS = Counter("kubetrain_pod_replacements",
                           "Lost pods made again alone, at the same attempt, while the others waited, by reason.",
                           ["reason"])
CHECKPOINT_REQUESTS = Counter("kubetrain_checkpoint_requests",
                              "Rank 0 asked to checkpoint now because a node announced a disruption (a cordon, a "
                              "NoExecute taint), by result: taken or failed (then asked again).", ["result"])


class JobGoodput(Collector):
    """kubetrain_job_goodput_seconds{job_namespace, training_job, bucket}: each job's status.goodput, as its last
    reconcile decided it (live, also while a goodput-only status write waits). Kept as six numbers per job and
    made into series only when scraped: six labelled children cost a job about 5 KB (tracemalloc), these numbers
    about 0.4 KB. A job's series go with it (``forget``). Its namespace is job_namespace: the target label
    namespace is the operator's."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], tuple[float, ...]] = {}

    def set(self, namespace: str, name: str, goodput: Mapping[str, Any] | None) -> None:
        if isinstance(goodput, Mapping):
            self.jobs[(namespace, name)] = tuple(float(goodput.get(f"{b}Seconds") or 0) for b in BUCKETS)

    def forget(self, namespace: str, name: str) -> None:
        self.jobs.pop((namespace, name), None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("kubetrain_job_goodput_seconds",
                                   "Each TrainingJob's wall time so far, by bucket (status.goodput).",
                                   labels=["job_namespace", "training_job", "bucket"])
        for (namespace, name), seconds in list(self.jobs.items()):
            for bucket, value in zip(BUCKETS, seconds, strict=True):
                family.add_metric([namespace, name, bucket], value)
        yield family


JOB_GOODPUT = JobGoodput()
REGISTRY.register(JOB_GOODPUT)


def set_job_phases(jobs_by_phase: Mapping[str, int]) -> None:
    """Publish the count of jobs per phase (every phase present, zero included)."""
    for phase in Phase:
        JOBS.labels(phase=str(phase)).set(jobs_by_phase.get(str(phase), 0))


# Labelled series exist from the start (at zero), so dashboards and alerts see "no errors" rather
# than "no data", and rate() has a baseline when the first error comes.
for _trigger in ("job", "pod", "timer", "node notice"):
    RECONCILE_ERRORS.labels(handler=_trigger)
    RECONCILE_DURATION.labels(handler=_trigger)
for _reason in ("PodFailed", "Disrupted", "NoHeartbeat", "Scaled", "OOMKilled"):
    RESTARTS.labels(reason=_reason)
for _result in ("taken", "failed"):
    CHECKPOINT_REQUESTS.labels(result=_result)
