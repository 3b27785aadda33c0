"""What the operator keeps between reconciles: one record per job, in one map, beside the work queue."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

import aiohttp

from kubetrain.controller import metrics
from kubetrain.controller.memory import return_freed_memory
from kubetrain.controller.operator_config import OperatorConfig
from kubetrain.core import api, judgements
from kubetrain.core.judgements import ScrapeClock
from kubetrain.core.queueing import Placement, QueuePosition
from kubetrain.core.spec import TrainingJob, parse
from kubetrain.core.status import PodState, parse_time
from kubetrain.core.status_policy import Event
from kubetrain.k8s.kube import Kube
from kubetrain.k8s.nodewatch import NodeWatch
from kubetrain.k8s.workqueue import WorkQueue

__all__ = ["JobRecord", "OperatorState", "PodIndex", "StoredStatus", "Trigger", "trim_memory", "without_managed_fields"]

Json = Any
Key = tuple[str, str]  # (namespace, name)
HandlerLogger = logging.Logger | logging.LoggerAdapter[Any]
# A namespace being deleted takes no new pods: its jobs are left alone this long (the namespace controller
# deletes them meanwhile), instead of each pod's deletion starting a restart the API server refuses.
TERMINATING_HOLD = 30.0
OWN_WRITES_KEPT = 4  # resourceVersions of the status writes a job's reconciles made last
TRIM_INTERVAL = 30.0  # seconds between handing freed memory back to the OS, when reconciles ran meanwhile
STARTUP_TRIM_DELAY = 3.0  # seconds after start-up (its initial listings done): the first such hand-back
CHECKPOINT_REQUEST_RESULTS: dict[str, str] = {api.Reason.CHECKPOINT_REQUESTED: "taken",
                                              api.Reason.CHECKPOINT_REQUEST_FAILED: "failed"}
RESTART_REASONS = frozenset({api.Reason.POD_FAILED, api.Reason.DISRUPTED, api.Reason.STALLED,
                             api.Reason.SCALED, api.Reason.OOM_KILLED, api.Reason.REPLACEMENT_TIMEOUT})


def without_managed_fields(body: Json) -> Json:
    """The job as it is kept between reconciles: without ``metadata.managedFields``, which the operator never reads
    and which is about half of a running job's JSON (2.6 of 5.5 KB; kept as dicts, 29 KiB a job, 145 MiB for
    5,000 jobs)."""
    metadata = body.get("metadata") or {}
    if "managedFields" not in metadata:
        return body
    return {**body, "metadata": {key: value for key, value in metadata.items() if key != "managedFields"}}


class PodIndex(Protocol):
    """Each job's pods as last seen (see podwatch.PodWatch), once their namespace is ``ready``."""

    def get(self, key: Key, default: Iterable[PodState], /) -> Iterable[PodState]: ...

    def items(self) -> Iterable[tuple[Key, Iterable[PodState]]]: ...

    async def ready(self, namespace: str) -> None: ...

    def release(self, namespace: str) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class Trigger:
    """What queued a job's reconcile: ``name`` labels its metrics; its messages go to ``logger`` (for a job's own
    event, kopf's logger of the job, which also posts them as its events); ``body``: the job as that event
    showed it (None: the reconcile reads it); ``routine``: a look nobody waits on, served after the rest
    (k8s/lanes.py)."""

    name: str
    logger: HandlerLogger
    body: Json | None = None
    routine: bool = False


@dataclass
class StoredStatus:
    """A job's status as last written, and the resourceVersion to write the next one against."""

    status: Mapping[str, Json]
    version: str


@dataclass
class JobRecord:
    """One job's memory between its reconciles."""

    # Its body as last seen (its watch event, or the answer to our own status write) and its parsed spec, kept
    # while it has pods: its many reconciles then read neither the API server nor the spec again. A stale body
    # cannot write a wrong status (writes are checked against its resourceVersion): the 409 drops it.
    body: Json | None = None
    job: TrainingJob | None = None
    generation: int | None = None  # metadata.generation last reconciled
    phase: str | None = None  # as the phase tally counts it
    scrape: ScrapeClock = field(default_factory=ScrapeClock)
    expected: frozenset[str] = frozenset()  # pods created, not yet seen by the watch...
    expected_until: float = 0.0  # ...waited for until then (monotonic time)
    own_writes: list[str] = field(default_factory=list)  # resourceVersions of its last status writes
    written_at: float = -math.inf  # monotonic time of the last status write
    # Its Kueue Workload as last seen (its watch event, or the answer to our own write), dropped with the body: the
    # reconcile a Workload event queues reads no Workload. A stale one cannot write (Workload patches carry its
    # resourceVersion): the 409 drops it.
    workload: Json | None = None
    # Where its admission puts its pods, with what identifies that admission (see controller/queueing.py).
    placement: tuple[object, Placement] | None = None

    def parsed(self, body: Json) -> TrainingJob:
        """The job's spec, parsed again only when it changed: its generation, or labels and annotations (which
        bump no generation)."""
        metadata = body["metadata"]
        job = self.job
        if (job is None or job.uid != metadata.get("uid") or job.generation != int(metadata.get("generation") or 0)
                or job.labels != (metadata.get("labels") or {})
                or job.annotations != (metadata.get("annotations") or {})):
            job = self.job = parse(body, check=False)
        return job

    def awaiting_own_creations(self, pods: Iterable[PodState], *, now: float) -> bool:
        """Whether pods this operator created are not in the pod index yet (until expected_until)."""
        if not self.expected:
            return False
        if self.expected <= {p.name for p in pods} or now > self.expected_until:
            self.expected = frozenset()
            return False
        return True

    def wrote(self, body: Json, *, at: float) -> None:
        """Its status was written at ``at`` (monotonic time): ``body`` is the job now, and its echo is ours."""
        self.body = without_managed_fields(body)
        self.written_at = at
        self.own_writes[:] = [*self.own_writes[-(OWN_WRITES_KEPT - 1):], body["metadata"]["resourceVersion"]]

    def drop_cached(self) -> None:
        """The next reconcile reads the job from the API server and parses it again."""
        self.body = None
        self.job = None
        self.workload = None


@dataclass
class PendingRead:
    """One read of a LocalQueue's pending Workloads, shared by the passes that ask before ``until``."""

    positions: asyncio.Future[dict[str, QueuePosition] | None]
    until: float  # monotonic seconds


@dataclass
class OperatorState:
    """Everything the handlers share, created at start-up and kept in kopf's memo; ``queue`` is set by whoever
    makes it (handlers.operator_state), as it reconciles through this state."""

    config: OperatorConfig
    kube: Kube
    http: aiohttp.ClientSession
    pods: PodIndex
    queue: WorkQueue[Key, Trigger] = field(init=False)
    # The nodes announcing a disruption (started by the first job event, in kopf's context); None: not watched.
    nodes: NodeWatch | None = None
    records: dict[Key, JobRecord] = field(default_factory=dict)
    terminating: dict[str, float] = field(default_factory=dict)  # namespace: when it refused new pods
    reconciles: int = 0  # reconcile passes so far (memory is trimmed after activity)
    phases: Counter[str] = field(default_factory=Counter)  # the records by phase (set_phase)
    in_namespace: Counter[str] = field(default_factory=Counter)  # the records by namespace
    # Kueue's pending Workloads by (namespace, LocalQueue), as last read (controller/queueing.py).
    pending: dict[tuple[str, str], PendingRead] = field(default_factory=dict)
    # The list of the cluster's globalDefault PriorityClass under way, for the Workloads of jobs that name none.
    default_priority: asyncio.Future[Json | None] | None = None

    @property
    def notices(self) -> Mapping[str, str]:
        """Why each node with a notice is about to disrupt its pods, by node name (core/notices.py)."""
        return self.nodes.notices if self.nodes is not None else {}

    def record(self, key: Key) -> JobRecord:
        record = self.records.get(key)
        if record is None:
            record = self.records[key] = JobRecord()
            self.in_namespace[key[0]] += 1
        return record

    def forget(self, key: Key) -> None:
        """The job is gone; the pod watch of its namespace stops with the namespace's last job. ``records`` holds
        every job seen since it was last forgotten (a new job's first event waits in ``pods.ready``)."""
        record = self.records.pop(key, None)
        self.queue.forget(key)
        metrics.JOB_GOODPUT.forget(*key)
        if record is not None:
            self.in_namespace[key[0]] -= 1
            self.set_phase(record, None)
        if self.in_namespace[key[0]] <= 0:  # also a job forgotten twice (gone mid-reconcile, then its deletion)
            self.in_namespace.pop(key[0], None)
            self.pods.release(key[0])

    def set_phase(self, record: JobRecord, phase: str | None) -> None:
        """The job's phase as last written, and the tally by phase (kept as phases change: a count over every
        record at each change would cost 100,000 jobs' operator a core in a burst)."""
        if record.phase == phase:
            return
        if record.phase is not None:
            self.phases[record.phase] -= 1
        if phase is not None:
            self.phases[phase] += 1
        record.phase = phase
        metrics.set_job_phases(self.phases)

    def observe(self, record: JobRecord, job: TrainingJob, before: Mapping[str, Json], after: Mapping[str, Json],
                events: Iterable[Event], *, now: datetime) -> None:
        """Operator metrics from the transition a reconcile made (``after``, with its ``events``)."""
        phase = after.get("phase", "")
        metrics.JOB_GOODPUT.set(job.namespace, job.name, after.get("goodput"))
        new_attempt = int(after.get("attempt", 0)) > int(before.get("attempt", 0))  # else one pod is replaced
        for event in events:
            if event.reason in RESTART_REASONS and phase == api.Phase.RESTARTING:
                (metrics.RESTARTS if new_attempt else metrics.POD_REPLACEMENTS).labels(reason=event.reason).inc()
            elif event.reason in CHECKPOINT_REQUEST_RESULTS:
                metrics.CHECKPOINT_REQUESTS.labels(result=CHECKPOINT_REQUEST_RESULTS[event.reason]).inc()
        first_running = phase == api.Phase.RUNNING and before.get("phase") != api.Phase.RUNNING
        if first_running and int(after.get("attempt", 0)) == 0 and int(after.get("restarts", 0)) == 0:
            created = parse_time(job.created)
            if created is not None:
                metrics.TIME_TO_RUNNING.observe(max(0.0, (now - created).total_seconds()))
        self.set_phase(record, phase)

    def hold_namespace(self, namespace: str) -> None:
        """Leave the namespace's jobs alone for TERMINATING_HOLD seconds: it is being deleted."""
        now = time.monotonic()
        self.terminating = {ns: since for ns, since in self.terminating.items() if now - since < TERMINATING_HOLD}
        self.terminating[namespace] = now

    def holds(self, namespace: str) -> bool:
        return time.monotonic() - self.terminating.get(namespace, -math.inf) < TERMINATING_HOLD

    def periods(self) -> judgements.Periods:
        """How often each job is looked at unprompted (judgements.periods), by the jobs held now."""
        running = sum(self.phases[phase] for phase in judgements.PROGRESS_PHASES)
        ended = self.phases[api.Phase.SUCCEEDED] + self.phases[api.Phase.FAILED]  # no look until they change
        config = self.config
        return judgements.periods(config.progress_interval, config.resync_interval, running=running,
                                  others=len(self.records) - running - ended, budget=config.looks_per_second)

    def keeps_cached(self, key: Key, record: JobRecord) -> bool:
        """Whether the job is active (it has pods, or is about to): its reconciles come often."""
        return bool(self.pods.get(key, ())) or bool(record.expected)


async def trim_memory(state: OperatorState, *, first_after: float = STARTUP_TRIM_DELAY,
                      every: float = TRIM_INTERVAL) -> None:
    """Hand freed memory back to the OS: what start-up freed (the initial listings among it) ``first_after``
    seconds after it, also when no job ever comes, then every ``every`` seconds in which reconciles ran."""
    await asyncio.sleep(first_after)
    return_freed_memory()
    reconciles_then = state.reconciles
    while True:
        await asyncio.sleep(every)
        if state.reconciles != reconciles_then:
            return_freed_memory()
            reconciles_then = state.reconciles
