"""Pure functions from pods (as the API returns them) to the facts a TrainingJob's status is made of."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from kubetrain.core import api

__all__ = [
    "CheckpointAnswer",
    "CheckpointAsk",
    "FailureKind",
    "LastRun",
    "NodeCounts",
    "PodState",
    "Progress",
    "Scrape",
    "count",
    "count_nodes",
    "format_duration",
    "in_range",
    "isoformat",
    "merge_patch",
    "owned_by",
    "parse_time",
    "pod_state",
    "progress_status",
    "set_condition",
    "some_names",
    "with_last_run_kept",
]

Json = Any


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def some_names(names: Sequence[str]) -> str:
    """The first few names, and how many more: a message about a 4,096-pod gang stays short."""
    shown = ", ".join(names[:api.MAX_NAMES_LISTED])
    more = len(names) - api.MAX_NAMES_LISTED
    return f"{shown} and {more} more" if more > 0 else shown


def isoformat(moment: datetime) -> str:
    """RFC 3339 in UTC with a Z, as Kubernetes writes times."""
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class FailureKind(StrEnum):
    """The failure taxonomy: each kind gets its own action (see failures.py)."""

    ERROR = "Error"  # non-zero exit of the program: counts against backoffLimit
    OOM = "OOMKilled"  # the kernel killed it for memory: fails the job unless restartOnOOM
    DISRUPTION = "Disrupted"  # preemption, eviction, node loss: restart without counting
    RENDEZVOUS_TIMEOUT = "RendezvousTimeout"  # torchrun gave up waiting for the gang: fails the job


# The DisruptionTarget reason of a pod the taint manager deletes (NoExecute: node unreachable or not ready).
TAINT_EVICTION_REASON = "DeletionByTaintManager"

# What torchrun's agent raises when the gang does not all join within its join_timeout; the kubelet keeps the
# traceback's tail as the termination message (FallbackToLogsOnError).
RENDEZVOUS_TIMEOUT_ERROR = "RendezvousTimeoutError"
# The reason of the last state of a container that the kubelet restarted in place (not the run's own end).
KUBELET_RESTART_REASON = "RestartingAllContainers"
# What the other agents raise when one agent closed the rendezvous on its way out (a consequence, not a cause).
RENDEZVOUS_CLOSED_ERROR = "RendezvousClosedError"
# What the other agents raise when node 0, which hosts the rendezvous store, is not there within read_timeout.
RENDEZVOUS_CONNECTION_ERROR = "RendezvousConnectionError"


# Pod-level reasons that mean the platform, not the program, ended the pod.
_DISRUPTION_REASONS = frozenset({"Evicted", "Preempting", "NodeLost", "Shutdown", "Terminated",
                                 "DeletionByTaintManager", "TerminationByKubelet"})
# PodScheduled=False reasons of a pod the scheduler tried and failed to place.
_UNPLACED = frozenset({"Unschedulable", "SchedulerError"})


@dataclass(frozen=True, slots=True)
class LastRun:
    """How the run before the container's current one ended: the kubelet restarted the pod's containers in
    place (manifests.in_place_rule), and the pod lives on with its name, uid, IP and volumes."""

    exit_code: int | None
    reason: str | None
    message: str | None
    finish_time: datetime | None


@dataclass(frozen=True, slots=True)
class PodState:
    """What the operator needs to know about one pod: what its index keeps of each pod it watches."""

    name: str
    index: int
    attempt: int
    phase: str
    scheduled: bool
    ready: bool
    node: str | None
    exit_code: int | None
    reason: str | None
    message: str | None
    disrupted: bool
    deleting: bool
    deletion_time: datetime | None
    start_time: datetime | None
    finish_time: datetime | None
    job_uid: str | None = None  # the job it belongs to (see owned_by)
    # Its node stopped answering and the taint manager evicted it: the kubelet cannot confirm its end.
    node_lost: bool = False
    ip: str | None = None  # where its metrics are scraped
    has_owner: bool = True  # has an owner reference (one made just before a crash may lack it: adopted)
    # Why the scheduler does not place it (its PodScheduled=False message; for a gang, the whole group's reason).
    unschedulable: str | None = None
    uid: str | None = None  # this incarnation of the pod (a replacement has the same name, another uid)
    restarts: int = 0  # its container's runs restarted in place by the kubelet (restartCount)
    last_run: LastRun | None = None  # how the last of those runs ended

    @property
    def finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def running(self) -> bool:
        return self.phase == "Running" and not self.deleting

    @property
    def failure_kind(self) -> FailureKind | None:
        if self.phase != "Failed":
            return None
        if self.reason == "OOMKilled":
            return FailureKind.OOM
        if self.disrupted:
            return FailureKind.DISRUPTION
        if RENDEZVOUS_TIMEOUT_ERROR in (self.message or ""):
            return FailureKind.RENDEZVOUS_TIMEOUT
        return FailureKind.ERROR

    def final_report(self) -> Mapping[str, Json] | None:
        """The trainer's last words (JSON in the termination message), if it left any."""
        if not self.message:
            return None
        try:
            report = json.loads(self.message)
        except ValueError:
            return None
        return report if isinstance(report, dict) else None


def owned_by(metadata: Mapping[str, Json]) -> str | None:
    """The uid of the job a child object belongs to: its job-uid label, else its controller's uid.

    The controller reference covers children made before the label existed; None when neither is there
    (e.g. a child whose job was deleted with --cascade=orphan, which strips owner references).
    """
    uid = (metadata.get("labels") or {}).get(api.LABEL.JOB_UID)
    if uid:
        return str(uid)
    for owner in metadata.get("ownerReferences") or []:
        if owner.get("controller") and owner.get("kind") == api.KIND:
            return str(owner.get("uid"))
    return None


def _condition(pod: Mapping[str, Json], kind: str) -> Mapping[str, Json] | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == kind:
            found: Mapping[str, Json] = condition
            return found
    return None


def _is_true(condition: Mapping[str, Json] | None) -> bool:
    return condition is not None and condition.get("status") == "True"


def pod_state(pod: Mapping[str, Json]) -> PodState:
    """Summarise a pod object (a dict as the API returns it)."""
    metadata = pod.get("metadata", {})
    labels = metadata.get("labels") or {}
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    container: Mapping[str, Json] = next((c for c in containers if c.get("name") == api.CONTAINER_NAME), {})
    terminated: Mapping[str, Json] = (container.get("state") or {}).get("terminated") or {}
    pod_reason = status.get("reason")
    restarts, last_run = _restarted_in_place(pod, container, terminated)
    disruption = _condition(pod, "DisruptionTarget")
    placing = _condition(pod, "PodScheduled") or {}
    return PodState(
        name=metadata.get("name", ""),
        index=int(labels.get(api.LABEL.NODE_INDEX, -1)),
        attempt=int(labels.get(api.LABEL.ATTEMPT, -1)),
        phase=status.get("phase") or "Pending",
        scheduled=_is_true(_condition(pod, "PodScheduled")) or bool(pod.get("spec", {}).get("nodeName")),
        ready=_is_true(_condition(pod, "Ready")),
        node=pod.get("spec", {}).get("nodeName"),
        exit_code=terminated.get("exitCode"),
        reason=terminated.get("reason") or pod_reason,
        message=terminated.get("message") or status.get("message"),
        disrupted=_is_true(disruption) or pod_reason in _DISRUPTION_REASONS,
        deleting=metadata.get("deletionTimestamp") is not None,
        deletion_time=parse_time(metadata.get("deletionTimestamp")),
        start_time=parse_time(status.get("startTime")),
        finish_time=parse_time(terminated.get("finishedAt")),
        job_uid=owned_by(metadata),
        node_lost=(disruption or {}).get("reason") == TAINT_EVICTION_REASON,
        ip=status.get("podIP"),
        has_owner=bool(metadata.get("ownerReferences")),
        unschedulable=placing.get("message") or placing.get("reason") if placing.get("reason") in _UNPLACED else None,
        uid=metadata.get("uid"),
        restarts=restarts,
        last_run=last_run,
    )


def _restarted_in_place(pod: Mapping[str, Json], container: Mapping[str, Json],
                        terminated: Mapping[str, Json]) -> tuple[int, LastRun | None]:
    """PodState's restarts and last_run. While the kubelet restarts the pod's containers (its condition
    AllContainersRestarting), the container's state is the run that just ended, which is about to count; after,
    lastState only says that the kubelet removed the container (KUBELET_RESTART_REASON), and the run's own end is
    known only to a pass that saw it on the way (with_last_run_kept)."""
    restarts = int(container.get("restartCount") or 0)
    if _is_true(_condition(pod, "AllContainersRestarting")) and terminated:
        return restarts + 1, _run(terminated)
    ended = (container.get("lastState") or {}).get("terminated") or {}
    if not restarts or not ended:
        return restarts, None
    if ended.get("reason") == KUBELET_RESTART_REASON:
        return restarts, LastRun(None, None, None, None)
    return restarts, _run(ended)


def with_last_run_kept(before: PodState | None, now: PodState) -> PodState:
    """``now``, keeping how its last run ended where ``before`` (the same pod, the same restart count) saw it while
    the kubelet restarted the pod and ``now`` no longer shows it (a reconcile may come after that second)."""
    if (before is None or before.last_run is None or now.last_run is None or before.uid != now.uid
            or before.restarts != now.restarts or now.last_run.exit_code is not None):
        return now
    return replace(now, last_run=before.last_run)


def _run(ended: Mapping[str, Json]) -> LastRun:
    return LastRun(exit_code=ended.get("exitCode"), reason=ended.get("reason"), message=ended.get("message"),
                   finish_time=parse_time(ended.get("finishedAt")))


@dataclass(frozen=True)
class NodeCounts:
    desired: int
    active: int
    ready: int
    succeeded: int
    failed: int

    def as_status(self) -> dict[str, Json]:
        return {
            "desired": self.desired, "active": self.active, "ready": self.ready,
            "succeeded": self.succeeded, "failed": self.failed, "summary": f"{self.ready}/{self.desired}",
        }


def count_nodes(desired: int, pods: Iterable[PodState]) -> NodeCounts:
    """Counts over the pods of one attempt."""
    current = list(pods)
    return NodeCounts(
        desired=desired,
        active=sum(1 for p in current if not p.finished and not p.deleting),
        ready=sum(1 for p in current if p.running and p.ready),
        succeeded=sum(1 for p in current if p.phase == "Succeeded"),
        failed=sum(1 for p in current if p.phase == "Failed"),
    )


def set_condition(
    conditions: Sequence[Mapping[str, Json]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    *,
    now: datetime,
    generation: int,
) -> list[dict[str, Json]]:
    """Conditions with ``kind`` set; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    result: list[dict[str, Json]] = []
    found = False
    for condition in conditions:
        if condition.get("type") != kind:
            result.append(dict(condition))
            continue
        found = True
        changed = condition.get("status") != value
        result.append({
            "type": kind, "status": value, "reason": reason, "message": message,
            "observedGeneration": generation,
            "lastTransitionTime": isoformat(now) if changed else condition.get("lastTransitionTime", isoformat(now)),
        })
    if not found:
        result.append({"type": kind, "status": value, "reason": reason, "message": message,
                       "observedGeneration": generation, "lastTransitionTime": isoformat(now)})
    return result


def format_duration(seconds: float) -> str:
    """Compact, human: 45s, 12m, 3h05m, 2d04h."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


# Bounds on what a user's program may report (its metrics and its last words are not trusted): beyond
# them a value is a broken counter, not a fast job, and is dropped rather than written to the status.
MAX_COUNT = 2**53 - 1  # steps, epochs: exact in a float and in the API server's int64
MAX_SAMPLES_PER_SECOND = 1e12
MAX_SECONDS_PER_STEP = 1e7
MAX_ETA_SECONDS = 10 * 365 * 86400  # an ETA further out than ten years is shown as none


def in_range(value: object, low: float, high: float) -> float | None:
    """``value`` as a float when it is a finite number within [low, high]; else None (NaN, infinite, absurd,
    not a number at all)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        return None
    return number if math.isfinite(number) and low <= number <= high else None


def count(value: object, high: int = MAX_COUNT) -> int | None:
    """``value`` as a non-negative integer (a step, an epoch) when it is one within bounds; else None."""
    number = in_range(value, 0, high)
    return int(number) if number is not None else None


@dataclass(frozen=True)
class Progress:
    """What rank 0 of the trainer reports (scraped from its metrics, or from its last words)."""

    step: int
    total_steps: int | None = None
    epoch: int | None = None
    loss: float | None = None
    samples_per_second: float | None = None
    heartbeat: datetime | None = None
    checkpoint_step: int | None = None
    resumed_from_step: int | None = None
    seconds_per_step: float | None = None  # mean step time of the attempt: the ETA when samples/step is unknown


def _loss_text(loss: float) -> str:
    if not math.isfinite(loss):
        return str(loss)
    return f"{loss:.4g}"


@dataclass(frozen=True)
class CheckpointAsk:
    """A request the controller is to make: rank 0 to checkpoint now, for ``node``'s ``notice`` (notices.py)."""

    node: str
    notice: str


@dataclass(frozen=True)
class CheckpointAnswer:
    """How a CheckpointAsk went: ``error`` is None when rank 0 took it."""

    ask: CheckpointAsk
    error: str | None = None


@dataclass(frozen=True)
class Scrape:
    """One read of rank 0's metrics endpoint: what it reported, or why it could not be read."""

    progress: Progress | None = None  # None when the page has no training step yet
    error: str | None = None  # connection refused, timeout, an HTTP error, a page that does not parse
    # The read before this one succeeded: a failure is read again before it is reported (see status_policy.py).
    first_failure: bool = False

    @property
    def failed(self) -> bool:
        return self.error is not None


def _eta(progress: Progress, total: int, step: int, samples_per_step: int | None) -> str | None:
    """Time left from the sample rate (or the mean step time); None when neither gives a sane answer."""
    if step >= total:
        return "0s"
    rate = in_range(progress.samples_per_second, 0, MAX_SAMPLES_PER_SECOND)
    step_time = in_range(progress.seconds_per_step, 0, MAX_SECONDS_PER_STEP)
    if rate and samples_per_step:
        seconds = (total - step) * samples_per_step / rate
    elif step_time:
        seconds = (total - step) * step_time
    else:
        return None
    return format_duration(seconds) if seconds <= MAX_ETA_SECONDS else None


def progress_status(
    progress: Progress, total_steps: int | None, samples_per_step: int | None, now: datetime
) -> dict[str, Json]:
    """status.progress from a progress report; the total from the report, else from the spec.

    The ETA divides the remaining steps by the step rate, which is the reported sample rate over
    the samples one optimizer step consumes (batch size x accumulation x world size); for a user program,
    whose samples per step the spec does not say, the mean step time it reported. Whatever the report holds
    (NaN, infinities, negative or absurd numbers), the result is valid JSON within the CRD's schema: such
    values are left out, and a heartbeat from the future counts as now.
    """
    step = count(progress.step) or 0
    total = count(progress.total_steps) or count(total_steps)
    result: dict[str, Json] = {"step": step, "updatedAt": isoformat(now)}
    if total:
        percent = min(100, int(100 * step / total))
        result |= {"totalSteps": total, "percent": percent, "summary": f"{percent}% ({step}/{total})"}
        eta = _eta(progress, total, step, samples_per_step)
        if eta is not None:
            result["eta"] = eta
    else:
        result["summary"] = f"step {step}"
    if count(progress.epoch) is not None:
        result["epoch"] = count(progress.epoch)
    if progress.loss is not None and math.isfinite(progress.loss):
        result["loss"] = progress.loss
    if progress.loss is not None:
        result["lossText"] = _loss_text(progress.loss)
    rate = in_range(progress.samples_per_second, 0, MAX_SAMPLES_PER_SECOND)
    if rate is not None:
        result["samplesPerSecond"] = round(rate, 3)
        result["throughputText"] = f"{rate:.1f}"
    if progress.heartbeat is not None:
        result["heartbeatTime"] = isoformat(min(progress.heartbeat, now))
    if count(progress.resumed_from_step) is not None:
        result["resumedFromStep"] = count(progress.resumed_from_step)
    return result


def merge_patch(old: Mapping[str, Json], new: Mapping[str, Json]) -> dict[str, Json]:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``; keys that disappeared become null."""
    patch: dict[str, Json] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            nested = merge_patch(before, value)
            if nested:
                patch[key] = nested
        elif before != value or key not in old:
            patch[key] = value
    return patch
