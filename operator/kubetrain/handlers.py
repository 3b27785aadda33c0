"""kopf handlers: thin triggers around one level-based reconcile of a TrainingJob.

Every trigger (a change of the job, a change of one of its pods, a due timer) runs the same
``reconcile``: read the job, take its pods from our own watch of them (podwatch.py), ask the pure core what
to do, write the status, act.
No kopf timers or daemons: they would put a finalizer on every job (and block its deletion while
the operator is down); a small scheduler of our own re-checks jobs that asked to be looked at later.
A failed reconcile never escapes a handler (kopf does not retry on.event handlers): the scheduler retries
it with backoff, and the job's status and events say what failed.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import math
import time
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar, cast

import aiohttp
import kopf

from kubetrain import api, metrics
from kubetrain.kube import (
    ConflictError,
    CreateError,
    JobGoneError,
    Kube,
    NamespaceTerminatingError,
    api_failure,
    login,
)
from kubetrain.manifests import build_pod, build_pod_group, build_service, owner_reference
from kubetrain.memory import return_freed_memory
from kubetrain.podwatch import PodWatch
from kubetrain.policy import (
    SCRAPE_RECHECK_SECONDS,
    Decision,
    Event,
    failed_reconcile,
    may_wait,
    must_persist_before_acting,
    reconcile,
    recovered,
    retry_delay,
    while_retrying,
)
from kubetrain.progress import fetch_progress
from kubetrain.spec import SpecError, TrainingJob, parse
from kubetrain.status import PodState, Scrape, merge_patch, owned_by, parse_time

__all__ = ["OperatorConfig"]

Json = Any
T = TypeVar("T")
Key = tuple[str, str]  # (namespace, name)
HandlerLogger = logging.Logger | logging.LoggerAdapter[Any]
JOB = (api.GROUP, api.VERSION, api.PLURAL)
POD_LOGGER: HandlerLogger = logging.getLogger("kubetrain.pods")
RESTART_REASONS = frozenset({api.Reason.POD_FAILED, api.Reason.DISRUPTED, api.Reason.STALLED,
                             api.Reason.SCALED, api.Reason.OOM_KILLED})
CONFLICT_RETRY = 0.5  # seconds: the job changed while we reconciled it; read it again soon
# Pods the operator created reach its index through the watch a moment later; until then a reconcile would
# see them missing and create them again. It waits this often, for at most EXPECTATION_TIMEOUT.
EXPECTATION_RETRY = 0.1
EXPECTATION_TIMEOUT = 10.0
WORKER_IDLE_S = 0.1  # seconds kopf keeps an object's worker (and its last event) after the object goes quiet
OWN_WRITES_KEPT = 4  # resourceVersions of the status writes a job's reconciles made last
# A namespace being deleted takes no new pods: its jobs are left alone this long (the namespace controller
# deletes them meanwhile), instead of each pod's deletion starting a restart the API server refuses.
TERMINATING_HOLD = 30.0
# Seconds a status change of only counts, messages or progress waits to fold into the next (a gang's pods
# starting one by one make one write, not one each); see policy.may_wait. With 1 s, a burst of 50 two-pod jobs
# made 118-142 status writes (Pending, then Starting, then Running), each 10-18 ms of the API server's
# CPU; with 2 s, 100-108, as many as Kubeflow's training operator made (docs/benchmarks.md).
STATUS_COALESCE = 2.0
# The step from Pending to Starting (the pods are placed and start) waits longer: on a node that has the image
# they run within seconds, and the write that says Running is then the only one. With 2 s, a slow spell's peer
# burst wrote Starting for most jobs (2.70 status writes per job against Kubeflow's 2.08); kubetrain's bursts
# alone made 100-120 writes for 50 jobs with 2 s and 99-100 with 5 s (docs/benchmarks.md).
STARTING_COALESCE = 5.0
TRIM_INTERVAL = 30.0  # seconds between handing freed memory back to the OS, when reconciles ran meanwhile
STARTUP_TRIM_DELAY = 3.0  # seconds after start-up (its initial listings done): the first such hand-back


@dataclass(frozen=True)
class OperatorConfig:
    """Settings from the command line (see `kubetrain operator --help`)."""

    progress_interval: float = 10.0  # seconds between scrapes of a running job's metrics
    trainer_image: str = api.DEFAULT_TRAINER_IMAGE  # image of jobs that leave spec.image unset
    resync_interval: float = 30.0  # every job is reconciled at least this often
    api_connections: int = 16  # concurrent requests to the API server (the aiohttp pool's limit)
    pod_group_scheduler: str = ""  # a coscheduling scheduler's name: each job gets a PodGroup, its pods that name
    # --namespace values when one is a pattern: kopf then watches jobs cluster-wide and these pick ours.
    namespace_patterns: tuple[str, ...] = ()
    all_namespaces: bool = False  # pods are watched cluster-wide (one watch), else namespace by namespace

    def serves(self, namespace: str) -> bool:
        """Whether this operator reconciles the jobs of ``namespace`` (kopf watches only such, unless patterns)."""
        return not self.namespace_patterns or any(matches_namespace(namespace, p) for p in self.namespace_patterns)


def matches_namespace(namespace: str, pattern: str) -> bool:
    """``pattern``: comma-separated globs, ``!`` before those that exclude. A namespace matches when no excluding
    glob does and an including one does (a pattern of exclusions only, such as ``!kube-*``, includes the rest)."""
    globs = [glob.strip() for glob in pattern.split(",") if glob.strip()]
    including = [glob for glob in globs if not glob.startswith("!")] or ["*"]
    excluding = [glob[1:] for glob in globs if glob.startswith("!")]
    return (any(fnmatch.fnmatchcase(namespace, glob) for glob in including)
            and not any(fnmatch.fnmatchcase(namespace, glob) for glob in excluding))


class PodIndex(Protocol):
    """Each job's pods as last seen (see podwatch.PodWatch), once their namespace is ``ready``."""

    def get(self, key: Key, default: Iterable[PodState], /) -> Iterable[PodState]: ...

    async def ready(self, namespace: str) -> None: ...

    def release(self, namespace: str) -> None: ...

    async def close(self) -> None: ...


@dataclass
class OperatorState:
    """Everything the handlers share, created at start-up and kept in kopf's memo."""

    config: OperatorConfig
    kube: Kube
    http: aiohttp.ClientSession
    pods: PodIndex
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    due: dict[Key, float] = field(default_factory=dict)  # monotonic time of the next look
    last_scrape: dict[Key, float] = field(default_factory=dict)
    failed_scrapes: dict[Key, int] = field(default_factory=dict)  # consecutive failed reads of rank 0
    phases: dict[Key, str] = field(default_factory=dict)
    failures: dict[Key, int] = field(default_factory=dict)  # consecutive failed reconciles (retry backoff)
    generations: dict[Key, int] = field(default_factory=dict)  # metadata.generation last reconciled
    expected: dict[Key, tuple[frozenset[str], float]] = field(default_factory=dict)  # created, not yet seen
    own_writes: dict[Key, list[str]] = field(default_factory=dict)  # see job_changed
    written_at: dict[Key, float] = field(default_factory=dict)  # monotonic time of the last status write
    # A job's body as last seen (its watch event, or the answer to our own status write) and its parsed spec,
    # kept while it has pods: its many reconciles then read neither the API server nor the spec again. A
    # stale body cannot write a wrong status (writes are checked against its resourceVersion): the 409 drops it.
    bodies: dict[Key, Json] = field(default_factory=dict)
    jobs: dict[Key, TrainingJob] = field(default_factory=dict)
    terminating: dict[str, float] = field(default_factory=dict)  # namespace: when it refused new pods
    dirty: set[Key] = field(default_factory=set)  # triggered while their reconcile ran: one more pass
    reconciles: int = 0  # reconcile passes so far (memory is trimmed after activity, see _scheduler)
    scheduler: asyncio.Task[None] | None = None
    triggered: set[asyncio.Task[None]] = field(default_factory=set)  # reconciles the pod watch started

    def lock(self, key: Key) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def forget(self, key: Key) -> None:
        """The job is gone; the pod watch of its namespace stops with the namespace's last job. ``locks`` holds
        every job reconciled since it was last forgotten (a new job's first event waits in ``pods.ready``)."""
        for table in (self.locks, self.due, self.last_scrape, self.failed_scrapes, self.phases, self.failures,
                      self.generations, self.expected, self.own_writes, self.written_at):
            table.pop(key, None)
        self.dirty.discard(key)
        self.drop_cached(key)
        metrics.set_job_phases(self.phases)
        if not any(namespace == key[0] for namespace, _ in self.locks):
            self.pods.release(key[0])

    def drop_cached(self, key: Key) -> None:
        """The next reconcile reads the job from the API server and parses it again."""
        self.bodies.pop(key, None)
        self.jobs.pop(key, None)

    def hold_namespace(self, namespace: str) -> None:
        """Leave the namespace's jobs alone for TERMINATING_HOLD seconds: it is being deleted."""
        now = time.monotonic()
        self.terminating = {ns: since for ns, since in self.terminating.items() if now - since < TERMINATING_HOLD}
        self.terminating[namespace] = now

    def holds(self, namespace: str) -> bool:
        return time.monotonic() - self.terminating.get(namespace, -math.inf) < TERMINATING_HOLD

    def keeps_cached(self, key: Key) -> bool:
        """Whether the job is active (it has pods, or is about to): its reconciles come often."""
        return bool(self.pods.get(key, ())) or key in self.expected


class _NoDiffBase(kopf.DiffBaseStorage):
    """kopf deep-copies every watched object at every event to diff it against the state its change handlers
    last saw: the operator has no change handlers (tests/operator_rights.py checks), so nothing is kept."""

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class _NoSuccessLines(logging.Filter):
    """kopf logs "Handler 'job_changed' succeeded." at INFO after every job event (the handler never fails: a failed
    reconcile is retried by our scheduler and logged then): 250 lines that say nothing in a burst of 50 jobs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Handler 'job_changed' succeeded."


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    """The CLI hands its settings over in kopf's memo (``kopf.run(memo=...)``): no module global."""
    config: OperatorConfig = memo.get("config") or OperatorConfig()
    # Reconnect watches well before proxies or the API server drop idle connections.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.persistence.diffbase_storage = _NoDiffBase()
    # Events on our own objects say who posted them.
    settings.posting.reporting_component = api.OPERATOR_COMPONENT
    logging.getLogger("kopf.objects").addFilter(_NoSuccessLines())
    # kopf keeps a worker per object for idle_timeout (5 s) after its last event, holding that event's body:
    # 1,000 jobs created in 10 s kept nearly all of them alive at once, and the memory freed afterwards stayed
    # fragmented (RSS 75 MiB, against 62 MiB with 0.5 s and 60 MiB with 0.1 s). A later event of the job
    # starts a new worker: tens of microseconds, against milliseconds to handle the event.
    settings.queueing.idle_timeout = WORKER_IDLE_S
    # kopf never retries on.event handlers: a failed reconcile is retried by our scheduler (see
    # _reconcile_measured); this only covers errors of kopf's own machinery.
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)
    kube = Kube(lambda: login(settings), connections=config.api_connections)
    settings.scanning.disabled = not await scanning_needed(kube)
    pods = PodWatch(kube, all_namespaces=config.all_namespaces)
    state = OperatorState(config=config, kube=kube, http=aiohttp.ClientSession(), pods=pods)
    pods.on_change(lambda key: _pods_changed(state, key))
    memo["state"] = state
    # What start-up freed (the initial listings among it) goes back, also when no job ever comes.
    asyncio.get_running_loop().call_later(STARTUP_TRIM_DELAY, return_freed_memory)


async def scanning_needed(kube: Kube) -> bool:
    """Whether kopf must watch the cluster's CRDs: to start serving TrainingJobs when their CRD appears.
    Otherwise it need not: it would hold a watch on every CRD, whole objects (a large CRD is megabytes of
    schema), and the operator's RSS grew 3.4 MiB (51 to 54) when another operator's CRDs were installed. A CRD
    installed later, or unreadable discovery, keeps the watch on. (kopf never watches namespaces here: see
    OperatorConfig.namespace_patterns.)"""
    try:
        return not await kube.serves_jobs()
    except Exception as error:  # cannot tell now: kopf's watch finds the CRD when it can
        logging.getLogger("kubetrain").info("API discovery failed (%s): watching CRDs for ours", error)
        return True


@kopf.on.login()
def login_handler(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo:
    """kopf's credentials, the same as Kube's: without a handler of our own, kopf would log in through the
    official client, which the operator does not load (see memory.py)."""
    return login(settings)


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    state: OperatorState = memo["state"]
    if state.scheduler is not None:
        state.scheduler.cancel()
    await state.pods.close()
    await state.http.close()
    await state.kube.close()


def _served(namespace: str | None, memo: Any, **_: Any) -> bool:
    """kopf's filter of job events: with --namespace patterns it watches every namespace, and this picks ours."""
    state: OperatorState = memo["state"]
    return state.config.serves(namespace or "")


@kopf.on.event(*JOB, when=_served)
async def job_changed(event: kopf.RawEvent, namespace: str | None, name: str, memo: Any,
                      logger: HandlerLogger, **kwargs: Any) -> None:
    state: OperatorState = memo["state"]
    assert namespace is not None  # TrainingJobs are namespaced
    key = (namespace, name)
    _start_scheduler(state)
    if event.get("type") == "DELETED":
        state.forget(key)
        return
    metadata = (event.get("object") or {}).get("metadata", {})
    if metadata.get("resourceVersion") in state.own_writes.get(key, ()):
        return  # the echo of a status this operator wrote: nothing changed that the reconcile did not know
    if state.failures.get(key) and state.generations.get(key) == metadata.get("generation"):
        return  # our own status write after a failure: the retry waits for its backoff (a spec change does not)
    state.bodies[key] = event["object"]
    await state.pods.ready(namespace)  # its pods are listed: a reconcile before would create them again
    await _reconcile_measured(state, key, "job", logger)


def _pods_changed(state: OperatorState, key: Key) -> None:
    """The pod watch saw the job's pods change: reconcile it (one more pass, if a reconcile of it runs now)."""
    task = asyncio.create_task(_reconcile_measured(state, key, "pod", POD_LOGGER))
    state.triggered.add(task)  # the loop keeps only weak references to tasks
    task.add_done_callback(state.triggered.discard)


def _start_scheduler(state: OperatorState) -> None:
    """Start the scheduler from a handler: the task copies the handler's context, without which kopf.event()
    fails (its event queue lives in context variables that the startup handler's context lacks)."""
    if state.scheduler is None:
        state.scheduler = asyncio.create_task(_scheduler(state))


async def _scheduler(state: OperatorState) -> None:
    """Reconcile jobs that asked to be looked at again (deadlines, TTL, stall, progress, retries)."""
    logger: HandlerLogger = logging.getLogger("kubetrain.scheduler")
    trimmed_at, reconciles_then = time.monotonic(), 0
    while True:
        await asyncio.sleep(0.25)
        now = time.monotonic()
        for key in [k for k, when in state.due.items() if when <= now]:
            state.due.pop(key, None)
            await _reconcile_measured(state, key, "timer", logger)
            # A reconcile with nothing to write awaits nothing: without this, 200 jobs due at once (created
            # together, so resynced together) would hold every other event of the operator for their whole run.
            await asyncio.sleep(0)
        if now - trimmed_at > TRIM_INTERVAL and state.reconciles != reconciles_then:
            return_freed_memory()
            trimmed_at, reconciles_then = now, state.reconciles


def _next_retry_delay(state: OperatorState, key: Key) -> float:
    return retry_delay(state.failures.get(key, 0) + 1)


async def _reconcile_measured(state: OperatorState, key: Key, trigger: str, logger: HandlerLogger) -> None:
    """One reconcile; never raises: a failed one is retried with backoff whatever triggered it.

    Triggers that arrive while the job's reconcile runs fold into one more pass after it: the events of a
    512-pod gang's creation make a few reconciles, not 512 queued behind the lock.
    """
    lock = state.lock(key)
    if lock.locked():
        state.dirty.add(key)
        return
    started = time.perf_counter()
    try:
        async with lock:
            state.dirty.add(key)
            while key in state.dirty:
                state.dirty.discard(key)
                state.reconciles += 1
                await _reconcile(state, key, logger)
        state.failures.pop(key, None)
        if not state.keeps_cached(key):
            state.drop_cached(key)
    except ConflictError:
        state.drop_cached(key)
        state.due[key] = time.monotonic() + CONFLICT_RETRY
    except JobGoneError as gone:  # deleted while we reconciled it: normal, so no error, no retry
        logger.debug("%s", gone)
        state.forget(key)
        if isinstance(gone, NamespaceTerminatingError):
            state.hold_namespace(key[0])
    except Exception as error:
        state.drop_cached(key)
        metrics.RECONCILE_ERRORS.labels(handler=trigger).inc()
        delay = _next_retry_delay(state, key)
        state.failures[key] = state.failures.get(key, 0) + 1
        state.due[key] = time.monotonic() + delay
        logger.warning("reconcile of %s/%s failed, retrying in %.0fs: %s", *key, delay, error,
                       exc_info=api_failure(error).internal)
    finally:
        metrics.RECONCILE_DURATION.labels(handler=trigger).observe(time.perf_counter() - started)


@dataclass
class _Stored:
    """The job's status as last written, and the resourceVersion to write the next one against."""

    status: Mapping[str, Json]
    version: str


async def _write_status(state: OperatorState, job: TrainingJob, stored: _Stored, status: Mapping[str, Json]) -> None:
    patch = merge_patch(stored.status, status)
    if patch:
        written = await state.kube.patch_job_status(job.namespace, job.name, patch, stored.version)
        state.bodies[(job.namespace, job.name)] = written
        stored.version = written["metadata"]["resourceVersion"]
        stored.status = status
        state.written_at[(job.namespace, job.name)] = time.monotonic()
        versions = state.own_writes.setdefault((job.namespace, job.name), [])
        versions[:] = [*versions[-(OWN_WRITES_KEPT - 1):], stored.version]


def _post(body: Json, events: tuple[Event, ...]) -> None:
    for event in events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)


async def _reconcile(state: OperatorState, key: Key, logger: HandlerLogger) -> None:
    namespace, name = key
    if state.holds(namespace):
        return
    body = state.bodies.get(key) or await state.kube.get_job(namespace, name)
    if body is None:  # e.g. its pods' events as they are deleted after it: nothing of it is kept
        raise JobGoneError(f"{namespace}/{name} is gone")
    if body["metadata"].get("deletionTimestamp"):
        return
    managed_by = (body.get("spec", {}).get("runPolicy") or {}).get("managedBy", api.DEFAULT_MANAGED_BY)
    if managed_by != api.DEFAULT_MANAGED_BY:
        return  # another controller (e.g. MultiKueue) owns this job: hands off
    state.bodies[key] = body
    try:
        job = _parsed(state, key, body)
    except SpecError as error:  # only for objects stored before the CRD's rules tightened
        kopf.event(body, type="Warning", reason="InvalidSpec", message=str(error)[:1024])
        return
    state.generations[key] = job.generation
    stored = _Stored(body.get("status") or {}, body["metadata"]["resourceVersion"])
    pods = list(state.pods.get(key, ()))
    if _awaiting_own_creations(state, key, pods):
        return
    try:
        decision = await _decide_and_act(state, key, body, job, stored, pods=pods, logger=logger)
    except (ConflictError, JobGoneError):
        raise
    except Exception as error:
        if await _gone(state, job):  # e.g. a 404 creating a pod in the job's deleted namespace
            raise JobGoneError(f"{namespace}/{name} was deleted while reconciling") from error
        decision = await _report_failure(state, key, body, job, stored, pods=pods, error=error)
        if decision.status.get("phase") != api.Phase.FAILED:
            raise  # retried with backoff by _reconcile_measured, as the status now says
        await _act(state, job, pods, decision, logger)  # failed for good: stop what runs of the gang
    status = recovered(job, decision.status, datetime.now(UTC))
    write_by = state.written_at.get(key, -math.inf) + _coalescing(stored.status, status)
    deferred = may_wait(stored.status, status) and time.monotonic() < write_by
    if not deferred:
        await _write_status(state, job, stored, status)
    _schedule(state, key, decision, write_by=write_by if deferred else None)


def _coalescing(before: Mapping[str, Json], after: Mapping[str, Json]) -> float:
    """Seconds after the last write that a change which may wait (policy.may_wait) is held back at most."""
    starting = (before.get("phase"), after.get("phase")) == (api.Phase.PENDING, api.Phase.STARTING)
    return STARTING_COALESCE if starting else STATUS_COALESCE


def _parsed(state: OperatorState, key: Key, body: Json) -> TrainingJob:
    """The job's spec, parsed again only when it changed: its generation, or labels (which bump no generation)."""
    metadata = body["metadata"]
    job = state.jobs.get(key)
    if (job is None or job.uid != metadata.get("uid") or job.generation != int(metadata.get("generation") or 0)
            or job.labels != (metadata.get("labels") or {})):
        job = state.jobs[key] = parse(body, check=False)
    return job


def _awaiting_own_creations(state: OperatorState, key: Key, pods: Iterable[PodState]) -> bool:
    """Whether pods this operator created are not in the index yet (then look again in a moment)."""
    names, deadline = state.expected.get(key, (frozenset(), 0.0))
    if not names:
        return False
    if names <= {p.name for p in pods} or time.monotonic() > deadline:
        del state.expected[key]
        return False
    state.due[key] = min(state.due.get(key, math.inf), time.monotonic() + EXPECTATION_RETRY)
    return True


async def _gone(state: OperatorState, job: TrainingJob) -> bool:
    """Whether the job was deleted (or is being deleted, or was replaced by a new one of the same name)."""
    try:
        body = await state.kube.get_job(job.namespace, job.name)
    except Exception:  # cannot tell: the original error is reported and retried
        return False
    return body is None or bool(body["metadata"].get("deletionTimestamp")) or body["metadata"].get("uid") != job.uid


async def _decide_and_act(state: OperatorState, key: Key, body: Json, job: TrainingJob, stored: _Stored, *,
                          pods: list[PodState], logger: HandlerLogger) -> Decision:
    """Ask the pure core what to do, write the status it decided (so a crash never loses a count), act."""
    before = stored.status
    progress = await _scrape(state, key, before, pods)
    now = datetime.now(UTC)
    decision = reconcile(job, before, pods, now, progress)
    if await _went_with_its_namespace(state, job, decision):
        raise NamespaceTerminatingError(f"namespace {job.namespace} is being deleted")
    written_first = must_persist_before_acting(before, decision)
    if written_first:
        await _write_status(state, job, stored, while_retrying(decision.status))
    # else only pods are created: a crash before the status write (in _reconcile) decides the same again
    _observe(state, key, job, before, decision, now=now)
    _post(body, decision.events)
    try:
        await _act(state, job, pods, decision, logger)
    except Exception:
        if not written_first:  # what was decided (progress, conditions) stands; the failure is added to it
            await _write_status(state, job, stored, while_retrying(decision.status))
        raise
    return decision


async def _went_with_its_namespace(state: OperatorState, job: TrainingJob, decision: Decision) -> bool:
    """Whether the pods that went from under the gang (a disruption) went with their namespace: deleting a
    namespace removes the pods before the job. Then there is nothing to restart, and no event can be posted
    there (kopf would retry each for a minute)."""
    if not any(event.reason == api.Reason.DISRUPTED for event in decision.events):
        return False
    probe = build_pod(job, 0, int(decision.status.get("attempt", 0)), default_image=state.config.trainer_image,
                      pod_group_scheduler=state.config.pod_group_scheduler)
    return await state.kube.refuses_new_pods(job.namespace, probe)


async def _report_failure(state: OperatorState, key: Key, body: Json, job: TrainingJob, stored: _Stored, *,
                          pods: list[PodState], error: Exception) -> Decision:
    """Put a failed step in the status and an event: the job fails if retrying cannot help."""
    decision = failed_reconcile(job, stored.status, pods, api_failure(error),
                                now=datetime.now(UTC), retry_in=_next_retry_delay(state, key))
    await _write_status(state, job, stored, decision.status)
    _post(body, decision.events)
    return decision


async def _scrape(state: OperatorState, key: Key, status: Mapping[str, Json],
                  pods: list[PodState]) -> Scrape | None:
    """Rank 0's progress (or why it cannot be read), at most every progress_interval seconds, while it runs.

    A first failed read is read again after SCRAPE_RECHECK_SECONDS, before the failure is reported.
    """
    if status.get("phase") not in (api.Phase.RUNNING, api.Phase.STARTING):
        return None
    failures = state.failed_scrapes.get(key, 0)
    interval = SCRAPE_RECHECK_SECONDS if failures == 1 else state.config.progress_interval
    if time.monotonic() - state.last_scrape.get(key, 0.0) < interval:
        return None
    attempt = int(status.get("attempt", 0))
    first = next((p for p in pods if p.index == 0 and p.attempt == attempt), None)
    if first is None or not first.ip or first.phase != "Running":
        return None
    state.last_scrape[key] = time.monotonic()
    scrape = await fetch_progress(state.http, first.ip)
    state.failed_scrapes[key] = failures + 1 if scrape.failed else 0
    return replace(scrape, first_failure=True) if scrape.failed and failures == 0 else scrape


async def _act(state: OperatorState, job: TrainingJob, pods: list[PodState], decision: Decision,
               logger: HandlerLogger) -> None:
    """Carry out the decision, after its status was written (so a crash never loses a count)."""
    kube = state.kube
    for name in decision.force_delete:
        logger.warning("force-deleting pod %s stuck terminating (its node is lost)", name)
    await _all([*(kube.delete_pod(job.namespace, name) for name in decision.delete),
                *(kube.delete_pod(job.namespace, name, force=True) for name in decision.force_delete)])
    # A pod labelled with this job's uid but without its owner was made before a crash: adopt it.
    await _all(kube.adopt_pod(job.namespace, pod.name, owner_reference(job)) for pod in pods
               if pod.job_uid == job.uid and not pod.has_owner)
    if decision.create and state.config.pod_group_scheduler:
        # The PodGroup first: the coscheduling plugin sets aside pods whose group does not exist yet.
        await _create_companions(state, job, logger)
        await _create_pods(state, job, decision)
    elif decision.create:  # the pods' agents wait for the Service's DNS names: both at once
        await _all([_create_companions(state, job, logger), _create_pods(state, job, decision)])
    if decision.delete_job:
        logger.info("ttlSecondsAfterFinished passed: deleting the job")
        await kube.delete_job(job.namespace, job.name)


async def _create_pods(state: OperatorState, job: TrainingJob, decision: Decision) -> None:
    attempt = int(decision.status["attempt"])
    new_pods = [build_pod(job, index, attempt, default_image=state.config.trainer_image,
                          pod_group_scheduler=state.config.pod_group_scheduler)
                for index in decision.create]
    key = (job.namespace, job.name)
    state.expected[key] = (frozenset(p["metadata"]["name"] for p in new_pods), time.monotonic() + EXPECTATION_TIMEOUT)
    try:
        created = await _all(state.kube.create(job.namespace, pod) for pod in new_pods)
    except Exception:
        state.expected.pop(key, None)  # some were refused: the retry must not wait for them to appear
        raise
    for pod, existing in zip(new_pods, created, strict=True):
        if existing is None:
            metrics.POD_CREATIONS.inc()
        elif owned_by(existing["metadata"]) != job.uid:
            raise _name_taken(job, "pod", pod["metadata"]["name"], existing)


async def _all(calls: Iterable[Awaitable[T]]) -> list[T]:
    """API calls at once (a gang's pods are created and deleted together; Kube's connection limit bounds
    them); the first error is raised once every call has ended, so none is left running unseen."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast(list[T], results)


async def _create_companions(state: OperatorState, job: TrainingJob, logger: HandlerLogger) -> None:
    """The headless Service, and the PodGroup when a gang scheduler places the pods."""
    await _create_companion(state, job, build_service(job), logger)
    if state.config.pod_group_scheduler:
        await _create_companion(state, job, build_pod_group(job), logger)


async def _create_companion(state: OperatorState, job: TrainingJob, body: Json, logger: HandlerLogger) -> None:
    """Create one object named after the job; one left by a deleted job of the same name (--cascade=orphan)
    is replaced."""
    kind = body["kind"]
    existing = await state.kube.create(job.namespace, body)
    if existing is None or owned_by(existing["metadata"]) == job.uid:
        return
    if existing["metadata"].get("labels", {}).get(api.LABEL.JOB_NAME) == job.name:
        logger.info("replacing %s %s left by a previous job named %s", kind, job.name, job.name)
        await state.kube.delete_companion(job.namespace, kind, job.name)
        existing = await state.kube.create(job.namespace, body)
    if existing is not None and owned_by(existing["metadata"]) != job.uid:
        raise _name_taken(job, kind.lower(), job.name, existing)


def _name_taken(job: TrainingJob, kind: str, name: str, existing: Json) -> CreateError:
    """A child's name is held by an object that is not this job's: wait for it to go, and say so."""
    previous = existing["metadata"].get("labels", {}).get(api.LABEL.JOB_NAME) == job.name
    owner = f"a previous job named {job.name}" if previous else "something other than this job"
    return CreateError(f"{kind} {name}", 409,
                       f"{kind} {name} exists and belongs to {owner}; waiting for it to be deleted")


def _observe(state: OperatorState, key: Key, job: TrainingJob, before: Mapping[str, Json], decision: Decision,
             *, now: datetime) -> None:
    """Operator metrics from the transition this reconcile made."""
    phase = decision.status.get("phase", "")
    for event in decision.events:
        if event.reason in RESTART_REASONS and decision.status.get("phase") == api.Phase.RESTARTING:
            metrics.RESTARTS.labels(reason=event.reason).inc()
    first_running = phase == api.Phase.RUNNING and before.get("phase") != api.Phase.RUNNING
    if first_running and int(decision.status.get("attempt", 0)) == 0 and int(decision.status.get("restarts", 0)) == 0:
        created = parse_time(job.created)
        if created is not None:
            metrics.TIME_TO_RUNNING.observe(max(0.0, (now - created).total_seconds()))
    if state.phases.get(key) != phase:  # the tally covers every job: not at each of a job's reconciles
        state.phases[key] = phase
        metrics.set_job_phases(state.phases)


def _schedule(state: OperatorState, key: Key, decision: Decision, write_by: float | None = None) -> None:
    """The job's next look; ``write_by``: the monotonic time by which a deferred status write is due."""
    phase = decision.status.get("phase")
    delays = [state.config.resync_interval]
    if write_by is not None:
        delays.append(write_by - time.monotonic())
    if decision.requeue_after is not None:
        delays.append(decision.requeue_after)
    if phase in (api.Phase.RUNNING, api.Phase.STARTING):
        delays.append(state.config.progress_interval)
    finished = phase in (api.Phase.SUCCEEDED, api.Phase.FAILED)
    if finished and decision.requeue_after is None and not decision.delete:
        state.due.pop(key, None)  # nothing left to do until the job changes
        return
    state.due[key] = time.monotonic() + min(delays)
