"""The handlers' reconcile against a recording fake of the Kubernetes client (no cluster, no kopf loop).

Quiet when normal: a job deleted while it is being reconciled (404 on the status patch, or on creating its
pods) is the job being gone: no warning, no traceback, no retry, no error counted. A real failure still is
one. The client methods the fake sees are within what tests/operator_rights.py derives from the code.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from kopf._core.engines import posting

from kubetrain.controller import handlers, jobstate, kopf_setup, metrics, queueing
from kubetrain.controller.operator_config import OperatorConfig
from kubetrain.core import judgements, spec
from kubetrain.core.goodput import REFRESH_SECONDS
from kubetrain.core.judgements import Coalescing, ScrapeClock
from kubetrain.core.queueing import POD_SET, QUEUE_LABEL
from kubetrain.core.status import Progress, Scrape, pod_state
from kubetrain.core.status_policy import SCRAPE_RECHECK_SECONDS, Event
from kubetrain.k8s.kube import ApiError, Kube
from kubetrain.k8s.lanes import in_routine_lane
from kubetrain.k8s.transport import LIST_PAGE
from tests.invalid_specs import base_job
from tests.operator_rights import client_methods_used
from tests.pods import pod

Json = Any
NAMESPACE = "team"
KEY = (NAMESPACE, "valid")


@dataclass
class FakeCluster:
    """The objects of one namespace, served as the client's methods would; ``faults`` replace a method."""

    job: Json | None
    pods: list[Json] = field(default_factory=list)
    calls: list[str] = field(default_factory=list)
    faults: dict[str, Callable[[], None]] = field(default_factory=dict)
    workloads: dict[str, Json] = field(default_factory=dict)  # Kueue's Workloads, by name
    flavors: dict[str, Json] = field(default_factory=dict)  # Kueue's ResourceFlavors, by name
    nodes: list[str] = field(default_factory=lambda: ["node-0", "node-1", "node-2"])  # all Ready
    lanes: list[str] = field(default_factory=list)  # each call's lane (k8s/lanes.py)

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(name)
        self.lanes.append("routine" if in_routine_lane() else "prompt")
        if name in self.faults:
            self.faults[name]()
        # A copy, as if it came over the wire.
        return json.loads(json.dumps(getattr(self, f"_{name}")(*args, **kwargs)))

    def _get_namespaced_custom_object(self, *args: Any, **_: Any) -> Json:
        if self.job is None:
            raise ApiError(404, "Not Found", "")
        return self.job

    def _patch_namespaced_custom_object_status(self, *args: Any, **_: Any) -> Json:
        assert self.job is not None
        body = args[-1]
        self.job["status"] = {**self.job.get("status", {}), **body["status"]}
        version = int(self.job["metadata"]["resourceVersion"]) + 1
        self.job["metadata"]["resourceVersion"] = str(version)
        return self.job

    def _create_namespaced_pod(self, _namespace: str, body: Json, dry_run: bool = False) -> None:
        if not dry_run:
            self.pods.append(copy.deepcopy(body))

    def _create_namespaced_service(self, _namespace: str, _body: Json) -> None:
        return None

    def _patch_namespaced_pod(self, name: str, *_: Any, **__: Any) -> Json:
        return next(p for p in self.pods if p["metadata"]["name"] == name)

    def _delete_namespaced_pod(self, name: str, *_: Any, **__: Any) -> None:
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]

    def _create_namespaced_workload(self, _namespace: str, body: Json) -> None:
        name = body["metadata"]["name"]
        if name in self.workloads:
            raise ApiError(409, "Conflict", "")
        self.workloads[name] = copy.deepcopy(body)
        self.workloads[name]["metadata"]["resourceVersion"] = "1"

    def _read_namespaced_workload(self, name: str, _namespace: str) -> Json:
        if name not in self.workloads:
            raise ApiError(404, "Not Found", "")
        return self.workloads[name]

    def _read_resource_flavor(self, name: str) -> Json:
        return self.flavors[name]

    def _list_priority_class(self, _params: Json) -> Json:
        return {"metadata": {"resourceVersion": "1"}, "items": []}  # no globalDefault class: priority 0

    def _list_node(self, _params: Json) -> Json:
        ready = [{"type": "Ready", "status": "True"}]
        nodes = [{"metadata": {"name": n}, "status": {"conditions": ready}} for n in self.nodes]
        return {"metadata": {"resourceVersion": "1"}, "items": nodes}


class ShownPods(dict[tuple[str, str], list[Any]]):
    """The pods the operator's watch has shown, by job, every namespace already listed (as PodWatch is then);
    ``released``: the namespaces whose watch the operator let go."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.released: list[str] = []

    async def ready(self, namespace: str) -> None:
        return None

    def release(self, namespace: str) -> None:
        self.released.append(namespace)

    async def close(self) -> None:
        return None


def shown(pods: list[Json]) -> ShownPods:
    return ShownPods({KEY: [pod_state(p) for p in pods]})


class _Client:
    """Stands for kube.py's _CoreV1 or _CustomObjects: every method is recorded and served by the FakeCluster."""

    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster

    def __getattr__(self, name: str) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(0)  # a request yields to the event loop, as a real one does
            return self._cluster.call(name, *args, **kwargs)
        return call


def job_body(**status: Json) -> Json:
    body = base_job()
    body["metadata"] |= {"namespace": NAMESPACE, "uid": "uid-1", "generation": 1, "resourceVersion": "1"}
    body["status"] = status
    return body


def gone(cluster: FakeCluster) -> Callable[[], None]:
    """A fault: the job (and its namespace) is deleted just now, and the call finds nothing."""
    def fault() -> None:
        cluster.job = None
        raise ApiError(404, "Not Found", "")
    return fault


WRITE_AT_ONCE = OperatorConfig(coalescing=Coalescing(status_s=0.0, starting_s=0.0))
TRIGGER = jobstate.Trigger("job", logging.getLogger("kubetrain.test"))


def fresh_state(kube: Any = None, config: OperatorConfig = WRITE_AT_ONCE) -> jobstate.OperatorState:
    return handlers.operator_state(config, kube, None, ShownPods())  # type: ignore[arg-type]


@pytest.fixture
def run(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[..., jobstate.OperatorState]]:
    """Reconcile once, as a handler would, against ``cluster``; the operator's state afterwards. Every status
    change is written at once, unless ``config`` (of a fresh state) says otherwise."""
    kube = Kube(lambda: kopf.ConnectionInfo(server="https://127.0.0.1:1"), connections=2)  # never connects
    caplog.set_level(logging.DEBUG)

    def reconcile(cluster: FakeCluster, state: jobstate.OperatorState | None = None,
                  indexed: list[Json] | None = None, config: OperatorConfig = WRITE_AT_ONCE,
                  trigger: jobstate.Trigger = TRIGGER) -> jobstate.OperatorState:
        """``state``: the operator's so far (default: a fresh one, with ``config``); ``indexed``: the pods its
        watch has shown (default: all of the cluster's); ``trigger``: what queued the pass (a job's event)."""
        kube._core = _Client(cluster)  # type: ignore[assignment]
        kube._custom = _Client(cluster)  # type: ignore[assignment]
        kube._kueue = _Client(cluster)  # type: ignore[assignment]
        kube._priorities = _Client(cluster)  # type: ignore[assignment]

        async def once() -> jobstate.OperatorState:
            posting.event_queue_loop_var.set(asyncio.get_running_loop())
            posting.event_queue_var.set(asyncio.Queue())
            posting.settings_var.set(kopf.OperatorSettings())
            current = state or fresh_state(kube, config)
            current.pods = shown(cluster.pods if indexed is None else indexed)
            await current.queue.run(KEY, trigger)
            return current

        return asyncio.run(once())

    yield reconcile
    asyncio.run(kube.close())


def errors_counted() -> float:
    return float(sum(metrics.RECONCILE_ERRORS.labels(handler=h)._value.get() for h in ("job", "pod", "timer")))


def warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


class TestDeletedWhileReconciling:
    def test_404_on_the_status_patch_is_the_job_gone(self, run: Any, caplog: pytest.LogCaptureFixture) -> None:
        cluster = FakeCluster(job_body())
        cluster.faults["patch_namespaced_custom_object_status"] = gone(cluster)
        before = errors_counted()
        state = run(cluster)
        assert warnings(caplog) == []
        assert state.queue.due(KEY) is None and state.queue.failures(KEY) == 0  # no retry
        assert errors_counted() == before
        assert cluster.calls.count("patch_namespaced_custom_object_status") == 1  # no second write of an error

    def test_404_creating_pods_is_the_job_gone(self, run: Any, caplog: pytest.LogCaptureFixture) -> None:
        cluster = FakeCluster(job_body())
        cluster.faults["create_namespaced_pod"] = gone(cluster)  # the namespace was deleted
        before = errors_counted()
        state = run(cluster)
        assert warnings(caplog) == []
        assert state.queue.due(KEY) is None and state.queue.failures(KEY) == 0
        assert errors_counted() == before

    def test_a_job_replaced_by_a_new_one_of_the_same_name_is_gone(self, run: Any,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
        cluster = FakeCluster(job_body())

        def replaced() -> None:
            cluster.job = job_body() | {"metadata": job_body()["metadata"] | {"uid": "uid-2"}}
            raise ApiError(404, "Not Found", "")
        cluster.faults["create_namespaced_pod"] = replaced
        state = run(cluster)
        assert warnings(caplog) == [] and state.queue.due(KEY) is None

    def test_a_failure_of_a_job_that_still_exists_is_still_retried(self, run: Any,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
        cluster = FakeCluster(job_body())

        def unavailable() -> None:
            raise ApiError(503, "Service Unavailable", "")
        cluster.faults["create_namespaced_pod"] = unavailable
        before = errors_counted()
        state = run(cluster)
        assert state.queue.due(KEY) is not None and state.queue.failures(KEY) == 1
        assert errors_counted() == before + 1
        assert [r.levelno for r in warnings(caplog)] == [logging.WARNING]
        assert cluster.job is not None
        assert cluster.job["status"]["conditions"][-1]["reason"] == "ApiUnavailable"


def test_a_namespace_being_deleted_is_left_alone_after_it_refuses_a_pod(run: Any,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    cluster = FakeCluster(job_body())

    def terminating() -> None:
        raise ApiError(403, "Forbidden", json.dumps({"message": "being terminated", "details": {
            "causes": [{"reason": "NamespaceTerminating"}]}}))
    cluster.faults["create_namespaced_pod"] = terminating
    before = errors_counted()
    state = run(cluster)
    assert warnings(caplog) == [] and errors_counted() == before and state.queue.due(KEY) is None
    calls = len(cluster.calls)
    run(cluster, state)  # its next pod event
    assert cluster.calls[calls:] == []
    state.terminating[NAMESPACE] -= jobstate.TERMINATING_HOLD  # long ago: a namespace of that name may be new
    run(cluster, state)
    assert "get_namespaced_custom_object" in cluster.calls[calls:]


def refusing_new_content() -> None:
    raise ApiError(403, "Forbidden", json.dumps({"message": "being terminated", "details": {
        "causes": [{"reason": "NamespaceTerminating"}]}}))


def running_gang_losing_a_pod() -> FakeCluster:
    """A running 2-node job whose pod 0 is being deleted by someone else (a disruption)."""
    cluster = FakeCluster(job_body(phase="Running", attempt=0, restarts=0))
    cluster.pods = [pod(0, deleting="2026-11-01T10:06:00Z"), pod(1)]
    for p in cluster.pods:
        p["metadata"]["labels"]["kubetrain.io/job-uid"] = "uid-1"
    return cluster


def test_pods_gone_with_their_namespace_are_no_disruption(run: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Deleting a namespace deletes the pods before the job: no gang restart, no status, no event to post."""
    cluster = running_gang_losing_a_pod()
    cluster.faults["create_namespaced_pod"] = refusing_new_content
    state = run(cluster)
    assert "create_namespaced_pod" in cluster.calls  # the dry run that asked
    assert "patch_namespaced_custom_object_status" not in cluster.calls
    assert "delete_namespaced_pod" not in cluster.calls
    assert warnings(caplog) == [] and state.holds(NAMESPACE) and state.queue.due(KEY) is None


def test_a_disruption_in_a_live_namespace_restarts_the_gang(run: Any) -> None:
    cluster = running_gang_losing_a_pod()
    run(cluster)
    assert cluster.calls.count("create_namespaced_pod") == 1  # the dry run: nothing stored
    assert [p["metadata"]["name"] for p in cluster.pods] == ["valid-0"]  # pod 1 deleted for the restart
    assert cluster.job is not None and cluster.job["status"]["phase"] == "Restarting"


class TestScrape:
    def test_rank_0_that_cannot_be_read_is_progress_unknown(self, run: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
        async def refused(*_: Any, **__: Any) -> Scrape:
            return Scrape(error="connection refused")
        monkeypatch.setattr(handlers, "fetch_progress", refused)
        ready = [pod(i) for i in range(2)]
        for p in ready:
            p["metadata"]["labels"]["kubetrain.io/job-uid"] = "uid-1"
            p["status"]["podIP"] = f"10.0.0.{p['metadata']['labels']['kubetrain.io/node-index']}"
        status = {"phase": "Running", "attempt": 0, "restarts": 0, "startTime": "2026-11-01T10:00:00Z",
                  "runningTime": "2020-01-01T00:00:00Z", "nodes": {"desired": 2}}
        cluster = FakeCluster(job_body(**status), pods=ready)
        state = run(cluster)
        assert cluster.job is not None
        assert "ProgressKnown" not in {c["type"] for c in cluster.job["status"].get("conditions", [])}, \
            "one failed read is read again first"
        due = state.queue.due(KEY)
        assert due is not None and due - state.records[KEY].scrape.last <= SCRAPE_RECHECK_SECONDS + 0.5, \
            "looked at again by then"
        rewind_scrape(state, SCRAPE_RECHECK_SECONDS)  # the recheck is due
        run(cluster, state)
        known = next(c for c in cluster.job["status"]["conditions"] if c["type"] == "ProgressKnown")
        assert known["status"] == "False" and known["reason"] == "ScrapeFailed"
        assert "connection refused" in known["message"]
        assert cluster.job["status"]["phase"] == "Running"  # silent for years, yet unknown is never a stall
        assert state.records[KEY].scrape.failures == 2

    def test_a_read_that_fails_once_is_not_reported(self, run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        """A trainer that has just finished stops serving while its pod still runs."""
        answers = iter([Scrape(error="connection refused"), Scrape(progress=Progress(step=7))])

        async def refused_once(*_: Any, **__: Any) -> Scrape:
            return next(answers)
        monkeypatch.setattr(handlers, "fetch_progress", refused_once)
        ready = [pod(i) for i in range(2)]
        for p in ready:
            p["metadata"]["labels"]["kubetrain.io/job-uid"] = "uid-1"
            p["status"]["podIP"] = f"10.0.0.{p['metadata']['labels']['kubetrain.io/node-index']}"
        cluster = FakeCluster(job_body(phase="Running", attempt=0, restarts=0, nodes={"desired": 2}), pods=ready)
        state = run(cluster)
        rewind_scrape(state, SCRAPE_RECHECK_SECONDS)
        run(cluster, state)
        assert cluster.job is not None
        known = next(c for c in cluster.job["status"]["conditions"] if c["type"] == "ProgressKnown")
        assert known["status"] == "True" and cluster.job["status"]["progress"]["step"] == 7
        assert state.records[KEY].scrape.failures == 0


def rewind_scrape(state: jobstate.OperatorState, seconds: float) -> None:
    """As if the last scrape of the job were ``seconds`` longer ago."""
    clock = state.records[KEY].scrape
    state.records[KEY].scrape = ScrapeClock(last=clock.last - seconds, failures=clock.failures)


def test_a_jobs_next_look_is_routine_and_its_calls_wait_in_the_routine_lane(run: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """After a burst, thousands of looks come due at once: a job created then must not wait behind them."""
    async def refused(*_: Any, **__: Any) -> Scrape:
        return Scrape(error="connection refused")
    monkeypatch.setattr(handlers, "fetch_progress", refused)
    cluster = FakeCluster(job_body())
    state = run(cluster)  # a job's event: its Service, pods and first status
    assert cluster.lanes and set(cluster.lanes) == {"prompt"}
    cluster.pods = [pod(i) for i in range(2)]
    for p in cluster.pods:
        p["metadata"]["labels"]["kubetrain.io/job-uid"] = "uid-1"
        p["status"]["podIP"] = "10.0.0.1"
    scheduled = []
    monkeypatch.setattr(state.queue, "reschedule", lambda key, delay, reason: scheduled.append(reason))
    run(cluster, state, trigger=handlers.TIMER)  # its pods run: a retry's pass writes Running
    assert scheduled and scheduled[-1].routine, "a running job's next look waits in the routine lane"
    cluster.lanes.clear()
    rewind_scrape(state, SCRAPE_RECHECK_SECONDS)
    run(cluster, state, trigger=scheduled[-1])  # the look: rank 0 read twice in vain, ProgressKnown written
    assert cluster.calls[-1] == "patch_namespaced_custom_object_status"
    assert cluster.lanes and set(cluster.lanes) == {"routine"}


def test_a_look_that_finds_a_gang_to_restart_makes_its_calls_in_the_prompt_lane(run: Any) -> None:
    cluster = FakeCluster(job_body())
    state = run(cluster)
    cluster.pods = [pod(0, "Failed", exit_code=1), pod(1)]
    cluster.lanes.clear()
    run(cluster, state, trigger=handlers.LOOK)  # the failure seen by a look, before the pod's own event
    assert "delete_namespaced_pod" in cluster.calls
    assert cluster.lanes and set(cluster.lanes) == {"prompt"}


def test_the_client_methods_called_are_the_ones_derived_from_the_code(run: Any) -> None:
    cluster = FakeCluster(job_body())
    run(cluster)  # creates the Service and the pods
    cluster.pods = [pod(0, "Failed", exit_code=1), pod(1)]
    run(cluster)  # a gang restart deletes them
    called = set(cluster.calls)
    assert {"create_namespaced_pod", "delete_namespaced_pod", "patch_namespaced_custom_object_status"} <= called
    assert called <= client_methods_used()


def test_pods_it_created_are_not_created_again_before_its_watch_shows_them(run: Any) -> None:
    cluster = FakeCluster(job_body())
    state = run(cluster)
    assert cluster.calls.count("create_namespaced_pod") == 2
    run(cluster, state, indexed=[])  # the watch has not delivered them yet
    assert cluster.calls.count("create_namespaced_pod") == 2, "created twice"
    due = state.queue.due(KEY)
    assert due is not None and due - time.monotonic() < 1, "looks again in a moment"
    run(cluster, state)
    assert not state.records[KEY].expected


def test_the_echo_of_its_own_status_write_is_not_reconciled(run: Any) -> None:
    cluster = FakeCluster(job_body())
    state = run(cluster)
    assert cluster.job is not None
    calls = len(cluster.calls)

    async def echo() -> None:
        event: Json = {"type": "MODIFIED", "object": copy.deepcopy(cluster.job)}
        await handlers.job_changed(event=event, namespace=NAMESPACE, name="valid", memo={"state": state},
                                   logger=logging.getLogger("kubetrain.test"))
    asyncio.run(echo())
    assert len(cluster.calls) == calls, cluster.calls[calls:]


def test_pods_the_api_refused_are_not_waited_for(run: Any) -> None:
    cluster = FakeCluster(job_body())

    def over_quota() -> None:
        raise ApiError(403, "Forbidden", json.dumps({"message": "exceeded quota: no-pods"}))
    cluster.faults["create_namespaced_pod"] = over_quota
    state = run(cluster)
    assert not state.records[KEY].expected, "the retry would wait for pods that were never created"
    assert state.queue.failures(KEY) == 1


def test_triggers_during_a_reconcile_fold_into_one_more_pass(run: Any) -> None:
    cluster = FakeCluster(job_body())
    state = run(cluster)
    passes = state.reconciles
    cluster.pods[0]["status"] = {"phase": "Running", "podIP": "10.0.0.1"}  # a change the first pass writes
    state.pods = shown(cluster.pods)

    async def burst() -> None:  # a gang's pod events, all while the first reconcile waits on the API
        first = asyncio.create_task(state.queue.run(KEY, TRIGGER))
        await asyncio.sleep(0)
        assert state.queue.busy(KEY)
        for _ in range(20):
            state.queue.add(KEY, handlers.POD_CHANGE)
        await first
        await state.queue.drained()
    asyncio.run(burst())
    assert state.reconciles - passes == 2, "one pass, then one more"


def _placed(run: Any, monkeypatch: pytest.MonkeyPatch,
            coalescing: Coalescing) -> tuple[FakeCluster, jobstate.OperatorState, int]:
    """A new job's pods created (Pending written), then placed on a node: the cluster, the operator's state after
    the reconcile that saw them placed, and the status writes before it. Its rank 0 is never read."""
    async def not_yet(*_: Any, **__: Any) -> Scrape:
        return Scrape(error="connection refused")
    monkeypatch.setattr(handlers, "fetch_progress", not_yet)
    cluster = FakeCluster(job_body())
    state = run(cluster, config=OperatorConfig(coalescing=coalescing))  # creates the pods, writes Pending
    for p in cluster.pods:
        p["status"] = {"phase": "Pending"}
        p["spec"]["nodeName"] = "node-1"
    writes = cluster.calls.count("patch_namespaced_custom_object_status")
    return cluster, run(cluster, state), writes


def test_a_status_change_of_only_counts_is_written_with_the_next_one(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, state, writes = _placed(run, monkeypatch, Coalescing(status_s=60.0, starting_s=60.0))
    # scheduled: Starting, which may wait too
    assert cluster.calls.count("patch_namespaced_custom_object_status") == writes
    cluster.pods[0]["status"] = pod(0)["status"]
    state = run(cluster, state)  # one more pod running: waits
    assert cluster.calls.count("patch_namespaced_custom_object_status") == writes
    due = state.queue.due(KEY)
    assert due is not None and due <= state.records[KEY].written_at + 60, "and is looked at again by then"
    cluster.pods[1]["status"] = pod(1)["status"]
    run(cluster, state)  # all running: Running, written at once
    assert cluster.calls.count("patch_namespaced_custom_object_status") == writes + 1
    assert cluster.job is not None and cluster.job["status"]["phase"] == "Running"


def test_pods_placed_and_starting_wait_longer_than_other_changes(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    starting_only = Coalescing(status_s=0.0, starting_s=60.0)  # nothing else waits
    cluster, state, writes = _placed(run, monkeypatch, starting_only)  # placed: Starting waits for the longer window
    assert cluster.calls.count("patch_namespaced_custom_object_status") == writes
    assert cluster.job is not None and cluster.job["status"]["phase"] == "Pending"
    written_at, due = state.records[KEY].written_at, state.queue.due(KEY)
    assert due is not None and written_at + 1 < due <= written_at + 60, "looked at again by then"
    assert starting_only.window({"phase": "Starting"}, {"phase": "Starting", "message": "1/2"}) == 0.0
    assert starting_only.window({"phase": "Pending"}, {"phase": "Starting"}) == 60.0


def job_event(state: jobstate.OperatorState, body: Json) -> None:
    """The watch shows the job changed (not by the operator): job_changed, as kopf calls it."""
    async def changed() -> None:
        await handlers.job_changed(event={"type": "MODIFIED", "object": body}, namespace=NAMESPACE, name="valid",
                                   memo={"state": state}, logger=logging.getLogger("kubetrain.test"))
    asyncio.run(changed())


def test_a_job_event_while_enough_passes_run_is_queued_with_its_body_alone(run: Any) -> None:
    """A burst of new jobs: past ``passes_at_once``, kopf's worker of a job queues it and returns, rather
    than waiting for the API around a pass of its own; the pass that follows takes the event's body."""
    cluster = FakeCluster(job_body())
    state = run(cluster)
    passes, reads = state.reconciles, cluster.calls.count("get_namespaced_custom_object")
    assert cluster.job is not None
    relabelled = copy.deepcopy(cluster.job)
    relabelled["metadata"] |= {"labels": {"team": "vision"}, "resourceVersion": "100",
                               "managedFields": [{"manager": "kubectl", "operation": "Update"}]}
    state.config = replace(state.config, passes_at_once=0)  # as when a burst's passes run

    async def burst() -> None:
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        posting.event_queue_var.set(asyncio.Queue())
        posting.settings_var.set(kopf.OperatorSettings())
        await handlers.job_changed(event={"type": "MODIFIED", "object": relabelled}, namespace=NAMESPACE,
                                   name="valid", memo={"state": state}, logger=logging.getLogger("kubetrain.test"))
        assert state.reconciles == passes, "the pass ran in kopf's worker"
        assert "managedFields" not in (state.records[KEY].body or {"metadata": {}})["metadata"]
        state.config = replace(state.config, passes_at_once=OperatorConfig().passes_at_once)
        await state.queue.drained()
    asyncio.run(burst())
    assert state.reconciles == passes + 1
    job = state.records[KEY].job
    assert job is not None and job.labels == {"team": "vision"}
    assert cluster.calls.count("get_namespaced_custom_object") == reads, "the queued pass read the event's body"


class TestActiveJobsAreReadFromMemory:
    """A job with pods is reconciled at each of their events: from the body it last saw, parsed once."""

    def test_reconciles_of_a_job_with_pods_neither_read_nor_parse_it_again(
            self, run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        parsed: list[str] = []
        monkeypatch.setattr(jobstate, "parse", lambda body, **kw: parsed.append("x") or spec.parse(body, **kw))
        cluster = FakeCluster(job_body())
        state = run(cluster)
        cluster.pods[0]["status"] = {"phase": "Running", "podIP": "10.0.0.1"}
        state = run(cluster, state)
        state = run(cluster, state)
        assert cluster.calls.count("get_namespaced_custom_object") == 1
        assert cluster.calls.count("patch_namespaced_custom_object_status") >= 2, "its own writes are what it read"
        assert len(parsed) == 1
        assert cluster.job is not None and state.records[KEY].body == cluster.job

    def test_a_conflict_reads_it_again(self, run: Any) -> None:
        cluster = FakeCluster(job_body())
        state = run(cluster)

        def conflict() -> None:
            raise ApiError(409, "Conflict", "")
        cluster.faults["patch_namespaced_custom_object_status"] = conflict
        cluster.pods[0]["status"] = {"phase": "Running", "podIP": "10.0.0.1"}  # a change to write
        state = run(cluster, state)
        assert state.records[KEY].body is None and state.records[KEY].job is None
        del cluster.faults["patch_namespaced_custom_object_status"]
        run(cluster, state)
        assert cluster.calls.count("get_namespaced_custom_object") == 2

    def test_a_changed_spec_or_label_is_parsed_again(self, run: Any) -> None:
        cluster = FakeCluster(job_body())
        state = run(cluster)
        assert cluster.job is not None
        relabelled = copy.deepcopy(cluster.job)
        relabelled["metadata"] |= {"labels": {"team": "vision"}, "resourceVersion": "100"}  # no new generation
        job_event(state, relabelled)
        assert state.records[KEY].job is not None and state.records[KEY].job.labels == {"team": "vision"}
        resized = copy.deepcopy(relabelled)
        resized["metadata"] |= {"generation": 2, "resourceVersion": "101"}
        resized["spec"]["nodes"] = 3
        job_event(state, resized)
        assert state.records[KEY].job is not None and state.records[KEY].job.spec.nodes == 3
        assert cluster.calls.count("get_namespaced_custom_object") == 1

    def test_a_job_without_pods_is_not_kept(self, run: Any) -> None:
        body = job_body()
        body["spec"]["runPolicy"] = {"suspend": True}
        cluster = FakeCluster(body)
        state = run(cluster)
        assert cluster.pods == []
        assert state.records[KEY].body is None and state.records[KEY].job is None


def test_a_job_being_deleted_is_left_alone_by_its_later_pod_events(run: Any) -> None:
    """kubectl delete --cascade=orphan: the job is marked for deletion, then its pods lose their owner. Adopting
    them then (from the body cached before the mark) would have the garbage collector delete them with it."""
    cluster = FakeCluster(job_body())
    state = run(cluster)  # creates the pods; the job's body is kept while it has them
    assert cluster.job is not None
    deleting = copy.deepcopy(cluster.job)
    deleting["metadata"] |= {"deletionTimestamp": "2026-12-01T00:00:00Z", "resourceVersion": "100"}
    job_event(state, deleting)
    for p in cluster.pods:
        p["metadata"].pop("ownerReferences", None)  # the garbage collector orphans them
    calls = len(cluster.calls)
    run(cluster, state)  # their pod events
    assert cluster.calls[calls:] == []


def test_pods_orphaned_before_the_jobs_deletion_mark_is_seen_are_not_adopted(run: Any) -> None:
    """The pods' watch and the job's are separate streams: the pods' stripped owner can be seen while the
    operator still holds the job's body from before its deletion mark. A fresh read of the job tells."""
    cluster = FakeCluster(job_body())
    state = run(cluster)
    assert cluster.job is not None
    cluster.job["metadata"] |= {"deletionTimestamp": "2026-12-01T00:00:00Z", "finalizers": ["orphan"]}
    for p in cluster.pods:
        p["metadata"].pop("ownerReferences", None)
    calls = len(cluster.calls)
    run(cluster, state)
    assert "patch_namespaced_pod" not in cluster.calls[calls:], cluster.calls[calls:]
    assert "get_namespaced_custom_object" in cluster.calls[calls:]


def test_pods_whose_owner_someone_stripped_are_adopted_while_the_job_is_here(run: Any) -> None:
    cluster = FakeCluster(job_body())
    state = run(cluster)
    for p in cluster.pods:
        p["metadata"].pop("ownerReferences", None)
    calls = len(cluster.calls)
    run(cluster, state)
    assert cluster.calls[calls:].count("patch_namespaced_pod") == len(cluster.pods) == 2, cluster.calls[calls:]


class _Discovery:
    def __init__(self, serves: bool | Exception) -> None:
        self.serves = serves

    async def serves_jobs(self) -> bool:
        if isinstance(self.serves, Exception):
            raise self.serves
        return self.serves


@pytest.mark.parametrize(("serves", "needed"), [
    (True, False),  # the CRD installed: no watch of CRDs
    (False, True),  # the CRD comes later: kopf's watch of CRDs starts serving it then
    (ApiError(503, "Service Unavailable", ""), True),  # cannot tell: the watch stays
])
def test_kopf_watches_crds_only_when_it_needs_to(serves: bool | Exception, needed: bool) -> None:
    assert asyncio.run(kopf_setup.scanning_needed(_Discovery(serves))) is needed  # type: ignore[arg-type]


@pytest.mark.parametrize(("patterns", "namespace", "served"), [
    ((), "anything", True),  # all namespaces, or named ones: kopf watches only those
    (("team-*",), "team-a", True),
    (("team-*",), "teams", False),
    (("team-*",), "other-team-a", False),
    (("team-a", "ml-*"), "team-a", True),  # a name beside a pattern is matched as itself
    (("team-a", "ml-*"), "team-b", False),
    (("!kube-*",), "default", True),  # exclusions only: every other namespace
    (("!kube-*",), "kube-system", False),
    (("team-*, !team-tmp-*",), "team-tmp-1", False),
    (("team-*, !team-tmp-*",), "team-prod", True),
    (("team-*,!team-tmp-*", "team-tmp-keep"), "team-tmp-keep", True),  # another value may include it
    (("Team-*",), "team-a", False),  # names are lower case; globs match case by case
])
def test_namespace_patterns_pick_the_jobs_the_operator_serves(patterns: tuple[str, ...], namespace: str,
                                                              served: bool) -> None:
    assert OperatorConfig(namespace_patterns=patterns).serves(namespace) is served


def test_startup_settings_are_current_kopf_settings_and_free_quiet_workers_soon(
        recwarn: pytest.WarningsRecorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting kopf has deprecated does nothing (``batching.batch_window`` was one, set here for days)."""
    monkeypatch.setattr(handlers, "login", lambda _: kopf.ConnectionInfo(server="https://127.0.0.1:1"))
    settings = kopf.OperatorSettings()
    memo = kopf.Memo()

    async def start() -> None:
        await handlers.startup(settings=settings, memo=memo)
        await handlers.cleanup(memo=memo)
    asyncio.run(start())
    deprecated = [str(w.message) for w in recwarn if issubclass(w.category, DeprecationWarning)]
    assert not deprecated
    assert settings.queueing.idle_timeout <= 1.0, "each quiet job's worker would hold its last event for seconds"
    assert settings.persistence.diffbase_storage.fetch(body=kopf.Body({})) is None
    assert settings.watching.chunk_size == LIST_PAGE, "kopf's lists of the jobs are paged as the operator's own"


def test_a_namespaces_pod_watch_is_let_go_with_its_last_job() -> None:
    state = fresh_state()
    pods = state.pods
    assert isinstance(pods, ShownPods)
    for key in [("ml", "a"), ("ml", "b"), ("ci-1", "a")]:
        state.record(key)
    state.forget(("ml", "a"))
    state.forget(("ci-1", "a"))
    assert pods.released == ["ci-1"]  # "ml" still has job b
    state.forget(("ml", "b"))
    assert pods.released == ["ci-1", "ml"]


def test_goodput_is_published_written_now_and_then_and_forgotten_with_the_job(run: Any) -> None:
    """A suspended job's status changes only in its goodput between resyncs: that alone is written every
    REFRESH_SECONDS, not at each reconcile; the operator's metric has the live figures, until the job is gone."""
    body = job_body()
    body["spec"]["runPolicy"] = {"suspend": True}
    cluster = FakeCluster(body)
    run(cluster)
    assert cluster.job is not None and cluster.job["status"]["phase"] == "Suspended"
    writes = cluster.calls.count("patch_namespaced_custom_object_status")

    def reconcile_after(seconds: int) -> jobstate.OperatorState:
        assert cluster.job is not None
        goodput = cluster.job["status"]["goodput"]
        since = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=seconds)
        goodput["accountedAt"] = since.isoformat().replace("+00:00", "Z")
        return run(cluster)

    reconcile_after(60)
    assert cluster.calls.count("patch_namespaced_custom_object_status") == writes, "goodput alone waits"
    assert metrics.JOB_GOODPUT.jobs[KEY][0] >= 60  # queued, live
    state = reconcile_after(REFRESH_SECONDS + 60)
    assert cluster.calls.count("patch_namespaced_custom_object_status") == writes + 1
    assert cluster.job["status"]["goodput"]["queuedSeconds"] >= REFRESH_SECONDS + 60
    state.forget(KEY)
    assert KEY not in metrics.JOB_GOODPUT.jobs


def _admitted(workload: Json, flavor: str) -> Json:
    """The Workload as Kueue writes it when it admits it on ``flavor``."""
    admitted = copy.deepcopy(workload)
    admitted["metadata"]["resourceVersion"] = "2"
    admitted["status"] = {
        "admission": {"clusterQueue": "team-cq", "podSetAssignments": [
            {"name": POD_SET, "flavors": {"cpu": flavor}, "count": admitted["spec"]["podSets"][0]["count"]}]},
        "conditions": [{"type": kind, "status": "True", "reason": kind, "message": "", "lastTransitionTime":
                        "2026-12-05T00:00:00Z"} for kind in ("QuotaReserved", "Admitted")]}
    return admitted


def test_a_queued_job_makes_its_workload_unread_and_takes_kueues_answer_from_the_watch(run: Any) -> None:
    """A new job's Workload is made without a read before it (there can be none), and the reconcile that Kueue's
    admission queues reads the Workload as the watch event showed it, not from the API server."""
    body = job_body()
    body["metadata"]["labels"] = {QUEUE_LABEL: "team"}
    cluster = FakeCluster(body)
    state = run(cluster)
    assert cluster.calls.count("create_namespaced_workload") == 1
    assert "read_namespaced_workload" not in cluster.calls
    assert cluster.pods == [] and cluster.job is not None and cluster.job["status"]["phase"] == "Queued"
    (workload,) = cluster.workloads.values()
    admitted = cluster.workloads[workload["metadata"]["name"]] = _admitted(workload, "pool-a")
    cluster.flavors["pool-a"] = {"metadata": {"name": "pool-a"}, "spec": {"nodeLabels": {"example.com/pool": "a"}}}
    cluster.calls.clear()
    _kueue_changes(state, admitted)
    assert "read_namespaced_workload" not in cluster.calls
    assert cluster.calls.count("read_resource_flavor") == 1
    assert len(cluster.pods) == 2
    assert all(p["spec"]["nodeSelector"]["example.com/pool"] == "a" for p in cluster.pods)


def _kueue_changes(state: jobstate.OperatorState, workload: Json | None = None,
                   cluster: FakeCluster | None = None) -> None:
    """Kueue's write of ``workload`` seen by the operator's watch (or, with None, a timer), and the reconciles that
    follow; ``cluster``: whose pods the operator's pod watch has shown by then."""
    if cluster is not None:
        state.pods = shown(cluster.pods)

    async def event() -> None:
        posting.event_queue_loop_var.set(asyncio.get_running_loop())
        posting.event_queue_var.set(asyncio.Queue())
        posting.settings_var.set(kopf.OperatorSettings())
        if workload is None:
            state.queue.add(KEY, handlers.TIMER)
        else:
            await queueing.workload_changed(body=kopf.Body(copy.deepcopy(workload)), namespace=NAMESPACE,
                                            memo={"state": state}, type="MODIFIED")
        await state.queue.drained()
    asyncio.run(event())


def test_an_admitted_job_reads_its_flavors_once_per_admission(run: Any) -> None:
    """The flavors are read when an admission places the job, not at each reconcile of the running job (as Kueue's
    own integrations read them when they start a job); a new admission reads them again."""
    body = job_body()
    body["metadata"]["labels"] = {QUEUE_LABEL: "team"}
    cluster = FakeCluster(body)
    state = run(cluster)
    (workload,) = cluster.workloads.values()
    admitted = cluster.workloads[workload["metadata"]["name"]] = _admitted(workload, "pool-a")
    cluster.flavors["pool-a"] = {"metadata": {"name": "pool-a"}, "spec": {"nodeLabels": {"example.com/pool": "a"}}}
    _kueue_changes(state, admitted)
    assert len(cluster.pods) == 2
    _kueue_changes(state, None, cluster)
    _kueue_changes(state, None, cluster)
    assert cluster.calls.count("patch_namespaced_custom_object_status") > 2, "the job was reconciled meanwhile"
    assert cluster.calls.count("read_resource_flavor") == 1

    again = copy.deepcopy(admitted)  # evicted and admitted again while its pods were still on their way out
    again["metadata"]["resourceVersion"] = "3"
    for condition in again["status"]["conditions"]:
        condition["lastTransitionTime"] = "2026-12-05T01:00:00Z"
    cluster.workloads[again["metadata"]["name"]] = again
    _kueue_changes(state, again, cluster)
    assert cluster.calls.count("read_resource_flavor") == 2


ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def _failed_on_node_1_again() -> FakeCluster:
    """A job whose pod failed on node-1 with a GPU error in attempt 0, and again now in attempt 1."""
    earlier = {"attempt": 0, "pod": "valid-1", "node": "node-1", "reason": "Error", "counted": True,
               "time": "2026-11-01T10:03:00Z", "message": "x", "nodeFault": "device or driver error: uncorrectable ECC"}
    body = job_body(phase="Running", attempt=1, restarts=1, startTime="2026-11-01T10:00:00Z",
                    runningTime="2026-11-01T10:01:00Z", nodes={"desired": 2}, failures=[earlier])
    pods = [pod(0, attempt=1, job_uid="uid-1"),
            pod(1, "Failed", exit_code=1, message=ECC, node="node-1", attempt=1, job_uid="uid-1")]
    return FakeCluster(body, pods=pods)


def test_a_node_failing_the_job_again_is_excluded_and_the_next_pods_avoid_it(run: Any) -> None:
    cluster = _failed_on_node_1_again()
    state = run(cluster)
    assert cluster.calls.count("list_node") == 1, "a failure that points at its node: are there nodes enough?"
    assert [e["node"] for e in cluster.job["status"]["excludedNodes"]] == ["node-1"]
    assert cluster.pods == [], "the gang restarts"
    run(cluster, state)
    assert cluster.calls.count("list_node") == 1, "no failed pod: the nodes are not read"
    for made in cluster.pods:
        terms = made["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"] == [
            {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]
    assert len(cluster.pods) == 2


def test_nodes_that_cannot_be_listed_exclude_nothing_and_the_restart_goes_on(
        run: Any, caplog: pytest.LogCaptureFixture) -> None:
    cluster = _failed_on_node_1_again()
    cluster.faults["list_node"] = lambda: (_ for _ in ()).throw(ApiError(403, "Forbidden", "nodes is forbidden"))
    run(cluster)
    assert "excludedNodes" not in cluster.job["status"]
    assert cluster.job["status"]["phase"] == "Restarting" and cluster.job["status"]["restarts"] == 2
    assert any("cannot list the cluster's nodes" in r.getMessage() for r in warnings(caplog))


@pytest.mark.parametrize(("attempt_after", "counter"), [(0, "kubetrain_pod_replacements_total"),
                                                        (1, "kubetrain_restarts_total")])
def test_a_replaced_pod_is_not_counted_as_a_gang_restart(attempt_after: int, counter: str) -> None:
    state = jobstate.OperatorState(config=OperatorConfig(), kube=None, http=None, pods=None)  # type: ignore[arg-type]
    job = spec.parse(base_job() | {"metadata": {"name": "valid", "namespace": "ns", "uid": "u"}})
    before = {"phase": "Running", "attempt": 0}
    after = {"phase": "Restarting", "attempt": attempt_after}
    samples = ("kubetrain_pod_replacements_total", "kubetrain_restarts_total")
    seen = {name: metrics.REGISTRY.get_sample_value(name, {"reason": "Disrupted"}) or 0.0 for name in samples}
    state.observe(jobstate.JobRecord(), job, before, after, [Event("Warning", "Disrupted", "lost")],
                  now=datetime.now(UTC))
    grew = {name: (metrics.REGISTRY.get_sample_value(name, {"reason": "Disrupted"}) or 0.0) - seen[name]
            for name in samples}
    assert grew == {name: 1.0 if name == counter else 0.0 for name in samples}


@pytest.mark.parametrize(("reason", "result"), [("CheckpointRequested", "taken"),
                                                ("CheckpointRequestFailed", "failed")])
def test_a_checkpoint_request_is_counted_by_its_result(reason: str, result: str) -> None:
    state = jobstate.OperatorState(config=OperatorConfig(), kube=None, http=None, pods=None)  # type: ignore[arg-type]
    job = spec.parse(base_job() | {"metadata": {"name": "valid", "namespace": "ns", "uid": "u"}})
    running = {"phase": "Running", "attempt": 0}
    counts = {r: metrics.REGISTRY.get_sample_value("kubetrain_checkpoint_requests_total", {"result": r}) or 0.0
              for r in ("taken", "failed")}
    state.observe(jobstate.JobRecord(), job, running, running, [Event("Normal", reason, "node n1 is cordoned")],
                  now=datetime.now(UTC))
    grew = {r: (metrics.REGISTRY.get_sample_value("kubetrain_checkpoint_requests_total", {"result": r}) or 0.0)
            - counts[r] for r in counts}
    assert grew == {r: 1.0 if r == result else 0.0 for r in counts}


def test_the_operator_stretches_its_periods_by_the_jobs_it_holds() -> None:
    config = OperatorConfig(progress_interval=10.0, resync_interval=30.0, looks_per_second=2.0)
    state = jobstate.OperatorState(config=config, kube=None, http=None, pods=None)  # type: ignore[arg-type]
    for number, phase in enumerate(["Running"] * 30 + ["Pending"] * 30 + ["Succeeded"] * 100):
        state.set_phase(state.record(("ns", f"j{number}")), phase)
    # 30 running every 10 s and 30 waiting every 30 s: 4 looks a second, twice the budget; ended jobs none
    assert state.periods() == judgements.Periods(progress=20.0, resync=60.0)
    for number in range(30, 60):
        state.set_phase(state.record(("ns", f"j{number}")), "Running")
    assert state.periods().progress == 30.0


def test_the_tallies_by_phase_and_namespace_follow_the_jobs() -> None:
    """Kept as jobs come, change and go: a count over every record at each change cost 100,000 jobs' operator a
    core in a burst."""
    state = fresh_state()
    state.set_phase(state.record(("a", "j1")), "Running")
    state.set_phase(state.record(("a", "j2")), "Pending")
    state.set_phase(state.record(("b", "j3")), "Running")
    state.set_phase(state.records[("a", "j2")], "Running")
    state.forget(("b", "j3"))
    assert +state.phases == {"Running": 2} and +state.in_namespace == {"a": 2}
    assert state.pods.released == ["b"], "the pod watch of a namespace goes with its last job"  # type: ignore[attr-defined]
    state.forget(("b", "j3"))  # again: a job gone mid-reconcile is forgotten, then its deletion event comes
    assert +state.in_namespace == {"a": 2}
    assert metrics.REGISTRY.get_sample_value("kubetrain_jobs", {"phase": "Running"}) == 2.0
    assert metrics.REGISTRY.get_sample_value("kubetrain_jobs", {"phase": "Pending"}) == 0.0


def test_a_job_is_kept_between_reconciles_without_its_managed_fields(run: Any) -> None:
    """managedFields is about half of a running job's JSON and the operator never reads it: 5,000 jobs kept it as
    145 MiB of the operator's memory (bench scale.burst)."""
    body = job_body()
    body["metadata"]["managedFields"] = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]
    cluster = FakeCluster(body)
    state = run(cluster)
    kept = state.records[KEY].body
    assert kept is not None and kept["metadata"]["uid"] == "uid-1" and "managedFields" not in kept["metadata"]
    assert cluster.job is not None and "managedFields" in cluster.job["metadata"], "the job itself is not changed"
    assert len(cluster.pods) == 2
