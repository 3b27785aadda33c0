"""What a job's status says, and when it is written: the decision that the reconcile assembles.

``Draft`` is the decision being assembled (lifecycle.py and failures.py take the steps); here are the parts of
it that every step shares: phase and conditions, what rank 0's progress says, the end of a job (Succeeded or
Failed, its pods cleaned up, its TTL), the GPU-seconds it used, and which status changes must be written
before the decision is carried out and which may wait.

The status written back is the operator's only memory (attempt, restarts, failures): what a crash must never
lose is written first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kubetrain.core import api
from kubetrain.core.api import ConditionType, Phase, Reason
from kubetrain.core.hangs import Hang
from kubetrain.core.spec import TrainingJob
from kubetrain.core.status import (
    CheckpointAnswer,
    CheckpointAsk,
    PodState,
    Progress,
    Scrape,
    count,
    count_nodes,
    isoformat,
    parse_time,
    progress_status,
    set_condition,
)

__all__ = [
    "FORCE_DELETE_AFTER",
    "SCRAPE_RECHECK_SECONDS",
    "Decision",
    "Draft",
    "Event",
    "changes_course",
    "clean_up_finished",
    "find_condition",
    "finish",
    "fold_gpu_seconds",
    "may_wait",
    "must_persist_before_acting",
    "progress_not_known_yet",
    "record_gpu_seconds",
    "record_scrape",
]

Json = Any

# A terminating pod whose node stopped answering never confirms its deletion: after its grace period
# plus this margin, the operator force-deletes it so that the next attempt can reuse the name. Only then:
# on a node that answers, the pod's processes may still run, and the next attempt must not start beside them.
FORCE_DELETE_AFTER = timedelta(seconds=30)
# A trainer that has finished stops serving while its pod still runs (torchrun's agents wait for each other,
# the kubelet reports the exit a second later): one failed read of rank 0 is read again this much later,
# and reported only if that fails too. Long enough for a node running at half speed: 3 s made a job that
# had just finished warn ScrapeFailed.
SCRAPE_RECHECK_SECONDS = 10.0
# What a crash must never lose: the attempt and the counts (and the post-mortem, status.failures).
_COUNTS = ("attempt", "restarts", "disruptions")


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Decision:
    """What the operator should do now; ``status`` is the complete new status."""

    status: dict[str, Json]
    create: tuple[int, ...] = ()
    delete: tuple[str, ...] = ()
    force_delete: tuple[str, ...] = ()
    events: tuple[Event, ...] = ()
    delete_job: bool = False
    requeue_after: float | None = None
    ask_checkpoint: CheckpointAsk | None = None  # rank 0 to be asked to checkpoint now (notices.py)


def _fenced(pod: PodState) -> bool:
    """Nothing of the pod can still run: its node is lost (the taint manager evicted it), or it never had one."""
    return pod.node_lost or not pod.scheduled


def _copied(value: Json) -> Json:
    """A copy of a status (JSON: dicts, lists and scalars) for a draft to change: a third of copy.deepcopy's
    time, which keeps a memo for cycles and shared parts that JSON never has."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


@dataclass
class Draft:
    """The decision being assembled by the steps of a reconcile."""

    job: TrainingJob
    now: datetime
    status: dict[str, Json]
    create: list[int] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    force_delete: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None
    # The cluster's Ready nodes open to pods, when the controller read them (nodes.exclude_failing_nodes).
    ready_nodes: frozenset[str] | None = None
    # The ranks' stacks compared, when the controller asked for them before a stall's restart (hangs.py).
    hang: Hang | None = None
    # The nodes that announce a disruption, and how asking rank 0 to checkpoint for one went (notices.py).
    notices: Mapping[str, str] = field(default_factory=dict)
    checkpoint_answer: CheckpointAnswer | None = None
    ask_checkpoint: CheckpointAsk | None = None  # decided: the controller asks, then decides again

    @classmethod
    def from_stored(cls, job: TrainingJob, status: Mapping[str, Json], now: datetime, *,
                    ready_nodes: frozenset[str] | None = None, hang: Hang | None = None,
                    notices: Mapping[str, str] | None = None,
                    checkpoint_answer: CheckpointAnswer | None = None) -> Draft:
        """A draft that starts from a copy of ``status`` (the stored one is never changed), with what else the
        controller read."""
        return cls(job=job, now=now, status=_copied(dict(status)), ready_nodes=ready_nodes, hang=hang,
                   notices=notices or {}, checkpoint_answer=checkpoint_answer)

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt", 0))

    def current(self, pods: Sequence[PodState]) -> list[PodState]:
        """The pods of this attempt."""
        return [p for p in pods if p.attempt == self.attempt]

    def condition(self, kind: str, value: bool, reason: str, message: str) -> None:
        self.status["conditions"] = set_condition(
            self.status.get("conditions", []), kind, value, reason, message[:api.MAX_CONDITION_MESSAGE], now=self.now,
            generation=self.job.generation
        )

    def phase(self, phase: Phase, message: str, event: Event | None = None) -> None:
        if self.status.get("phase") != phase and event is not None:
            self.events.append(event)
        self.status["phase"] = str(phase)
        self.status["message"] = message[:api.MAX_STATUS_MESSAGE]

    def requeue(self, seconds: float) -> None:
        seconds = max(1.0, seconds)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def remove(self, pods: Sequence[PodState]) -> None:
        """Delete pods gracefully; force-delete those stuck terminating on a lost node."""
        taken = {*self.delete, *self.force_delete}  # a set: a 4,096-pod gang is removed in one pass
        for pod in pods:
            if pod.name in taken:
                continue
            taken.add(pod.name)
            if not pod.deleting:
                self.delete.append(pod.name)
            elif _fenced(pod) and pod.deletion_time is not None and self.now >= pod.deletion_time + FORCE_DELETE_AFTER:
                self.force_delete.append(pod.name)
            else:
                self.requeue(FORCE_DELETE_AFTER.total_seconds())

    def decision(self) -> Decision:
        return Decision(
            status=self.status,
            create=tuple(self.create),
            delete=tuple(self.delete),
            force_delete=tuple(self.force_delete),
            events=tuple(self.events),
            delete_job=self.delete_job,
            requeue_after=self.requeue_after,
            ask_checkpoint=self.ask_checkpoint,
        )


def find_condition(status: Mapping[str, Json], kind: str) -> Mapping[str, Json] | None:
    return next((c for c in status.get("conditions", []) if c.get("type") == kind), None)


# --- What rank 0's progress says ---------------------------------------------------------------------


def record_scrape(draft: Draft, scrape: Scrape) -> None:
    """Rank 0's report, or that it could not be read: said in condition ProgressKnown, and never a stall."""
    known = find_condition(draft.status, ConditionType.PROGRESS_KNOWN)
    if not scrape.failed:
        if scrape.progress is not None:
            _record_progress(draft, scrape.progress)
        draft.condition(ConditionType.PROGRESS_KNOWN, True, Reason.METRICS_SCRAPED, "rank 0's metrics were read")
        return
    if draft.status.get("phase") != Phase.RUNNING:
        return  # pods still starting: the trainer is not serving yet
    if scrape.first_failure:
        draft.requeue(SCRAPE_RECHECK_SECONDS)
        return
    message = f"progress unknown: rank 0's metrics cannot be read ({scrape.error}); not judged a stall"
    if draft.job.spec.command is not None:  # the honest zero-code answer: the program has not reported
        message += ("; a program of its own (spec.command) serves them once it calls kubetrain_trainer.report() "
                    "(README: Your own training script)")
    draft.condition(ConditionType.PROGRESS_KNOWN, False, Reason.SCRAPE_FAILED, message)
    if known is not None and known.get("status") == "True":
        draft.events.append(Event("Warning", Reason.SCRAPE_FAILED, message[:1024]))


def progress_not_known_yet(draft: Draft) -> None:
    """A new attempt's progress is unknown until its rank 0 is read (and what the last one said is no stall); so is
    the step it resumed from, which the last attempt's must not stand for."""
    if find_condition(draft.status, ConditionType.PROGRESS_KNOWN) is not None:
        draft.condition(ConditionType.PROGRESS_KNOWN, False, Reason.NOT_SCRAPED_YET,
                        f"attempt {draft.attempt} has not been read yet")
    progress = draft.status.get("progress")
    if isinstance(progress, dict):
        progress.pop("resumedFromStep", None)


def _record_progress(draft: Draft, progress: Progress) -> None:
    spec = draft.job.spec
    previous = draft.status.get("progress") or {}
    draft.status["progress"] = progress_status(progress, spec.total_steps, spec.samples_per_step, draft.now)
    checkpoint_step = count(progress.checkpoint_step) or 0
    if checkpoint_step > int((draft.status.get("lastCheckpoint") or {}).get("step", 0)):
        draft.status["lastCheckpoint"] = {"step": checkpoint_step, "time": isoformat(draft.now),
                                          "path": f"{spec.checkpoint.path}/{api.checkpoint_dir(checkpoint_step)}"}
        if spec.checkpoint.claim_name:
            draft.status["lastCheckpoint"]["claimName"] = spec.checkpoint.claim_name
    saved = int((draft.status.get("lastCheckpoint") or {}).get("step", 0))
    first_report = "resumedFromStep" not in previous
    if progress.resumed_from_step == 0 and first_report and draft.attempt > 0 and saved > 0:
        draft.events.append(Event("Warning", "CheckpointNotResumed",
                                  f"attempt {draft.attempt} started at step 0 although a checkpoint at step "
                                  f"{saved} exists: check that the checkpoint volume survives restarts"))


# --- The end of a job ----------------------------------------------------------------------------------


def finish(draft: Draft, pods: Sequence[PodState], succeeded: bool, reason: str, message: str) -> None:
    """The job ends: Succeeded or Failed, said in its phase, conditions and completion time."""
    phase = Phase.SUCCEEDED if succeeded else Phase.FAILED
    kind = ConditionType.SUCCEEDED if succeeded else ConditionType.FAILED
    draft.phase(phase, message, Event("Normal" if succeeded else "Warning", reason, message))
    draft.condition(kind, True, reason, message)
    draft.condition(ConditionType.RUNNING, False, reason, message)
    draft.condition(ConditionType.RESTARTING, False, reason, message)
    if any(c.get("type") == ConditionType.STALLED for c in draft.status.get("conditions", [])):
        draft.condition(ConditionType.STALLED, False, reason, "the job has finished")
    draft.status["completionTime"] = isoformat(draft.now)
    if succeeded:
        _final_progress(draft, pods)
    else:
        draft.remove([p for p in pods if not p.finished])  # the rest of a failed gang cannot go on alone
    clean_up_finished(draft, pods)


def clean_up_finished(draft: Draft, pods: Sequence[PodState]) -> None:
    """A finished job's pods go as cleanPodPolicy says, and the job itself once its TTL has passed."""
    policy = draft.job.spec.run_policy
    if policy.clean_pod_policy == "All":
        draft.remove(list(pods))
    elif policy.clean_pod_policy == "Running":
        draft.remove([p for p in pods if not p.finished])
    draft.status["nodes"] = count_nodes(draft.job.spec.nodes, draft.current(pods)).as_status()
    draft.status["gpus"] = 0
    completed = parse_time(draft.status.get("completionTime"))
    if policy.ttl_seconds_after_finished is not None and completed is not None:
        expires = completed + timedelta(seconds=policy.ttl_seconds_after_finished)
        if draft.now >= expires:
            draft.delete_job = True
        else:
            draft.requeue((expires - draft.now).total_seconds())


def _final_progress(draft: Draft, pods: Sequence[PodState]) -> None:
    """A finished job shows 100% and the loss the trainer reported last."""
    spec = draft.job.spec
    reports = [r for r in (p.final_report() for p in sorted(pods, key=lambda p: p.index)) if r]
    progress = draft.status.get("progress") or {}
    step = count(progress.get("step")) or 0
    loss = progress.get("loss")
    if reports:  # the program's last words: any JSON at all (NaN, strings, 1e30) is possible
        step = count(reports[0].get("step")) or step
        loss = reports[0].get("loss", loss)
    total = spec.total_steps or count(progress.get("totalSteps")) or step
    number = loss if isinstance(loss, int | float) and not isinstance(loss, bool) else None
    final = Progress(step=max(step, total), total_steps=total, loss=float(number) if number is not None else None)
    draft.status["progress"] = {**progress, **progress_status(final, total, None, draft.now)}
    if number is not None and not math.isfinite(number):
        draft.status["progress"].pop("loss", None)  # a finite loss kept from the last scrape is no longer true
    resumed = count(reports[0].get("resumedFromStep")) if reports else None
    if resumed is not None and "resumedFromStep" not in progress and draft.attempt > 0:
        draft.status["progress"]["resumedFromStep"] = resumed


# --- GPU-seconds -----------------------------------------------------------------------------------------


def _attempt_gpu_seconds(draft: Draft, pods: Sequence[PodState]) -> float:
    per_pod = draft.job.spec.gpus_per_node
    total = 0.0
    for pod in pods:
        if pod.start_time is not None:
            end = pod.finish_time or draft.now
            total += max(0.0, (end - pod.start_time).total_seconds()) * per_pod
    return total


def fold_gpu_seconds(draft: Draft, current: Sequence[PodState]) -> None:
    """An attempt that ends adds its GPU-seconds to those of the attempts before it."""
    prior = float(draft.status.get("gpuSecondsPriorAttempts", 0.0))
    draft.status["gpuSecondsPriorAttempts"] = prior + _attempt_gpu_seconds(draft, current)


def record_gpu_seconds(draft: Draft, pods: Sequence[PodState]) -> None:
    """The job's GPU-seconds so far: the earlier attempts' and this one's up to now."""
    prior = float(draft.status.get("gpuSecondsPriorAttempts", 0.0))
    draft.status["gpuSeconds"] = round(prior + _attempt_gpu_seconds(draft, draft.current(pods)), 1)


# --- When the status is written --------------------------------------------------------------------------


def changes_course(before: Mapping[str, Json], decision: Decision) -> bool:
    """Whether the decision acts (pods created or deleted, the job deleted) or moves the phase: what a routine
    look (k8s/lanes.py) finds then is work someone waits on."""
    acts = decision.create or decision.delete or decision.force_delete or decision.delete_job
    return bool(acts) or before.get("phase") != decision.status.get("phase")


def must_persist_before_acting(before: Mapping[str, Json], decision: Decision) -> bool:
    """Whether the decided status must be written before the decision is carried out.

    A decision that deletes pods, or moves the attempt, a count or the post-mortem, is written first: after a
    crash the pods are gone but the status still says why. One that only creates pods is carried out first (one
    API round trip less before a gang starts): a crash in between leaves pods that the next reconcile keeps.
    """
    if decision.delete or decision.force_delete or decision.delete_job:
        return True
    after = decision.status
    return (any(int(before.get(key) or 0) != int(after.get(key) or 0) for key in _COUNTS)
            or (before.get("failures") or []) != (after.get("failures") or []))


def may_wait(before: Mapping[str, Json], after: Mapping[str, Json]) -> bool:
    """Whether a status change may be written a moment later, folded into the next one: only pod counts,
    messages or progress moved, or the gang went from Pending to Starting (its pods were placed and start; on a
    node with the image they run within the moment, and the write that says Running is the only one). A flipped
    condition, any other new phase, a count, a failure, an excluded node or a checkpoint request is written at
    once (each remembers something done or decided)."""
    phase = after.get("phase")
    if not phase or phase in (Phase.SUCCEEDED, Phase.FAILED):
        return False
    if phase != before.get("phase") and (before.get("phase"), phase) != (Phase.PENDING, Phase.STARTING):
        return False
    if any(int(before.get(key) or 0) != int(after.get(key) or 0) for key in _COUNTS):
        return False
    if any((before.get(key) or []) != (after.get(key) or []) for key in ("failures", "excludedNodes",
                                                                          "checkpointRequest")):
        return False
    return _condition_states(before) == _condition_states(after)


def _condition_states(status: Mapping[str, Json]) -> dict[str, str]:
    return {c.get("type", ""): c.get("status", "") for c in status.get("conditions") or []}
