"""The only module that talks to the Kubernetes API (besides kopf's own watching).

Plain REST over one aiohttp session (kopf already brings aiohttp): no threads, and not the official client,
whose import alone costs the operator ~17 MiB of RSS. Credentials come from kopf's own login functions (``login``;
handlers.py registers it as kopf's login handler too). Objects are plain dicts in the API's own camelCase
shape, the same shape the pure core's builders produce. The methods of ``_CoreV1`` and ``_CustomObjects``
are named like the official client's: tests/operator_rights.py derives the operator's RBAC from those names.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import kopf

from kubetrain import api
from kubetrain.policy import ApiFailure

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
Login = Callable[[], kopf.ConnectionInfo]

HTTP_UNAUTHORIZED = 401
HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_ERRORS = 400
NAMESPACE_TERMINATING = "NamespaceTerminating"  # a StatusCause: no new objects in a namespace being deleted
# Seconds: a call that cannot connect, or does not finish, is an API server that did not answer.
CONNECT_TIMEOUT = 10
REQUEST_TIMEOUT = 60
# The API server takes a request's User-Agent (up to the "/") as the field manager of what it writes.
USER_AGENT = f"{api.OPERATOR_COMPONENT}/{api.RELEASE}"
# A watch: the API server ends it after WATCH_SECONDS (it is then resumed); silence for longer than
# WATCH_READ_TIMEOUT is a connection that died unseen (bookmarks come every minute or so).
WATCH_SECONDS = 300
WATCH_READ_TIMEOUT = WATCH_SECONDS + 30
LIST_PAGE = 500  # objects per page of a list
HTTP_GONE = 410  # a watch's resourceVersion is too old: list again
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"  # custom resources take no strategic merge patch
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"  # what the official client sends for core kinds
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ApiError(Exception):
    """The API server answered with an error status; ``message`` is its Status object's message."""

    def __init__(self, status: int, reason: str, body: str) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        super().__init__(self.message)

    @property
    def message(self) -> str:
        try:
            return str(json.loads(self.body)["message"])
        except (TypeError, ValueError, KeyError):
            return f"{self.status} {self.reason}"

    @property
    def causes(self) -> set[str]:
        """The reasons in the Status object's details.causes (e.g. NamespaceTerminating)."""
        try:
            return {str(cause.get("reason")) for cause in json.loads(self.body)["details"]["causes"]}
        except (TypeError, ValueError, KeyError, AttributeError):
            return set()

    @property
    def namespace_terminating(self) -> bool:
        """The refusal of a new object in a namespace being deleted."""
        return self.status == HTTP_FORBIDDEN and NAMESPACE_TERMINATING in self.causes


class VersionGoneError(Exception):
    """A watch asked for a resourceVersion the API server no longer keeps (410): list again."""


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
    """Any exception of a reconcile as the pure core's ApiFailure (see policy.classify)."""
    if isinstance(error, CreateError):
        return ApiFailure(error.status, error.message, creating=error.what)
    if isinstance(error, ApiError):
        return ApiFailure(error.status or None, error.message)
    if isinstance(error, aiohttp.ClientError | OSError | TimeoutError):  # no answer at all
        return ApiFailure(None, f"{type(error).__name__}: {error}")
    return ApiFailure(None, f"{type(error).__name__}: {error}", internal=True)


def login(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """The operator's credentials: its service account in a pod, else the kubeconfig (KUBECONFIG or
    ~/.kube/config). kopf's own minimal logins, so that neither kopf nor we need the official client."""
    info = kopf.login_with_service_account(settings=settings)
    if info is not None:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port:  # the address the official client uses in a pod (kopf's is the Service's DNS name)
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
            info = dataclasses.replace(info, server=server)
        return info
    info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("neither a service account token nor a kubeconfig (KUBECONFIG, ~/.kube/config)")
    return _relative_to_kubeconfig(info)


def _relative_to_kubeconfig(info: kopf.ConnectionInfo) -> kopf.ConnectionInfo:
    """Relative file names in a kubeconfig are relative to its folder (kopf's login reads them as they are)."""
    first = (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0]
    folder = Path(first).expanduser().parent
    changes: dict[str, Any] = {name: str(folder / path) for name in ("ca_path", "certificate_path", "private_key_path")
               if isinstance(path := getattr(info, name), str) and path and not Path(path).is_absolute()}
    return dataclasses.replace(info, **changes) if changes else info


def _headers(info: kopf.ConnectionInfo) -> dict[str, str]:
    return {**info.as_http_headers(), "User-Agent": USER_AGENT}


class _Rest:
    """JSON over HTTP to the API server; one session, made on first use (in the operator's event loop)."""

    def __init__(self, login: Login, connections: int) -> None:
        self._login = login
        self._info = login()
        self._headers = _headers(self._info)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None

    def _log_in_again(self) -> None:
        """A 401: the token was rotated (a service account's, by the kubelet); read the credentials again."""
        self._headers = _headers(self._login())

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # The connection limit bounds the calls in flight, as a thread pool did (a gang's pods at once).
                connector=aiohttp.TCPConnector(limit=self._connections, ssl=self._info.as_ssl_context()),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT),
                proxy=self._info.proxy_url, trust_env=self._info.trust_env,
            )
        return self._session

    def _open_for_watches(self) -> aiohttp.ClientSession:
        """Watches hold their connection for minutes: a pool of their own, so they never take the calls' slots."""
        if self._watch_session is None:
            self._watch_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=self._info.as_ssl_context()),
                timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT, sock_read=WATCH_READ_TIMEOUT),
                proxy=self._info.proxy_url, trust_env=self._info.trust_env,
            )
        return self._watch_session

    async def close(self) -> None:
        for session in (self._session, self._watch_session):
            if session is not None:
                await session.close()

    async def stream(self, path: str, params: Mapping[str, str]) -> AsyncIterator[Json]:
        """A watch's events, one JSON object each; ApiError for an error status (a 401 logs in again for the
        next one), VersionGoneError when the watch's resourceVersion is gone."""
        url = self._info.server.rstrip("/") + path
        headers = {**self._headers, "Accept": JSON}
        async with self._open_for_watches().get(url, params=params, headers=headers) as response:
            if response.status >= HTTP_ERRORS:
                if response.status == HTTP_UNAUTHORIZED:
                    self._log_in_again()
                raise ApiError(response.status, response.reason or "", await response.text())
            # Lines are split here: aiohttp's readline() refuses lines over 64 KiB, and a pod can be larger.
            pending = b""
            async for chunk in response.content.iter_any():
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _watch_event(json.loads(line))

    async def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                      body: Json = None, content_type: str = JSON) -> Json:
        """The answer's JSON; ApiError for an error status. A 401 logs in again once (rotated tokens)."""
        for attempt in range(2):
            headers = {**self._headers, "Accept": JSON, "Content-Type": content_type}
            data = None if body is None else json.dumps(body)
            async with self._open().request(method, self._info.server.rstrip("/") + path, params=params,
                                            data=data, headers=headers) as response:
                text = await response.text()
                if response.status == HTTP_UNAUTHORIZED and attempt == 0:
                    self._log_in_again()
                    continue
                if response.status >= HTTP_ERRORS:
                    raise ApiError(response.status, response.reason or "", text)
                return json.loads(text) if text else None
        raise AssertionError("unreachable: the second attempt returns or raises")


def _watch_event(event: Json) -> Json:
    """The event, unless it is the API server's error event: VersionGoneError for a 410, else ApiError."""
    if event.get("type") != "ERROR":
        return event
    status = event.get("object") or {}
    if status.get("code") == HTTP_GONE:
        raise VersionGoneError(status.get("message", "resourceVersion too old"))
    raise ApiError(int(status.get("code") or 500), status.get("reason") or "", json.dumps(status))


class _CoreV1:
    """The core/v1 calls the operator makes, named like the official client's CoreV1Api."""

    def __init__(self, rest: _Rest) -> None:
        self._rest = rest

    @staticmethod
    def _path(namespace: str | None, plural: str, name: str = "") -> str:
        """None: the objects of every namespace."""
        where = "/api/v1" if namespace is None else f"/api/v1/namespaces/{namespace}"
        return f"{where}/{plural}" + (f"/{name}" if name else "")

    async def list_namespaced_pod(self, namespace: str | None, params: Mapping[str, str]) -> Json:
        return await self._rest.request("GET", self._path(namespace, "pods"), params=params)

    def watch_namespaced_pod(self, namespace: str | None, params: Mapping[str, str]) -> AsyncIterator[Json]:
        return self._rest.stream(self._path(namespace, "pods"), {**params, "watch": "true"})

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


class _PodGroups:
    """scheduler-plugins' PodGroups (only with ``--pod-group-scheduler``), named like a generated client's."""

    def __init__(self, rest: _Rest) -> None:
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


class _CustomObjects:
    """The TrainingJob calls the operator makes, named like the official client's CustomObjectsApi."""

    def __init__(self, rest: _Rest) -> None:
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
        self._rest = _Rest(login, connections)
        self._core = _CoreV1(self._rest)
        self._custom = _CustomObjects(self._rest)
        self._pod_groups = _PodGroups(self._rest)

    async def close(self) -> None:
        await self._rest.close()

    async def serves_jobs(self) -> bool:
        """Whether the API server serves TrainingJobs (their CRD is installed), from API discovery, which every
        authenticated client may read."""
        try:
            found = await self._rest.request("GET", f"/apis/{api.GROUP}/{api.VERSION}")
        except ApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return False
            raise
        return any(resource.get("name") == api.PLURAL for resource in found.get("resources") or [])

    async def get_job(self, namespace: str, name: str) -> Json | None:
        try:
            return await self._custom.get_namespaced_custom_object(namespace, name)
        except ApiError as error:
            if error.status == HTTP_NOT_FOUND:
                return None
            raise

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
        """Create a pod, a Service or a PodGroup: None when created, else the object of that name that exists.

        Any other refusal raises CreateError naming the object.
        """
        create, read = {
            "Pod": (self._core.create_namespaced_pod, self._core.read_namespaced_pod),
            "Service": (self._core.create_namespaced_service, self._core.read_namespaced_service),
            api.PODGROUP.KIND: (self._pod_groups.create_namespaced_pod_group,
                                self._pod_groups.read_namespaced_pod_group),
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

    async def list_pods(self, namespace: str | None, selector: str) -> tuple[list[Json], str]:
        """The pods that match the label selector, in one namespace or (None) all, page by page; and the
        resourceVersion to watch them from."""
        pods: list[Json] = []
        params = {"labelSelector": selector, "limit": str(LIST_PAGE)}
        while True:
            page = await self._core.list_namespaced_pod(namespace, params)
            pods += page.get("items") or []
            after = page["metadata"].get("continue")
            if not after:
                return pods, page["metadata"]["resourceVersion"]
            params = {**params, "continue": after}

    def watch_pods(self, namespace: str | None, selector: str, version: str) -> AsyncIterator[Json]:
        """The pods' changes after ``version``, with bookmarks, until the API server ends the watch (see
        _Rest.stream)."""
        return self._core.watch_namespaced_pod(namespace, {
            "labelSelector": selector, "resourceVersion": version, "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS)})

    async def delete_companion(self, namespace: str, kind: str, name: str) -> None:
        """Delete the job's Service or PodGroup (one that a deleted job of the same name left)."""
        delete = (self._pod_groups.delete_namespaced_pod_group if kind == api.PODGROUP.KIND
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


def _raise_unless_missing(error: ApiError) -> None:
    if error.status != HTTP_NOT_FOUND:  # already gone is what we wanted
        raise error
