"""TrainingJobs of one namespace of a lab, through its REST client: create, read, patch, wait, record phases.

Shared by the operator tests and the benchmarks (bench/cluster.py, bench/scale.py, bench/rendezvous.py).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from tests.lab.lab import Lab
from tests.lab.procs import wait_for
from tests.lab.rest import ApiError, Rest

Json = Any


class Jobs:
    """TrainingJobs of one namespace: create, read, patch and wait."""

    def __init__(self, lab: Lab, namespace: str) -> None:
        self.lab = lab
        self.namespace = namespace
        self.base = f"/apis/kubetrain.io/v1alpha1/namespaces/{namespace}/trainingjobs"

    def create(self, name: str, spec: Json) -> Json:
        body = {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name},
                "spec": spec}
        created: Json = self.lab.api.post(self.base, body)
        return created

    def get(self, name: str) -> Json:
        job: Json = self.lab.api.get(f"{self.base}/{name}")
        return job

    def status(self, name: str) -> Json:
        return self.get(name).get("status") or {}

    def patch_spec(self, name: str, spec: Json) -> None:
        self.lab.api.merge_patch(f"{self.base}/{name}", {"spec": spec})

    def pods(self, name: str) -> list[Json]:
        pods: list[Json] = self.lab.api.get(f"/api/v1/namespaces/{self.namespace}/pods",
                                            labelSelector=f"kubetrain.io/job-name={name}")["items"]
        return pods

    def wait(self, name: str, predicate: Callable[[Json], bool], what: str, timeout: float = 120) -> Json:
        """Poll the status until ``predicate(status)``; the last status is in the error otherwise."""
        seen: list[Json] = [{}]

        def check() -> bool:
            seen[0] = self.status(name)
            return predicate(seen[0])
        try:
            wait_for(check, timeout, f"{name}: {what}", interval=0.25)
        except TimeoutError as error:
            raise AssertionError(f"{name}: {what}; last status: {json.dumps(seen[0], indent=1)}") from error
        return seen[0]

    def wait_phase(self, name: str, phase: str, timeout: float = 120) -> Json:
        return self.wait(name, lambda s: s.get("phase") == phase, f"phase {phase}", timeout)

    def events(self, name: str) -> list[Json]:
        events: list[Json] = self.lab.api.get(f"/api/v1/namespaces/{self.namespace}/events",
                                              fieldSelector=f"involvedObject.name={name}")["items"]
        return events


def list_version(api: Rest, path: str) -> str:
    """The list's resourceVersion; a CRD established a moment ago answers 429 until its storage is ready."""
    found: list[str] = []

    def listed() -> bool:
        try:
            found.append(api.get(path)["metadata"]["resourceVersion"])
            return True
        except ApiError as error:
            if error.status != 429:
                raise
            return False
    wait_for(listed, 30, f"listing {path}", interval=0.5)
    return found[-1]


def phase_recorder(jobs: Jobs, name: str) -> Callable[[], list[str]]:
    """Start recording the distinct phases a job goes through.

    From a watch that starts before the job exists: the apiserver delivers every status write in order, so a
    phase that lasts a few milliseconds (Pending, on a fast lab) is seen, which polling could miss.
    """
    api = jobs.lab.admin_rest()  # its own connection for the long-lived watch
    phases: list[str] = []
    stop = threading.Event()
    version = list_version(api, jobs.base)

    def note(job: Json) -> None:
        phase = (job.get("status") or {}).get("phase")
        if job["metadata"]["name"] == name and phase and (not phases or phases[-1] != phase):
            phases.append(phase)

    def follow() -> None:
        nonlocal version
        while not stop.is_set():
            for event in api.watch(jobs.base, version, timeout_s=2):
                if event["type"] == "ERROR":  # 410 Gone: our version was compacted; carry on from now
                    version = list_version(api, jobs.base)
                    break
                version = event["object"]["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    note(event["object"])

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()

    def finish() -> list[str]:
        stop.set()
        thread.join(timeout=10)
        note(jobs.get(name))  # the phase the caller waited for
        return phases
    return finish


# Run in a trainer container: SIGKILL the workers, torchrun's (PID 1's) children.
_KILL_THE_WORKERS = """
import os, signal
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        parent = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
    except OSError:
        continue
    if parent == "1":
        os.kill(int(pid), signal.SIGKILL)
"""


def kill_workers(lab: Lab, namespace: str, pod: str) -> None:
    """A worker's death on the real node (its own PID namespace): the workers of ``pod`` SIGKILLed, torchrun left
    to see it."""
    lab.kubectl("exec", "-n", namespace, pod, "--", "python", "-c", _KILL_THE_WORKERS)
