"""Helpers to build pods the way the operator does and to wait on their status."""

from __future__ import annotations

import time
from typing import Any

from tests.lab.rest import JSON, ApiError, Rest

TERMINAL = ("Succeeded", "Failed")
RESTRICTED_SECURITY_CONTEXT: JSON = {
    "runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_manifest(name: str, command: list[str], args: list[str] | None = None, *,
                 env: dict[str, str] | None = None, labels: dict[str, str] | None = None,
                 hostname: str | None = None, subdomain: str | None = None,
                 grace_s: int = 5, image: str = "kubetrain/trainer:lab", **spec: Any) -> JSON:
    """A bare pod shaped like the operator's: one `trainer` container, restricted, restartPolicy Never."""
    container: JSON = {
        "name": "trainer", "image": image, "command": command, "args": args or [],
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
        "securityContext": RESTRICTED_SECURITY_CONTEXT,
        "resources": {"limits": {"cpu": "1", "memory": "1Gi"}},
    }
    pod_spec: JSON = {"containers": [container], "restartPolicy": "Never",
                      "automountServiceAccountToken": False, "terminationGracePeriodSeconds": grace_s, **spec}
    if hostname:
        pod_spec["hostname"] = hostname
    if subdomain:
        pod_spec["subdomain"] = subdomain
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}},
            "spec": pod_spec}


def headless_service(name: str, selector: dict[str, str], ports: dict[str, int]) -> JSON:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector,
                     "ports": [{"name": k, "port": v} for k, v in ports.items()]}}


def get_pod(api: Rest, namespace: str, name: str) -> JSON | None:
    try:
        return api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except ApiError as error:
        if error.status == 404:
            return None
        raise


def wait_pod(api: Rest, namespace: str, name: str, phases: tuple[str, ...] = TERMINAL,
             timeout: float = 120) -> JSON:
    """Poll until the pod's phase is one of ``phases``; fail fast if it ends in another terminal phase."""
    deadline = time.monotonic() + timeout
    pod: JSON | None = None
    while time.monotonic() < deadline:
        pod = get_pod(api, namespace, name)
        phase = (pod or {}).get("status", {}).get("phase")
        if phase in phases:
            assert pod is not None
            return pod
        if phase in TERMINAL:
            raise AssertionError(f"pod {namespace}/{name} ended {phase}, wanted {phases}: {pod}")
        time.sleep(0.1)
    raise TimeoutError(f"pod {namespace}/{name} not in {phases} after {timeout} s: {pod}")


def wait_pod_gone(api: Rest, namespace: str, name: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while get_pod(api, namespace, name) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"pod {namespace}/{name} still exists after {timeout} s")
        time.sleep(0.1)


def terminated_state(pod: JSON, container: str = "trainer") -> JSON:
    status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == container)
    return dict(status["state"]["terminated"])
