"""The CLI's reads of the cluster (`kubetrain logs`, `kubetrain watch`), over the operator's own transport.

One Kubernetes client for the whole project: k8s/transport.py's ``Rest`` (aiohttp) and its login, so the user's
credentials come from a service account in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config), read by
kopf's login functions as the operator's are. The CLI reads, and writes one annotation (clear-excluded-nodes);
kube.py's calls are the operator's (its RBAC).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

import aiohttp
import kopf

from kubetrain.core import api
from kubetrain.core.naming import job_selector
from kubetrain.k8s.transport import HTTP_GONE, MERGE_PATCH, ApiError, Rest, VersionGoneError, login

__all__ = ["RECONNECTING", "REFUSALS", "Cluster", "ConnectionLost", "connect"]

Json = Any

RECONNECTING = "RECONNECTING"
# Statuses that no retry mends: the user's credentials, their rights, or the API itself (no CRD) are wrong.
REFUSALS = (401, 403, 404)
# Seconds between attempts to get a lost watch back (the last one repeats).
WATCH_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0)
# Calls in flight at once; streams (one per followed pod) have a pool of their own, without a limit.
CONNECTIONS = 8
# What a connection that broke or went silent raises: aiohttp's errors, a socket's, or a read timeout.
ConnectionLost = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


def connect(namespace: str) -> Cluster:
    """The cluster the user's credentials reach; raises kopf.LoginError when there are none."""
    try:
        rest = Rest(lambda: login(kopf.OperatorSettings()), connections=CONNECTIONS)
    except OSError as error:  # a kubeconfig (or its certificate files) that cannot be read
        raise kopf.LoginError(f"cannot read the credentials: {error}") from error
    return Cluster(namespace, rest)


class Cluster:
    """The few API calls the CLI makes, in one namespace; close it (``async with``) to end its connections."""

    def __init__(self, namespace: str, rest: Rest) -> None:
        self.namespace = namespace
        self._rest = rest

    async def __aenter__(self) -> Cluster:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self._rest.close()

    def _jobs_path(self, name: str = "") -> str:
        path = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{self.namespace}/{api.PLURAL}"
        return f"{path}/{name}" if name else path

    def _pods_path(self, name: str = "") -> str:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        return f"{path}/{name}" if name else path

    async def job(self, name: str) -> Json:
        """The TrainingJob ``name``; ApiError 404 when there is none."""
        return await self._rest.request("GET", self._jobs_path(name))

    async def annotate_job(self, name: str, annotations: Mapping[str, str]) -> Json:
        """Set annotations on the TrainingJob ``name``; ApiError 404 when there is none."""
        return await self._rest.request("PATCH", self._jobs_path(name), body={"metadata": {"annotations": annotations}},
                                        content_type=MERGE_PATCH)

    async def pods(self, job: Mapping[str, Json]) -> list[Json]:
        """Every pod the operator made for ``job`` (all its attempts still present)."""
        selector = job_selector(job["metadata"]["name"], job["metadata"].get("uid", ""))
        listing = await self._rest.request("GET", self._pods_path(), params={"labelSelector": selector})
        items: list[Json] = listing["items"]
        return items

    async def pod(self, name: str) -> Json:
        return await self._rest.request("GET", self._pods_path(name))

    def log_chunks(self, pod: str, follow: bool, read_timeout: float) -> AsyncGenerator[bytes, None]:
        """The trainer container's log as it arrives; ApiError while it has not started (400) or is gone (404)."""
        params = {"container": api.CONTAINER_NAME, "follow": "true" if follow else "false"}
        return self._rest.stream_bytes(self._pods_path(pod) + "/log", params, read_timeout=read_timeout)

    async def watch_job(self, name: str, timeout: float) -> AsyncGenerator[tuple[str, Json], None]:
        """Each event of one TrainingJob, as (type, object), for ``timeout`` seconds.

        A watch the server ends or a connection that drops resumes from the last resourceVersion seen, so no
        change is missed; one too old for the server (410 Gone) starts over from the current state. Each loss is
        reported as (RECONNECTING, reason) before the next try. Refusals (401, 403, 404) are raised.
        """
        deadline = time.monotonic() + timeout
        version: str | None = None
        failures = 0
        while (left := deadline - time.monotonic()) > 0:
            params = {"watch": "true", "fieldSelector": f"metadata.name={name}", "allowWatchBookmarks": "true",
                      "timeoutSeconds": str(max(1, int(left))), **({"resourceVersion": version} if version else {})}
            try:
                async with contextlib.aclosing(self._rest.stream(self._jobs_path(), params)) as events:
                    async for event in events:
                        version = event.get("object", {}).get("metadata", {}).get("resourceVersion", version)
                        failures = 0
                        if event["type"] != "BOOKMARK":
                            yield event["type"], event["object"]
                continue  # the server closed the watch at its timeout: resume where it stopped
            except VersionGoneError as error:
                version, reason = None, str(error)
            except ApiError as error:
                if error.status in REFUSALS:
                    raise
                if error.status == HTTP_GONE:  # as an answer's status, not a watch event: the same remedy
                    version = None
                reason = error.message
            except ConnectionLost as error:
                reason = f"{type(error).__name__}: {error}"
            yield RECONNECTING, reason
            await asyncio.sleep(min(WATCH_RETRY_DELAYS[min(failures, len(WATCH_RETRY_DELAYS) - 1)],
                                    max(0.0, deadline - time.monotonic())))
            failures += 1
