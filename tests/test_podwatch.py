"""The operator's own watch of its jobs' pods (podwatch.py), against a scripted API server: what it keeps, which
jobs it reports changed, and how it goes on after the watch ends, fails, or finds its version gone."""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubetrain.k8s import follow as follow_module
from kubetrain.k8s.kube import ApiError, VersionGoneError
from kubetrain.k8s.podwatch import PodWatch
from tests.pods import pod

Json = Any
KEY = ("ml", "valid")


def in_namespace(body: Json, namespace: str = "ml", version: str = "1") -> Json:
    body = copy.deepcopy(body)
    body["metadata"].update(namespace=namespace, resourceVersion=version)
    return body


def event(kind: str, body: Json, version: str) -> Json:
    return {"type": kind, "object": in_namespace(body, body["metadata"].get("namespace", "ml"), version)}


class FakeKube:
    """Lists give the next of ``lists``; watches give the next of ``watches``: a list of events, or an exception
    raised after them. When both run out, a watch waits until cancelled. Records every call."""

    def __init__(self, lists: list[tuple[list[Json], str]], watches: list[list[Json | Exception]]) -> None:
        self.lists = lists
        self.watches = watches
        self.calls: list[tuple[str, str | None, str]] = []
        self.exhausted = asyncio.Event()

    async def list_pods(self, namespace: str | None, selector: str) -> tuple[list[Json], str]:
        self.calls.append(("list", namespace, selector))
        if isinstance(self.lists[0], Exception):
            raise self.lists.pop(0)
        return self.lists.pop(0)

    async def watch_pods(self, namespace: str | None, selector: str, version: str) -> AsyncIterator[Json]:
        self.calls.append(("watch", namespace, version))
        if not self.watches:
            self.exhausted.set()
            await asyncio.Event().wait()
        for item in self.watches.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item
            await asyncio.sleep(0)


def follow(kube: FakeKube, *, all_namespaces: bool = False, namespaces: tuple[str, ...] = ("ml",)
           ) -> tuple[PodWatch, list[tuple[str, str]], dict[str, Any]]:
    """Run a PodWatch until its scripted watches are used up; (it, the jobs it reported, its pods then)."""
    told: list[tuple[str, str]] = []
    kept: dict[str, Any] = {}

    async def main() -> PodWatch:
        watch = PodWatch(kube, all_namespaces=all_namespaces)  # type: ignore[arg-type]
        watch.on_change(told.append)
        for namespace in namespaces:
            await asyncio.wait_for(watch.ready(namespace), 5)
        await asyncio.wait_for(kube.exhausted.wait(), 5)
        kept.update({f"{ns}/{job}": sorted(p.name for p in pods) for (ns, job), pods in watch.items()})
        await watch.close()
        return watch

    return asyncio.run(main()), told, kept


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(follow_module, "RETRY_DELAYS", (0.0,))


def test_a_job_is_reported_when_what_the_reconcile_reads_of_its_pods_changes() -> None:
    running = pod(0)
    annotated = copy.deepcopy(running)  # a change the reconcile does not read
    annotated["metadata"]["annotations"] = {"example.com/seen": "yes"}
    kube = FakeKube([([in_namespace(pod(0, "Pending"))], "10")],
                    [[event("MODIFIED", running, "11"), event("MODIFIED", annotated, "12"),
                      event("ADDED", pod(1), "13"), event("DELETED", pod(0), "14")]])
    _, told, kept = follow(kube)
    assert told == [KEY, KEY, KEY], "Running, a new pod, a deleted one: not the event that changed nothing"
    assert kept == {"ml/valid": ["valid-1"]}
    assert kube.calls[:2] == [("list", "ml", "kubetrain.io/job-name"), ("watch", "ml", "10")]


def test_the_first_list_reports_nothing_and_a_job_without_pods_is_not_kept() -> None:
    kube = FakeKube([([in_namespace(pod(0))], "10")], [[event("DELETED", pod(0), "11")]])
    _, told, kept = follow(kube)
    assert told == [KEY] and kept == {}


def test_a_watch_that_ends_goes_on_from_its_last_version_bookmarks_included() -> None:
    bookmark = {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "30"}}}
    kube = FakeKube([([], "10")], [[event("ADDED", pod(0), "20"), bookmark], [ApiError(500, "etcd", "")], []])
    follow(kube)
    assert [c for c in kube.calls if c[0] == "watch"] == [("watch", "ml", v) for v in ("10", "30", "30", "30")]
    assert [c[0] for c in kube.calls].count("list") == 1, "a failed watch resumes: no list again"


def test_a_version_gone_lists_again_and_reports_what_changed_meanwhile() -> None:
    other = pod(0, job="other")
    kube = FakeKube([([in_namespace(pod(0)), in_namespace(other)], "10"),
                     ([in_namespace(pod(0)), in_namespace(pod(1))], "50")],
                    [[VersionGoneError("too old")]])
    _, told, kept = follow(kube)
    assert sorted(told) == [("ml", "other"), KEY], "valid got a pod, other lost its only one"
    assert kept == {"ml/valid": ["valid-0", "valid-1"]}
    assert kube.calls[-1] == ("watch", "ml", "50")


def test_a_failed_first_list_is_retried_before_anything_is_ready() -> None:
    kube = FakeKube([ApiError(403, "Forbidden", "pods is forbidden"), ([in_namespace(pod(0))], "10")], [])  # type: ignore[list-item]
    _, _, kept = follow(kube)
    assert kept == {"ml/valid": ["valid-0"]}
    assert [c[0] for c in kube.calls] == ["list", "list", "watch"]


def test_a_relabelled_pod_moves_to_its_new_job_and_both_are_reported() -> None:
    moved = pod(0)
    moved["metadata"]["labels"]["kubetrain.io/job-name"] = "other"
    kube = FakeKube([([in_namespace(pod(0))], "10")], [[event("MODIFIED", moved, "11")]])
    _, told, kept = follow(kube)
    assert told == [KEY, ("ml", "other")]
    assert kept == {"ml/other": ["valid-0"]}


@pytest.mark.parametrize(("all_namespaces", "scopes"), [(False, ["ml", "team"]), (True, [None])])
def test_namespaces_are_watched_one_by_one_or_all_in_one_watch(all_namespaces: bool, scopes: list[str | None]) -> None:
    kube = FakeKube([([], "10"), ([], "11")], [])
    follow(kube, all_namespaces=all_namespaces, namespaces=("ml", "team", "ml"))
    assert [c[1] for c in kube.calls if c[0] == "list"] == scopes



def test_a_watch_that_ends_at_once_without_events_backs_off(caplog: pytest.LogCaptureFixture) -> None:
    """A proxy that closes every stream must not turn the watch into a loop of requests."""
    kube = FakeKube([([], "10")], [[], [], [event("ADDED", pod(0), "11")]])
    with caplog.at_level(logging.WARNING, logger="kubetrain.pods"):
        _, told, _ = follow(kube)
    ended = [r for r in caplog.records if "the watch ended at once" in r.getMessage()]
    assert len(ended) == 2, [r.getMessage() for r in caplog.records]
    assert told == [KEY], "and goes on when events come"


def test_a_released_namespace_stops_its_watch_drops_its_pods_and_lists_again_when_needed() -> None:
    kube = FakeKube(lists=[([in_namespace(pod(0))], "5"), ([], "9")], watches=[])

    async def main() -> tuple[list[Any], list[Any], bool]:
        watch = PodWatch(kube, all_namespaces=False)  # type: ignore[arg-type]
        await asyncio.wait_for(watch.ready("ml"), 5)
        await asyncio.wait_for(kube.exhausted.wait(), 5)
        kept_before = list(watch)
        first = watch._scopes["ml"].task
        watch.release("ml")
        await asyncio.sleep(0)
        stopped = first is not None and first.cancelled()
        kept_after = list(watch)
        await asyncio.wait_for(watch.ready("ml"), 5)  # a new job in the namespace
        await watch.close()
        return kept_before, kept_after, stopped

    before, after, stopped = asyncio.run(main())
    assert before == [KEY] and after == [] and stopped
    assert [call[0] for call in kube.calls] == ["list", "watch", "list", "watch"]


def test_a_waiter_for_a_namespace_released_meanwhile_gets_a_fresh_list() -> None:
    kube = FakeKube(lists=[([in_namespace(pod(0))], "7")], watches=[])

    async def main() -> list[Any]:
        watch = PodWatch(kube, all_namespaces=False)  # type: ignore[arg-type]
        waiter = asyncio.create_task(watch.ready("ml"))  # a new job's first event
        await asyncio.sleep(0)  # the waiter has started the namespace's watch, which has not listed yet
        watch.release("ml")  # the namespace's last job went meanwhile
        await asyncio.wait_for(waiter, 5)
        kept = list(watch)
        await watch.close()
        return kept

    assert asyncio.run(main()) == [KEY], "ready() returned before the namespace's pods were listed"
    assert [call[0] for call in kube.calls][:1] == ["list"]


def test_one_watch_of_every_namespace_is_never_released() -> None:
    kube = FakeKube(lists=[([], "5")], watches=[])

    async def main() -> bool:
        watch = PodWatch(kube, all_namespaces=True)  # type: ignore[arg-type]
        await asyncio.wait_for(watch.ready("ml"), 5)
        watch.release("ml")
        await asyncio.sleep(0)
        task = watch._scopes[None].task
        running = task is not None and not task.done()
        await watch.close()
        return running

    assert asyncio.run(main())


def test_how_a_run_restarted_in_place_ended_is_kept_after_the_kubelet_shows_only_its_restart() -> None:
    """The real kubelet shows a run's end only while it restarts the pod in place (condition AllContainersRestarting);
    a reconcile that comes after that second still reads it."""
    restarting = pod(1, uid="u-1", exit_code=1, message="ValueError: bad batch")
    restarting["status"]["conditions"].append({"type": "AllContainersRestarting", "status": "True"})
    restarted = pod(1, uid="u-1", restarted=(1, 137, "2026-11-01T10:09:58Z"))
    restarted["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"] = "RestartingAllContainers"
    kept_runs: list[Any] = []

    async def main() -> None:
        kube = FakeKube([([in_namespace(pod(1, uid="u-1"))], "10")],
                        [[event("MODIFIED", restarting, "11"), event("MODIFIED", restarted, "12")]])
        watch = PodWatch(kube, all_namespaces=False)  # type: ignore[arg-type]
        await asyncio.wait_for(watch.ready("ml"), 5)
        await asyncio.wait_for(kube.exhausted.wait(), 5)
        kept_runs.extend((p.restarts, p.last_run) for pods in dict(watch.items()).values() for p in pods)
        await watch.close()

    asyncio.run(main())
    ((restarts, run),) = kept_runs
    assert restarts == 1 and run is not None
    assert (run.exit_code, run.message) == (1, "ValueError: bad batch")
