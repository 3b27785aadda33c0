"""The reconcile's small judgements on what it read, apart from its I/O (no kopf, no API client).

handlers.py reads (a created object's answer, a scrape, the job's status), asks here, and acts on the answer:
whether a status write may wait, whether a scrape is due and whether its failure is reported yet, whether an
object that holds a child's name is the job's, and whether a disruption needs the namespace probed.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from kubetrain.core import api
from kubetrain.core.status import PodState, Scrape, owned_by
from kubetrain.core.status_policy import Event

__all__ = ["PROGRESS_PHASES", "Coalescing", "Holder", "Periods", "ScrapeClock", "hands_off", "holder",
           "name_taken_message", "needs_namespace_probe", "next_look_in", "periods", "scrape_address"]

Json = Any
PROGRESS_PHASES = frozenset({api.Phase.RUNNING, api.Phase.STARTING})  # rank 0's progress is read in these


@dataclass(frozen=True)
class Coalescing:
    """How long a status change that may wait (status_policy.may_wait) is held back after the last write, to fold into
    the next one: ``status_s`` for counts, messages or progress (a gang's pods starting one by one make one
    write, not one each); ``starting_s`` for Pending to Starting (on a node with the image the pods run within
    seconds, and the write that says Running is then the only one). docs/benchmarks.md measured the defaults."""

    status_s: float = 2.0
    starting_s: float = 5.0

    def window(self, before: Mapping[str, Json], after: Mapping[str, Json]) -> float:
        starting = (before.get("phase"), after.get("phase")) == (api.Phase.PENDING, api.Phase.STARTING)
        return self.starting_s if starting else self.status_s

    def write_by(self, before: Mapping[str, Json], after: Mapping[str, Json], *, may_wait: bool,
                 written_at: float, now: float) -> float | None:
        """When the change from ``before`` to ``after`` (which ``may_wait``, as status_policy.may_wait says) must be
        written at the latest (monotonic time), if that is after ``now``; None when it is written now."""
        write_by = written_at + self.window(before, after)
        return write_by if may_wait and now < write_by else None


@dataclass(frozen=True)
class ScrapeClock:
    """When rank 0's progress is read, and whether a failed read is reported: a first failure is read again
    after ``recheck`` seconds and reported only if that read fails too (a trainer that has just finished stops
    serving while its pod still runs)."""

    last: float = 0.0  # monotonic time of the last read
    failures: int = 0  # consecutive failed reads

    def due(self, phase: str | None, *, now: float, interval: float, recheck: float) -> bool:
        if phase not in PROGRESS_PHASES:
            return False
        wait = recheck if self.failures == 1 else interval
        return now - self.last >= wait

    def after(self, scrape: Scrape, *, now: float) -> tuple[ScrapeClock, Scrape]:
        """The clock after a read at ``now``, and the scrape as the core should see it (a first failure marked)."""
        clock = ScrapeClock(last=now, failures=self.failures + 1 if scrape.failed else 0)
        return clock, replace(scrape, first_failure=True) if scrape.failed and self.failures == 0 else scrape


def scrape_address(status: Mapping[str, Json], pods: Iterable[PodState]) -> str | None:
    """The address of rank 0 of the current attempt, when it runs and has one."""
    attempt = int(status.get("attempt", 0))
    first = next((p for p in pods if p.index == 0 and p.attempt == attempt), None)
    return first.ip if first is not None and first.ip and first.phase == "Running" else None


class Holder(enum.Enum):
    """Who holds a name the job creates a child under."""

    NOBODY = "nobody"  # created now
    THIS_JOB = "this job"
    PREVIOUS_JOB = "a previous job of the same name"  # left behind by --cascade=orphan: replaceable
    SOMEONE_ELSE = "something other than this job"


def hands_off(body: Json) -> bool:
    """Whether the job is not this operator's to reconcile now: it is being deleted, or another controller
    (e.g. MultiKueue) manages it."""
    if body["metadata"].get("deletionTimestamp"):
        return True
    managed_by = (body.get("spec", {}).get("runPolicy") or {}).get("managedBy", api.DEFAULT_MANAGED_BY)
    return bool(managed_by != api.DEFAULT_MANAGED_BY)


def holder(existing: Json | None, *, job_uid: str, job_name: str) -> Holder:
    """``existing``: the object found under the name (None: ours was created)."""
    if existing is None:
        return Holder.NOBODY
    metadata = existing["metadata"]
    if owned_by(metadata) == job_uid:
        return Holder.THIS_JOB
    if (metadata.get("labels") or {}).get(api.LABEL.JOB_NAME) == job_name:
        return Holder.PREVIOUS_JOB
    return Holder.SOMEONE_ELSE


def name_taken_message(kind: str, name: str, job_name: str, by: Holder) -> str:
    owner = f"a previous job named {job_name}" if by is Holder.PREVIOUS_JOB else "something other than this job"
    return f"{kind} {name} exists and belongs to {owner}; waiting for it to be deleted"


def needs_namespace_probe(events: Iterable[Event]) -> bool:
    """Whether the decision restarts the gang for a disruption: deleting a namespace removes its pods before its
    jobs, so the namespace is asked first whether it still takes pods (if not, nothing is restarted)."""
    return any(event.reason == api.Reason.DISRUPTED for event in events)


@dataclass(frozen=True)
class Periods:
    """Seconds between the looks the operator takes at a job unprompted: a running job's progress read, and every
    job's resync."""

    progress: float
    resync: float


def periods(progress: float, resync: float, *, running: int, others: int, budget: float) -> Periods:
    """The configured periods, stretched alike where the looks they make (``running`` jobs every ``progress`` s,
    ``others`` every ``resync`` s) would pass ``budget`` a second. Each look is a reconcile (about 1 ms of the
    operator's one core, bench scale.costs) and, for a job whose training moves, a status write: at 10 s, 100,000
    running jobs would ask for 10,000 of both a second."""
    rate = running / progress + others / resync
    stretch = max(1.0, rate / budget) if budget > 0 else 1.0
    return Periods(progress * stretch, resync * stretch)


def next_look_in(phase: str | None, *, requeue_after: float | None, deletes: bool, write_in: float | None,
                 resync: float, progress: float) -> float | None:
    """Seconds until a job's next reconcile (None: none until it changes): at the latest after ``resync``, sooner
    for a deferred status write (``write_in``), what the core asked for, or a running job's next scrape."""
    if phase in (api.Phase.SUCCEEDED, api.Phase.FAILED) and requeue_after is None and not deletes:
        return None
    delays = [resync, *(d for d in (write_in, requeue_after) if d is not None)]
    if phase in PROGRESS_PHASES:
        delays.append(progress)
    return min(delays)
