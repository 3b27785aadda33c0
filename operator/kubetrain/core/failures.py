"""Failures and backoff: what a failed pod means for the job, what a failed API call means for the operator.

Failure taxonomy (decided from pod status, never guessed):
- disruption (DisruptionTarget condition, eviction, preemption, node loss, a pod that vanished)
  -> the lost pod replaced alone while the others wait for it (replace_lost_pods, where the job allows it: never
  node 0, which hosts the rendezvous), else a gang restart; neither counts against backoffLimit;
- OOMKilled -> Failed with reason OOMKilled, unless failurePolicy.restartOnOOM;
- any other non-zero exit -> gang restart while restarts < backoffLimit, then Failed;
- torchrun's failure (exit 1) in a pod whose kubelet restarts its containers in place (manifests.in_place_rule)
  -> the pod lives on, the gang re-forms at the same attempt (handle_in_place_restarts), counted the same way;
- torchrun's RendezvousTimeoutError (the gang did not all join in rendezvousTimeoutSeconds), or the agents'
  RendezvousConnectionError while node 0 (the rendezvous host) never started -> Failed at once;
- more than failurePolicy.disruptionLimit disruptions -> Failed, reason TooManyDisruptions (no endless evictions).
A failure that points at its node (nodes.py) is marked so in its record; a node that keeps failing the job is
avoided by its next pods.
The first pod to fail names the cause: peers that fail afterwards only lost their rendezvous (a first failure
that is itself only a consequence, RendezvousClosedError, waits up to CAUSE_WAIT for its cause to be seen).

When carrying out a decision fails, ``failed_reconcile`` decides: pods the API server refuses as invalid
fail the job; anything else is retried with backoff and shown in condition ReconcileError.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from kubetrain.core import api
from kubetrain.core.api import ConditionType, Phase, Reason
from kubetrain.core.goodput import record_goodput
from kubetrain.core.launch import RENDEZVOUS_HOST_INDEX, lost_pod_wait_seconds
from kubetrain.core.naming import pod_name
from kubetrain.core.nodes import exclude_failing_nodes, node_fault
from kubetrain.core.spec import TrainingJob
from kubetrain.core.status import (
    RENDEZVOUS_CLOSED_ERROR,
    RENDEZVOUS_CONNECTION_ERROR,
    FailureKind,
    PodState,
    isoformat,
    parse_time,
    some_names,
)
from kubetrain.core.status_policy import (
    Decision,
    Draft,
    Event,
    find_condition,
    finish,
    fold_gpu_seconds,
    progress_not_known_yet,
)

__all__ = [
    "CAUSE_WAIT",
    "HOST_LATE_SLACK",
    "MAX_RETRY_DELAY",
    "ApiFailure",
    "classify",
    "failed_reconcile",
    "gang_restart",
    "handle_failed_pods",
    "handle_in_place_restarts",
    "recovered",
    "replace_lost_pods",
    "replaceable",
    "retry_delay",
    "while_retrying",
]

Json = Any

# The trainer's last words when a peer is gone and it cannot go on (its __main__ and rejoin.py).
PEER_LOST = "PeerLost"
# How long a failure that only follows another (RendezvousClosedError) waits for that other one to be seen.
CAUSE_WAIT = timedelta(seconds=5)
# Timestamps have one-second resolution: a node 0 that started within this of a peer's failure came too late.
HOST_LATE_SLACK = timedelta(seconds=2)
# One failure restarts several pods in place (the others' agents exit on the lost peer, or its lost store): pods
# restarted in place within this many seconds of a counted one are one restart.
IN_PLACE_ROUND = timedelta(seconds=30)
# Uncounted restarts in place (the others that one failure took along) allowed per node, before the gang is made
# again with new pods: each pod may end once or twice while node 0's store starts afresh.
IN_PLACE_FOLLOWERS_PER_NODE = 3
# Retries of a failed reconcile back off exponentially up to this many seconds.
MAX_RETRY_DELAY = 60.0


# --- Failed pods ------------------------------------------------------------------------------------------


def handle_failed_pods(draft: Draft, current: Sequence[PodState]) -> bool:
    """Act on the failed pods of this attempt, if any: fail the job or restart the gang. Whether there were any."""
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
    if _config_rejected(draft, current, failed, message):
        return True
    if kind is FailureKind.OOM and not draft.job.spec.failure_policy.restart_on_oom:
        _record_failures(draft, failed, Reason.OOM_KILLED, message, counted=True)
        finish(draft, current, False, Reason.OOM_KILLED,
               f"{message}: out of memory; raise spec.resources.memory or lower the batch size "
               "(set failurePolicy.restartOnOOM to retry as is)")
    elif _replacement_never_came(draft, first, kind):
        gang_restart(draft, current, Reason.REPLACEMENT_TIMEOUT,
                     f"{message}: the replacement of a lost pod did not join in time", counted=False, failed=failed)
    elif kind is FailureKind.RENDEZVOUS_TIMEOUT:
        _rendezvous_timed_out(draft, current, failed, message)
    elif kind is FailureKind.DISRUPTION and all(p.disrupted for p in failed) and replaceable(draft, failed):
        replace_lost_pods(draft, current, failed, message)
    elif kind is FailureKind.DISRUPTION:
        gang_restart(draft, current, Reason.DISRUPTED, message, counted=False, failed=failed)
    else:
        gang_restart(draft, current, Reason.POD_FAILED if kind is FailureKind.ERROR else Reason.OOM_KILLED,
                     message, counted=True, failed=failed)
    return True


def _config_rejected(draft: Draft, current: Sequence[PodState], failed: Sequence[PodState], message: str, *,
                     per_pod: Mapping[str, Mapping[str, Json]] | None = None) -> bool:
    """The first of ``failed`` is the trainer rejecting its configuration: every retry would fail the same way, so
    the job fails; ``per_pod``: more for each pod's record (_record_failures)."""
    report = failed[0].final_report() or {}
    if report.get("reason") != "ConfigError":
        return False
    _record_failures(draft, failed, Reason.INVALID_CONFIG, message, counted=True, per_pod=per_pod)
    finish(draft, current, False, Reason.INVALID_CONFIG,
           f"{message}: the trainer rejected its configuration: {report.get('message', '')}")
    return True


def _rendezvous_timed_out(draft: Draft, current: Sequence[PodState], failed: Sequence[PodState], message: str, *,
                          per_pod: Mapping[str, Mapping[str, Json]] | None = None) -> None:
    """The gang did not form: the job fails, not retried (the same gang would wait the same way)."""
    _record_failures(draft, failed, Reason.RENDEZVOUS_TIMEOUT, message, counted=True, per_pod=per_pod)
    finish(draft, current, False, Reason.RENDEZVOUS_TIMEOUT, _rendezvous_timeout_message(draft, current, failed[0]))


def _describe(pod: PodState) -> str:
    code = f" with exit code {pod.exit_code}" if pod.exit_code is not None else ""
    node = f" on node {pod.node}" if pod.node else ""
    return f"pod {pod.name}{node} failed{code} ({pod.reason or 'Error'})"


def _awaiting_the_cause(draft: Draft, first: PodState, current: Sequence[PodState]) -> bool:
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


def _rendezvous_timeout_message(draft: Draft, current: Sequence[PodState], first: PodState) -> str:
    seconds = draft.job.spec.failure_policy.rendezvous_timeout_seconds
    # Pending, not unscheduled: a pod the scheduler could not place (e.g. one per machine, required) may be
    # placed the moment its peers exit, before this reconcile sees them; either way it never started in time.
    late = _host_never_came(first, current)
    unstarted = [p.name for p in current if p.phase == "Pending" or (late and p.index == RENDEZVOUS_HOST_INDEX)
                 or _started_after_a_peer_gave_up(p, first)]
    if unstarted:
        where = f"pod(s) {some_names(unstarted)} never started in time (see their events: unschedulable, image pull)"
    else:
        where = "every pod started, but not all of them joined (see `kubetrain logs`)"
    return (f"the gang did not all join torchrun's rendezvous within failurePolicy.rendezvousTimeoutSeconds="
            f"{seconds}: {where}; not retried, as the same gang would wait the same way")


# --- Pods restarted in place by their kubelet ------------------------------------------------------------------


def handle_in_place_restarts(draft: Draft, current: Sequence[PodState]) -> bool:
    """Account for the pods of this attempt whose containers the kubelet restarted since the last pass: record each
    run that ended, count one restart per round (IN_PLACE_ROUND), and fail the job when it is one too many or
    when retrying cannot help. Whether there were any."""
    ended = sorted((_as_failed(p) for p in current if p.last_run is not None and not _run_recorded(draft, p)),
                   key=lambda p: (p.finish_time or draft.now, p.index))
    if not ended:
        return False
    first = ended[0]
    message = _describe(first) if first.reason else (
        f"the kubelet restarted pod {first.name} in place (how its run ended was not seen: the kubelet shows it only "
        "while it restarts the pod)")
    if _config_rejected(draft, current, ended, message, per_pod=_restart_counts(ended)):
        return True
    if first.failure_kind is FailureKind.RENDEZVOUS_TIMEOUT:
        _rendezvous_timed_out(draft, current, ended, message, per_pod=_restart_counts(ended))
        return True
    if _gang_not_reforming(draft, ended):
        gang_restart(draft, current, Reason.POD_FAILED, f"{message}; the gang did not form again in place after "
                     f"{IN_PLACE_FOLLOWERS_PER_NODE * draft.job.spec.nodes} restarts of its pods", counted=False,
                     failed=ended)
        return True
    counted = not (_in_a_counted_round(draft, first) or _a_consequence(first))
    used_up = _restarts_used_up(draft, Reason.POD_FAILED, counted=counted)
    _record_failures(draft, ended, Reason.POD_FAILED, message, counted=counted,
                     recovery=None if used_up else Reason.IN_PLACE_RESTART, per_pod=_restart_counts(ended))
    if used_up is not None:
        finish(draft, current, False, used_up[0], f"{message}; {used_up[1]}")
        return True
    _restarting_in_place(draft, [p.name for p in ended], message, counted=counted)
    return True


def _restarting_in_place(draft: Draft, names: Sequence[str], message: str, *, counted: bool) -> None:
    if counted:
        draft.status["restarts"] = int(draft.status.get("restarts", 0)) + 1
        text = (f"{message}; the kubelet restarted the containers of pod(s) {some_names(names)} in place (same pods, "
                f"nodes, IPs and volumes): the gang re-forms at attempt {draft.attempt}, restart "
                f"{draft.status['restarts']}")
    else:
        text = f"{message}; pod(s) {some_names(names)} restarted in place within the same restart (not counted again)"
    draft.events.append(Event("Warning", Reason.IN_PLACE_RESTART, text[:1024]))
    progress_not_known_yet(draft)
    draft.status.pop("runningTime", None)  # the stall clock starts again once the gang trains again
    draft.phase(Phase.RESTARTING, text)
    draft.condition(ConditionType.RESTARTING, True, Reason.IN_PLACE_RESTART, text)
    draft.condition(ConditionType.RUNNING, False, Reason.IN_PLACE_RESTART, text)
    draft.requeue(1)


def _as_failed(pod: PodState) -> PodState:
    """The pod as its run that ended left it: what a pod that failed for good would say."""
    run = pod.last_run
    assert run is not None
    return replace(pod, phase="Failed", exit_code=run.exit_code, reason=run.reason, message=run.message,
                   finish_time=run.finish_time)


def _a_consequence(pod: PodState) -> bool:
    """The run ended only because another did: its gang's rendezvous was closed by an agent that gave up (the
    trainer's PeerLost, torchrun's RendezvousClosedError), or node 0's store went with its agent."""
    words = pod.message or ""
    report = pod.final_report() or {}
    return (report.get("reason") == PEER_LOST or RENDEZVOUS_CLOSED_ERROR in words
            or RENDEZVOUS_CONNECTION_ERROR in words)


def _gang_not_reforming(draft: Draft, ended: Sequence[PodState]) -> bool:
    """Uncounted restarts in place pile up since the last counted one (say a node 0 whose workers hang instead of
    ending, so that its store never starts afresh): the gang is made again with new pods, as before."""
    since = 0
    for record in draft.status.get("failures", ()):
        if record.get("attempt") == draft.attempt and record.get("recovery") == Reason.IN_PLACE_RESTART:
            since = 0 if record.get("counted") else since + 1
    return since + len(ended) > IN_PLACE_FOLLOWERS_PER_NODE * draft.job.spec.nodes


def _run_recorded(draft: Draft, pod: PodState) -> bool:
    """Whether the pod's run that ended last is in failures[] already (by pod uid and the kubelet's count)."""
    return any(r.get("podUID") == pod.uid and int(r.get("containerRestarts", 0)) >= pod.restarts
               for r in draft.status.get("failures", ()))


def _in_a_counted_round(draft: Draft, pod: PodState) -> bool:
    """Another pod of this attempt was restarted in place, and counted, less than IN_PLACE_ROUND ago: this one is
    part of the same restart (its agent left with the lost peer, or its store). A pod's own next run is not."""
    return any(r.get("attempt") == draft.attempt and r.get("recovery") == Reason.IN_PLACE_RESTART and r.get("counted")
               and r.get("pod") != pod.name and (when := parse_time(r.get("time"))) is not None
               and draft.now - when < IN_PLACE_ROUND for r in draft.status.get("failures", ()))


def _restart_counts(ended: Sequence[PodState]) -> dict[str, dict[str, Json]]:
    """Each restarted pod's record names the run by the kubelet's restart count (_run_recorded reads it)."""
    return {p.name: {"containerRestarts": p.restarts} for p in ended}


# --- Gang restarts and their limits -------------------------------------------------------------------------


def gang_restart(draft: Draft, current: Sequence[PodState], reason: str, message: str, *, counted: bool,
                 failed: Sequence[PodState] = (), details: Mapping[str, Json] | None = None) -> None:
    """Record the post-mortem (with ``details``, e.g. a stall's hang), bump the attempt, delete every pod of
    this attempt; or fail the job when this restart is one too many."""
    used_up = _restarts_used_up(draft, reason, counted=counted)
    _record_failures(draft, failed, reason, message, counted=counted,
                     recovery=None if used_up else Reason.GANG_RESTART, details=details)
    if used_up is not None:
        final_reason, explanation = used_up
        finish(draft, current, False, final_reason, f"{message}; {explanation}")
        return
    if counted:
        draft.status["restarts"] = int(draft.status.get("restarts", 0)) + 1
    elif reason == Reason.DISRUPTED:  # a scale is the user's wish, not a disruption
        draft.status["disruptions"] = int(draft.status.get("disruptions", 0)) + 1
    fold_gpu_seconds(draft, current)
    draft.status["attempt"] = draft.attempt + 1
    progress_not_known_yet(draft)
    draft.status.pop("runningTime", None)
    draft.status.pop("attemptStartTime", None)
    text = f"{message}; gang restart as attempt {draft.attempt}" + ("" if counted else " (not counted)")
    draft.events.append(Event("Warning", reason, text))  # also from Restarting (a replacement that never came)
    draft.phase(Phase.RESTARTING, text)
    draft.condition(ConditionType.RESTARTING, True, reason, text)
    draft.condition(ConditionType.RUNNING, False, reason, text)
    draft.remove(current)


# --- One lost pod replaced alone -----------------------------------------------------------------------------


def replaceable(draft: Draft, lost: Sequence[PodState | int]) -> bool:
    """Whether the job's ``lost`` pods (or indices) can be replaced alone: the job allows it
    (launch.lost_pod_wait_seconds) and node 0 is not among them (its agent hosts the rendezvous store)."""
    indices = {p if isinstance(p, int) else p.index for p in lost}
    return lost_pod_wait_seconds(draft.job) is not None and RENDEZVOUS_HOST_INDEX not in indices


def replace_lost_pods(draft: Draft, current: Sequence[PodState], lost: Sequence[PodState], message: str, *,
                      vanished: Sequence[int] = ()) -> None:
    """Remove the ``lost`` pods (evicted, preempted, failed with their node) and the ``vanished`` indices' pods
    come again at the same attempt (lifecycle's missing pods), while the others wait for them (the trainer's
    rejoin.py); or fail the job when this disruption is one too many.

    Counted once, however many reconciles see it: a pod already in failures[] (by uid) is not counted again,
    and a vanished pod is counted by the pass that leaves Running (the next one sees the job Restarting).
    """
    new = [p for p in lost if not _recorded(draft, p)]
    vanished_names = [pod_name(draft.job.name, i) for i in vanished]
    if new or vanished:
        used_up = _restarts_used_up(draft, Reason.DISRUPTED, counted=False)
        _record_failures(draft, new, Reason.DISRUPTED, message, counted=False,
                         recovery=None if used_up else Reason.POD_REPLACED)
        if used_up is not None:
            finish(draft, current, False, used_up[0], f"{message}; {used_up[1]}")
            return
        draft.status["disruptions"] = int(draft.status.get("disruptions", 0)) + 1
        names = [p.name for p in new] + vanished_names
        draft.events.append(Event("Warning", Reason.DISRUPTED,
                                  f"{message}; replacing pod(s) {some_names(names)} alone at attempt {draft.attempt}: "
                                  "the others wait for it (not counted)"[:1024]))
    draft.remove(lost)
    draft.status.pop("runningTime", None)  # the stall clock starts again once the gang trains again
    waiting = [p.name for p in lost] + vanished_names
    text = (f"replacing lost pod(s) {some_names(waiting)} at attempt {draft.attempt}; the others wait for it "
            f"(the last cause: {message})")
    draft.phase(Phase.RESTARTING, text)
    draft.condition(ConditionType.RESTARTING, True, Reason.POD_REPLACED, text)
    draft.condition(ConditionType.RUNNING, False, Reason.POD_REPLACED, text)


def _replacement_never_came(draft: Draft, first: PodState, kind: FailureKind | None) -> bool:
    """A pod was replaced in this attempt, and the gang did not form again: a survivor gave up waiting (the
    trainer's PeerLost), or an agent timed out in the rendezvous (torch dropped a live agent that was late with
    its heartbeats, and the others never saw the replacement). The disruption, counted when the pod was lost,
    now costs a gang restart, which is not counted again: the job does not fail for it."""
    report = first.final_report() or {}
    gave_up = report.get("reason") == PEER_LOST or kind is FailureKind.RENDEZVOUS_TIMEOUT
    return gave_up and any(
        r.get("attempt") == draft.attempt and r.get("recovery") == Reason.POD_REPLACED
        for r in draft.status.get("failures", ()))


def _recorded(draft: Draft, pod: PodState) -> bool:
    """Whether this incarnation of the pod is in failures[] already (a disruption seen by an earlier pass); its
    runs restarted in place are records of their own."""
    return pod.uid is not None and any(r.get("podUID") == pod.uid and "containerRestarts" not in r
                                       for r in draft.status.get("failures", ()))


def _restarts_used_up(draft: Draft, reason: str, *, counted: bool) -> tuple[str, str] | None:
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


def _record_failures(draft: Draft, failed: Sequence[PodState], reason: str, message: str, *,
                     counted: bool, recovery: str | None = None, details: Mapping[str, Json] | None = None,
                     per_pod: Mapping[str, Mapping[str, Json]] | None = None) -> None:
    """Append the post-mortem: one record per failed pod, or one for the attempt (stall, lost pod), with the
    recovery it led to (a gang restart, or the pod replaced alone; none when the job ends)."""
    base: dict[str, Json] = {"attempt": draft.attempt, "reason": reason, "counted": counted,
                             "time": isoformat(draft.now), "message": message[:1024]}
    if recovery is not None:
        base["recovery"] = recovery
    base |= details or {}
    records = list(draft.status.get("failures", []))
    earlier = len(records)
    if not failed:
        records.append(base)
    for pod in failed:
        record = base | {"pod": pod.name, "node": pod.node or "", "reason": pod.reason or reason}
        if pod.uid:
            record["podUID"] = pod.uid
        if pod.exit_code is not None:
            record["exitCode"] = pod.exit_code
        if pod.message:  # the post-mortem that outlives the pod (`kubetrain logs --attempt N`)
            record["logTail"] = pod.message[-api.LOG_TAIL_CHARS:]
        if fault := node_fault(pod):
            record["nodeFault"] = fault
        records.append(record | dict((per_pod or {}).get(pod.name, {})))
    draft.status["failures"] = records[-api.MAX_FAILURES_KEPT:]
    exclude_failing_nodes(draft, records[earlier:])


# --- When carrying out a decision fails -------------------------------------------------------------------


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
    draft = Draft.from_stored(job, status, now)
    reason = classify(failure)
    what = f"creating {failure.creating}" if failure.creating else "reconciling"
    if reason is Reason.INVALID_POD_SPEC:
        message = f"the API server rejected {failure.creating}: {failure.message}"
        if _reconcile_error(status) is not None:
            draft.condition(ConditionType.RECONCILE_ERROR, False, reason, message)
        finish(draft, [p for p in pods if p.job_uid == job.uid], False, reason, message)
        record_goodput(draft, status)
        return draft.decision()
    message = f"retrying in {retry_in:.0f}s: {what} failed: {failure.message}"
    draft.condition(ConditionType.RECONCILE_ERROR, True, reason, message)
    draft.status["message"] = message[:api.MAX_STATUS_MESSAGE]
    draft.events.append(Event("Warning", reason, f"{what} failed: {failure.message}"[:1024]))
    return draft.decision()


def _reconcile_error(status: Mapping[str, Json]) -> Mapping[str, Json] | None:
    found = find_condition(status, ConditionType.RECONCILE_ERROR)
    return found if found is not None and found.get("status") == "True" else None


def while_retrying(status: Mapping[str, Json]) -> dict[str, Json]:
    """``status`` as written before acting: while a failed step is being retried the message keeps saying so."""
    error = _reconcile_error(status)
    if error is None or status.get("phase") in (Phase.SUCCEEDED, Phase.FAILED):
        return dict(status)
    return {**status, "message": str(error.get("message", ""))[:api.MAX_STATUS_MESSAGE]}


def recovered(job: TrainingJob, status: Mapping[str, Json], now: datetime) -> dict[str, Json]:
    """``status`` once every step of a reconcile succeeded: a ReconcileError condition turns False."""
    if _reconcile_error(status) is None:
        return dict(status)
    draft = Draft.from_stored(job, status, now)
    draft.condition(ConditionType.RECONCILE_ERROR, False, Reason.RECONCILED, "the last reconcile succeeded")
    return draft.status
