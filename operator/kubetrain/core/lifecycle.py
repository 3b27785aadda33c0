"""The reconcile decision as a pure function: (job, stored status, pods, now, progress) -> Decision.

Level-based: every call recomputes what should happen from what exists, so the operator can crash
and restart at any point. The status written back is the only memory (attempt, restarts, failures).

The lifecycle: Pending (pods created, not all placed) -> Starting -> Running -> Succeeded once every pod exited
0. A gang restart (failures.gang_restart) goes through Restarting to the next attempt, a restart in place by the
kubelet (failures.handle_in_place_restarts) through Restarting at the same attempt; activeDeadlineSeconds, or
a failure that retrying cannot help (failures.py), ends the job Failed; suspend deletes the pods and keeps the
checkpoints, and resuming starts a new attempt. Besides failed pods:
- no heartbeat for stallTimeoutSeconds while Running, as seen by a scrape of rank 0 -> condition Stalled and
  a counted gang restart; while rank 0 cannot be scraped, progress is unknown (condition ProgressKnown False,
  reason ScrapeFailed), which is never a stall;
- a pod of the attempt that vanished or is being deleted by the cluster -> that pod made again alone while the
  others wait (failures.replace_lost_pods), else an uncounted gang restart;
- an elastic job's nodes lowered -> the pods above it are deleted, the rest re-rendezvous: no restart at all.
Pods of an earlier job of the same name (another uid) are never this job's: they are deleted first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from kubetrain.core.api import ConditionType, Phase, Reason
from kubetrain.core.failures import (
    gang_restart,
    handle_failed_pods,
    handle_in_place_restarts,
    replace_lost_pods,
    replaceable,
)
from kubetrain.core.goodput import record_goodput
from kubetrain.core.hangs import Hang
from kubetrain.core.naming import job_selector, pod_name
from kubetrain.core.nodes import excluded_note, forget_cleared
from kubetrain.core.notices import ask_for_checkpoint
from kubetrain.core.queueing import Admission, QueueState, hold, record_admission
from kubetrain.core.spec import TrainingJob
from kubetrain.core.status import (
    CheckpointAnswer,
    PodState,
    Progress,
    Scrape,
    count_nodes,
    isoformat,
    parse_time,
    some_names,
)
from kubetrain.core.status_policy import (
    Decision,
    Draft,
    Event,
    clean_up_finished,
    find_condition,
    finish,
    progress_not_known_yet,
    record_gpu_seconds,
    record_scrape,
)

__all__ = ["declares_stall", "reconcile"]

Json = Any


def reconcile(
    job: TrainingJob,
    status: Mapping[str, Json],
    pods: Sequence[PodState],
    now: datetime,
    progress: Progress | Scrape | None = None,
    *,
    queue: Admission | None = None,
    ready_nodes: frozenset[str] | None = None,
    hang: Hang | None = None,
    notices: Mapping[str, str] | None = None,
    checkpoint_answer: CheckpointAnswer | None = None,
) -> Decision:
    """Decide the next step for ``job`` given its stored ``status`` and all of its ``pods``.

    ``progress``: what a scrape of rank 0 read now (a Progress, or a Scrape that may have failed); None when
    rank 0 was not scraped this time. ``queue``: what Kueue says of the job's Workload (queueing.py); None for
    a job in no Kueue queue. ``ready_nodes``: the cluster's Ready nodes, read when a failure points at a node
    (a node is excluded only while the gang still fits on the rest). ``hang``: the ranks' stacks compared,
    which the controller asks for when a decision restarts a stalled gang (:func:`declares_stall`), and then
    decides again with them. ``notices``: the nodes that announce a disruption (why, by node name);
    ``checkpoint_answer``: how the request of ``Decision.ask_checkpoint`` went, decided again with it.
    """
    draft = Draft.from_stored(job, status, now, ready_nodes=ready_nodes, hang=hang, notices=notices,
                              checkpoint_answer=checkpoint_answer)
    draft.status["observedGeneration"] = job.generation
    draft.status["selector"] = job_selector(job.name, job.uid)
    # Pods of an earlier job of the same name (deleted with --cascade=orphan) are never this job's.
    foreign = [p for p in pods if p.job_uid != job.uid]
    pods = [p for p in pods if p.job_uid == job.uid]
    draft.status.setdefault("attempt", 0)
    draft.status.setdefault("restarts", 0)
    draft.status.setdefault("startTime", isoformat(now))
    if progress is not None:
        record_scrape(draft, progress if isinstance(progress, Scrape) else Scrape(progress=progress))
    forget_cleared(draft)
    draft.status.pop("queuePosition", None)  # true only while the job waits in Kueue's queue: hold() sets it

    phase = draft.status.get("phase")
    if phase in (Phase.SUCCEEDED, Phase.FAILED):
        clean_up_finished(draft, pods)
    elif job.spec.run_policy.suspend:
        _suspend(draft, pods)
    elif queue is not None and queue.state is not QueueState.ADMITTED:
        hold(draft, pods, queue)
    else:
        # Back from a suspension, or admitted again after an eviction (its attempt had made pods): a new attempt.
        if phase == Phase.SUSPENDED or (phase == Phase.QUEUED and "attemptStartTime" in draft.status):
            _resume(draft)
        if queue is not None:
            record_admission(draft, queue)
        _run(draft, pods, foreign)
    record_gpu_seconds(draft, pods)
    record_goodput(draft, status)
    return draft.decision()


def _suspend(draft: Draft, pods: Sequence[PodState]) -> None:
    draft.remove(list(pods))
    message = "suspended: pods deleted, checkpoints kept; set spec.runPolicy.suspend=false to resume"
    draft.phase(Phase.SUSPENDED, message, Event("Normal", Reason.SUSPENDED, message))
    draft.condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED, message)
    draft.condition(ConditionType.RUNNING, False, Reason.SUSPENDED, message)
    draft.status["nodes"] = count_nodes(draft.job.spec.nodes, [p for p in pods if not p.deleting]).as_status()
    draft.status["gpus"] = 0


def _resume(draft: Draft) -> None:
    """A resumed job starts a fresh attempt (not a restart) and its deadline counts from now."""
    draft.status["attempt"] = draft.attempt + 1
    progress_not_known_yet(draft)
    draft.status["startTime"] = isoformat(draft.now)
    draft.status.pop("runningTime", None)
    draft.status.pop("attemptStartTime", None)
    message = "resumed: starting a new attempt from the latest checkpoint"
    draft.events.append(Event("Normal", Reason.RESUMED, message))
    draft.condition(ConditionType.SUSPENDED, False, Reason.RESUMED, message)


def _run(draft: Draft, pods: Sequence[PodState], foreign: Sequence[PodState]) -> None:
    spec = draft.job.spec
    current = draft.current(pods)
    stale = [p for p in pods if p.attempt != draft.attempt]

    deadline = spec.run_policy.active_deadline_seconds
    started = parse_time(draft.status.get("startTime")) or draft.now
    if deadline is not None:
        remaining = (started + timedelta(seconds=deadline) - draft.now).total_seconds()
        if remaining <= 0:
            finish(draft, pods, False, Reason.DEADLINE,
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
    if handle_failed_pods(draft, current) or handle_in_place_restarts(draft, current):
        return
    if _handle_success(draft, current):
        return
    if _handle_lost_or_extra(draft, current) or _handle_stall(draft, current):
        return
    # Their names are the ones this job needs: delete them (they are nobody's now) and wait until they are gone.
    draft.remove(foreign)
    _progress_attempt(draft, current, blocked=[p.name for p in foreign])
    draft.ask_checkpoint = ask_for_checkpoint(draft, current)


def _handle_success(draft: Draft, current: Sequence[PodState]) -> bool:
    succeeded = [p for p in current if p.phase == "Succeeded"]
    if not succeeded or len(succeeded) < len(current):
        return False
    spec = draft.job.spec
    needed = spec.elastic.min_nodes if spec.elastic else spec.nodes
    if len(succeeded) < needed:
        return False
    finish(draft, current, True, Reason.ALL_SUCCEEDED,
           f"all {len(succeeded)} pods completed successfully")
    draft.status["nodes"] = count_nodes(spec.nodes, current).as_status()
    return True


def _handle_lost_or_extra(draft: Draft, current: Sequence[PodState]) -> bool:
    """A pod that vanished mid-attempt is a disruption; fewer desired nodes (elastic) regroup the gang."""
    spec = draft.job.spec
    present = {p.index for p in current}
    was_complete = draft.status.get("phase") in (Phase.STARTING, Phase.RUNNING)
    previous_desired = int((draft.status.get("nodes") or {}).get("desired", spec.nodes))
    lost = [i for i in range(min(previous_desired, spec.nodes)) if i not in present]
    if was_complete and lost:
        message = f"pod(s) {some_names([str(i) for i in lost])} disappeared"
        if not replaceable(draft, lost):
            gang_restart(draft, current, Reason.DISRUPTED, message, counted=False)
            return True
        replace_lost_pods(draft, current, [], message, vanished=lost)  # made again below, with the missing
    # The operator deletes pods of this attempt only when they ended: a pod of this attempt that is being
    # deleted while it runs was evicted, preempted or removed with its node (the taint manager) by someone else.
    evicted = [p for p in current if p.deleting and not p.finished]
    if evicted:
        message = f"pod {evicted[0].name} is being deleted by the cluster (eviction, preemption or node loss)"
        if replaceable(draft, evicted):
            replace_lost_pods(draft, current, evicted, message)
        else:
            gang_restart(draft, current, Reason.DISRUPTED, message, counted=False, failed=evicted)
        return True
    extra = [p for p in current if p.index >= spec.nodes and not p.finished]
    if extra:
        gang_restart(draft, current, Reason.SCALED,
                     f"scaled from {previous_desired} to {spec.nodes} nodes", counted=False)
        return True
    return False


def _handle_stall(draft: Draft, current: Sequence[PodState]) -> bool:
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
    if draft.hang is not None:
        message += f"; {draft.hang.summary}"
    draft.condition(ConditionType.STALLED, True, Reason.STALLED, message)
    gang_restart(draft, current, Reason.STALLED, message, counted=True,
                 details={"hang": draft.hang.record()} if draft.hang else None)
    return True


def declares_stall(decision: Decision, now: datetime) -> bool:
    """Whether ``decision``, made at ``now``, restarts the gang for a stall (or ends the job for one): the
    ranks are then worth asking where they are, before their pods go."""
    return any(r.get("reason") == Reason.STALLED and r.get("time") == isoformat(now)
               for r in decision.status.get("failures", []))


def _last_seen(status: Mapping[str, Json]) -> datetime | None:
    """When a scrape last read rank 0's progress; None while rank 0 cannot be read (progress unknown)."""
    known = find_condition(status, ConditionType.PROGRESS_KNOWN)
    if known is None or known.get("status") != "True":
        return None
    return parse_time((status.get("progress") or {}).get("updatedAt"))


def _shrink_in_place(draft: Draft, current: Sequence[PodState]) -> list[PodState]:
    """An elastic gang shrinks without a restart: the pods above spec.nodes leave, whatever their exit.

    The survivors' workers fail on the lost peers and their torchrun agents re-rendezvous with the nodes left,
    at the same attempt (launch.in_place_restarts gives them the restarts for it). Returns the pods that stay.
    """
    nodes = draft.job.spec.nodes
    leaving = [p for p in current if p.index >= nodes]
    if any(not p.deleting for p in leaving):
        names = some_names([p.name for p in leaving])
        draft.events.append(Event("Normal", Reason.SCALED_DOWN,
                                  f"scaling in place to {nodes} nodes: deleting pod(s) {names}; the others "
                                  "re-rendezvous at the same attempt"))
    draft.remove(leaving)
    return [p for p in current if p.index < nodes]


def _progress_attempt(draft: Draft, current: Sequence[PodState], blocked: Sequence[str] = ()) -> None:
    """Create missing pods (unless a previous job's pod still holds the name); report Pending, Starting or Running."""
    spec = draft.job.spec
    present = {p.index for p in current}
    missing = [i for i in range(spec.nodes) if i not in present]
    waiting_for = [pod_name(draft.job.name, i) for i in missing if pod_name(draft.job.name, i) in blocked]
    if waiting_for:  # the gang starts whole: create none of its pods until every name is free
        message = (f"waiting for pod(s) {some_names(waiting_for)} of a previous job named {draft.job.name} "
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
        draft.events.append(Event("Normal", _creation_reason(draft, current), message))
    unscheduled = [p for p in current if not p.scheduled]
    running = counts.ready + counts.succeeded
    if running >= spec.nodes:
        _report_running(draft, f"all {spec.nodes} pods running ({spec.world_size} processes)", Reason.ALL_RUNNING)
    elif spec.elastic is not None and running >= spec.elastic.min_nodes and not draft.create:
        # torchrun's elastic rendezvous trains with the pods it has once minNodes joined; the rest join later. (A
        # pass that creates pods says Pending, as before: a Running job's pod missing from the index is lost.)
        waiting = _pending_message(draft, unscheduled)[0] if unscheduled else ""
        message = (f"{running}/{spec.nodes} pods running, at least the {spec.elastic.min_nodes} the elastic gang "
                   f"trains with" + (f"; {waiting}" if waiting else ""))
        _report_running(draft, message, Reason.MINIMUM_RUNNING)
    elif draft.create or unscheduled:
        _report_pending(draft, unscheduled)
    else:
        message = f"{counts.ready}/{spec.nodes} pods running"
        draft.phase(Phase.STARTING, message)
        draft.condition(ConditionType.RUNNING, False, Reason.PODS_STARTING, message)


def _creation_reason(draft: Draft, current: Sequence[PodState]) -> Reason:
    """Why pods are created: a new attempt, a lost pod replaced (the job says Restarting), or an elastic scale-up."""
    if not current:
        return Reason.CREATED
    return Reason.POD_REPLACED if draft.status.get("phase") == Phase.RESTARTING else Reason.SCALED


def _report_running(draft: Draft, message: str, reason: Reason) -> None:
    """Running, with an event when the job starts running and when an elastic gang's last pods join it."""
    before = find_condition(draft.status, ConditionType.RUNNING) or {}
    joined = before.get("status") == "True" and before.get("reason") != reason
    if draft.status.get("phase") != Phase.RUNNING or joined:
        draft.events.append(Event("Normal", reason, message[:1024]))
    draft.phase(Phase.RUNNING, message)
    draft.condition(ConditionType.RUNNING, True, reason, message)
    draft.condition(ConditionType.RESTARTING, False, reason, message)
    draft.status.setdefault("runningTime", isoformat(draft.now))
    policy = draft.job.spec.failure_policy
    if policy.stall_timeout_seconds:
        draft.condition(ConditionType.STALLED, False, reason, "the training heartbeat is fresh")
        draft.requeue(policy.stall_timeout_seconds)


def _report_pending(draft: Draft, unscheduled: Sequence[PodState]) -> None:
    message, reason = _pending_message(draft, unscheduled)
    draft.phase(Phase.PENDING, message)
    draft.condition(ConditionType.RUNNING, False, reason, message)


def _pending_message(draft: Draft, unscheduled: Sequence[PodState]) -> tuple[str, Reason]:
    """The pods not placed yet, and the scheduler's reason when it said it cannot place them (for a gang,
    kube-scheduler's PodGroup message: minCount cannot be satisfied, no feasible placement...)."""
    waiting = [*(p.name for p in unscheduled), *(pod_name(draft.job.name, i) for i in draft.create)]
    message = f"waiting for {len(waiting)} pod(s) to be scheduled: {some_names(waiting)}"
    why = next((p.unschedulable for p in unscheduled if p.unschedulable), None)
    if why is None:
        return message, Reason.PODS_PENDING
    return f"{message}; the scheduler: {why}{excluded_note(draft.status)}", Reason.UNSCHEDULABLE
