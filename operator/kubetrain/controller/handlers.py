"""kopf handlers: thin triggers around one level-based reconcile of a TrainingJob.

Every trigger (a change of the job, a change of one of its pods, a due timer) queues the same ``reconcile``
(workqueue.py: one pass of a job at a time, timers for jobs that asked to be looked at later): read the job,
take its pods from our own watch of them (podwatch.py), ask the pure core what to do, write the status, act.
No kopf timers or daemons: they would put a finalizer on every job (and block its deletion while the operator
is down). A failed reconcile never escapes a handler (kopf does not retry on.event handlers): the queue retries
it with backoff, and the job's status and events say what failed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import aiohttp
import kopf

from kubetrain.controller import metrics
from kubetrain.controller.companions import create_companions, name_taken, resolve_gang_scheduling
from kubetrain.controller.jobstate import (
    HandlerLogger,
    JobRecord,
    Key,
    OperatorState,
    PodIndex,
    StoredStatus,
    Trigger,
    trim_memory,
    without_managed_fields,
)
from kubetrain.controller.kopf_setup import configure, scanning_needed
from kubetrain.controller.operator_config import OperatorConfig
from kubetrain.controller.queueing import admit, settle
from kubetrain.core import api, judgements
from kubetrain.core.failures import failed_reconcile, recovered, retry_delay, while_retrying
from kubetrain.core.goodput import worth_writing
from kubetrain.core.hangs import Hang, RankStack, Silent, explain
from kubetrain.core.lifecycle import declares_stall, reconcile
from kubetrain.core.manifests import build_pod, owner_reference
from kubetrain.core.nodes import excluded_names, needs_ready_nodes, ready_node_names
from kubetrain.core.spec import SpecError, TrainingJob
from kubetrain.core.status import PodState, Scrape, merge_patch
from kubetrain.core.status_policy import (
    SCRAPE_RECHECK_SECONDS,
    Decision,
    Event,
    changes_course,
    may_wait,
    must_persist_before_acting,
)
from kubetrain.k8s.kube import (
    ConflictError,
    JobGoneError,
    Kube,
    NamespaceTerminatingError,
    api_failure,
    login,
)
from kubetrain.k8s.lanes import prompt_from_here, routine_calls
from kubetrain.k8s.nodewatch import NodeWatch
from kubetrain.k8s.podwatch import PodWatch
from kubetrain.k8s.scrape import ask_checkpoint, fetch_progress, fetch_stacks
from kubetrain.k8s.workqueue import WorkQueue

__all__ = ["operator_state"]

Json = Any
T = TypeVar("T")
JOB = (api.GROUP, api.VERSION, api.PLURAL)
POD_CHANGE = Trigger("pod", logging.getLogger("kubetrain.pods"))
NODE_NOTICE = Trigger("node notice", logging.getLogger("kubetrain.nodes"))
TIMER = Trigger("timer", logging.getLogger("kubetrain.scheduler"))  # a retry, or a look again in a moment
LOOK = replace(TIMER, routine=True)  # the job's next look (_schedule): its progress, a resync
CONFLICT_RETRY = 0.5  # seconds: the job changed while we reconciled it; read it again soon
# How long the first job waits for the operator's first list of the nodes (which say whether pods may restart in
# place); an operator without the right to list nodes goes on without (no restart in place).
NODE_LIST_WAIT_SECONDS = 10.0
# Pods the operator created reach its index through the watch a moment later; until then a reconcile would
# see them missing and create them again. It waits this often, for at most EXPECTATION_TIMEOUT.
EXPECTATION_RETRY = 0.1
EXPECTATION_TIMEOUT = 10.0


def operator_state(config: OperatorConfig, kube: Kube, http: aiohttp.ClientSession,
                   pods: PodIndex) -> OperatorState:
    """The handlers' shared state, with the queue that reconciles through it."""
    state = OperatorState(config=config, kube=kube, http=http, pods=pods)

    async def process(key: Key, trigger: Trigger) -> None:
        with routine_calls(trigger.routine):
            await _reconcile_measured(state, key, trigger)
    state.queue = WorkQueue(process, backoff=retry_delay, workers=config.workers, routine=lambda t: t.routine)
    return state


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    """The CLI hands its settings over in kopf's memo (``kopf.run(memo=...)``): no module global."""
    config: OperatorConfig = memo.get("config") or OperatorConfig()
    configure(settings)
    kube = Kube(lambda: login(settings), connections=config.api_connections)
    settings.scanning.disabled = not await scanning_needed(kube)
    config = await resolve_gang_scheduling(config, kube)
    pods = PodWatch(kube, all_namespaces=config.all_namespaces)
    state = operator_state(config, kube, aiohttp.ClientSession(), pods)
    pods.on_change(lambda key: state.queue.add(key, POD_CHANGE))
    state.nodes = NodeWatch(kube)  # started by the first job's event (see job_changed)
    memo["state"] = state
    memo["trimmer"] = asyncio.create_task(trim_memory(state))


@kopf.on.login()
def login_handler(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """kopf's credentials, the same as Kube's: without a handler of our own, kopf would log in through the
    official client, which the operator does not load (see memory.py)."""
    return login(settings)


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    state: OperatorState = memo["state"]
    memo["trimmer"].cancel()
    state.queue.close()
    if state.nodes is not None:
        await state.nodes.close()
    await state.pods.close()
    await state.http.close()
    await state.kube.close()


def _jobs_on_node(state: OperatorState, node: str) -> None:
    """A node's notice came or went: the jobs with a pod there look again (notices.py)."""
    for key, pods in list(state.pods.items()):
        if any(p.node == node for p in pods):
            state.queue.add(key, NODE_NOTICE)


def _served(namespace: str | None, memo: Any, **_: Any) -> bool:
    """kopf's filter of job events: with --namespace patterns it watches every namespace, and this picks ours."""
    state: OperatorState = memo["state"]
    return state.config.serves(namespace or "")


@kopf.on.event(*JOB, when=_served)
async def job_changed(event: kopf.RawEvent, namespace: str | None, name: str, memo: Any,
                      logger: HandlerLogger, **kwargs: Any) -> None:
    """Reconcile the job from the body its event shows, in kopf's worker of the job; or queue it, the body kept in
    its record, when a pass of it runs (one more after that) or passes_at_once run."""
    state: OperatorState = memo["state"]
    assert namespace is not None  # TrainingJobs are namespaced
    key = (namespace, name)
    if event.get("type") == "DELETED":
        state.forget(key)
        return
    body = event["object"]
    metadata = body.get("metadata", {})
    record = state.record(key)
    if metadata.get("resourceVersion") in record.own_writes:
        return  # the echo of a status this operator wrote: nothing changed that the reconcile did not know
    if state.queue.failures(key) and record.generation == metadata.get("generation"):
        return  # our own status write after a failure: the retry waits for its backoff (a spec change does not)
    if state.nodes is not None:
        state.nodes.start(lambda node: _jobs_on_node(state, node))
        await state.nodes.listed(NODE_LIST_WAIT_SECONDS)  # whether pods may restart in place (once; then at once)
    await state.pods.ready(namespace)  # its pods are listed: a reconcile before would create them again
    trigger = Trigger("job", logger)
    if state.queue.busy(key) or state.queue.running() >= state.config.passes_at_once:
        # Newer than a running pass's body. And past passes_at_once (a burst of new jobs), a pass run here would
        # wait for the API with kopf's worker of the job around it: 5,000 jobs created at once held 129,000
        # coroutines and 310 MB, whose freed memory stayed the operator's. Queued, it holds the body alone.
        record.body = without_managed_fields(body)
        state.queue.add(key, trigger)
    else:
        await state.queue.run(key, replace(trigger, body=body))


async def _reconcile_measured(state: OperatorState, key: Key, trigger: Trigger) -> None:
    """One reconcile pass (the queue's processing of a job); never raises: a failed one is retried with backoff
    whatever triggered it."""
    record = state.record(key)
    logger = trigger.logger
    started = time.perf_counter()
    try:
        state.reconciles += 1
        await _reconcile(state, key, record, trigger)
        state.queue.succeeded(key)
        if not state.keeps_cached(key, record) and not state.queue.again(key):
            record.drop_cached()
    except ConflictError:
        record.drop_cached()
        state.queue.reschedule(key, CONFLICT_RETRY, TIMER)
    except JobGoneError as gone:  # deleted while we reconciled it: normal, so no error, no retry
        logger.debug("%s", gone)
        state.forget(key)
        if isinstance(gone, NamespaceTerminatingError):
            state.hold_namespace(key[0])
    except Exception as error:
        record.drop_cached()
        metrics.RECONCILE_ERRORS.labels(handler=trigger.name).inc()
        delay = state.queue.add_rate_limited(key, TIMER)
        logger.warning("reconcile of %s/%s failed, retrying in %.0fs: %s", *key, delay, error,
                       exc_info=api_failure(error).internal)
    finally:
        metrics.RECONCILE_DURATION.labels(handler=trigger.name).observe(time.perf_counter() - started)


async def _write_status(state: OperatorState, record: JobRecord, job: TrainingJob, stored: StoredStatus,
                        status: Mapping[str, Json]) -> None:
    patch = merge_patch(stored.status, status)
    if patch:
        written = await state.kube.patch_job_status(job.namespace, job.name, patch, stored.version)
        stored.version = written["metadata"]["resourceVersion"]
        stored.status = status
        record.wrote(written, at=time.monotonic())


def _post(body: Json, events: tuple[Event, ...]) -> None:
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


async def _reconcile(state: OperatorState, key: Key, record: JobRecord, trigger: Trigger) -> None:
    """Read the job and its pods, have the core decide and carry it out, write the status (unless it may wait)."""
    read = await _read(state, key, record, trigger)
    if read is None:
        return
    body, job = read
    stored = StoredStatus(body.get("status") or {}, body["metadata"]["resourceVersion"])
    pods = list(state.pods.get(key, ()))
    if record.awaiting_own_creations(pods, now=time.monotonic()):
        state.queue.add_after(key, EXPECTATION_RETRY, TIMER)  # look again in a moment
        return
    try:
        decision = await _decide_and_act(state, record, body, job, stored, pods=pods, logger=trigger.logger)
    except (ConflictError, JobGoneError):
        raise
    except Exception as error:
        if await _gone(state, job):  # e.g. a 404 creating a pod in the job's deleted namespace
            raise JobGoneError(f"{job.namespace}/{job.name} was deleted while reconciling") from error
        decision = await _report_failure(state, record, body, job, stored, pods=pods, error=error)
        if decision.status.get("phase") != api.Phase.FAILED:
            raise  # retried with backoff by _reconcile_measured, as the status now says
        await _act(state, record, job, pods, decision, logger=trigger.logger)  # failed for good: stop the gang
    status = recovered(job, decision.status, datetime.now(UTC))
    write_by = state.config.coalescing.write_by(stored.status, status, may_wait=may_wait(stored.status, status),
                                                written_at=record.written_at, now=time.monotonic())
    if write_by is None and worth_writing(stored.status, status):  # goodput alone: now and then
        await _write_status(state, record, job, stored, status)
    _schedule(state, key, decision, write_by=write_by)


async def _read(state: OperatorState, key: Key, record: JobRecord,
                trigger: Trigger) -> tuple[Json, TrainingJob] | None:
    """The job's body (its event's, as last seen, or the API server's) and spec; None when it is not ours to
    reconcile now."""
    namespace, name = key
    if state.holds(namespace):
        return None
    body = trigger.body or record.body or await state.kube.get_job(namespace, name)
    if body is None:  # e.g. its pods' events as they are deleted after it: nothing of it is kept
        raise JobGoneError(f"{namespace}/{name} is gone")
    body = without_managed_fields(body)
    record.body = body  # also when hands off: a later pass must not act on an older body (e.g. before deletion)
    if judgements.hands_off(body):
        return None
    try:
        job = record.parsed(body)
    except SpecError as error:  # only for objects stored before the CRD's rules tightened
        kopf.event(body, type="Warning", reason="InvalidSpec", message=str(error)[:1024])
        return None
    record.generation = job.generation
    return body, job


async def _still_here(state: OperatorState, job: TrainingJob) -> bool | None:
    """Whether the job, read now, is still this one and not being deleted; None when the read failed."""
    try:
        body = await state.kube.get_job(job.namespace, job.name)
    except Exception:
        return None
    return body is not None and not body["metadata"].get("deletionTimestamp") and body["metadata"].get("uid") == job.uid


async def _gone(state: OperatorState, job: TrainingJob) -> bool:
    """Whether the job was deleted (or is being deleted, or was replaced by a new one of the same name)."""
    return await _still_here(state, job) is False  # cannot tell: the original error is reported and retried


async def _decide_and_act(state: OperatorState, record: JobRecord, body: Json, job: TrainingJob, stored: StoredStatus,
                          *, pods: list[PodState], logger: HandlerLogger) -> Decision:
    """Ask the pure core what to do, write the status it decided (so a crash never loses a count), act."""
    before = stored.status
    progress = await _scrape(state, record, before, pods)
    # Kueue's say over a job in its queue; the job placed where it admitted
    gate = await admit(state, record, job, before)
    job = gate.job
    ready = await _ready_nodes(state, logger) if needs_ready_nodes(pods, int(before.get("attempt", 0))) else None
    now = datetime.now(UTC)
    decide = functools.partial(reconcile, job, before, pods, now, progress, queue=gate.admission, ready_nodes=ready,
                               notices=state.notices)
    decision = await _decided(state, job, before, pods, decide=decide, now=now)
    if changes_course(before, decision):
        prompt_from_here()  # a look that finds the job to act on (a stalled gang to restart): someone waits now
    if await _went_with_its_namespace(state, job, decision):
        raise NamespaceTerminatingError(f"namespace {job.namespace} is being deleted")
    written_first = must_persist_before_acting(before, decision)
    if written_first:
        await _write_status(state, record, job, stored, while_retrying(decision.status))
    # else only pods are created: a crash before the status write (in _reconcile) decides the same again
    state.observe(record, job, before, decision.status, decision.events, now=now)
    _post(body, decision.events)
    try:
        await _act(state, record, job, pods, decision, logger=logger)
    except Exception:
        if not written_first:  # what was decided (progress, conditions) stands; the failure is added to it
            await _write_status(state, record, job, stored, while_retrying(decision.status))
        raise
    await settle(state, record, gate, decision.status, pods)  # its Workload Finished, or its quota given back
    return decision


async def _decided(state: OperatorState, job: TrainingJob, before: Mapping[str, Json], pods: list[PodState], *,
                   decide: Callable[..., Decision], now: datetime) -> Decision:
    """The core's decision, decided again with what it needs found out first: where a stalled gang's ranks are
    (asked before their pods go), or how rank 0 took a checkpoint request (a node announced a disruption)."""
    decision = decide()
    if declares_stall(decision, now):
        stalled = [p for p in pods if p.attempt == before.get("attempt", 0)]
        return decide(hang=await _where_the_ranks_are(state, job, stalled))
    if decision.ask_checkpoint is not None:
        address = judgements.scrape_address(before, pods)
        return decide(checkpoint_answer=await ask_checkpoint(state.http, address, decision.ask_checkpoint))
    return decision


async def _where_the_ranks_are(state: OperatorState, job: TrainingJob, stalled: list[PodState]) -> Hang:
    """Every rank's stack (their /stacks, all asked at once), compared: core/hangs.py."""
    running = [(p.name, p.ip) for p in stalled if p.ip and p.phase == "Running"]
    answers = await fetch_stacks(state.http, running, job.spec.procs_per_node)
    return explain([a for a in answers if isinstance(a, RankStack)], [a for a in answers if isinstance(a, Silent)],
                   nodes={p.name: p.node or "" for p in stalled})


async def _ready_nodes(state: OperatorState, logger: HandlerLogger) -> frozenset[str] | None:
    """The cluster's Ready nodes; None when they cannot be listed (the core then excludes no node, and says why)."""
    try:
        return ready_node_names(await state.kube.list_nodes())
    except Exception as error:  # e.g. a chart without the nodes rule: failures are still handled, nodes kept
        logger.warning("cannot list the cluster's nodes: %s", error)
        return None


async def _went_with_its_namespace(state: OperatorState, job: TrainingJob, decision: Decision) -> bool:
    """Whether the pods that went from under the gang (a disruption) went with their namespace: then there is
    nothing to restart, and no event can be posted there (kopf would retry each for a minute)."""
    if not judgements.needs_namespace_probe(decision.events):
        return False
    probe = build_pod(job, 0, int(decision.status.get("attempt", 0)), default_image=state.config.trainer_image,
                      gang=state.config.gangs)
    return await state.kube.refuses_new_pods(job.namespace, probe)


async def _report_failure(state: OperatorState, record: JobRecord, body: Json, job: TrainingJob, stored: StoredStatus,
                          *, pods: list[PodState], error: Exception) -> Decision:
    """Put a failed step in the status and an event: the job fails if retrying cannot help."""
    retry_in = state.queue.next_backoff((job.namespace, job.name))
    decision = failed_reconcile(job, stored.status, pods, api_failure(error), now=datetime.now(UTC), retry_in=retry_in)
    await _write_status(state, record, job, stored, decision.status)
    _post(body, decision.events)
    return decision


async def _scrape(state: OperatorState, record: JobRecord, status: Mapping[str, Json],
                  pods: list[PodState]) -> Scrape | None:
    """Rank 0's progress (or why it cannot be read) when a read is due (judgements.ScrapeClock)."""
    now = time.monotonic()
    if not record.scrape.due(status.get("phase"), now=now, interval=state.periods().progress,
                             recheck=SCRAPE_RECHECK_SECONDS):
        return None
    address = judgements.scrape_address(status, pods)
    if address is None:
        return None
    scrape = await fetch_progress(state.http, address)
    record.scrape, seen = record.scrape.after(scrape, now=now)
    return seen


async def _act(state: OperatorState, record: JobRecord, job: TrainingJob, pods: list[PodState],
               decision: Decision, *, logger: HandlerLogger) -> None:
    """Carry out the decision, after its status was written (so a crash never loses a count)."""
    kube = state.kube
    for name in decision.force_delete:
        logger.warning("force-deleting pod %s stuck terminating (its node is lost)", name)
    await _all([*(kube.delete_pod(job.namespace, name) for name in decision.delete),
                *(kube.delete_pod(job.namespace, name, force=True) for name in decision.force_delete)])
    await _adopt(state, job, pods)
    if decision.create:
        await _create_attempt(state, record, job, decision, logger)
    if decision.delete_job:
        logger.info("ttlSecondsAfterFinished passed: deleting the job")
        await kube.delete_job(job.namespace, job.name)


async def _adopt(state: OperatorState, job: TrainingJob, pods: list[PodState]) -> None:
    """Give the job's pods that lost their owner reference (someone stripped it) their owner back. The garbage
    collector strips it too when the job is deleted with --cascade=orphan, and the pod's event can come before
    the job's: adopted then, the pod would be collected with the job. So, as Kubernetes' own controllers do, adopt
    only once a fresh read shows the job still here and not being deleted."""
    orphans = [pod for pod in pods if pod.job_uid == job.uid and not pod.has_owner]
    if orphans and await _still_here(state, job):
        await _all(state.kube.adopt_pod(job.namespace, pod.name, owner_reference(job)) for pod in orphans)


async def _create_attempt(state: OperatorState, record: JobRecord, job: TrainingJob, decision: Decision,
                          logger: HandlerLogger) -> None:
    """The missing pods and their companions: with gangs the PodGroup first (a pod whose group is missing waits
    unscheduled), else both at once (the pods' agents wait for the Service's DNS names anyway)."""
    companions = create_companions(state, job, int(decision.status["attempt"]), logger)
    if state.config.gangs:
        await companions
        await _create_pods(state, record, job, decision)
    else:
        await _all([companions, _create_pods(state, record, job, decision)])


async def _create_pods(state: OperatorState, record: JobRecord, job: TrainingJob, decision: Decision) -> None:
    attempt = int(decision.status["attempt"])
    avoid = excluded_names(decision.status)
    in_place = state.nodes is not None and state.nodes.restart_in_place
    new_pods = [build_pod(job, index, attempt, default_image=state.config.trainer_image, gang=state.config.gangs,
                          avoid=avoid, nodes_restart_in_place=in_place) for index in decision.create]
    record.expected = frozenset(p["metadata"]["name"] for p in new_pods)
    record.expected_until = time.monotonic() + EXPECTATION_TIMEOUT
    try:
        created = await _all(state.kube.create(job.namespace, pod) for pod in new_pods)
    except Exception:
        record.expected = frozenset()  # some were refused: the retry must not wait for them to appear
        raise
    for pod, existing in zip(new_pods, created, strict=True):
        by = judgements.holder(existing, job_uid=job.uid, job_name=job.name)
        if by is judgements.Holder.NOBODY:
            metrics.POD_CREATIONS.inc()
        elif by is not judgements.Holder.THIS_JOB:
            raise name_taken(job, "pod", pod["metadata"]["name"], by)


async def _all(calls: Iterable[Awaitable[T]]) -> list[T]:
    """API calls at once (a gang's pods are created and deleted together; Kube's connection limit bounds
    them); the first error is raised once every call has ended, so none is left running unseen."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(list[T], results)


def _schedule(state: OperatorState, key: Key, decision: Decision, write_by: float | None = None) -> None:
    """The job's next look; ``write_by``: the monotonic time by which a deferred status write is due."""
    write_in = None if write_by is None else write_by - time.monotonic()
    periods = state.periods()
    delay = judgements.next_look_in(decision.status.get("phase"), requeue_after=decision.requeue_after,
                                    deletes=bool(decision.delete), write_in=write_in, resync=periods.resync,
                                    progress=periods.progress)
    if delay is None:
        state.queue.cancel(key)  # nothing left to do until the job changes
    else:
        state.queue.reschedule(key, delay, LOOK)
