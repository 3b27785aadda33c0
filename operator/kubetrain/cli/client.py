"""The CLI's synchronous Kubernetes client (`kubetrain logs`, `kubetrain watch`): the official client.

The operator never imports this module (nor the official client): its own calls go through kube.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from kubetrain.core import api

__all__ = ["RECONNECTING", "api_message", "load_configuration", "stream_job"]

Json = Any

# A watch that hears nothing for this long is taken for a dead (half-open) connection and resumed.
WATCH_READ_TIMEOUT_SECONDS = 120
# Seconds between attempts to get a lost watch back (the last one repeats).
WATCH_RETRY_DELAYS = (1.0, 2.0, 4.0, 8.0)
RECONNECTING = "RECONNECTING"
HTTP_GONE = 410


def api_message(error: ApiException) -> str:
    """The message of the Status object the API server answered with, else the HTTP reason."""
    try:
        return str(json.loads(error.body or "")["message"])
    except (TypeError, ValueError, KeyError):
        return f"{error.status} {error.reason}"


def load_configuration(pool_size: int) -> client.Configuration:
    """In-cluster credentials when running in a pod, else the kubeconfig (KUBECONFIG or ~/.kube/config)."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        config.load_kube_config(client_configuration=configuration)
    # One HTTP connection per concurrent call, or urllib3 drops connections under load.
    configuration.connection_pool_maxsize = pool_size
    return configuration


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
            reason = api_message(error)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            reason = f"{type(error).__name__}: {error}"
        yield RECONNECTING, reason
        time.sleep(min(WATCH_RETRY_DELAYS[min(failures, len(WATCH_RETRY_DELAYS) - 1)],
                       max(0.0, deadline - time.monotonic())))
        failures += 1
