"""The operator's own Prometheus metrics (prefix kubetrain_), served on --metrics-port."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from kubetrain.core.api import Phase

__all__ = [
    "JOBS",
    "POD_CREATIONS",
    "RECONCILE_DURATION",
    "RECONCILE_ERRORS",
    "RESTARTS",
    "TIME_TO_RUNNING",
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


def set_job_phases(phases: Mapping[Any, str]) -> None:
    """Publish the count of jobs per phase (every phase present, zero included)."""
    tally = Tally(phases.values())
    for phase in Phase:
        JOBS.labels(phase=str(phase)).set(tally.get(str(phase), 0))


# Labelled series exist from the start (at zero), so dashboards and alerts see "no errors" rather
# than "no data", and rate() has a baseline when the first error comes.
for _trigger in ("job", "pod", "timer"):
    RECONCILE_ERRORS.labels(handler=_trigger)
    RECONCILE_DURATION.labels(handler=_trigger)
for _reason in ("PodFailed", "Disrupted", "NoHeartbeat", "Scaled", "OOMKilled"):
    RESTARTS.labels(reason=_reason)
