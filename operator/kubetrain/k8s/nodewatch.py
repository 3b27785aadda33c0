"""The nodes that announce a disruption (cordoned, or tainted NoExecute: core/notices.py), and those whose kubelet
cannot restart a pod's containers in place (core/nodes.py), from a watch of every node: list, watch from the list's
resourceVersion (with bookmarks), list again after a 410.

Only each node's notice is kept (most nodes have none), and only a change of it is told: a node's status
heartbeats cost a parse, never a reconcile. Without the right to list and watch nodes the watch retries with
backoff and no notice is known: jobs then checkpoint at SIGTERM, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from kubetrain.core.nodes import lacks_in_place_restarts
from kubetrain.core.notices import node_notice
from kubetrain.k8s.follow import follow
from kubetrain.k8s.kube import Kube

__all__ = ["NodeWatch"]

Json = Any
log = logging.getLogger("kubetrain.nodes")


class NodeWatch:
    """``notices``: why each node with one is about to disrupt its pods, by node name (a live mapping)."""

    def __init__(self, kube: Kube) -> None:
        self._kube = kube
        self._notices: dict[str, str] = {}
        self._changed: Callable[[str], None] = lambda node: None
        self.version: str | None = None  # where the watch goes on from (k8s/follow.py)
        self._task: asyncio.Task[None] | None = None
        self._without_in_place: set[str] = set()
        self._listed = asyncio.Event()
        self._waited = False  # the first job waited for the first list (listed): the others go on at once

    @property
    def restart_in_place(self) -> bool:
        """Every node (that takes pods) restarts containers in place; False until the nodes were listed."""
        return self._listed.is_set() and not self._without_in_place

    async def listed(self, timeout: float) -> None:
        """Return once the nodes were listed, or after ``timeout`` seconds (without the right to list them); at once
        after the first such wait ended."""
        if self._waited:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._listed.wait(), timeout)
        self._waited = True

    @property
    def notices(self) -> Mapping[str, str]:
        return self._notices

    def start(self, changed: Callable[[str], None]) -> None:
        """Follow the nodes for good (from the first call on), calling ``changed`` with each node whose notice came
        or went. Called from a kopf handler, the watch runs in a copy of its context, where kopf.event() works."""
        if self._task is None:
            self._changed = changed
            self._task = asyncio.create_task(self._follow(), name="node watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self) -> None:
        await follow("nodes", self, self._list, self._kube.watch_nodes, self._apply, log=log)

    async def _list(self) -> None:
        nodes, self.version = await self._kube.list_nodes_to_watch()
        fresh = {node["metadata"]["name"]: notice for node in nodes if (notice := node_notice(node))}
        for name in set(fresh) | set(self._notices):
            self._set(name, fresh.get(name))  # told only where a notice came, went or changed
        self._without_in_place = {node["metadata"]["name"] for node in nodes if lacks_in_place_restarts(node)}
        self._listed.set()

    def _apply(self, event: Json) -> None:
        node = event["object"]
        self.version = node["metadata"]["resourceVersion"]
        kind = event.get("type")
        if kind == "BOOKMARK":
            return
        name = node["metadata"]["name"]
        self._set(name, None if kind == "DELETED" else node_notice(node))
        if kind != "DELETED" and lacks_in_place_restarts(node):
            self._without_in_place.add(name)
        else:
            self._without_in_place.discard(name)

    def _set(self, name: str, notice: str | None) -> None:
        if self._notices.get(name) == notice:
            return
        if notice is None:
            del self._notices[name]
        else:
            log.info("node %s %s", name, notice)
            self._notices[name] = notice
        self._changed(name)
