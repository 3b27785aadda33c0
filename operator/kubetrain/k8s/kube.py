"""The only module that talks to the Kubernetes API (besides kopf's own watching): the operator's calls.

Objects are plain dicts in the API's own camelCase shape, the same shape the pure core's builders produce; the
requests go through transport.py. The methods of ``_CoreV1`` and ``_CustomObjects`` are named like the official
client's: tests/operator_rights.py derives the operator's RBAC from those names. The errors a caller handles are
all importable from here, the transport's (ApiError, VersionGoneError) with the rest.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import aiohttp

from kubetrain.core import api
from kubetrain.core.failures import ApiFailure
from kubetrain.core.queueing import KUEUE
from kubetrain.k8s.transport import (
    HTTP_CONFLICT,
    HTTP_NOT_FOUND,
    LIST_PAGE,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    WATCH_SECONDS,
    ApiError,
    Login,
    Rest,
    VersionGoneError,
    login,
)

__all__ = [
    "ApiError",
    "ConflictError",
    "CreateError",
    "JobGoneError",
    "Kube",
    "NamespaceTerminatingError",
    "VersionGoneError",
    "api_failure",
    "login",
]

Json = Any


class ConflictError(Exception):
    """The object changed since it was read (resourceVersion mismatch): reconcile again."""


class JobGoneError(Exception):
    """The TrainingJob was deleted while it was being reconciled: nothing is wrong, and nothing is left to do."""


class NamespaceTerminatingError(JobGoneError):
    """The job's namespace is being deleted: the API server takes no new objects there, and deletes the job."""


class CreateError(Exception):
    """Creating a child object failed; says which object and carries the API's answer."""

    def __init__(self, what: str, status: int | None, message: str) -> None:
        super().__init__(f"creating {what}: {message}")
        self.what = what
        self.status = status
        self.message = message


def api_failure(error: BaseException) -> ApiFailure:
    """Any exception of a reconcile as the pure core's ApiFailure (see failures.classify)."""
    if isinstance(error, CreateError):
        return ApiFailure(error.status, error.message, creating=error.what)
    if isinstance(error, ApiError):
        return ApiFailure(error.status or None, error.message)
    if isinstance(error, aiohttp.ClientError | OSError | TimeoutError):  # no answer at all
        return ApiFailure(None, f"{type(error).__name__}: {error}")
    return ApiFailure(None, f"{type(error).__name__}: {error}", internal=True)


class _CoreV1:
    """The core/v1 calls the operator makes, named like the official client's CoreV1Api."""

    def __init__(self, rest: Rest) -> None:
        self._rest = rest

    @staticmethod
    def _path(namespace: str | None, plural: str, name: str = "") -> str:
        """None: the objects of every namespace."""
        where = "/api/v1" if namespace is None else f"/api/v1/namespaces/{namespace}"
        return f"{where}/{plural}" + (f"/{name}" if name else "")

    async def list_namespaced_pod(self, namespace: str | None, params: Mapping[str, str]) -> Json:
        return await self._rest.request("GET", self._path(namespace, "pods"), params=params)

    async def list_node(self, params: Mapping[str, str]) -> Json:
        return await self._rest.request("GET", "/api/v1/nodes", params=params)

    def watch_namespaced_pod(self, namespace: str | None, params: Mapping[str, str]) -> AsyncIterator[Json]:
        return self._rest.stream(self._path(namespace, "pods"), {**params, "watch": "true"})

    def watch_node(self, params: Mapping[str, str]) -> AsyncIterator[Json]:
        return self._rest.stream("/api/v1/nodes", {**params, "watch": "true"})

    async def create_namespaced_pod(self, namespace: str, body: Json, dry_run: bool = False) -> Json:
        params = {"dryRun": "All"} if dry_run else None
        return await self._rest.request("POST", self._path(namespace, "pods"), params=params, body=body)

    async def create_namespaced_service(self, namespace: str, body: Json) -> Json:
        return await self._rest.request("POST", self._path(namespace, "services"), body=body)

    async def read_namespaced_pod(self, name: str, namespace: str) -> Json:
        return await self._rest.request("GET", self._path(namespace, "pods", name))

    async def read_namespaced_service(self, name: str, namespace: str) -> Json:
        return await self._rest.request("GET", self._path(namespace, "services", name))

    async def patch_namespaced_pod(self, name: str, namespace: str, body: Json) -> Json:
        return await self._rest.request("PATCH", self._path(namespace, "pods", name), body=body,
                                        content_type=STRATEGIC_MERGE_PATCH)

    async def delete_namespaced_pod(self, name: str, namespace: str, grace_period_seconds: int | None = None) -> Json:
        params = {} if grace_period_seconds is None else {"gracePeriodSeconds": str(grace_period_seconds)}
        return await self._rest.request("DELETE", self._path(namespace, "pods", name), params=params)

    async def delete_namespaced_service(self, name: str, namespace: str) -> Json:
        return await self._rest.request("DELETE", self._path(namespace, "services", name))


class _SchedulingV1beta1:
    """Kubernetes' own PodGroups (scheduling.k8s.io/v1beta1, with gang scheduling on), named like the official
    client's SchedulingV1beta1Api."""

    def __init__(self, rest: Rest) -> None:
        self._rest = rest

    @staticmethod
    def _path(namespace: str, name: str = "") -> str:
        group = api.PODGROUP
        return (f"/apis/{group.GROUP}/{group.VERSION}/namespaces/{namespace}/{group.PLURAL}"
                + (f"/{name}" if name else ""))

    async def create_namespaced_pod_group(self, namespace: str, body: Json) -> Json:
        return await self._rest.request("POST", self._path(namespace), body=body)

    async def read_namespaced_pod_group(self, name: str, namespace: str) -> Json:
        return await self._rest.request("GET", self._path(namespace, name))

    async def delete_namespaced_pod_group(self, name: str, namespace: str) -> Json:
        return await self._rest.request("DELETE", self._path(namespace, name))


class _SchedulingV1:
    """PriorityClasses (cluster-scoped), named like the official client's SchedulingV1Api."""

    def __init__(self, rest: Rest) -> None:
        self._rest = rest

    async def read_priority_class(self, name: str) -> Json:
        return await self._rest.request("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}")

    async def list_priority_class(self, params: Mapping[str, str]) -> Json:
        return await self._rest.request("GET", "/apis/scheduling.k8s.io/v1/priorityclasses", params=params)


class _KueueV1beta2:
    """Kueue's Workloads and (cluster-scoped) ResourceFlavors, for jobs in a Kueue queue (core/queueing.py); named
    as the official client would name them, so that tests/operator_rights.py maps them to RBAC rules."""

    def __init__(self, rest: Rest) -> None:
        self._rest = rest

    @staticmethod
    def _path(plural: str, name: str = "", namespace: str | None = None) -> str:
        scope = f"namespaces/{namespace}/" if namespace else ""
        return f"/apis/{KUEUE.GROUP}/{KUEUE.VERSION}/{scope}{plural}" + (f"/{name}" if name else "")

    async def create_namespaced_workload(self, namespace: str, body: Json) -> Json:
        return await self._rest.request("POST", self._path(KUEUE.WORKLOADS, namespace=namespace), body=body)

    async def read_namespaced_workload(self, name: str, namespace: str) -> Json:
        return await self._rest.request("GET", self._path(KUEUE.WORKLOADS, name, namespace))

    async def patch_namespaced_workload(self, name: str, namespace: str, body: Json) -> Json:
        return await self._rest.request("PATCH", self._path(KUEUE.WORKLOADS, name, namespace), body=body,
                                        content_type=MERGE_PATCH)

    async def patch_namespaced_workload_status(self, name: str, namespace: str, body: Json) -> Json:
        return await self._rest.request("PATCH", self._path(KUEUE.WORKLOADS, name, namespace) + "/status",
                                        body=body, content_type=MERGE_PATCH)

    async def read_resource_flavor(self, name: str) -> Json:
        return await self._rest.request("GET", self._path(KUEUE.RESOURCE_FLAVORS, name))

    async def read_namespaced_local_queue_pending_workloads(self, name: str, namespace: str) -> Json:
        path = f"/apis/{KUEUE.VISIBILITY_GROUP}/{KUEUE.VERSION}/namespaces/{namespace}/{KUEUE.LOCAL_QUEUES}/{name}"
        return await self._rest.request("GET", f"{path}/{KUEUE.PENDING_WORKLOADS}")


class _CustomObjects:
    """The TrainingJob calls the operator makes, named like the official client's CustomObjectsApi."""

    def __init__(self, rest: Rest) -> None:
        self._rest = rest

    @staticmethod
    def _path(namespace: str, name: str) -> str:
        return f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{namespace}/{api.PLURAL}/{name}"

    async def get_namespaced_custom_object(self, namespace: str, name: str) -> Json:
        return await self._rest.request("GET", self._path(namespace, name))

    async def patch_namespaced_custom_object_status(self, namespace: str, name: str, body: Json) -> Json:
        return await self._rest.request("PATCH", self._path(namespace, name) + "/status", body=body,
                                        content_type=MERGE_PATCH)

    async def delete_namespaced_custom_object(self, namespace: str, name: str, propagation_policy: str) -> Json:
        return await self._rest.request("DELETE", self._path(namespace, name),
                                        params={"propagationPolicy": propagation_policy})


class Kube:
    """Async facade over the API calls the operator makes; one instance per operator."""

    def __init__(self, login: Login, connections: int = 16) -> None:
        self._rest = Rest(login, connections)
        self._core = _CoreV1(self._rest)
        self._custom = _CustomObjects(self._rest)
        self._scheduling = _SchedulingV1beta1(self._rest)
        self._priorities = _SchedulingV1(self._rest)
        self._kueue = _KueueV1beta2(self._rest)

    async def close(self) -> None:
        await self._rest.close()

    async def serves_jobs(self) -> bool:
        """Whether the API server serves TrainingJobs (their CRD is installed)."""
        return await self._serves(api.GROUP, api.VERSION, api.PLURAL)

    async def serves_pod_groups(self) -> bool:
        """Whether the API server serves scheduling.k8s.io/v1beta1 PodGroups (Kubernetes' own gang scheduling,
        feature gate GenericWorkload)."""
        return await self._serves(api.PODGROUP.GROUP, api.PODGROUP.VERSION, api.PODGROUP.PLURAL)

    async def _serves(self, group: str, version: str, plural: str) -> bool:
        """From API discovery, which every authenticated client may read."""
        try:
            found = await self._rest.request("GET", f"/apis/{group}/{version}")
        except ApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return False
            raise
        return any(resource.get("name") == plural for resource in found.get("resources") or [])

    async def get_job(self, namespace: str, name: str) -> Json | None:
        return await _none_if_missing(self._custom.get_namespaced_custom_object(namespace, name))

    async def patch_job_status(self, namespace: str, name: str, patch: Mapping[str, Json],
                               resource_version: str) -> Json:
        """Merge-patch the status; the job as written. ConflictError when it changed since read,
        JobGoneError when it was deleted."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": patch}
        try:
            return await self._custom.patch_namespaced_custom_object_status(namespace, name, body)
        except ApiError as error:
            if error.status == HTTP_CONFLICT:
                raise ConflictError(f"{namespace}/{name} changed while reconciling") from error
            if error.status == HTTP_NOT_FOUND:
                raise JobGoneError(f"{namespace}/{name} was deleted while reconciling") from error
            raise

    async def delete_job(self, namespace: str, name: str) -> None:
        try:
            await self._custom.delete_namespaced_custom_object(namespace, name, propagation_policy="Background")
        except ApiError as error:
            _raise_unless_missing(error)

    async def refuses_new_pods(self, namespace: str, pod: Json) -> bool:
        """Whether the namespace is being deleted, asked the way a Role allows: a dry run of creating ``pod``
        (nothing is stored), which the API server refuses there with NamespaceTerminating. Reading the
        namespace would need a cluster-wide right."""
        try:
            await self._core.create_namespaced_pod(namespace, pod, dry_run=True)
        except ApiError as error:
            return error.namespace_terminating
        return False

    async def create(self, namespace: str, body: Mapping[str, Json]) -> Json | None:
        """Create a pod, a Service, a PodGroup or a Workload: None when created, else the object of that name that
        exists.

        Any other refusal raises CreateError naming the object.
        """
        create, read = {
            "Pod": (self._core.create_namespaced_pod, self._core.read_namespaced_pod),
            "Service": (self._core.create_namespaced_service, self._core.read_namespaced_service),
            api.PODGROUP.KIND: (self._scheduling.create_namespaced_pod_group,
                                self._scheduling.read_namespaced_pod_group),
            KUEUE.WORKLOAD: (self._kueue.create_namespaced_workload, self._kueue.read_namespaced_workload),
        }[body["kind"]]
        name = body["metadata"]["name"]
        try:
            await create(namespace, body)
        except ApiError as error:
            if error.namespace_terminating:
                # the namespace controller deletes the job next: nothing is wrong, and nothing to retry
                raise NamespaceTerminatingError(f"namespace {namespace} is being deleted") from error
            if error.status != HTTP_CONFLICT:
                raise CreateError(f"{body['kind'].lower()} {name}", error.status, error.message) from error
            try:
                return await read(name, namespace)
            except ApiError as missing:
                if missing.status != HTTP_NOT_FOUND:
                    raise
                raise ConflictError(f"{body['kind'].lower()} {name} was deleted while creating it") from error
        return None

    async def get_workload(self, namespace: str, name: str) -> Json | None:
        """A job's Kueue Workload; None when there is none (yet)."""
        return await _none_if_missing(self._kueue.read_namespaced_workload(name, namespace))

    async def patch_workload(self, namespace: str, name: str, patch: Mapping[str, Json], *,
                             status: bool = False) -> Json:
        """Merge-patch a Workload (its status with ``status``), guarded by the resourceVersion the patch carries:
        ConflictError when Kueue changed it since it was read (or it went), so the job is reconciled again."""
        write = self._kueue.patch_namespaced_workload_status if status else self._kueue.patch_namespaced_workload
        try:
            return await write(name, namespace, patch)
        except ApiError as error:
            if error.status in (HTTP_CONFLICT, HTTP_NOT_FOUND):
                raise ConflictError(f"workload {namespace}/{name} changed while reconciling") from error
            raise

    async def get_resource_flavor(self, name: str) -> Json:
        return await self._kueue.read_resource_flavor(name)

    async def get_pending_workloads(self, namespace: str, local_queue: str) -> Json:
        """A LocalQueue's pending Workloads in Kueue's order (its PendingWorkloadsSummary); ApiError where Kueue's
        visibility API is not served (404, 503) or the operator may not read it (403)."""
        return await self._kueue.read_namespaced_local_queue_pending_workloads(local_queue, namespace)

    async def get_priority_class(self, name: str) -> Json:
        return await self._priorities.read_priority_class(name)

    async def list_priority_classes(self) -> list[Json]:
        classes, _ = await _all_pages(self._priorities.list_priority_class, {})
        return classes

    async def list_pods(self, namespace: str | None, selector: str) -> tuple[list[Json], str]:
        """The pods that match the label selector, in one namespace or (None) all, page by page; and the
        resourceVersion to watch them from."""
        return await _all_pages(functools.partial(self._core.list_namespaced_pod, namespace),
                                {"labelSelector": selector})

    async def list_nodes(self) -> list[Json]:
        """Every node of the cluster, page by page (read only when a failure points at a node: core/nodes.py)."""
        nodes, _ = await _all_pages(self._core.list_node, {})
        return nodes

    async def list_nodes_to_watch(self) -> tuple[list[Json], str]:
        """Every node, and the resourceVersion to watch them from (k8s/nodewatch.py)."""
        return await _all_pages(self._core.list_node, {})

    def watch_nodes(self, version: str) -> AsyncIterator[Json]:
        """The nodes' changes after ``version``, with bookmarks, until the API server ends the watch."""
        return self._core.watch_node({"resourceVersion": version, "allowWatchBookmarks": "true",
                                      "timeoutSeconds": str(WATCH_SECONDS)})

    def watch_pods(self, namespace: str | None, selector: str, version: str) -> AsyncIterator[Json]:
        """The pods' changes after ``version``, with bookmarks, until the API server ends the watch (see
        Rest.stream)."""
        return self._core.watch_namespaced_pod(namespace, {
            "labelSelector": selector, "resourceVersion": version, "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS)})

    async def delete_companion(self, namespace: str, kind: str, name: str) -> None:
        """Delete one of the job's Service or PodGroups (left by a deleted job of the same name, or an earlier
        attempt's group)."""
        delete = (self._scheduling.delete_namespaced_pod_group if kind == api.PODGROUP.KIND
                  else self._core.delete_namespaced_service)
        try:
            await delete(name, namespace)
        except ApiError as error:
            _raise_unless_missing(error)

    async def adopt_pod(self, namespace: str, name: str, owner: Mapping[str, Json]) -> None:
        """Give an orphaned pod of the job its owner reference back (it was created before a crash)."""
        patch = {"metadata": {"ownerReferences": [dict(owner)]}}
        try:
            await self._core.patch_namespaced_pod(name, namespace, patch)
        except ApiError as error:
            _raise_unless_missing(error)

    async def delete_pod(self, namespace: str, name: str, *, force: bool = False) -> None:
        try:
            await self._core.delete_namespaced_pod(name, namespace, grace_period_seconds=0 if force else None)
        except ApiError as error:
            _raise_unless_missing(error)


async def _none_if_missing(read: Awaitable[Json]) -> Json | None:
    """What a read returns; None when the object does not exist."""
    try:
        return await read
    except ApiError as error:
        _raise_unless_missing(error)
        return None


def _raise_unless_missing(error: ApiError) -> None:
    if error.status != HTTP_NOT_FOUND:  # already gone is what we wanted
        raise error


async def _all_pages(list_call: Callable[[Mapping[str, str]], Awaitable[Json]],
                     params: Mapping[str, str]) -> tuple[list[Json], str]:
    """Every item of a list, LIST_PAGE at a time; and the resourceVersion of the list (to watch from)."""
    items: list[Json] = []
    params = {**params, "limit": str(LIST_PAGE)}
    while True:
        page = await list_call(params)
        items += page.get("items") or []
        after = page["metadata"].get("continue")
        if not after:
            return items, page["metadata"]["resourceVersion"]
        params = {**params, "continue": after}
