"""A small JSON client for the lab's own components (kubelet, DNS, fixtures' plumbing).

The lab talks plain JSON over ``requests`` so that it depends on the API, not on a client library's models.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import requests
import requests.adapters

JSON = dict[str, Any]
HTTP_CONFLICT = 409


class ApiError(Exception):
    def __init__(self, status: int, body: str, what: str) -> None:
        super().__init__(f"{what}: HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class Rest:
    def __init__(self, server: str, ca: Path, cert: Path, key: Path, timeout: float = 15.0) -> None:
        self.server = server
        self.timeout = timeout
        self.session = requests.Session()
        # Passed on every request too: a REQUESTS_CA_BUNDLE in the environment beats the session's setting.
        self.verify = str(ca)
        self.session.verify = self.verify
        self.session.cert = (str(cert), str(key))
        # Pod workers share one client from many threads; keep enough pooled connections for them.
        self.session.mount("https://", requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=64))

    def request(self, method: str, path: str, body: Any = None, *, params: dict[str, Any] | None = None,
                content_type: str = "application/json", timeout: float | None = None) -> JSON:
        """One request; ``timeout`` (seconds) overrides the client's for requests that take long by nature."""
        data = None if body is None else json.dumps(body)
        try:
            response = self.session.request(
                method, self.server + path, data=data, params=params, timeout=timeout or self.timeout,
                verify=self.verify,
                headers={"Content-Type": content_type, "Accept": "application/json"},
            )
        except requests.RequestException as error:  # the same kind of error, naming the request that failed
            raise type(error)(f"{method} {path}: {error}", request=error.request,
                              response=error.response) from error
        if response.status_code >= 400:
            raise ApiError(response.status_code, response.text, f"{method} {path}")
        return dict(response.json()) if response.content else {}

    def get(self, path: str, **params: Any) -> JSON:
        return self.request("GET", path, params=params or None)

    def exists(self, path: str) -> bool:
        """Whether GET ``path`` finds the object (False on 404; other errors raise)."""
        try:
            self.get(path)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    def post(self, path: str, body: JSON) -> JSON:
        """Create; once more if the connection closed before any answer (an API server under a burst closes a
        kept-alive connection as it is reused): then a 409 for a named object means the first create made it."""
        try:
            return self.request("POST", path, body)
        except requests.ConnectionError as error:
            name = (body.get("metadata") or {}).get("name")
            if not name or "RemoteDisconnected" not in str(error):
                raise
        try:
            return self.request("POST", path, body)
        except ApiError as again:
            if again.status != HTTP_CONFLICT:
                raise
            return self.get(f"{path}/{name}")

    def put(self, path: str, body: JSON) -> JSON:
        return self.request("PUT", path, body)

    def merge_patch(self, path: str, body: JSON) -> JSON:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.request("DELETE", path, body)

    def watch(self, path: str, resource_version: str, timeout_s: int = 60) -> Iterator[JSON]:
        """Yield watch events until the server ends the stream; raise ApiError on HTTP errors."""
        params = {"watch": "1", "resourceVersion": resource_version, "timeoutSeconds": str(timeout_s),
                  "allowWatchBookmarks": "true"}
        with self.session.get(self.server + path, params=params, stream=True, verify=self.verify,
                              timeout=(self.timeout, timeout_s + 30)) as response:
            if response.status_code >= 400:
                raise ApiError(response.status_code, response.text, f"WATCH {path}")
            for line in response.iter_lines():
                if line:
                    yield dict(json.loads(line))


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods/{name}" + (f"/{sub}" if sub else "")
