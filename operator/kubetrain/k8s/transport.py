"""HTTP to the Kubernetes API server: credentials, one session for calls and one for watches, JSON in and out.

kopf already brings aiohttp: no threads, and not the official client, whose import alone costs the operator
~17 MiB of RSS. Credentials come from kopf's own login functions (``login``; the operator registers it as kopf's
login handler too). kube.py builds the operator's calls on this; nothing else sends requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncGenerator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import kopf
from prometheus_client import Counter

from kubetrain.core import api
from kubetrain.k8s.exec_login import with_exec_credentials
from kubetrain.k8s.lanes import Slots

__all__ = ["API_REQUESTS", "ApiError", "Login", "Rest", "VersionGoneError", "login", "request_labels"]

Json = Any
Login = Callable[[], kopf.ConnectionInfo]

HTTP_UNAUTHORIZED = 401
HTTP_FORBIDDEN = 403
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_TOO_MANY_REQUESTS = 429  # API Priority and Fairness: the level's queues are full; Retry-After says when
THROTTLED_RETRIES = 10  # as client-go retries a 429
THROTTLED_WAIT_MAX = 10.0  # seconds, whatever Retry-After says
HTTP_ERRORS = 400
NAMESPACE_TERMINATING = "NamespaceTerminating"  # a StatusCause: no new objects in a namespace being deleted
# Seconds: a call that cannot connect, or does not finish, is an API server that did not answer. Both count from
# the moment the call has one of the operator's connection slots: aiohttp's own `connect` timeout also counts the
# wait for a free connection of its pool, and a 4,096-pod gang's creates queued there past 10 s and failed as
# "Connection timeout" with the API server answering well.
CONNECT_TIMEOUT = 10
# Routine calls (lanes.py) hold at most a quarter of the connection slots (at least one).
ROUTINE_SHARE_DIVISOR = 4
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

API_REQUESTS = Counter("kubetrain_api_requests", "The operator's own calls to the API server (not kopf's watches and "
                       "events), by verb, resource and answer: 2xx, an error status, or 'error' for no answer.",
                       ["verb", "resource", "code"])
# The API server's verbs for a call, by method and whether it names one object.
_VERBS = {("GET", True): "get", ("GET", False): "list", ("POST", False): "create", ("POST", True): "create",
          ("PATCH", True): "patch", ("PUT", True): "update", ("DELETE", True): "delete",
          ("DELETE", False): "deletecollection"}


def request_labels(method: str, path: str) -> tuple[str, str]:
    """The verb and resource (with its subresource) of a call, as the API server's metrics name them:
    ``PATCH /apis/g/v/namespaces/ns/trainingjobs/a/status`` is ("patch", "trainingjobs/status")."""
    parts = path.split("?", maxsplit=1)[0].strip("/").split("/")
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:  # not the Namespace object itself
        rest = rest[2:]
    resource = rest[0] if rest else ""
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource += "/" + rest[2]
    return _VERBS.get((method.upper(), named), method.lower()), resource


class ApiError(Exception):
    """The API server answered with an error status; ``message`` is its Status object's message."""

    def __init__(self, status: int, reason: str, body: str, *, retry_after: float | None = None) -> None:
        self.status = status
        self.reason = reason
        self.body = body
        self.retry_after = retry_after  # seconds, from the answer's Retry-After header
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


def login(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """The operator's credentials: its service account in a pod, else the kubeconfig (KUBECONFIG or
    ~/.kube/config, its `exec:` plugin run as kubectl runs it). kopf's own minimal logins, so that neither
    kopf nor we need the official client."""
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
    return with_exec_credentials(_relative_to_kubeconfig(info))


def _relative_to_kubeconfig(info: kopf.ConnectionInfo) -> kopf.ConnectionInfo:
    """Relative file names in a kubeconfig are relative to its folder (kopf's login reads them as they are)."""
    first = (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0]
    folder = Path(first).expanduser().parent
    changes: dict[str, Any] = {name: str(folder / path) for name in ("ca_path", "certificate_path", "private_key_path")
               if isinstance(path := getattr(info, name), str) and path and not Path(path).is_absolute()}
    return dataclasses.replace(info, **changes) if changes else info


def _headers(info: kopf.ConnectionInfo) -> dict[str, str]:
    return {**info.as_http_headers(), "User-Agent": USER_AGENT}


class Rest:
    """JSON over HTTP to the API server; one session, made on first use (in the operator's event loop)."""

    def __init__(self, login: Login, connections: int) -> None:
        self._login = login
        self._info = login()
        self._headers = _headers(self._info)
        self._connections = connections
        self._slots: Slots | None = None  # made with the session, in the loop that uses it
        self._session: aiohttp.ClientSession | None = None
        self._watch_session: aiohttp.ClientSession | None = None

    def _log_in_again(self) -> None:
        """A 401: the token was rotated (a service account's, by the kubelet); read the credentials again."""
        self._headers = _headers(self._login())

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                # The slots bound the calls in flight (a gang's pods at once); the pool has as many connections.
                connector=aiohttp.TCPConnector(limit=self._connections, ssl=self._info.as_ssl_context()),
                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT, sock_connect=CONNECT_TIMEOUT),
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

    async def stream(self, path: str, params: Mapping[str, str]) -> AsyncGenerator[Json, None]:
        """A watch's events, one JSON object each; ApiError for an error status (a 401 logs in again for the
        next one), VersionGoneError when the watch's resourceVersion is gone."""
        # Lines are split here: aiohttp's readline() refuses lines over 64 KiB, and a pod can be larger.
        pending = b""
        async with contextlib.aclosing(self.stream_bytes(path, params, accept=JSON)) as chunks:
            async for chunk in chunks:
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _watch_event(json.loads(line))

    async def stream_bytes(self, path: str, params: Mapping[str, str], *, accept: str = "*/*",
                           read_timeout: float = WATCH_READ_TIMEOUT) -> AsyncGenerator[bytes, None]:
        """A long answer's body as it arrives (a watch's, a followed log's), in chunks that split lines
        anywhere; ApiError for an error status (a 401 logs in again for the next one)."""
        url = self._info.server.rstrip("/") + path
        headers = {**self._headers, "Accept": accept}
        timeout = aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT, sock_read=read_timeout)
        async with self._open_for_watches().get(url, params=params, headers=headers, timeout=timeout) as response:
            if response.status >= HTTP_ERRORS:
                if response.status == HTTP_UNAUTHORIZED:
                    self._log_in_again()
                raise ApiError(response.status, response.reason or "", await response.text())
            async for chunk in response.content.iter_any():
                yield chunk

    async def request(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                      body: Json = None, content_type: str = JSON) -> Json:
        """The answer's JSON; ApiError for an error status. A 401 logs in again once (rotated tokens). The call
        waits for a slot in its caller's lane (lanes.py)."""
        if self._slots is None:
            self._slots = Slots(self._connections, routine_max=self._connections // ROUTINE_SHARE_DIVISOR)
        counted = API_REQUESTS.labels(*request_labels(method, path), "2xx")
        for attempt in range(THROTTLED_RETRIES + 1):
            try:
                async with self._slots.held():  # the call's timeouts start once it has a slot (CONNECT_TIMEOUT)
                    answer = await self._request(method, path, params, body, content_type)
                counted.inc()
                return answer
            except ApiError as error:
                API_REQUESTS.labels(*request_labels(method, path), str(error.status)).inc()
                if error.status != HTTP_TOO_MANY_REQUESTS or attempt == THROTTLED_RETRIES:
                    raise
                await asyncio.sleep(throttled_wait(error.retry_after))  # its slot free for other calls meanwhile
            except (aiohttp.ClientError, TimeoutError):
                API_REQUESTS.labels(*request_labels(method, path), "error").inc()
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def _request(self, method: str, path: str, params: Mapping[str, str] | None, body: Json,
                       content_type: str) -> Json:
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
                    raise ApiError(response.status, response.reason or "", text,
                                   retry_after=_seconds(response.headers.get("Retry-After")))
                return json.loads(text) if text else None
        raise AssertionError("unreachable: the second attempt returns or raises")


def _seconds(header: str | None) -> float | None:
    """A Retry-After header's delay (the API server sends whole seconds; an HTTP date is not read)."""
    try:
        return float(header) if header else None
    except ValueError:
        return None


def throttled_wait(retry_after: float | None) -> float:
    """Seconds to wait before a throttled call's next try: what the API server asked, at least 0.1, at most 10."""
    return min(max(retry_after if retry_after is not None else 1.0, 0.1), THROTTLED_WAIT_MAX)


def _watch_event(event: Json) -> Json:
    """The event, unless it is the API server's error event: VersionGoneError for a 410, else ApiError."""
    if event.get("type") != "ERROR":
        return event
    status = event.get("object") or {}
    if status.get("code") == HTTP_GONE:
        raise VersionGoneError(status.get("message", "resourceVersion too old"))
    raise ApiError(int(status.get("code") or 500), status.get("reason") or "", json.dumps(status))
