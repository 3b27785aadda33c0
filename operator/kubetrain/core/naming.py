"""The names and labels of a job's children: facts that the pod builder and the reconcile decision share.

A pod per node is named ``<job>-<index>``, an attempt's PodGroup ``<job>-gang-<attempt>``; every child carries the
job's name and uid as labels, which tell it from a child of an earlier job of the same name.
"""

from __future__ import annotations

from kubetrain.core import api
from kubetrain.core.spec import TrainingJob

__all__ = ["identity_labels", "job_labels", "job_selector", "pod_group_name", "pod_name"]


def pod_name(job_name: str, index: int) -> str:
    return f"{job_name}-{index}"


def pod_group_name(job_name: str, attempt: int) -> str:
    """Each attempt's gang has a PodGroup of its own: a group's gang policy binds once, and a new attempt's
    pods must be placed whole again (MAX_NAME_LENGTH leaves room for the suffix)."""
    return f"{job_name}-gang-{attempt}"


def identity_labels(job: TrainingJob) -> dict[str, str]:
    """The labels that tell this job's children from those of an earlier job of the same name."""
    labels = {api.LABEL.JOB_NAME: job.name}
    if job.uid:  # `kubetrain render` has no uid: the API server assigns it on create
        labels[api.LABEL.JOB_UID] = job.uid
    return labels


def job_labels(job: TrainingJob) -> dict[str, str]:
    """Labels shared by every child object of a job."""
    return identity_labels(job) | {api.LABEL.MANAGED_BY: "kubetrain"}


def job_selector(job_name: str, job_uid: str = "") -> str:
    """Label selector (string form) of a job's pods, whatever the attempt.

    Without a uid it also matches pods of earlier jobs of the same name: the operator lists those too,
    to clear them out of the way of the pod names the job needs (see lifecycle.py).
    """
    selector = f"{api.LABEL.JOB_NAME}={job_name}"
    return f"{selector},{api.LABEL.JOB_UID}={job_uid}" if job_uid else selector
