"""A queued job's position (controller/queueing.queue_position): Kueue's visibility API is read once per LocalQueue
every few seconds, however many jobs wait in it, and a cluster that does not serve it costs one try a minute; the
cluster's default PriorityClass, for the Workloads of jobs that name none, is listed once for the ones made at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from kubetrain.controller import jobstate, queueing
from kubetrain.controller.operator_config import OperatorConfig
from kubetrain.core.queueing import QUEUE_LABEL, QueuePosition, workload_name
from kubetrain.core.spec import TrainingJob, parse
from kubetrain.k8s.transport import ApiError
from tests.invalid_specs import base_job

Json = Any


def job(name: str, queue: str = "team-q") -> TrainingJob:
    document = base_job()
    document["metadata"] |= {"name": name, "namespace": "team-a", "uid": f"uid-{name}",
                             "labels": {QUEUE_LABEL: queue}}
    return parse(document)


class VisibilityApi:
    """Kube's get_pending_workloads, answering for the jobs it is given, in their order (or with ``error``)."""

    def __init__(self, *jobs: TrainingJob) -> None:
        self.jobs = list(jobs)
        self.reads: list[tuple[str, str]] = []
        self.error: ApiError | None = None

    async def get_pending_workloads(self, namespace: str, local_queue: str) -> Json:
        self.reads.append((namespace, local_queue))
        await asyncio.sleep(0.01)  # an answer takes a while: passes asking meanwhile share it
        if self.error is not None:
            raise self.error
        return {"items": [{"metadata": {"name": workload_name(j), "namespace": namespace},
                           "positionInLocalQueue": i, "positionInClusterQueue": i + 3}
                          for i, j in enumerate(self.jobs)]}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(queueing, "monotonic", lambda: now[0])
    return now


def state_with(api: VisibilityApi) -> jobstate.OperatorState:
    return jobstate.OperatorState(config=OperatorConfig(), kube=api, http=None, pods=None)  # type: ignore[arg-type]


async def positions_of(state: jobstate.OperatorState, *jobs: TrainingJob) -> list[QueuePosition | None]:
    return list(await asyncio.gather(*(queueing.queue_position(state, j) for j in jobs)))


def test_the_jobs_of_one_queue_share_one_read_until_it_is_a_few_seconds_old(clock: list[float]) -> None:
    waiting = [job(f"j{i}") for i in range(20)]
    api = VisibilityApi(*waiting)
    state = state_with(api)
    found = asyncio.run(positions_of(state, *waiting))
    assert found[0] == QueuePosition(1, 4) and found[19] == QueuePosition(20, 23)
    assert api.reads == [("team-a", "team-q")]
    api.jobs.pop(0)  # the first was admitted
    clock[0] += queueing.PENDING_READ_EVERY_S - 0.1
    assert asyncio.run(positions_of(state, waiting[1])) == [QueuePosition(2, 5)]  # as read before
    clock[0] += 0.2
    assert asyncio.run(positions_of(state, waiting[1], waiting[0])) == [QueuePosition(1, 4), None]
    assert len(api.reads) == 2
    asyncio.run(positions_of(state, job("other", queue="team-r")))
    assert api.reads[-1] == ("team-a", "team-r"), "each LocalQueue is read on its own"


def test_where_the_visibility_api_is_not_served_no_position_and_one_try_a_minute(clock: list[float]) -> None:
    waiting = job("j0")
    api = VisibilityApi(waiting)
    api.error = ApiError(503, "ServiceUnavailable", '{"message": "service unavailable"}')
    state = state_with(api)
    assert asyncio.run(positions_of(state, waiting, waiting)) == [None, None]
    clock[0] += queueing.PENDING_READ_EVERY_S + 1
    assert asyncio.run(positions_of(state, waiting)) == [None]
    assert len(api.reads) == 1
    api.error = None
    clock[0] += queueing.PENDING_UNSERVED_S
    assert asyncio.run(positions_of(state, waiting)) == [QueuePosition(1, 4)]
    assert len(api.reads) == 2


class PriorityClasses:
    """Kube's list_priority_classes (or ``error``) and create, as the Workloads of queued jobs need them."""

    def __init__(self, default_value: int) -> None:
        self.default_value = default_value
        self.lists = 0
        self.error: ApiError | None = None
        self.created: list[Json] = []

    async def list_priority_classes(self) -> list[Json]:
        self.lists += 1
        await asyncio.sleep(0.01)  # passes asking meanwhile share the answer
        if self.error is not None:
            raise self.error
        return [{"metadata": {"name": "low"}, "value": 1},
                {"metadata": {"name": "cluster-default"}, "value": self.default_value, "globalDefault": True}]

    async def create(self, _namespace: str, body: Json) -> None:
        self.created.append(body)


async def workloads_of(state: jobstate.OperatorState, *jobs: TrainingJob) -> list[Json]:
    made = await asyncio.gather(*(queueing._create_workload(state, j) for j in jobs))
    return [body for body, _ in made]


def test_a_burst_of_queued_jobs_without_a_class_shares_one_list_of_the_priority_classes() -> None:
    api = PriorityClasses(default_value=7)
    state = state_with(api)  # type: ignore[arg-type]
    bodies = asyncio.run(workloads_of(state, *(job(f"j{i}") for i in range(20))))
    assert api.lists == 1
    assert {(b["spec"]["priority"], b["spec"]["priorityClassRef"]["name"]) for b in bodies} == {(7, "cluster-default")}
    api.default_value = 9  # the admin changed it: the next job's Workload has it at once
    assert asyncio.run(workloads_of(state, job("a")))[0]["spec"]["priority"] == 9
    assert api.lists == 2


def test_a_failed_list_of_priority_classes_is_not_kept() -> None:
    api = PriorityClasses(default_value=7)
    api.error = ApiError(503, "Service Unavailable", "")
    state = state_with(api)  # type: ignore[arg-type]
    with pytest.raises(ApiError):
        asyncio.run(workloads_of(state, job("j0")))
    api.error = None
    assert asyncio.run(workloads_of(state, job("j0")))[0]["spec"]["priority"] == 7
    assert api.lists == 2
