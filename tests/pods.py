"""Pod objects shaped like the API server returns them, for the pure status and policy tests."""

from __future__ import annotations

from typing import Any

from kubetrain.core.status import PodState, pod_state

Json = Any
T0 = "2026-11-01T10:00:00Z"


def pod(
    index: int,
    phase: str = "Running",
    *,
    job: str = "valid",
    job_uid: str | None = "uid-1",
    attempt: int = 0,
    exit_code: int | None = None,
    reason: str | None = None,
    pod_reason: str | None = None,
    disrupted: bool = False,
    disruption_reason: str = "EvictionByEvictionAPI",
    scheduled: bool = True,
    deleting: str | None = None,
    finished_at: str = "2026-11-01T10:05:00Z",
    message: str | None = None,
    node: str = "node-0",
    unschedulable: str | None = None,
    uid: str | None = None,
    restarted: tuple[int, int, str] | None = None,
) -> Json:
    """A pod object in ``phase``; a terminated container when exit_code is given.

    ``job_uid`` is the job-uid label (the policy tests' job has uid-1); None leaves it out. ``unschedulable``: the
    scheduler's message on a pod it could not place (not scheduled, reason Unschedulable). ``restarted``: the
    kubelet restarted its containers in place (restart count, the last run's exit code, its finishedAt).
    """
    conditions = [{"type": "PodScheduled", "status": "True" if scheduled else "False"}]
    if unschedulable is not None:
        scheduled = False
        conditions = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                       "message": unschedulable}]
    if phase == "Running":
        conditions += [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}]
    if disrupted:
        conditions.append({"type": "DisruptionTarget", "status": "True", "reason": disruption_reason})
    container: dict[str, Json] = {"name": "trainer", "state": {"running": {"startedAt": T0}}}
    if exit_code is not None:
        terminated: dict[str, Json] = {"exitCode": exit_code, "reason": reason or ("Completed" if exit_code == 0
                                       else "Error"), "startedAt": T0, "finishedAt": finished_at}
        if message:
            terminated["message"] = message
        container["state"] = {"terminated": terminated}
    if restarted is not None:
        count, code, ended = restarted
        container["restartCount"] = count
        container["lastState"] = {"terminated": {"exitCode": code, "reason": "Error", "startedAt": T0,
                                                 "finishedAt": ended, **({"message": message} if message else {})}}
    status: dict[str, Json] = {"phase": phase, "conditions": conditions}
    if phase != "Pending" or scheduled:
        status |= {"startTime": T0, "containerStatuses": [container]}
    if pod_reason:
        status["reason"] = pod_reason
    metadata: dict[str, Json] = {
        "name": f"{job}-{index}",
        "labels": {"kubetrain.io/job-name": job, "kubetrain.io/node-index": str(index),
                   "kubetrain.io/attempt": str(attempt)},
    }
    if job_uid is not None:
        metadata["labels"]["kubetrain.io/job-uid"] = job_uid
    if uid is not None:
        metadata["uid"] = uid
    if deleting:
        metadata["deletionTimestamp"] = deleting
    return {"metadata": metadata, "spec": {"nodeName": node if scheduled else None}, "status": status}


def states(*pods: Json) -> list[PodState]:
    return [pod_state(p) for p in pods]
