"""Kueue's job contract, the operator's I/O (core/queueing.py decides): a queued job's Workload made and read before
the job's reconcile decides, Kueue's answer written back after it acts, and a job reconciled again whenever Kueue
changes its Workload (admits, evicts).

A job without the label ``kueue.x-k8s.io/queue-name`` costs nothing here: no call is made for it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from time import monotonic
from typing import Any

import kopf

from kubetrain.controller.jobstate import JobRecord, OperatorState, PendingRead, Trigger
from kubetrain.core import api
from kubetrain.core.manifests import build_pod
from kubetrain.core.queueing import (
    KUEUE,
    Admission,
    Placement,
    QueuePosition,
    QueueState,
    build_workload,
    default_priority_class,
    finished_patch,
    placed,
    placement,
    pods_ready_patch,
    positions,
    queue_name,
    read_admission,
    release_patch,
    workload_name,
    workload_spec_patch,
)
from kubetrain.core.spec import TrainingJob
from kubetrain.core.status import PodState
from kubetrain.k8s.transport import ApiError

__all__ = ["Gate", "admit", "queue_position", "settle", "workload_changed"]

Json = Any
WORKLOAD = (KUEUE.GROUP, KUEUE.VERSION, KUEUE.WORKLOADS)
WORKLOAD_CHANGE = Trigger("workload", logging.getLogger("kubetrain.kueue"))
# A LocalQueue's pending Workloads are read at most this often: the positions of a thousand jobs waiting in one
# queue cost one request, not a thousand. Where Kueue's visibility API is not served, it is asked again after a
# minute.
PENDING_READ_EVERY_S = 5.0
PENDING_UNSERVED_S = 60.0
log = logging.getLogger("kubetrain.kueue")


def _owning_job(body: Json) -> str | None:
    """The name of the TrainingJob that controls this Workload; None for any other's (a batch Job's...)."""
    for owner in body.get("metadata", {}).get("ownerReferences") or []:
        if owner.get("controller") and owner.get("apiVersion") == api.API_VERSION and owner.get("kind") == api.KIND:
            return str(owner["name"])
    return None


def _owned_by_a_job(body: kopf.Body, **_: Any) -> bool:
    return _owning_job(body) is not None


@kopf.on.event(*WORKLOAD, when=_owned_by_a_job)
async def workload_changed(body: kopf.Body, namespace: str | None, memo: Any, type: str | None,  # noqa: A002
                           **_: Any) -> None:
    """Kueue admitted, evicted or finished a job's Workload (or it was deleted): reconcile the job, which reads the
    Workload as this event shows it."""
    state: OperatorState = memo["state"]
    name = _owning_job(body)
    if namespace and name and state.config.serves(namespace):
        record = state.records.get((namespace, name))
        if record is not None:  # a job not reconciled yet reads its Workload from the API server
            record.workload = None if type == "DELETED" else dict(body)
        state.queue.add((namespace, name), WORKLOAD_CHANGE)


@dataclass(frozen=True)
class Gate:
    """A queued job before its reconcile: the job as its pods must be made (where Kueue admitted it), what Kueue
    said (None: Kueue has no say over the job) and the Workload as read."""

    job: TrainingJob
    admission: Admission | None = None
    workload: Json = None


async def admit(state: OperatorState, record: JobRecord, job: TrainingJob, status: Json) -> Gate:
    """The job's Workload, made when missing (not for a job that has ended), kept in step with the job (an elastic
    resize while it waits, suspension), and what Kueue says of it; admitted, the job placed on its flavors."""
    if queue_name(job) is None:
        return Gate(job)
    kube = state.kube
    workload = _seen(record, job)
    if workload is None and status:  # a new job (no status yet) has none: it is made without a read first
        workload = await kube.get_workload(job.namespace, workload_name(job))
    if workload is None:
        if api.Phase(status.get("phase") or api.Phase.PENDING).finished:
            return Gate(job)
        workload, made = await _create_workload(state, job)
        if made:  # Kueue has not seen it yet; the watch event of its making queues the job's next reconcile
            return Gate(job, read_admission(workload))
    else:
        patch = workload_spec_patch(workload, job)
        if patch is not None:
            workload = await kube.patch_workload(job.namespace, workload_name(job), patch)
    record.workload = workload
    admission = read_admission(workload)
    if admission.state is not QueueState.ADMITTED:
        if admission.state is not QueueState.FINISHED and not admission.quota_reserved:
            admission = replace(admission, position=await queue_position(state, job))
        return Gate(job, admission, workload)
    return Gate(placed(job, await _placement(state, record, workload, admission)), admission, workload)


async def _placement(state: OperatorState, record: JobRecord, workload: Json, admission: Admission) -> Placement:
    """Where the admission puts the pods: its flavors are read once per admission, as Kueue's own integrations
    read them when they start a job, not at each reconcile of a running one."""
    key = (workload["metadata"].get("uid"), admission)
    if record.placement is None or record.placement[0] != key:
        flavors = {name: await state.kube.get_resource_flavor(name) for name in admission.flavors}
        record.placement = (key, placement(admission, flavors))
    return record.placement[1]


async def queue_position(state: OperatorState, job: TrainingJob) -> QueuePosition | None:
    """Where the job's Workload waits, from its LocalQueue's pending Workloads as read in the last few seconds."""
    key = (job.namespace, str(queue_name(job)))
    now = monotonic()
    read = state.pending.get(key)
    if read is None or read.until <= now:
        read = state.pending[key] = PendingRead(asyncio.ensure_future(_read_positions(state, *key)),
                                                now + PENDING_READ_EVERY_S)
    found = await asyncio.shield(read.positions)
    if found is None:
        read.until = max(read.until, now + PENDING_UNSERVED_S)
        return None
    return found.get(workload_name(job))


async def _read_positions(state: OperatorState, namespace: str, local_queue: str) -> dict[str, QueuePosition] | None:
    """None where the visibility API does not answer: positions are shown where Kueue serves them, and a job waits
    the same without one."""
    try:
        return positions(await state.kube.get_pending_workloads(namespace, local_queue))
    except ApiError as error:
        log.info("no queue positions for LocalQueue %s/%s: Kueue's visibility API answered %s %s", namespace,
                 local_queue, error.status, str(error)[:200])
        return None


def _seen(record: JobRecord, job: TrainingJob) -> Json | None:
    """The job's Workload as its watch last showed it; None when not seen since the job's cache was dropped (or
    it was the Workload of an earlier job of the same name)."""
    workload = record.workload
    if workload is not None and workload["metadata"].get("name") == workload_name(job):
        return workload
    return None


async def _create_workload(state: OperatorState, job: TrainingJob) -> tuple[Json, bool]:
    """The job's Workload, made now (True) or as it existed (False). Kueue orders and preempts by spec.priority:
    the value of the job's PriorityClass, or of the cluster's globalDefault one, read as Kueue's own integrations
    read them."""
    class_name = job.spec.scheduling.priority_class_name
    if class_name:
        chosen: Json = await state.kube.get_priority_class(class_name)
    else:
        chosen = await _default_priority_class(state)
    priority = int((chosen or {}).get("value") or 0)
    pod = build_pod(job, 0, 0, default_image=state.config.trainer_image)
    body = build_workload(job, pod, priority, (chosen or {}).get("metadata", {}).get("name"))
    existing = await state.kube.create(job.namespace, body)
    return (body, True) if existing is None else (existing, False)


async def _default_priority_class(state: OperatorState) -> Json | None:
    """The cluster's globalDefault PriorityClass. The Workloads made while one list is under way share it (a
    burst of queued jobs that name no class); a later one lists again, so a class an admin just marked counts."""
    listing = state.default_priority
    if listing is None or listing.done():
        listing = state.default_priority = asyncio.ensure_future(_read_default_priority_class(state))
    return await asyncio.shield(listing)


async def _read_default_priority_class(state: OperatorState) -> Json | None:
    return default_priority_class(await state.kube.list_priority_classes())


async def settle(state: OperatorState, record: JobRecord, gate: Gate, status: Json, pods: list[PodState]) -> None:
    """After the reconcile acted: an ended job's Workload Finished (its quota goes to the next job); an evicted
    job's admission given back once its pods are gone; an admitted job's PodsReady kept true."""
    workload = gate.workload
    if workload is None or gate.admission is None:
        return
    now = datetime.now(UTC)
    phase = status.get("phase")
    if phase in (api.Phase.SUCCEEDED, api.Phase.FAILED):
        patch = finished_patch(workload, phase == api.Phase.SUCCEEDED, str(status.get("message") or ""), now)
    elif gate.admission.state is QueueState.EVICTED and not any(p.job_uid == gate.job.uid for p in pods):
        patch = release_patch(workload, now)
    elif gate.admission.state is QueueState.ADMITTED:
        patch = pods_ready_patch(workload, phase == api.Phase.RUNNING, now)
    else:
        return
    if patch is not None:
        record.workload = await state.kube.patch_workload(gate.job.namespace, workload["metadata"]["name"], patch,
                                                          status=True)
