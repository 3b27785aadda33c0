"""Kueue's job contract for a TrainingJob, decided purely: the Workload to make, what Kueue's answer means.

Kueue manages only the kinds it has an integration for (batch/v1 Job, JobSet, ...); for any other kind the kind's
own controller implements the contract, as Kueue's integrations do (pkg/controller/jobframework/reconciler.go in
sigs.k8s.io/kueue v0.17.0). For a job labelled ``kueue.x-k8s.io/queue-name`` the operator:

- makes a Workload (kueue.x-k8s.io/v1beta2) owned by the job: one pod set of ``spec.nodes`` pods with the pod
  template, its resources included, and the job's priority (Kueue orders and preempts by ``spec.priority``, which
  the job's controller fills from the PriorityClass, as Kueue's own integrations do);
- holds the job, with no pods, until Kueue admits the Workload; then adds the admitted flavors' node labels and
  tolerations (and the admission checks' podSetUpdates) to the pods and starts it;
- on eviction (condition Evicted) deletes the pods (SIGTERM and their grace period to checkpoint) and, once they
  are gone, gives the quota back: the Workload's admission cleared, QuotaReserved False, Requeued (Kueue's job
  reconciler does the same, step 6); admitted again, the job resumes from its checkpoint;
- says in the Workload's PodsReady condition whether the job's pods run, which Kueue's ``waitForPodsReady`` reads
  (without it Kueue evicts every admitted job once the timeout passes);
- marks the Workload Finished when the job ends, so that its quota goes to the next one.

Deleting the job deletes the Workload through its owner reference. Nothing here does I/O: the controller reads the
Workload and the ResourceFlavors it names, and writes what these functions return.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum
from typing import Any, Final

from kubetrain.core import api
from kubetrain.core.api import ConditionType, Phase
from kubetrain.core.spec import TrainingJob
from kubetrain.core.status import PodState, count_nodes, set_condition
from kubetrain.core.status_policy import Draft, Event

__all__ = [
    "KUEUE",
    "QUEUE_LABEL",
    "Admission",
    "Placement",
    "QueuePosition",
    "QueueState",
    "build_workload",
    "default_priority_class",
    "finished_patch",
    "hold",
    "placed",
    "placement",
    "pods_ready_patch",
    "positions",
    "queue_name",
    "read_admission",
    "record_admission",
    "release_patch",
    "waiting_message",
    "workload_name",
    "workload_spec_patch",
]

Json = Any

QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
POD_SET: Final = "trainer"  # the Workload's one pod set: every node of the job runs the same pod
# The reason of a job whose Workload Kueue has not answered yet (Kueue's own reasons follow once it has).
WAITING_FOR_KUEUE: Final = "WaitingForKueue"
ADMISSION_CHECKS_PENDING: Final = "AdmissionChecksPending"  # quota reserved; an admission check has not said Ready
PODS_READY: Final = "PodsReady"
# Kueue's reasons and words for PodsReady (generatePodsReadyCondition in pkg/controller/jobframework/reconciler.go).
_WAIT_FOR_START: Final = ("WaitForStart", "Not all pods are ready or succeeded")
_WAIT_FOR_RECOVERY: Final = ("WaitForRecovery", "At least one pod has failed, waiting for recovery")
_READY_MESSAGE: Final = "All pods reached readiness and the workload is running"


class KUEUE:
    """The Kueue API the operator speaks: v1beta2 is what v0.17.0 serves and stores."""

    GROUP: Final = "kueue.x-k8s.io"
    VERSION: Final = "v1beta2"
    API_VERSION: Final = f"{GROUP}/{VERSION}"
    WORKLOAD: Final = "Workload"
    WORKLOADS: Final = "workloads"
    RESOURCE_FLAVORS: Final = "resourceflavors"
    # The visibility API: a LocalQueue's pending Workloads in order, served by Kueue through the API server's
    # aggregation layer (APIService v1beta2.visibility.kueue.x-k8s.io).
    VISIBILITY_GROUP: Final = f"visibility.{GROUP}"
    LOCAL_QUEUES: Final = "localqueues"
    PENDING_WORKLOADS: Final = "pendingworkloads"
    # Labels and annotation Kueue's integrations put on an admitted job's pods (pkg/controller/constants).
    JOB_UID_LABEL: Final = f"{GROUP}/job-uid"


class QueueState(StrEnum):
    WAITING = "Waiting"  # no Workload yet, or Kueue has not reserved quota for it
    ADMITTED = "Admitted"
    EVICTED = "Evicted"  # admitted once, then evicted (preempted, deactivated, pods not ready in time...)
    FINISHED = "Finished"


@dataclass(frozen=True)
class Admission:
    """What Kueue says of a job's Workload."""

    state: QueueState
    reason: str
    message: str
    quota_reserved: bool = False
    cluster_queue: str | None = None
    flavors: tuple[str, ...] = ()  # the ResourceFlavors of the pod set's assignment, each once
    pod_set_updates: tuple[Mapping[str, Json], ...] = ()
    since: str | None = None  # when Kueue admitted it (Admitted's lastTransitionTime): tells re-admissions apart
    count: int | None = None  # the pods Kueue admitted: fewer than requested for an elastic job admitted in part
    requested: int | None = None  # the pods the Workload asks for (its pod set's count)
    position: QueuePosition | None = None  # where it waits, when Kueue's visibility API says (positions)


@dataclass(frozen=True)
class QueuePosition:
    """Where a pending Workload stands in Kueue's queues, counted from 1: the next one Kueue will try to admit."""

    local_queue: int
    cluster_queue: int

    def as_status(self) -> dict[str, int]:
        return {"localQueue": self.local_queue, "clusterQueue": self.cluster_queue}


@dataclass(frozen=True)
class Placement:
    """What an admission adds to every pod of the job."""

    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Json], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)  # the admission checks' podSetUpdates'...
    annotations: Mapping[str, str] = field(default_factory=dict)  # ...(a ProvisioningRequest's, for one)
    nodes: int | None = None  # the pods admitted (Kueue's partial admission of an elastic job): at most this many


def queue_name(job: TrainingJob) -> str | None:
    """The LocalQueue the job asks for; None: Kueue has no say over it."""
    return job.labels.get(QUEUE_LABEL) or None


def workload_name(job: TrainingJob) -> str:
    """Named like Kueue's own (``<kind>-<name>-<hash>``): a job re-created under the same name gets a new one."""
    digest = hashlib.sha256(f"{api.KIND}/{job.uid}".encode()).hexdigest()[:5]
    return f"{api.SINGULAR}-{job.name}-{digest}"


def default_priority_class(classes: Sequence[Mapping[str, Json]]) -> Mapping[str, Json] | None:
    """The PriorityClass a job that names none gets, as Kueue's own integrations take it: the cluster's
    ``globalDefault`` one (the lowest in value if several say so), else None (priority 0)."""
    defaults = [c for c in classes if c.get("globalDefault")]
    return min(defaults, key=lambda c: int(c.get("value") or 0)) if defaults else None


def build_workload(job: TrainingJob, pod: Mapping[str, Json], priority: int,
                   class_name: str | None = None) -> dict[str, Json]:
    """The job's Workload. ``pod``: one of its pods as the operator builds it (manifests.build_pod); ``priority``
    and ``class_name``: the job's PriorityClass's value and name, or the cluster's default one's
    (default_priority_class), or 0 and None. The priority is always set, as Kueue's own integrations set it:
    Kueue v0.17.0's visibility API dereferences it and fails the whole LocalQueue's answer (a nil-pointer panic,
    HTTP 503 through the aggregator) for one Workload without it."""
    template_spec = {k: v for k, v in pod["spec"].items() if k not in ("hostname", "schedulingGroup")}
    spec: dict[str, Json] = {
        "active": True,
        "queueName": queue_name(job),
        "podSets": [{"name": POD_SET, **_pod_counts(job), "template": {
            "metadata": {"labels": dict(pod["metadata"].get("labels") or {})}, "spec": template_spec}}],
    }
    class_name = job.spec.scheduling.priority_class_name or class_name
    if class_name:
        spec["priorityClassRef"] = {"group": "scheduling.k8s.io", "kind": "PriorityClass", "name": class_name}
    spec["priority"] = priority
    return {
        "apiVersion": KUEUE.API_VERSION,
        "kind": KUEUE.WORKLOAD,
        "metadata": {
            "name": workload_name(job),
            "namespace": job.namespace,
            # Kueue names the job by this label in its messages ("Preempted to accommodate ... JobUID: <uid>").
            "labels": {api.LABEL.JOB_NAME: job.name, api.LABEL.JOB_UID: job.uid, KUEUE.JOB_UID_LABEL: job.uid},
            "ownerReferences": [{"apiVersion": api.API_VERSION, "kind": api.KIND, "name": job.name, "uid": job.uid,
                                 "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": spec,
    }


def _pod_counts(job: TrainingJob) -> dict[str, int]:
    """A fixed gang starts whole or not at all: no minCount, so Kueue admits spec.nodes pods or none. An elastic one
    may start with spec.elastic.minNodes: Kueue's partial admission then admits as many as the quota allows."""
    elastic = job.spec.elastic
    if elastic is None or elastic.min_nodes >= job.spec.nodes:
        return {"count": job.spec.nodes}
    return {"count": job.spec.nodes, "minCount": elastic.min_nodes}


def _condition(workload: Mapping[str, Json], kind: str) -> Mapping[str, Json]:
    conditions = (workload.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), {})


def _true(condition: Mapping[str, Json]) -> bool:
    return condition.get("status") == "True"


def read_admission(workload: Mapping[str, Json] | None) -> Admission:
    """Kueue's answer, first what ends the job's hold or cancels it: Finished, Evicted, Admitted, else waiting
    (with the reason of QuotaReserved=False: Pending with the flavors it could not assign, Inadmissible for a
    LocalQueue that does not exist...)."""
    if workload is None:
        return Admission(QueueState.WAITING, WAITING_FOR_KUEUE, "the job's Workload is being made")
    reserved = _true(_condition(workload, "QuotaReserved"))
    for kind, state in (("Finished", QueueState.FINISHED), ("Evicted", QueueState.EVICTED)):
        found = _condition(workload, kind)
        if _true(found):
            return Admission(state, found.get("reason") or kind, found.get("message") or "", reserved)
    if _true(_condition(workload, "Admitted")):
        admitted = _condition(workload, "Admitted")
        cluster_queue = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue")
        return Admission(QueueState.ADMITTED, admitted.get("reason") or "Admitted", admitted.get("message") or "",
                         reserved, cluster_queue, _flavors(workload), _pod_set_updates(workload),
                         admitted.get("lastTransitionTime"), *_counts(workload))
    quota = _condition(workload, "QuotaReserved")
    checks = [c for c in (workload.get("status") or {}).get("admissionChecks") or [] if c.get("state") != "Ready"]
    if reserved and checks:  # Kueue admits once every admission check of the ClusterQueue says Ready
        said = "; ".join(_check_said(check) for check in checks)
        return Admission(QueueState.WAITING, ADMISSION_CHECKS_PENDING,
                         f"quota reserved, waiting for admission checks: {said}", reserved)
    if quota:
        return Admission(QueueState.WAITING, quota.get("reason") or "Pending", quota.get("message") or "", reserved)
    return Admission(QueueState.WAITING, WAITING_FOR_KUEUE, "Kueue has not considered the Workload yet", reserved)


def positions(summary: Mapping[str, Json]) -> dict[str, QueuePosition]:
    """The positions of a LocalQueue's pending Workloads by name, from its PendingWorkloadsSummary (Kueue's
    visibility API, which counts from 0 and lists at most 1,000)."""
    return {str(item["metadata"]["name"]): QueuePosition(int(item.get("positionInLocalQueue") or 0) + 1,
                                                         int(item.get("positionInClusterQueue") or 0) + 1)
            for item in summary.get("items") or [] if (item.get("metadata") or {}).get("name")}


def _counts(workload: Mapping[str, Json]) -> tuple[int | None, int | None]:
    """The pods admitted (the pod set's assignment's count) and asked for (its pod set's count)."""
    assignments = ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    admitted = next((a.get("count") for a in assignments if a.get("name") == POD_SET), None)
    pod_sets = (workload.get("spec") or {}).get("podSets") or []
    requested = next((p.get("count") for p in pod_sets if p.get("name") == POD_SET), None)
    return (None if admitted is None else int(admitted)), (None if requested is None else int(requested))


def _check_said(check: Mapping[str, Json]) -> str:
    """One admission check's state and words: ``capacity Pending: waiting for 2 nodes``."""
    said = f"{check.get('name')} {check.get('state') or 'Pending'}"
    return f"{said}: {check['message']}" if check.get("message") else said


def _flavors(workload: Mapping[str, Json]) -> tuple[str, ...]:
    assignments = ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    names = [flavor for assignment in assignments if assignment.get("name") == POD_SET
             for flavor in (assignment.get("flavors") or {}).values()]
    return tuple(dict.fromkeys(names))


def _pod_set_updates(workload: Mapping[str, Json]) -> tuple[Mapping[str, Json], ...]:
    checks = (workload.get("status") or {}).get("admissionChecks") or []
    return tuple(update for check in checks for update in check.get("podSetUpdates") or []
                 if update.get("name") == POD_SET)


def placement(admission: Admission, flavors: Mapping[str, Mapping[str, Json]]) -> Placement:
    """The flavors' node labels and tolerations, then the admission checks' updates' node selectors, tolerations,
    pod labels and annotations, as Kueue's podset.FromAssignment and FromUpdate merge them; ``flavors``: the
    ResourceFlavor objects by name. ValueError on a key that two of them set differently (Kueue fails such a start
    too)."""
    selector: dict[str, str] = {}
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    tolerations: list[Mapping[str, Json]] = []
    parts = [(f"ResourceFlavor {name}", flavors[name].get("spec") or {}) for name in admission.flavors]
    for source, part in parts:
        _merge(selector, part.get("nodeLabels") or {}, source)
        tolerations += [t for t in part.get("tolerations") or [] if t not in tolerations]
    for update in admission.pod_set_updates:
        source = "an admission check's podSetUpdate"
        _merge(selector, update.get("nodeSelector") or {}, source, "node label")
        _merge(labels, update.get("labels") or {}, source, "pod label")
        _merge(annotations, update.get("annotations") or {}, source, "pod annotation")
        tolerations += [t for t in update.get("tolerations") or [] if t not in tolerations]
    return Placement(selector, tuple(tolerations), labels, annotations, admission.count)


def _merge(into: dict[str, str], labels: Mapping[str, str], source: str, what: str = "node label") -> None:
    for key, value in labels.items():
        if into.get(key, value) != value:
            raise ValueError(f"{source} needs {what} {key}={value}, which conflicts with {key}={into[key]}")
        into[key] = value


def placed(job: TrainingJob, where: Placement) -> TrainingJob:
    """The job as its pods must be made under this admission: no more nodes than Kueue admitted (an elastic job
    admitted in part runs with fewer, as Kueue's own integrations run a Job with the admitted parallelism), Kueue's
    node labels and tolerations added to its own, and the admission checks' pod labels and annotations
    (ValueError on a node label the job sets otherwise, or on a label or annotation in the operator's own domain,
    whose values it decides)."""
    scheduling = job.spec.scheduling
    selector = dict(scheduling.node_selector)
    _merge(selector, where.node_selector, "Kueue's admission")
    owned = [key for key in (*where.labels, *where.annotations) if key.startswith(f"{api.GROUP}/")]
    if owned:
        raise ValueError(f"an admission check's podSetUpdate sets {owned[0]}, a key the operator owns")
    tolerations = tuple(scheduling.tolerations) + tuple(t for t in where.tolerations if t not in scheduling.tolerations)
    new_scheduling = replace(scheduling, node_selector=selector, tolerations=tolerations,
                             pod_labels=dict(where.labels), pod_annotations=dict(where.annotations))
    nodes = job.spec.nodes if where.nodes is None else min(job.spec.nodes, where.nodes)
    return replace(job, spec=replace(job.spec, scheduling=new_scheduling, nodes=nodes))


def workload_spec_patch(workload: Mapping[str, Json], job: TrainingJob) -> dict[str, Json] | None:
    """The Workload kept in step with its job: inactive while the job is suspended (Kueue then evicts it, reason
    Deactivated, and the quota goes back once the pods are gone), and the pod count of an elastic job resized while
    it waits (Kueue refuses that change while quota is reserved). None when nothing is to change."""
    spec = workload.get("spec") or {}
    patch: dict[str, Json] = {}
    active = not job.spec.run_policy.suspend
    if spec.get("active", True) != active:
        patch["active"] = active
    pod_sets = [dict(p) for p in spec.get("podSets") or []]
    counts = _pod_counts(job)
    asked = {k: pod_sets[0][k] for k in ("count", "minCount") if pod_sets and k in pod_sets[0]}
    if pod_sets and asked != counts and not _true(_condition(workload, "QuotaReserved")):
        pod_sets[0] = {**{k: v for k, v in pod_sets[0].items() if k not in asked}, **counts}
        patch["podSets"] = pod_sets
    if not patch:
        return None
    return {"metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]}, "spec": patch}


def _status_patch(workload: Mapping[str, Json], conditions: Sequence[Mapping[str, Json]],
                  **fields: Json) -> dict[str, Json]:
    """A merge patch of the Workload's status, guarded by its resourceVersion (Kueue writes the same conditions)."""
    return {"metadata": {"resourceVersion": workload["metadata"]["resourceVersion"]},
            "status": {"conditions": list(conditions), **fields}}


def _set(conditions: Sequence[Mapping[str, Json]], kind: str, value: bool, reason: str, message: str, *,
         now: datetime, generation: int) -> list[dict[str, Json]]:
    return set_condition(conditions, kind, value, reason, message[:32768], now=now, generation=generation)


def release_patch(workload: Mapping[str, Json], now: datetime) -> dict[str, Json] | None:
    """After an eviction, once the job's pods are gone: the admission cleared, QuotaReserved and Admitted False,
    Requeued (True for a preemption or node failures, whose job goes back to the queue at once), as Kueue's job
    reconciler writes it. None while nothing is reserved any more."""
    evicted = _condition(workload, "Evicted")
    if not _true(evicted) or not _true(_condition(workload, "QuotaReserved")):
        return None
    generation = int(workload["metadata"].get("generation") or 0)
    reason, message = evicted.get("reason") or "Evicted", evicted.get("message") or ""
    conditions = (workload.get("status") or {}).get("conditions") or []
    conditions = _set(conditions, "Requeued", reason in ("Preempted", "NodeFailures"), reason, message,
                      now=now, generation=generation)
    conditions = _set(conditions, "QuotaReserved", False, "Pending", message, now=now, generation=generation)
    conditions = _set(conditions, "Admitted", False, "NoReservation", "The workload has no reservation",
                      now=now, generation=generation)
    if _condition(workload, PODS_READY):  # the next admission's pods are waited for afresh
        conditions = _set(conditions, PODS_READY, False, *_WAIT_FOR_START, now=now, generation=generation)
    return _status_patch(workload, conditions, admission=None)


def pods_ready_patch(workload: Mapping[str, Json], running: bool, now: datetime) -> dict[str, Json] | None:
    """An admitted job's PodsReady condition, as Kueue's integrations write it: True once its pods run (Started;
    Recovered after a restart), False while they start (WaitForStart) or after they ran and the gang restarts
    (WaitForRecovery, for Kueue's recoveryTimeout). Kueue's waitForPodsReady evicts an admitted Workload whose
    condition is not True within its timeout, and with blockAdmission admits nothing else meanwhile. ``running``:
    the job's phase is Running. None when the condition says so already."""
    current = _condition(workload, PODS_READY)
    value, reason, message = _pods_ready(current, running)
    if current and _true(current) == value and current.get("reason") == reason:
        return None
    generation = int(workload["metadata"].get("generation") or 0)
    conditions = _set((workload.get("status") or {}).get("conditions") or [], PODS_READY, value, reason, message,
                      now=now, generation=generation)
    return _status_patch(workload, conditions)


def _pods_ready(current: Mapping[str, Json], running: bool) -> tuple[bool, str, str]:
    recovering = current.get("reason") in (_WAIT_FOR_RECOVERY[0], "Recovered")
    if running:
        return True, "Recovered" if recovering else "Started", _READY_MESSAGE
    if _true(current) or current.get("reason") == _WAIT_FOR_RECOVERY[0]:
        return (False, *_WAIT_FOR_RECOVERY)
    return (False, *_WAIT_FOR_START)


def finished_patch(workload: Mapping[str, Json], succeeded: bool, message: str,
                   now: datetime) -> dict[str, Json] | None:
    """The job ended: the Workload Finished (reason Succeeded or Failed, as Kueue's integrations say), which frees its
    quota. None when it says so already."""
    if _true(_condition(workload, "Finished")):
        return None
    generation = int(workload["metadata"].get("generation") or 0)
    conditions = _set((workload.get("status") or {}).get("conditions") or [], "Finished", True,
                      "Succeeded" if succeeded else "Failed", message or "the TrainingJob finished",
                      now=now, generation=generation)
    return _status_patch(workload, conditions)


def waiting_message(job: TrainingJob, admission: Admission) -> str:
    """The job's status message while it waits for Kueue, its position and Kueue's own words included."""
    where = f"LocalQueue {queue_name(job)}"
    if admission.position is not None:
        where += (f" at position {admission.position.local_queue}"
                  f" ({admission.position.cluster_queue} in its ClusterQueue)")
    what = f"queued in Kueue {where}"
    if admission.state is QueueState.EVICTED:
        what = f"evicted by Kueue ({admission.reason}), queued again in {where}"
    elif admission.state is QueueState.FINISHED:
        what = f"Kueue marked its Workload finished ({admission.reason}) before the job ended"
    return f"{what}: {admission.message}" if admission.message else what


# --- The job's side: lifecycle's steps for a queued job --------------------------------------------------------


def hold(draft: Draft, pods: Sequence[PodState], admission: Admission) -> None:
    """Not admitted, or evicted: the job holds nothing. Its pods are deleted (SIGTERM and the grace period to write a
    checkpoint), checkpoints kept; it waits Queued, condition Admitted False with Kueue's reason and words."""
    draft.remove(list(pods))
    message = waiting_message(draft.job, admission)
    if draft.status.get("phase") != Phase.QUEUED:
        evicted = admission.state is QueueState.EVICTED
        draft.events.append(Event("Warning" if evicted else "Normal", "Evicted" if evicted else "Queued",
                                  message[:1024]))
    draft.phase(Phase.QUEUED, message)
    draft.condition(ConditionType.ADMITTED, False, admission.reason, message)
    draft.condition(ConditionType.RUNNING, False, admission.reason, message)
    draft.status["nodes"] = count_nodes(draft.job.spec.nodes, [p for p in pods if not p.deleting]).as_status()
    draft.status["gpus"] = 0
    if admission.position is not None:
        draft.status["queuePosition"] = admission.position.as_status()


def record_admission(draft: Draft, admission: Admission) -> None:
    """Admitted: said in condition Admitted (the ClusterQueue named), and an event the first time."""
    message = f"admitted by Kueue in ClusterQueue {admission.cluster_queue}"
    if admission.count is not None and admission.requested is not None and admission.count < admission.requested:
        message += (f" for {admission.count} of {admission.requested} nodes (partial admission of an elastic job: "
                    "the quota left no room for more)")
    known = next((c for c in draft.status.get("conditions") or [] if c.get("type") == ConditionType.ADMITTED), None)
    if known is None or known.get("status") != "True":
        draft.events.append(Event("Normal", "Admitted", message))
    draft.condition(ConditionType.ADMITTED, True, "Admitted", message)
