"""kopf handlers: thin triggers around one level-based reconcile of a TrainingJob.

Every trigger (a change of the job, a change of one of its pods, a due timer) runs the same
``reconcile``: read the job and its pods, ask the pure core what to do, write the status, act.
No kopf timers or daemons: they would put a finalizer on every job (and block its deletion while
the operator is down); a small scheduler of our own re-checks jobs that asked to be looked at later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf

from kubetrain import api, metrics
from kubetrain.kube import ConflictError, Kube, load_configuration
from kubetrain.manifests import build_pod, build_service, owner_reference
from kubetrain.policy import Decision, reconcile
from kubetrain.progress import fetch_progress
from kubetrain.spec import SpecError, TrainingJob, parse
from kubetrain.status import Progress, merge_patch, parse_time, pod_state

__all__ = ["OperatorConfig"]

Json = Any
Key = tuple[str, str]  # (namespace, name)
HandlerLogger = logging.Logger | logging.LoggerAdapter[Any]
JOB = (api.GROUP, api.VERSION, api.PLURAL)
RESTART_REASONS = frozenset({api.Reason.POD_FAILED, api.Reason.DISRUPTED, api.Reason.STALLED,
                             api.Reason.SCALED, api.Reason.OOM_KILLED})


@dataclass(frozen=True)
class OperatorConfig:
    """Settings from the command line (see `kubetrain operator --help`)."""

    progress_interval: float = 10.0  # seconds between scrapes of a running job's metrics
    trainer_image: str = api.DEFAULT_TRAINER_IMAGE  # image of jobs that leave spec.image unset
    resync_interval: float = 30.0  # every job is reconciled at least this often
    api_threads: int = 16


@dataclass
class OperatorState:
    """Everything the handlers share, created at start-up and kept in kopf's memo."""

    config: OperatorConfig
    kube: Kube
    http: aiohttp.ClientSession
    locks: dict[Key, asyncio.Lock] = field(default_factory=dict)
    due: dict[Key, float] = field(default_factory=dict)  # monotonic time of the next look
    last_scrape: dict[Key, float] = field(default_factory=dict)
    phases: dict[Key, str] = field(default_factory=dict)
    scheduler: asyncio.Task[None] | None = None

    def lock(self, key: Key) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    def forget(self, key: Key) -> None:
        for table in (self.locks, self.due, self.last_scrape, self.phases):
            table.pop(key, None)
        metrics.set_job_phases(self.phases)


CONFIG = OperatorConfig()


def configure(config: OperatorConfig) -> None:
    """Set the configuration before kopf starts (called by the CLI)."""
    global CONFIG  # noqa: PLW0603 - kopf's startup handler has no other way to receive CLI settings
    CONFIG = config


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # Only pods that belong to a TrainingJob are watched (server-side selector): the operator's
    # memory stays flat however many other pods the cluster runs.
    settings.watching.label_selectors["pods"] = api.LABEL.JOB_NAME
    # Reconnect watches well before proxies or the API server drop idle connections.
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # Events on our own objects say who posted them.
    settings.posting.reporting_component = "kubetrain-operator"
    # batching.batch_window stays at kopf's 0.1 s: it batches the events of one object, and each pod of a
    # gang is its own object, so a longer window would only delay every reaction.
    # A failed reconcile is retried soon: the state of the world is re-read every time anyway.
    settings.batching.error_delays = (1, 2, 5, 10, 30, 60)
    kube = Kube(load_configuration(CONFIG.api_threads), threads=CONFIG.api_threads)
    state = OperatorState(config=CONFIG, kube=kube, http=aiohttp.ClientSession())
    state.scheduler = asyncio.create_task(_scheduler(state))
    memo["state"] = state


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    state: OperatorState = memo["state"]
    if state.scheduler is not None:
        state.scheduler.cancel()
    await state.http.close()
    state.kube.close()


@kopf.on.event(*JOB)
async def job_changed(event: kopf.RawEvent, namespace: str | None, name: str, memo: Any,
                      logger: HandlerLogger, **_: Any) -> None:
    state: OperatorState = memo["state"]
    assert namespace is not None  # TrainingJobs are namespaced
    if event.get("type") == "DELETED":
        state.forget((namespace, name))
        return
    await _reconcile_measured(state, (namespace, name), "job", logger)


@kopf.on.event("", "v1", "pods", labels={api.LABEL.JOB_NAME: kopf.PRESENT})
async def pod_changed(labels: Mapping[str, str], namespace: str | None, memo: Any, logger: HandlerLogger,
                      **_: Any) -> None:
    state: OperatorState = memo["state"]
    assert namespace is not None  # pods are namespaced
    await _reconcile_measured(state, (namespace, labels[api.LABEL.JOB_NAME]), "pod", logger)


async def _scheduler(state: OperatorState) -> None:
    """Reconcile jobs whose decision asked to be looked at again (deadlines, TTL, stall, progress)."""
    logger: HandlerLogger = logging.getLogger("kubetrain.scheduler")
    while True:
        await asyncio.sleep(1.0)
        now = time.monotonic()
        for key in [k for k, when in state.due.items() if when <= now]:
            state.due.pop(key, None)
            try:
                await _reconcile_measured(state, key, "timer", logger)
            except Exception:  # one job's error must not stop the others' timers
                logger.exception("reconcile of %s/%s failed; retrying in 5 s", *key)
                state.due[key] = time.monotonic() + 5


async def _reconcile_measured(state: OperatorState, key: Key, trigger: str, logger: HandlerLogger) -> None:
    started = time.perf_counter()
    try:
        async with state.lock(key):
            await _reconcile(state, key, logger)
    except ConflictError as error:
        raise kopf.TemporaryError(str(error), delay=0.5) from error
    except Exception:
        metrics.RECONCILE_ERRORS.labels(handler=trigger).inc()
        raise
    finally:
        metrics.RECONCILE_DURATION.labels(handler=trigger).observe(time.perf_counter() - started)


async def _reconcile(state: OperatorState, key: Key, logger: HandlerLogger) -> None:
    namespace, name = key
    body = await state.kube.get_job(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return
    managed_by = (body.get("spec", {}).get("runPolicy") or {}).get("managedBy", api.DEFAULT_MANAGED_BY)
    if managed_by != api.DEFAULT_MANAGED_BY:
        return  # another controller (e.g. MultiKueue) owns this job: hands off
    try:
        job = parse(body, check=False)
    except SpecError as error:  # only for objects stored before the CRD's rules tightened
        kopf.event(body, type="Warning", reason="InvalidSpec", message=str(error)[:1024])
        return
    pods = await state.kube.list_job_pods(namespace, name)
    status: Mapping[str, Json] = body.get("status") or {}
    progress = await _scrape(state, key, status, pods)
    now = datetime.now(UTC)
    decision = reconcile(job, status, [pod_state(p) for p in pods], now, progress)
    patch = merge_patch(status, decision.status)
    if patch:
        await state.kube.patch_job_status(namespace, name, patch, body["metadata"]["resourceVersion"])
    _observe(state, key, job, status, decision, now=now)
    for event in decision.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    await _act(state, job, pods, decision, logger)
    _schedule(state, key, decision)


async def _scrape(state: OperatorState, key: Key, status: Mapping[str, Json], pods: list[Json]) -> Progress | None:
    """Rank 0's progress, at most every progress_interval seconds, while the job runs."""
    if status.get("phase") not in (api.Phase.RUNNING, api.Phase.STARTING):
        return None
    if time.monotonic() - state.last_scrape.get(key, 0.0) < state.config.progress_interval:
        return None
    attempt = str(status.get("attempt", 0))
    first = next((p for p in pods if p["metadata"].get("labels", {}).get(api.LABEL.NODE_INDEX) == "0"
                  and p["metadata"]["labels"].get(api.LABEL.ATTEMPT) == attempt), None)
    pod_ip = (first or {}).get("status", {}).get("podIP")
    if not pod_ip:
        return None
    state.last_scrape[key] = time.monotonic()
    return await fetch_progress(state.http, pod_ip)


async def _act(state: OperatorState, job: TrainingJob, pods: list[Json], decision: Decision,
               logger: HandlerLogger) -> None:
    """Carry out the decision, after its status was written (so a crash never loses a count)."""
    kube = state.kube
    for name in decision.delete:
        await kube.delete_pod(job.namespace, name)
    for name in decision.force_delete:
        logger.warning("force-deleting pod %s stuck terminating (its node is lost)", name)
        await kube.delete_pod(job.namespace, name, force=True)
    for pod in pods:
        if not pod["metadata"].get("ownerReferences"):
            await kube.adopt_pod(job.namespace, pod["metadata"]["name"], owner_reference(job))
    if decision.create:
        await kube.create(job.namespace, build_service(job))
        attempt = int(decision.status["attempt"])
        for index in decision.create:
            pod = build_pod(job, index, attempt, default_image=state.config.trainer_image)
            if await kube.create(job.namespace, pod):
                metrics.POD_CREATIONS.inc()
    if decision.delete_job:
        logger.info("ttlSecondsAfterFinished passed: deleting the job")
        await kube.delete_job(job.namespace, job.name)


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
    state.phases[key] = phase
    metrics.set_job_phases(state.phases)


def _schedule(state: OperatorState, key: Key, decision: Decision) -> None:
    phase = decision.status.get("phase")
    delays = [state.config.resync_interval]
    if decision.requeue_after is not None:
        delays.append(decision.requeue_after)
    if phase in (api.Phase.RUNNING, api.Phase.STARTING):
        delays.append(state.config.progress_interval)
    finished = phase in (api.Phase.SUCCEEDED, api.Phase.FAILED)
    if finished and decision.requeue_after is None and not decision.delete:
        state.due.pop(key, None)  # nothing left to do until the job changes
        return
    state.due[key] = time.monotonic() + min(delays)
