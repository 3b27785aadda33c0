"""Deleting a lab namespace so that nothing of it runs on: its pods stopped, its lab PersistentVolumes gone.

Used by the ``namespace`` fixture (tests/lab/fixtures.py), tests that make namespaces of their own, and the
benchmarks (bench/cluster.py).
"""

from __future__ import annotations

import time

from tests.lab.lab import Lab
from tests.lab.procs import wait_for
from tests.lab.rest import ApiError

GRACEFUL_POD_DELETE_S = 15


def delete_namespace(lab: Lab, name: str) -> None:
    """Delete the namespace and wait until its pods (and so their processes) are gone.

    The namespace object itself is left to the namespace controller: names are unique per test, and
    waiting for its final sweep would cost seconds per test.
    """
    lab.api.delete(f"/api/v1/namespaces/{name}")
    # The namespace controller gets to the pods after a while; asking directly saves seconds per test.
    lab.api.delete(f"/api/v1/namespaces/{name}/pods")

    def pods() -> list[str]:
        return [p["metadata"]["name"] for p in lab.api.get(f"/api/v1/namespaces/{name}/pods")["items"]]

    deadline = time.monotonic() + GRACEFUL_POD_DELETE_S
    while time.monotonic() < deadline and pods():
        time.sleep(0.2)
    # Pods whose processes ignore SIGTERM would hold on for their whole grace period: force them.
    for pod in pods():
        try:
            lab.api.delete(f"/api/v1/namespaces/{name}/pods/{pod}",
                           {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
        except ApiError as error:
            if error.status != 404:
                raise
    wait_for(lambda: not pods(), 30, f"pods of namespace {name} to be gone", interval=0.2)
    lab.wait_pods_stopped(name)
    for pv in lab.api.get("/api/v1/persistentvolumes",
                          labelSelector=f"kubetrain.dev/lab-namespace={name}")["items"]:
        lab.api.delete(f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
