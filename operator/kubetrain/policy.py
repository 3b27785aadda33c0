"""The reconcile decision as a pure function: (job, stored status, pods, now, progress) -> Decision.

Level-based: every call recomputes what should happen from what exists, so the operator can crash
and restart at any point. The status written back is the only memory (attempt, restarts, failures).

Failure taxonomy (decided from pod status, never guessed):
- every pod exited 0 -> Succeeded;
- disruption (DisruptionTarget condition, eviction, preemption, node loss, a pod that vanished)
  -> gang restart that does not count against backoffLimit;
- OOMKilled -> Failed with reason OOMKilled, unless failurePolicy.restartOnOOM;
- any other non-zero exit -> gang restart while restarts < backoffLimit, then Failed;
- no heartbeat for stallTimeoutSeconds while Running, as seen by a scrape of rank 0 -> condition Stalled and
  a counted gang restart; while rank 0 cannot be scraped, progress is unknown (condition ProgressKnown False,
  reason ScrapeFailed), which is never a stall;
- torchrun's RendezvousTimeoutError (the gang did not all join in rendezvousTimeoutSeconds), or the agents'
  RendezvousConnectionError while node 0 (the rendezvous host) never started -> Failed at once;
- more than failurePolicy.disruptionLimit disruptions -> Failed, reason TooManyDisruptions (no endless evictions);
- an elastic job's nodes lowered -> the pods above it are deleted, the rest re-rendezvous: no restart at all.
Pods of an earlier job of the same name (another uid) are never this job's: they are deleted first.
When carrying out a decision fails, ``failed_reconcile`` decides: pods the API server refuses as invalid
fail the job; anything else is retried with backoff and shown in condition ReconcileError.
The first pod to fail names the cause: peers that fail afterwards only lost their rendezvous (a first failure
that is itself only a consequence, RendezvousClosedError, waits up to CAUSE_WAIT for its cause to be seen).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from kubetrain import api
from kubetrain.api import ConditionType, Phase, Reason
from kubetrain.launch import RENDEZVOUS_HOST_INDEX
from kubetrain.manifests import job_selector, pod_name
from kubetrain.spec import TrainingJob
from kubetrain.status import (
    RENDEZVOUS_CLOSED_ERROR,
    RENDEZVOUS_CONNECTION_ERROR,
    FailureKind,
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
    "SCRAPE_RECHECK_SECONDS",
    "ApiFailure",
    "Decision",
    "Event",
    "classify",
    "failed_reconcile",
    "may_wait",
    "must_persist_before_acting",
    "reconcile",
    "recovered",
    "retry_delay",
    "while_retrying",
]

Json = Any

# A terminating pod whose node stopped answering never confirms its deletion: after its grace period
# plus this margin, the operator force-deletes it so that the next attempt can reuse the name. Only then:
# on a node that answers, the pod's processes may still run, and the next attempt must not start beside them.
FORCE_DELETE_AFTER = timedelta(seconds=30)
# A trainer that has finished stops serving while its pod still runs (torchrun's agents wait for each other,
# the kubelet reports the exit a second later): one failed read of rank 0 is read again this much later,
# and reported only if that fails too. 3 s was too short on a busy node: the e2e journey's job warned
# ScrapeFailed at its end in three runs out of three on 2026-12-02, when this machine ran at half speed.
SCRAPE_RECHECK_SECONDS = 10.0



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


def _fenced(pod: PodState) -> bool:
    """Nothing of the pod can still run: its node is lost (the taint manager evicted it), or it never had one."""
    return pod.node_lost or not pod.scheduled


@dataclass
class _Draft:
    """The decision being assembled by the steps below."""

    job: TrainingJob
    now: datetime
    status: dict[str, Json]
    create: list[int] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    force_delete: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    delete_job: bool = False
    requeue_after: float | None = None

    @property
    def attempt(self) -> int:
        return int(self.status.get("attempt", 0))

    def condition(self, kind: str, value: bool, reason: str, message: str) -> None:
        self.status["conditions"] = set_condition(
            self.status.get("conditions", []), kind, value, reason, message, now=self.now,
            generation=self.job.generation
        )

    def phase(self, phase: Phase, message: str, event: Event | None = None) -> None:
        if self.status.get("phase") != phase and event is not None:
            self.events.append(event)
        self.status["phase"] = str(phase)
        self.status["message"] = message[:1024]

    def requeue(self, seconds: float) -> None:
        seconds = max(1.0, seconds)
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def remove(self, pods: Sequence[PodState]) -> None:
        """Delete pods gracefully; force-delete those stuck terminating on a lost node."""
        for pod in pods:
            if pod.name in self.delete or pod.name in self.force_delete:
                continue
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
        )


def _copied(value: Json) -> Json:
    """A copy of a status (JSON: dicts, lists and scalars) for a draft to change: a third of copy.deepcopy's
    time, which keeps a memo for cycles and shared parts that JSON never has."""
    if isinstance(value, dict):
        return {key: _copied(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copied(item) for item in value]
    return value


def reconcile(
    job: TrainingJob,
    status: Mapping[str, Json],
    pods: Sequence[PodState],
    now: datetime,
    progress: Progress | Scrape | None = None,
) -> Decision:
    """Decide the next step for ``job`` given its stored ``status`` and all of its ``pods``.

    ``progress``: what a scrape of rank 0 read now (a Progress, or a Scrape that may have failed); None when
    rank 0 was not scraped this time.
    """
    draft = _Draft(job=job, now=now, status=_copied(dict(status)))
    draft.status["observedGeneration"] = job.generation
    draft.status["selector"] = job_selector(job.name, job.uid)
    # Pods of an earlier job of the same name (deleted with --cascade=orphan) are never this job's.
    foreign = [p for p in pods if p.job_uid != job.uid]
    pods = [p for p in pods if p.job_uid == job.uid]
    draft.status.setdefault("attempt", 0)
    draft.status.setdefault("restarts", 0)
    draft.status.setdefault("startTime", isoformat(now))
    if progress is not None:
        _record_scrape(draft, progress if isinstance(progress, Scrape) else Scrape(progress=progress))

    phase = draft.status.get("phase")
    if phase in (Phase.SUCCEEDED, Phase.FAILED):
        _finished(draft, pods)
    elif job.spec.run_policy.suspend:
        _suspend(draft, pods)
    else:
        if phase == Phase.SUSPENDED:
            _resume(draft)
        _run(draft, pods, foreign)
    _account(draft, pods)
    return draft.decision()


def _record_scrape(draft: _Draft, scrape: Scrape) -> None:
    """Rank 0's report, or that it could not be read: said in condition ProgressKnown, and never a stall."""
    known = _condition(draft.status, ConditionType.PROGRESS_KNOWN)
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


def _progress_not_known_yet(draft: _Draft) -> None:
    """A new attempt's progress is unknown until its rank 0 is read (and what the last one said is no stall)."""
    if _condition(draft.status, ConditionType.PROGRESS_KNOWN) is not None:
        draft.condition(ConditionType.PROGRESS_KNOWN, False, Reason.NOT_SCRAPED_YET,
                        f"attempt {draft.attempt} has not been read yet")


def _condition(status: Mapping[str, Json], kind: str) -> Mapping[str, Json] | None:
    return next((c for c in status.get("conditions", []) if c.get("type") == kind), None)


def _record_progress(draft: _Draft, progress: Progress) -> None:
    spec = draft.job.spec
    previous = draft.status.get("progress") or {}
    draft.status["progress"] = progress_status(progress, spec.total_steps, spec.samples_per_step, draft.now)
    checkpoint_step = count(progress.checkpoint_step) or 0
    if checkpoint_step > int((draft.status.get("lastCheckpoint") or {}).get("step", 0)):
        draft.status["lastCheckpoint"] = {"step": checkpoint_step, "time": isoformat(draft.now)}
    saved = int((draft.status.get("lastCheckpoint") or {}).get("step", 0))
    first_report = "resumedFromStep" not in previous
    if progress.resumed_from_step == 0 and first_report and draft.attempt > 0 and saved > 0:
        draft.events.append(Event("Warning", "CheckpointNotResumed",
                                  f"attempt {draft.attempt} started at step 0 although a checkpoint at step "
                                  f"{saved} exists: check that the checkpoint volume survives restarts"))


def _finished(draft: _Draft, pods: Sequence[PodState]) -> None:
    policy = draft.job.spec.run_policy
    if policy.clean_pod_policy == "All":
        draft.remove(list(pods))
    elif policy.clean_pod_policy == "Running":
        draft.remove([p for p in pods if not p.finished])
    draft.status["nodes"] = count_nodes(draft.job.spec.nodes, _current(draft, pods)).as_status()
    draft.status["gpus"] = 0
    completed = parse_time(draft.status.get("completionTime"))
    if policy.ttl_seconds_after_finished is not None and completed is not None:
        expires = completed + timedelta(seconds=policy.ttl_seconds_after_finished)
        if draft.now >= expires:
            draft.delete_job = True
        else:
            draft.requeue((expires - draft.now).total_seconds())


def _finish(draft: _Draft, pods: Sequence[PodState], succeeded: bool, reason: str, message: str) -> None:
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
    _finished(draft, pods)


def _final_progress(draft: _Draft, pods: Sequence[PodState]) -> None:
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


def _suspend(draft: _Draft, pods: Sequence[PodState]) -> None:
    draft.remove(list(pods))
    message = "suspended: pods deleted, checkpoints kept; set spec.runPolicy.suspend=false to resume"
    draft.phase(Phase.SUSPENDED, message, Event("Normal", Reason.SUSPENDED, message))
    draft.condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED, message)
    draft.condition(ConditionType.RUNNING, False, Reason.SUSPENDED, message)
    draft.status["nodes"] = count_nodes(draft.job.spec.nodes, [p for p in pods if not p.deleting]).as_status()
    draft.status["gpus"] = 0


def _resume(draft: _Draft) -> None:
    """A resumed job starts a fresh attempt (not a restart) and its deadline counts from now."""
    draft.status["attempt"] = draft.attempt + 1
    _progress_not_known_yet(draft)
    draft.status["startTime"] = isoformat(draft.now)
    draft.status.pop("runningTime", None)
    draft.status.pop("attemptStartTime", None)
    message = "resumed: starting a new attempt from the latest checkpoint"
    draft.events.append(Event("Normal", Reason.RESUMED, message))
    draft.condition(ConditionType.SUSPENDED, False, Reason.RESUMED, message)


def _current(draft: _Draft, pods: Sequence[PodState]) -> list[PodState]:
    return [p for p in pods if p.attempt == draft.attempt]


def _run(draft: _Draft, pods: Sequence[PodState], foreign: Sequence[PodState]) -> None:
    spec = draft.job.spec
    current = _current(draft, pods)
    stale = [p for p in pods if p.attempt != draft.attempt]

    deadline = spec.run_policy.active_deadline_seconds
    started = parse_time(draft.status.get("startTime")) or draft.now
    if deadline is not None:
        remaining = (started + timedelta(seconds=deadline) - draft.now).total_seconds()
        if remaining <= 0:
            _finish(draft, pods, False, Reason.DEADLINE,
                    f"ran longer than activeDeadlineSeconds={deadline}; pods deleted, checkpoints kept")
            return
        draft.requeue(remaining)

    if stale:
        # Gang restart in progress: the next attempt starts only once every old pod is gone.
        draft.remove(stale)
        message = f"waiting for {len(stale)} pod(s) of the previous attempt to terminate"
        draft.phase(Phase.RESTARTING, message)
        draft.condition(ConditionType.RESTARTING, True, Reason.GANG_RESTART, message)
        draft.status["nodes"] = count_nodes(spec.nodes, current).as_status()
        return

    if spec.elastic is not None:
        current = _shrink_in_place(draft, current)
    if _handle_failures(draft, current) or _handle_success(draft, current):
        return
    if _handle_lost_or_extra(draft, current) or _handle_stall(draft, current):
        return
    # Their names are the ones this job needs: delete them (they are nobody's now) and wait until they are gone.
    draft.remove(foreign)
    _progress_attempt(draft, current, blocked=[p.name for p in foreign])


def _restart(draft: _Draft, current: Sequence[PodState], reason: str, message: str, *, counted: bool,
             failed: Sequence[PodState] = ()) -> None:
    """Gang restart: record the post-mortem, bump the attempt, delete every pod of this attempt."""
    used_up = _restarts_used_up(draft, reason, counted=counted)
    _record_failures(draft, failed, reason, message, counted=counted)
    if used_up is not None:
        final_reason, explanation = used_up
        _finish(draft, current, False, final_reason, f"{message}; {explanation}")
        return
    if counted:
        draft.status["restarts"] = int(draft.status.get("restarts", 0)) + 1
    elif reason == Reason.DISRUPTED:  # a scale is the user's wish, not a disruption
        draft.status["disruptions"] = int(draft.status.get("disruptions", 0)) + 1
    _fold_gpu_seconds(draft, current)
    draft.status["attempt"] = draft.attempt + 1
    _progress_not_known_yet(draft)
    draft.status.pop("runningTime", None)
    draft.status.pop("attemptStartTime", None)
    progress = draft.status.get("progress")
    if isinstance(progress, dict):
        progress.pop("resumedFromStep", None)
    text = f"{message}; gang restart as attempt {draft.attempt}" + ("" if counted else " (not counted)")
    draft.phase(Phase.RESTARTING, text, Event("Warning", reason, text))
    draft.condition(ConditionType.RESTARTING, True, reason, text)
    draft.condition(ConditionType.RUNNING, False, reason, text)
    draft.remove(current)


def _restarts_used_up(draft: _Draft, reason: str, *, counted: bool) -> tuple[str, str] | None:
    """(reason, explanation) when this restart is one too many: backoffLimit, or the bound on disruptions."""
    restarts = int(draft.status.get("restarts", 0))
    disruptions = int(draft.status.get("disruptions", 0))
    policy = draft.job.spec.failure_policy
    if counted and restarts >= policy.backoff_limit:
        return Reason.BACKOFF_LIMIT, f"backoffLimit={policy.backoff_limit} restarts used up"
    if not counted and reason == Reason.DISRUPTED and disruptions >= policy.disruption_limit:
        return Reason.TOO_MANY_DISRUPTIONS, (
            f"disrupted {disruptions + 1} times (evictions, preemptions, node losses: failurePolicy.disruptionLimit "
            f"is {policy.disruption_limit}); find out why the cluster keeps stopping the job's pods")
    return None


def _record_failures(draft: _Draft, failed: Sequence[PodState], reason: str, message: str, *,
                     counted: bool) -> None:
    """Append the post-mortem: one record per failed pod, or one for the attempt (stall, lost pod)."""
    base: dict[str, Json] = {"attempt": draft.attempt, "reason": reason, "counted": counted,
                             "time": isoformat(draft.now), "message": message[:1024]}
    records = list(draft.status.get("failures", []))
    if not failed:
        records.append(base)
    for pod in failed:
        record = base | {"pod": pod.name, "node": pod.node or "", "reason": pod.reason or reason}
        if pod.exit_code is not None:
            record["exitCode"] = pod.exit_code
        if pod.message:  # the post-mortem that outlives the pod (`kubetrain logs --attempt N`)
            record["logTail"] = pod.message[-api.LOG_TAIL_CHARS:]
        records.append(record)
    draft.status["failures"] = records[-api.MAX_FAILURES_KEPT:]


def _describe(pod: PodState) -> str:
    code = f" with exit code {pod.exit_code}" if pod.exit_code is not None else ""
    node = f" on node {pod.node}" if pod.node else ""
    return f"pod {pod.name}{node} failed{code} ({pod.reason or 'Error'})"


def _handle_failures(draft: _Draft, current: Sequence[PodState]) -> bool:
    failed = sorted((p for p in current if p.phase == "Failed"),
                    key=lambda p: (p.finish_time or draft.now, p.index))
    if not failed:
        return False
    first = failed[0]
    if _awaiting_the_cause(draft, first, current):
        return True
    timed_out = any(p.failure_kind is FailureKind.RENDEZVOUS_TIMEOUT for p in failed)
    kind = FailureKind.RENDEZVOUS_TIMEOUT if timed_out or _host_never_came(first, current) else first.failure_kind
    message = _describe(first)
    report = first.final_report() or {}
    if report.get("reason") == "ConfigError":
        # The trainer rejected its configuration: every retry would fail the same way.
        _record_failures(draft, failed, Reason.INVALID_CONFIG, message, counted=True)
        _finish(draft, current, False, Reason.INVALID_CONFIG,
                f"{message}: the trainer rejected its configuration: {report.get('message', '')}")
    elif kind is FailureKind.OOM and not draft.job.spec.failure_policy.restart_on_oom:
        _record_failures(draft, failed, Reason.OOM_KILLED, message, counted=True)
        _finish(draft, current, False, Reason.OOM_KILLED,
                f"{message}: out of memory; raise spec.resources.memory or lower the batch size "
                "(set failurePolicy.restartOnOOM to retry as is)")
    elif kind is FailureKind.RENDEZVOUS_TIMEOUT:
        _record_failures(draft, failed, Reason.RENDEZVOUS_TIMEOUT, message, counted=True)
        _finish(draft, current, False, Reason.RENDEZVOUS_TIMEOUT, _rendezvous_timeout_message(draft, current, first))
    elif kind is FailureKind.DISRUPTION:
        _restart(draft, current, Reason.DISRUPTED, message, counted=False, failed=failed)
    else:
        _restart(draft, current, Reason.POD_FAILED if kind is FailureKind.ERROR else Reason.OOM_KILLED,
                 message, counted=True, failed=failed)
    return True


def _awaiting_the_cause(draft: _Draft, first: PodState, current: Sequence[PodState]) -> bool:
    """A RendezvousClosedError is a consequence: a peer's agent closed the rendezvous as it exited (its join
    timed out, or it failed). While peers still run, wait a moment for that peer's own failure to be seen."""
    if RENDEZVOUS_CLOSED_ERROR not in (first.message or "") or first.finish_time is None:
        return False
    if not any(p.running for p in current) or draft.now >= first.finish_time + CAUSE_WAIT:
        return False
    draft.requeue((first.finish_time + CAUSE_WAIT - draft.now).total_seconds())
    return True


def _host_never_came(first: PodState, current: Sequence[PodState]) -> bool:
    """The agents could not reach the rendezvous store because node 0, which hosts it, had not started: the gang
    did not form, as surely as when torchrun's join timeout passes (launch.rendezvous_conf makes both waits
    rendezvousTimeoutSeconds long). Node 0 may be placed the moment a peer gives up and frees its machine, so
    one that started only then counts as never come."""
    if RENDEZVOUS_CONNECTION_ERROR not in (first.message or ""):
        return False
    host = next((p for p in current if p.index == RENDEZVOUS_HOST_INDEX), None)
    if host is None or host.phase == "Pending" or host.start_time is None:
        return True
    return _started_after_a_peer_gave_up(host, first)


def _started_after_a_peer_gave_up(pod: PodState, first: PodState) -> bool:
    """A pod placed on the machine a peer freed as it gave up, and started before this reconcile saw the peer
    exit (a process starts in a fraction of a second): it never started in time either."""
    return (pod.start_time is not None and first.finish_time is not None
            and pod.start_time >= first.finish_time - HOST_LATE_SLACK)


def _rendezvous_timeout_message(draft: _Draft, current: Sequence[PodState], first: PodState) -> str:
    seconds = draft.job.spec.failure_policy.rendezvous_timeout_seconds
    # Pending, not unscheduled: a pod the scheduler could not place (e.g. one per machine, required) may be
    # placed the moment its peers exit, before this reconcile sees them; either way it never started in time.
    late = _host_never_came(first, current)
    unstarted = [p.name for p in current if p.phase == "Pending" or (late and p.index == RENDEZVOUS_HOST_INDEX)
                 or _started_after_a_peer_gave_up(p, first)]
    if unstarted:
        where = f"pod(s) {', '.join(unstarted)} never started in time (see their events: unschedulable, image pull)"
    else:
        where = "every pod started, but not all of them joined (see `kubetrain logs`)"
    return (f"the gang did not all join torchrun's rendezvous within failurePolicy.rendezvousTimeoutSeconds="
            f"{seconds}: {where}; not retried, as the same gang would wait the same way")


def _handle_success(draft: _Draft, current: Sequence[PodState]) -> bool:
    succeeded = [p for p in current if p.phase == "Succeeded"]
    if not succeeded or len(succeeded) < len(current):
        return False
    spec = draft.job.spec
    needed = spec.elastic.min_nodes if spec.elastic else spec.nodes
    if len(succeeded) < needed:
        return False
    _finish(draft, current, True, Reason.ALL_SUCCEEDED,
            f"all {len(succeeded)} pods completed successfully")
    draft.status["nodes"] = count_nodes(spec.nodes, current).as_status()
    return True


def _handle_lost_or_extra(draft: _Draft, current: Sequence[PodState]) -> bool:
    """A pod that vanished mid-attempt is a disruption; fewer desired nodes (elastic) regroup the gang."""
    spec = draft.job.spec
    present = {p.index for p in current}
    was_complete = draft.status.get("phase") in (Phase.STARTING, Phase.RUNNING)
    previous_desired = int((draft.status.get("nodes") or {}).get("desired", spec.nodes))
    lost = [i for i in range(min(previous_desired, spec.nodes)) if i not in present]
    if was_complete and lost:
        _restart(draft, current, Reason.DISRUPTED,
                 f"pod(s) {', '.join(str(i) for i in lost)} disappeared", counted=False)
        return True
    # The operator deletes pods only after moving to the next attempt: a pod of this attempt that is
    # being deleted was evicted, preempted or removed with its node (the taint manager) by someone else.
    evicted = [p for p in current if p.deleting and not p.finished]
    if evicted:
        _restart(draft, current, Reason.DISRUPTED,
                 f"pod {evicted[0].name} is being deleted by the cluster (eviction, preemption or node loss)",
                 counted=False, failed=evicted)
        return True
    extra = [p for p in current if p.index >= spec.nodes and not p.finished]
    if extra:
        _restart(draft, current, Reason.SCALED,
                 f"scaled from {previous_desired} to {spec.nodes} nodes", counted=False)
        return True
    return False


def _handle_stall(draft: _Draft, current: Sequence[PodState]) -> bool:
    """A stall is a heartbeat that a scrape of rank 0 actually saw stale; unknown progress is never one."""
    timeout = draft.job.spec.failure_policy.stall_timeout_seconds
    running_since = parse_time(draft.status.get("runningTime"))
    if not timeout or draft.status.get("phase") != Phase.RUNNING or running_since is None:
        return False
    heartbeat = parse_time((draft.status.get("progress") or {}).get("heartbeatTime"))
    if heartbeat is None and draft.job.spec.trainer is None:
        return False  # a user program that exports no heartbeat cannot be judged by one
    last_sign = max(running_since, heartbeat) if heartbeat else running_since
    seen = _last_seen(draft.status)
    silent = (seen - last_sign).total_seconds() if seen is not None else 0.0
    if silent < timeout:
        draft.requeue((last_sign + timedelta(seconds=timeout) - draft.now).total_seconds())
        return False
    message = f"no training heartbeat for {int(silent)}s (stallTimeoutSeconds={timeout})"
    draft.condition(ConditionType.STALLED, True, Reason.STALLED, message)
    _restart(draft, current, Reason.STALLED, message, counted=True)
    return True


def _last_seen(status: Mapping[str, Json]) -> datetime | None:
    """When a scrape last read rank 0's progress; None while rank 0 cannot be read (progress unknown)."""
    known = _condition(status, ConditionType.PROGRESS_KNOWN)
    if known is None or known.get("status") != "True":
        return None
    return parse_time((status.get("progress") or {}).get("updatedAt"))


def _shrink_in_place(draft: _Draft, current: Sequence[PodState]) -> list[PodState]:
    """An elastic gang shrinks without a restart: the pods above spec.nodes leave, whatever their exit.

    The survivors' workers fail on the lost peers and their torchrun agents re-rendezvous with the nodes left,
    at the same attempt (launch.in_place_restarts gives them the restarts for it). Returns the pods that stay.
    """
    nodes = draft.job.spec.nodes
    leaving = [p for p in current if p.index >= nodes]
    if any(not p.deleting for p in leaving):
        names = ", ".join(p.name for p in leaving)
        draft.events.append(Event("Normal", Reason.SCALED_DOWN,
                                  f"scaling in place to {nodes} nodes: deleting pod(s) {names}; the others "
                                  "re-rendezvous at the same attempt"))
    draft.remove(leaving)
    return [p for p in current if p.index < nodes]


def _progress_attempt(draft: _Draft, current: Sequence[PodState], blocked: Sequence[str] = ()) -> None:
    """Create missing pods (unless a previous job's pod still holds the name); report Pending, Starting or Running."""
    spec = draft.job.spec
    present = {p.index for p in current}
    missing = [i for i in range(spec.nodes) if i not in present]
    waiting_for = [pod_name(draft.job.name, i) for i in missing if pod_name(draft.job.name, i) in blocked]
    if waiting_for:  # the gang starts whole: create none of its pods until every name is free
        message = (f"waiting for pod(s) {', '.join(waiting_for[:5])} of a previous job named {draft.job.name} "
                   "to be deleted")
        draft.phase(Phase.PENDING, message)
        draft.condition(ConditionType.RUNNING, False, Reason.PREVIOUS_JOB_PODS, message)
        draft.status["nodes"] = count_nodes(spec.nodes, current).as_status()
        return
    draft.create = missing
    counts = count_nodes(spec.nodes, current)
    draft.status["nodes"] = counts.as_status()
    draft.status["gpus"] = spec.gpus
    if draft.create:
        draft.status.setdefault("attemptStartTime", isoformat(draft.now))
        message = f"creating {len(draft.create)} pod(s) for attempt {draft.attempt}"
        draft.condition(ConditionType.CREATED, True, Reason.CREATED, message)
        reason = Reason.CREATED if not current else Reason.SCALED
        draft.events.append(Event("Normal", reason, message))
    unscheduled = [p.name for p in current if not p.scheduled]
    if draft.create or unscheduled:
        waiting = [*unscheduled, *(pod_name(draft.job.name, i) for i in draft.create)]
        message = f"waiting for {len(waiting)} pod(s) to be scheduled: {', '.join(waiting[:5])}"
        draft.phase(Phase.PENDING, message)
        draft.condition(ConditionType.RUNNING, False, Reason.PODS_PENDING, message)
    elif counts.ready + counts.succeeded < spec.nodes:
        message = f"{counts.ready}/{spec.nodes} pods running"
        draft.phase(Phase.STARTING, message)
        draft.condition(ConditionType.RUNNING, False, Reason.PODS_STARTING, message)
    else:
        message = f"all {spec.nodes} pods running ({spec.world_size} processes)"
        draft.phase(Phase.RUNNING, message, Event("Normal", Reason.ALL_RUNNING, message))
        draft.condition(ConditionType.RUNNING, True, Reason.ALL_RUNNING, message)
        draft.condition(ConditionType.RESTARTING, False, Reason.ALL_RUNNING, message)
        draft.status.setdefault("runningTime", isoformat(draft.now))
        if spec.failure_policy.stall_timeout_seconds:
            draft.condition(ConditionType.STALLED, False, Reason.ALL_RUNNING, "the training heartbeat is fresh")
            draft.requeue(spec.failure_policy.stall_timeout_seconds)


def _attempt_gpu_seconds(draft: _Draft, pods: Sequence[PodState]) -> float:
    per_pod = draft.job.spec.gpus_per_node
    total = 0.0
    for pod in pods:
        if pod.start_time is not None:
            end = pod.finish_time or draft.now
            total += max(0.0, (end - pod.start_time).total_seconds()) * per_pod
    return total


def _fold_gpu_seconds(draft: _Draft, current: Sequence[PodState]) -> None:
    prior = float(draft.status.get("gpuSecondsPriorAttempts", 0.0))
    draft.status["gpuSecondsPriorAttempts"] = prior + _attempt_gpu_seconds(draft, current)


def _account(draft: _Draft, pods: Sequence[PodState]) -> None:
    prior = float(draft.status.get("gpuSecondsPriorAttempts", 0.0))
    draft.status["gpuSeconds"] = round(prior + _attempt_gpu_seconds(draft, _current(draft, pods)), 1)


# --- When carrying out a decision fails -------------------------------------------------------------

# Retries of a failed reconcile back off exponentially up to this many seconds.
MAX_RETRY_DELAY = 60.0


@dataclass(frozen=True)
class ApiFailure:
    """A failed step of a reconcile, as the pure core sees it (kube.py turns exceptions into these)."""

    status: int | None  # the HTTP status; None when the API server did not answer (timeout, connection)
    message: str  # the API server's own message, or the error's text
    creating: str = ""  # "pod NAME" / "service NAME" when the failed call created that object
    internal: bool = False  # an error of the operator itself, not an answer of the API server


def classify(failure: ApiFailure) -> Reason:
    """The reason a failure is reported under; only INVALID_POD_SPEC is permanent (see failed_reconcile)."""
    if failure.internal:
        return Reason.API_ERROR
    if failure.status == 422 and failure.creating:  # Invalid: the same object would be refused again
        return Reason.INVALID_POD_SPEC
    if failure.status == 409 and failure.creating:  # AlreadyExists, and not ours
        return Reason.NAME_TAKEN
    if failure.status == 403:  # quota, admission webhooks, RBAC: an administrator may lift it
        return Reason.QUOTA_EXCEEDED if "exceeded quota" in failure.message else Reason.FORBIDDEN
    if failure.status is None or failure.status == 429 or failure.status >= 500:
        return Reason.API_UNAVAILABLE
    return Reason.API_ERROR


def retry_delay(failures: int) -> float:
    """Seconds before retry number ``failures`` (1, 2, 4, ... up to MAX_RETRY_DELAY)."""
    return min(MAX_RETRY_DELAY, 2.0 ** max(0, failures - 1))


def failed_reconcile(job: TrainingJob, status: Mapping[str, Json], pods: Sequence[PodState], failure: ApiFailure,
                     *, now: datetime, retry_in: float) -> Decision:
    """The status after a step of the reconcile failed: the job fails when retrying cannot help, else it says
    that it retries, with the API's message, in condition ReconcileError and the status message."""
    draft = _Draft(job=job, now=now, status=_copied(dict(status)))
    reason = classify(failure)
    what = f"creating {failure.creating}" if failure.creating else "reconciling"
    if reason is Reason.INVALID_POD_SPEC:
        message = f"the API server rejected {failure.creating}: {failure.message}"
        if _reconcile_error(status) is not None:
            draft.condition(ConditionType.RECONCILE_ERROR, False, reason, message)
        _finish(draft, [p for p in pods if p.job_uid == job.uid], False, reason, message)
        return draft.decision()
    message = f"retrying in {retry_in:.0f}s: {what} failed: {failure.message}"
    draft.condition(ConditionType.RECONCILE_ERROR, True, reason, message)
    draft.status["message"] = message[:1024]
    draft.events.append(Event("Warning", reason, f"{what} failed: {failure.message}"[:1024]))
    return draft.decision()


def _reconcile_error(status: Mapping[str, Json]) -> Mapping[str, Json] | None:
    found = _condition(status, ConditionType.RECONCILE_ERROR)
    return found if found is not None and found.get("status") == "True" else None


# How long a failure that only follows another (RendezvousClosedError) waits for that other one to be seen.
CAUSE_WAIT = timedelta(seconds=5)
# Timestamps have one-second resolution: a node 0 that started within this of a peer's failure came too late.
HOST_LATE_SLACK = timedelta(seconds=2)

# What a crash must never lose: the attempt and the counts (and the post-mortem, status.failures).
_COUNTS = ("attempt", "restarts", "disruptions")


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
    condition, any other new phase, a count or a failure is written at once."""
    phase = after.get("phase")
    if not phase or phase in (Phase.SUCCEEDED, Phase.FAILED):
        return False
    if phase != before.get("phase") and (before.get("phase"), phase) != (Phase.PENDING, Phase.STARTING):
        return False
    if any(int(before.get(key) or 0) != int(after.get(key) or 0) for key in _COUNTS):
        return False
    if (before.get("failures") or []) != (after.get("failures") or []):
        return False
    return _condition_states(before) == _condition_states(after)


def _condition_states(status: Mapping[str, Json]) -> dict[str, str]:
    return {c.get("type", ""): c.get("status", "") for c in status.get("conditions") or []}


def while_retrying(status: Mapping[str, Json]) -> dict[str, Json]:
    """``status`` as written before acting: while a failed step is being retried the message keeps saying so."""
    error = _reconcile_error(status)
    if error is None or status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED):
        return dict(status)
    return {**status, "message": error.get("message", "")}


def recovered(job: TrainingJob, status: Mapping[str, Json], now: datetime) -> dict[str, Json]:
    """``status`` once every step of a reconcile succeeded: a ReconcileError condition turns False."""
    if _reconcile_error(status) is None:
        return dict(status)
    draft = _Draft(job=job, now=now, status=_copied(dict(status)))
    draft.condition(ConditionType.RECONCILE_ERROR, False, Reason.RECONCILED, "the last reconcile succeeded")
    return draft.status
