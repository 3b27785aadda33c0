"""The only module that talks to the Kubernetes API (besides kopf's own watching).

The official client is synchronous; each call runs in a worker thread so that the operator's event
loop keeps serving other jobs. Objects come back as plain dicts in the API's own camelCase shape
(``_preload_content=False``), the same shape the pure core's builders produce.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from kubetrain import api
from kubetrain.manifests import job_selector
from kubetrain.policy import ApiFailure

__all__ = [
    "RECONNECTING",
    "ConflictError",
    "CreateError",
    "JobGoneError",
    "Kube",
    "api_failure",
    "load_configuration",
    "stream_job",
]

Json = Any

HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409


class ConflictError(Exception):
    """The object changed since it was read (resourceVersion mismatch): reconcile again."""


class JobGoneError(Exception):
    """The TrainingJob was deleted while it was being reconciled: nothing is wrong, and nothing is left to do."""


class CreateError(Exception):
    """Creating a child object failed; says which object and carries the API's answer."""

    def __init__(self, what: str, status: int | None, message: str) -> None:
        super().__init__(f"creating {what}: {message}")
        self.what = what
        self.status = status
        self.message = message


def _api_message(error: ApiException) -> str:
    """The message of the Status object the API server answered with, else the HTTP reason."""
    try:
        return str(json.loads(error.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def api_failure(error: BaseException) -> ApiFailure:
    """Any exception of a reconcile as the pure core's ApiFailure (see policy.classify)."""
    if isinstance(error, CreateError):
        return ApiFailure(error.status, error.message, creating=error.what)
    if isinstance(error, ApiException):
        return ApiFailure(error.status or None, _api_message(error))
    if isinstance(error, urllib3.exceptions.HTTPError | OSError | TimeoutError):  # no answer at all
        return ApiFailure(None, f"{type(error).__name__}: {error}")
    return ApiFailure(None, f"{type(error).__name__}: {error}", internal=True)


def load_configuration(pool_size: int) -> client.Configuration:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    # One HTTP connection per worker thread, or urllib3 drops connections under load.
    configuration.connection_pool_maxsize = pool_size
    return configuration


class Kube:
    """Async facade over the API calls the operator makes; one instance per operator."""

    def __init__(self, configuration: client.Configuration, threads: int = 16) -> None:
        self._api_client = client.ApiClient(configuration)
        self._core = client.CoreV1Api(self._api_client)
        self._custom = client.CustomObjectsApi(self._api_client)
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kube")

    async def _call(self, function: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: function(*args, **kwargs))

    async def _json(self, function: Any, *args: Any, **kwargs: Any) -> Json:
        response = await self._call(function, *args, _preload_content=False, **kwargs)
        return json.loads(response.data)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._api_client.close()

    async def get_job(self, namespace: str, name: str) -> Json | None:
        try:
            return await self._json(self._custom.get_namespaced_custom_object,
                                    api.GROUP, api.VERSION, namespace, api.PLURAL, name)
        except ApiException as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise

    async def list_job_pods(self, namespace: str, job_name: str) -> list[Json]:
        listing = await self._json(self._core.list_namespaced_pod, namespace, label_selector=job_selector(job_name))
        items: list[Json] = listing.get("items", [])
        return items

    async def patch_job_status(self, namespace: str, name: str, patch: Mapping[str, Json],
                               resource_version: str) -> str:
        """Merge-patch the status; the job's new resourceVersion. ConflictError when it changed since read,
        JobGoneError when it was deleted."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": patch}
        try:
            updated = await self._json(self._custom.patch_namespaced_custom_object_status,
                                       api.GROUP, api.VERSION, namespace, api.PLURAL, name, body)
            return str(updated["metadata"]["resourceVersion"])
        except ApiException as error:
            if error.status == HTTP_CONFLICT:
                raise ConflictError(f"{namespace}/{name} changed while reconciling") from error
            if error.status == HTTP_NOT_FOUND:
                raise JobGoneError(f"{namespace}/{name} was deleted while reconciling") from error
            raise

    async def delete_job(self, namespace: str, name: str) -> None:
        await self._ignore_missing(self._custom.delete_namespaced_custom_object,
                                   api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                   propagation_policy="Background")

    async def create(self, namespace: str, body: Mapping[str, Json]) -> Json | None:
        """Create a pod or a Service: None when created, else the object of that name that exists already.

        Any other refusal raises CreateError naming the object.
        """
        is_pod = body["kind"] == "Pod"
        create = self._core.create_namespaced_pod if is_pod else self._core.create_namespaced_service
        read = self._core.read_namespaced_pod if is_pod else self._core.read_namespaced_service
        name = body["metadata"]["name"]
        try:
            await self._call(create, namespace, body)
        except ApiException as error:
            if error.status != HTTP_CONFLICT:
                raise CreateError(f"{body['kind'].lower()} {name}", error.status, _api_message(error)) from error
            try:
                return await self._json(read, name, namespace)
            except ApiException as missing:
                if missing.status != HTTP_NOT_FOUND:
                    raise
                raise ConflictError(f"{body['kind'].lower()} {name} was deleted while creating it") from error
        return None

    async def delete_service(self, namespace: str, name: str) -> None:
        await self._ignore_missing(self._core.delete_namespaced_service, name, namespace)

    async def adopt_pod(self, namespace: str, name: str, owner: Mapping[str, Json]) -> None:
        """Give an orphaned pod of the job its owner reference back (it was created before a crash)."""
        patch = {"metadata": {"ownerReferences": [dict(owner)]}}
        await self._ignore_missing(self._core.patch_namespaced_pod, name, namespace, patch)

    async def delete_pod(self, namespace: str, name: str, *, force: bool = False) -> None:
        options = client.V1DeleteOptions(grace_period_seconds=0) if force else None
        await self._ignore_missing(self._core.delete_namespaced_pod, name, namespace, body=options)

    async def _ignore_missing(self, function: Any, *args: Any, **kwargs: Any) -> None:
        try:
            await self._call(function, *args, **kwargs)
        except ApiException as error:
            if error.status != HTTP_NOT_FOUND:  # already gone is what we wanted
                raise


# A watch that hears nothing for this long is taken for a dead (half-open) connection and resumed.
WATCH_READ_TIMEOUT_SECONDS = 120
# Seconds between attempts to get a lost watch back (the last one repeats).
WATCH_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0)
RECONNECTING = "RECONNECTING"
HTTP_GONE = 410


def stream_job(namespace: str, name: str, timeout: float) -> Iterator[tuple[str, Json]]:
    """Each event of one TrainingJob, as (type, object), for ``timeout`` seconds (the CLI's `watch`; synchronous).

    A watch the server ends or a connection that drops resumes from the last resourceVersion seen, so no
    change is missed; one too old for the server (410 Gone) starts over from the current state. Each loss is
    reported as (RECONNECTING, reason) before the next try. Refusals (401, 403, 404) are raised.
    """
    custom = client.CustomObjectsApi(client.ApiClient(load_configuration(pool_size=1)))
    deadline = time.monotonic() + timeout
    version: str | None = None
    failures = 0
    while (left := deadline - time.monotonic()) > 0:
        try:
            for event in watch.Watch().stream(
                custom.list_namespaced_custom_object, api.GROUP, api.VERSION, namespace, api.PLURAL,
                field_selector=f"metadata.name={name}", timeout_seconds=max(1, int(left)),
                resource_version=version, allow_watch_bookmarks=True,
                _request_timeout=(10, WATCH_READ_TIMEOUT_SECONDS),
            ):
                if not isinstance(event, dict):
                    continue  # a blank keep-alive line
                version = event["raw_object"].get("metadata", {}).get("resourceVersion", version)
                failures = 0
                if event["type"] != "BOOKMARK":
                    yield event["type"], event["raw_object"]
            continue  # the server closed the watch at its timeout: resume where it stopped
        except ApiException as error:
            if error.status in (401, 403, 404):
                raise
            if error.status == HTTP_GONE:
                version = None
            reason = _api_message(error)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            reason = f"{type(error).__name__}: {error}"
        yield RECONNECTING, reason
        time.sleep(min(WATCH_RETRY_DELAYS[min(failures, len(WATCH_RETRY_DELAYS) - 1)],
                       max(0.0, deadline - time.monotonic())))
        failures += 1
