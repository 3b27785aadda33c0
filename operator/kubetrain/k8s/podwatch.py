"""Each job's pods, from a watch of our own: list, watch from the list's resourceVersion (with bookmarks), and
list again only when the API server no longer keeps that version (410).

kopf watched them before (an index and an on.event handler). Its machinery per event (a worker task per pod,
a handler call with two dozen arguments, an object logger) was the largest share of the operator's CPU in a
burst of jobs. Here an event is parsed and summarised (``pod_state``), and its job is reconciled only when
that summary changed: a pod's events that change nothing the reconcile reads (a condition's probe time, a
container's image id) cost no reconcile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubetrain.core import api
from kubetrain.core.status import PodState, pod_state, with_last_run_kept
from kubetrain.k8s.follow import follow
from kubetrain.k8s.kube import Kube

__all__ = ["PodWatch"]

Json = Any
Key = tuple[str, str]  # (namespace, job name)
log = logging.getLogger("kubetrain.pods")


@dataclass
class _Scope:
    """One namespace's watch (None: every namespace's)."""

    namespace: str | None
    listed: asyncio.Event = field(default_factory=asyncio.Event)
    version: str | None = None  # where the watch goes on from; None: list first
    task: asyncio.Task[None] | None = None
    released: bool = False  # no job of the namespace is left: the watch is stopped, its pods dropped


class PodWatch(Mapping[Key, Iterable[PodState]]):
    """Each job's pods as last seen (a live mapping, key: (namespace, job name)), for namespaces watched on
    first use."""

    def __init__(self, kube: Kube, *, all_namespaces: bool) -> None:
        self._kube = kube
        self._changed: Callable[[Key], None] = lambda key: None
        self._all_namespaces = all_namespaces
        self._by_job: dict[Key, dict[str, PodState]] = {}
        self._job_of: dict[Key, Key] = {}  # (namespace, pod name): its job (a relabelled pod moves)
        self._scopes: dict[str | None, _Scope] = {}

    def on_change(self, changed: Callable[[Key], None]) -> None:
        """Call ``changed`` with each job whose pods changed (after their namespace's first list)."""
        self._changed = changed

    def __getitem__(self, key: Key) -> Iterable[PodState]:
        return self._by_job[key].values()

    def __iter__(self) -> Iterator[Key]:
        return iter(self._by_job)

    def __len__(self) -> int:
        return len(self._by_job)

    async def ready(self, namespace: str) -> None:
        """Return once the namespace's pods are listed, starting its watch the first time (again after a
        release). A watch started from a kopf handler runs in a copy of its context, where kopf.event() works."""
        scope_name = None if self._all_namespaces else namespace
        while True:
            scope = self._scopes.get(scope_name)
            if scope is None:
                log.info("watching the pods of jobs in %s", scope_name or "every namespace")
                scope = self._scopes[scope_name] = _Scope(scope_name)
                scope.task = asyncio.create_task(self._follow(scope), name=f"pod watch {scope_name or '(all)'}")
            await scope.listed.wait()
            if not scope.released:
                return

    def release(self, namespace: str) -> None:
        """Stop watching the namespace, whose last job is gone, and drop its pods: an operator that runs for
        months sees many short-lived namespaces (one per CI run, per user) and must not keep a watch on each.
        A waiter in :meth:`ready` starts a fresh watch. One watch of every namespace is kept."""
        scope = None if self._all_namespaces else self._scopes.pop(namespace, None)
        if scope is None:
            return
        log.info("stopped watching pods in %s: its last job is gone", namespace)
        scope.released = True
        scope.listed.set()
        if scope.task is not None:
            scope.task.cancel()
        for where in [where for where in self._job_of if where[0] == namespace]:
            self._forget(where)

    async def close(self) -> None:
        tasks = [scope.task for scope in self._scopes.values() if scope.task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow(self, scope: _Scope) -> None:
        async def relist() -> None:
            await self._list(scope, tell=scope.listed.is_set())
            scope.listed.set()

        await follow(f"pods in {scope.namespace or 'every namespace'}", scope, relist,
                     lambda version: self._kube.watch_pods(scope.namespace, api.LABEL.JOB_NAME, version),
                     lambda event: self._apply(scope, event), log=log)

    async def _list(self, scope: _Scope, *, tell: bool) -> None:
        """Replace the scope's pods by a fresh list; ``tell``: report the jobs whose pods changed meanwhile (not
        at the first list: every job gets its own first reconcile from its watch event)."""
        pods, scope.version = await self._kube.list_pods(scope.namespace, api.LABEL.JOB_NAME)
        seen = {(pod["metadata"]["namespace"], pod["metadata"]["name"]) for pod in pods}
        gone = [where for where in self._job_of if where not in seen
                and (scope.namespace is None or where[0] == scope.namespace)]
        touched = {key for where in gone if (key := self._forget(where)) is not None}
        for pod in pods:
            if (key := self._put(pod)) is not None:
                touched.add(key)
        if tell:
            for key in touched:
                self._changed(key)

    def _apply(self, scope: _Scope, event: Json) -> None:
        pod = event["object"]
        scope.version = pod["metadata"]["resourceVersion"]
        kind = event.get("type")
        if kind == "BOOKMARK":
            return
        key = (self._forget((pod["metadata"]["namespace"], pod["metadata"]["name"])) if kind == "DELETED"
               else self._put(pod))
        if key is not None:
            self._changed(key)

    def _put(self, pod: Json) -> Key | None:
        """Keep the pod's summary; the job whose pods changed by it (two jobs' changes when a pod was relabelled:
        the old one is told here), or None when nothing the reconcile reads changed."""
        metadata = pod["metadata"]
        where = (metadata["namespace"], metadata["name"])
        key = (where[0], (metadata.get("labels") or {})[api.LABEL.JOB_NAME])
        if self._job_of.get(where, key) != key and (moved_from := self._forget(where)) is not None:
            self._changed(moved_from)
        pods = self._by_job.setdefault(key, {})
        state = with_last_run_kept(pods.get(where[1]), pod_state(pod))
        if pods.get(where[1]) == state:
            return None
        pods[where[1]] = state
        self._job_of[where] = key
        return key

    def _forget(self, where: Key) -> Key | None:
        """Drop the pod; its job, or None when it was not kept."""
        key = self._job_of.pop(where, None)
        if key is None:
            return None
        pods = self._by_job[key]
        pods.pop(where[1], None)
        if not pods:
            del self._by_job[key]
        return key
