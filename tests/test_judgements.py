"""The reconcile's judgements on what it read (kubetrain/core/judgements.py), table by table: no I/O."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from kubetrain.core import judgements
from kubetrain.core.judgements import Coalescing, Holder, ScrapeClock
from kubetrain.core.status import PodState, Progress, Scrape

Json = Any
UID, NAME = "uid-1", "train"


def metadata(owner: str | None = None, job_label: str | None = None) -> Json:
    meta: Json = {"name": NAME, "labels": {} if job_label is None else {"kubetrain.io/job-name": job_label}}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "kubetrain.io/v1", "kind": "TrainingJob", "name": NAME,
                                    "uid": owner, "controller": True}]
    return {"metadata": meta}


@pytest.mark.parametrize(("existing", "who"), [
    (None, Holder.NOBODY),  # created now
    (metadata(owner=UID), Holder.THIS_JOB),  # e.g. created by a pass that failed after
    (metadata(owner="uid-0", job_label=NAME), Holder.PREVIOUS_JOB),  # left by --cascade=orphan
    (metadata(owner=None, job_label=NAME), Holder.PREVIOUS_JOB),
    (metadata(owner="uid-9", job_label="other"), Holder.SOMEONE_ELSE),
    (metadata(owner=None), Holder.SOMEONE_ELSE),  # someone's own Service of that name
])
def test_who_holds_a_childs_name(existing: Json | None, who: Holder) -> None:
    assert judgements.holder(existing, job_uid=UID, job_name=NAME) is who


@pytest.mark.parametrize(("who", "says"), [
    (Holder.PREVIOUS_JOB, "belongs to a previous job named train"),
    (Holder.SOMEONE_ELSE, "belongs to something other than this job"),
])
def test_a_taken_name_says_whose(who: Holder, says: str) -> None:
    message = judgements.name_taken_message("service", NAME, NAME, who)
    assert says in message and message.startswith("service train exists")


@pytest.mark.parametrize(("body", "hands_off"), [
    ({"metadata": {}, "spec": {}}, False),
    ({"metadata": {}, "spec": {"runPolicy": {"managedBy": "kubetrain.io/operator"}}}, False),
    ({"metadata": {}, "spec": {"runPolicy": None}}, False),
    ({"metadata": {"deletionTimestamp": "2026-12-01T00:00:00Z"}, "spec": {}}, True),
    ({"metadata": {}, "spec": {"runPolicy": {"managedBy": "kueue.x-k8s.io/multikueue"}}}, True),
])
def test_jobs_being_deleted_or_managed_elsewhere_are_left_alone(body: Json, hands_off: bool) -> None:
    assert judgements.hands_off(body) is hands_off


@dataclass(frozen=True)
class _Event:
    reason: str


@pytest.mark.parametrize(("reasons", "probe"), [
    ((), False),
    (("PodFailed",), False),
    (("Disrupted",), True),  # a disruption may be the namespace going: ask it before restarting
    (("Created", "Disrupted"), True),
])
def test_only_a_disruption_asks_the_namespace(reasons: tuple[str, ...], probe: bool) -> None:
    assert judgements.needs_namespace_probe([_Event(r) for r in reasons]) is probe


@pytest.mark.parametrize(("before", "after", "window"), [
    ({"phase": "Pending"}, {"phase": "Starting"}, 5.0),
    ({"phase": "Starting"}, {"phase": "Starting", "message": "1/2 running"}, 2.0),
    ({"phase": "Running"}, {"phase": "Running"}, 2.0),
])
def test_pods_placed_and_starting_wait_longest(before: Json, after: Json, window: float) -> None:
    assert Coalescing().window(before, after) == window


@pytest.mark.parametrize(("may_wait", "written_at", "now", "write_by"), [
    (True, 100.0, 101.0, 102.0),  # held back until the window ends
    (True, 100.0, 102.5, None),  # the window is over: written now
    (False, 100.0, 101.0, None),  # e.g. a new phase: written at once
    (True, float("-inf"), 101.0, None),  # nothing written yet
])
def test_a_change_that_may_wait_waits_out_its_window(may_wait: bool, written_at: float, now: float,
                                                     write_by: float | None) -> None:
    coalescing = Coalescing(status_s=2.0, starting_s=5.0)
    before, after = {"phase": "Running"}, {"phase": "Running", "message": "x"}
    assert coalescing.write_by(before, after, may_wait=may_wait, written_at=written_at, now=now) == write_by


@pytest.mark.parametrize(("clock", "phase", "now", "due"), [
    (ScrapeClock(), "Pending", 100.0, False),  # nothing to read before the pods run
    (ScrapeClock(), "Running", 100.0, True),
    (ScrapeClock(), "Starting", 100.0, True),
    (ScrapeClock(last=95.0), "Running", 100.0, False),  # read 5 s ago, every 10 s
    (ScrapeClock(last=90.0), "Running", 100.0, True),
    (ScrapeClock(last=97.0, failures=1), "Running", 100.0, True),  # a first failure is read again sooner
    (ScrapeClock(last=97.0, failures=2), "Running", 100.0, False),  # reported: back to the interval
])
def test_when_a_scrape_is_due(clock: ScrapeClock, phase: str, now: float, due: bool) -> None:
    assert clock.due(phase, now=now, interval=10.0, recheck=2.0) is due


@pytest.mark.parametrize(("failures", "scrape", "after_failures", "first_failure"), [
    (0, Scrape(progress=Progress(step=3)), 0, False),
    (0, Scrape(error="refused"), 1, True),  # not reported yet: read again first
    (1, Scrape(error="refused"), 2, False),  # failed twice: reported
    (2, Scrape(progress=Progress(step=4)), 0, False),
])
def test_a_failed_scrape_counts_from_its_second_failure(failures: int, scrape: Scrape, after_failures: int,
                                                        first_failure: bool) -> None:
    clock, seen = ScrapeClock(failures=failures).after(scrape, now=50.0)
    assert clock == ScrapeClock(last=50.0, failures=after_failures)
    assert seen.first_failure is first_failure and seen.error == scrape.error


def pod_state(index: int, attempt: int = 0, phase: str = "Running", ip: str | None = "10.0.0.1") -> PodState:
    return PodState(name=f"{NAME}-{index}", index=index, attempt=attempt, phase=phase, scheduled=True, ready=True,
                    node="n", exit_code=None, reason=None, message=None, disrupted=False, deleting=False,
                    deletion_time=None, start_time=None, finish_time=None, ip=ip)


@pytest.mark.parametrize(("status", "pods", "address"), [
    ({"attempt": 0}, [pod_state(1, ip="10.0.0.2"), pod_state(0)], "10.0.0.1"),
    ({"attempt": 1}, [pod_state(0, attempt=0)], None),  # an earlier attempt's rank 0
    ({"attempt": 0}, [pod_state(0, phase="Pending")], None),
    ({"attempt": 0}, [pod_state(0, ip=None)], None),
    ({}, [], None),
])
def test_rank_0_of_the_current_attempt_is_read(status: Json, pods: list[PodState], address: str | None) -> None:
    assert judgements.scrape_address(status, pods) == address


@pytest.mark.parametrize(("phase", "requeue_after", "deletes", "write_in", "delay"), [
    ("Pending", None, False, None, 30.0),  # the resync
    ("Running", None, False, None, 10.0),  # the next scrape
    ("Running", None, False, 1.5, 1.5),  # a status write held back
    ("Pending", 4.0, False, None, 4.0),  # the core asked (a deadline, a TTL)
    ("Succeeded", None, False, None, None),  # nothing to do until the job changes
    ("Failed", None, True, None, 30.0),  # its pods are still deleted
    ("Succeeded", 60.0, False, None, 30.0),  # its TTL runs out later
])
def test_the_next_look(phase: str, requeue_after: float | None, deletes: bool, write_in: float | None,
                       delay: float | None) -> None:
    assert judgements.next_look_in(phase, requeue_after=requeue_after, deletes=deletes, write_in=write_in,
                                   resync=30.0, progress=10.0) == delay


@pytest.mark.parametrize(("running", "others", "periods"), [
    (0, 0, (10.0, 30.0)),  # nothing to look at: the configured periods
    (1000, 3000, (10.0, 30.0)),  # 100 + 100 looks a second: within the 200
    (2000, 0, (10.0, 30.0)),  # exactly the budget
    (4000, 0, (20.0, 60.0)),  # twice the budget: both periods twice as long
    (100_000, 0, (500.0, 1500.0)),  # a frontier cluster's running jobs: 200 looks a second still
    (0, 12_000, (20.0, 60.0)),  # waiting jobs alone stretch the resync, and the progress read alike
])
def test_the_periods_stretch_alike_to_keep_the_looks_within_the_budget(
        running: int, others: int, periods: tuple[float, float]) -> None:
    found = judgements.periods(10.0, 30.0, running=running, others=others, budget=200.0)
    assert (found.progress, found.resync) == pytest.approx(periods)
    assert running / found.progress + others / found.resync <= 200.0 + 1e-9
