"""Pytest plugin: the CRD installed in the lab and the operator running with the chart's identity.

The operator runs as a local process (no image can run here) authenticated with a token of the
ServiceAccount that the chart creates, bound by the RBAC that the chart renders: so every operator
test also proves that the chart's permissions are sufficient.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetrain.ports import free_port
from tests.lab.build import ensure_binary
from tests.lab.lab import Lab
from tests.lab.procs import stop_group, wait_for
from tests.lab.rest import ApiError, Rest

ROOT = Path(__file__).resolve().parent.parent
CRD = ROOT / "crds" / "trainingjobs.kubetrain.io.yaml"
CHART = ROOT / "charts" / "kubetrain"
OPERATOR_NAMESPACE = "kubetrain-system"
Json = Any


def render_chart(*args: str) -> list[Json]:
    """`helm template` of the chart, as objects."""
    argv = [str(ensure_binary("helm")), "template", "kubetrain", str(CHART), "--namespace", OPERATOR_NAMESPACE,
            "--kube-version", "v1.37.2", *args]
    rendered = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


class OperatorProcess:
    """`kubetrain operator` as a child process, restartable, with its log in a file."""

    def __init__(self, kubeconfig: Path, log_path: Path, args: tuple[str, ...],
                 progress_interval: float | None = 2) -> None:
        """``progress_interval``: seconds between reads of a running job's progress (tests see it change soon);
        None: the operator's default."""
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.args = args
        self.progress_interval = progress_interval
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "kubetrain", "operator", *self.args,
                f"--metrics-port={self.metrics_port}",
                f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz"]
        if self.progress_interval is not None:
            argv.append(f"--progress-interval={self.progress_interval:g}")
        env = os.environ | {"KUBECONFIG": str(self.kubeconfig)}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_for(self.alive, 60, "the operator's liveness endpoint", interval=0.2)

    def alive(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.process.returncode}; see {self.log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
            text: str = answer.read().decode()
            return text

    def kill(self, signum: int = signal.SIGKILL) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signum)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def crd(lab: Lab) -> Path:
    lab.kubectl("apply", "--server-side", "-f", str(CRD))
    wait_crd_established(lab)
    return CRD


def wait_crd_established(lab: Lab, name: str = "trainingjobs.kubetrain.io", timeout: float = 60) -> None:
    """Polled, not `kubectl wait`: right after a create, that fails at once on a CRD without conditions yet."""
    def established() -> bool:
        crd = lab.api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = crd.get("status", {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)
    wait_for(established, timeout, f"the CRD {name} to be established", interval=0.2)


def install_identity(lab: Lab, *helm_args: str) -> tuple[str, Path]:
    """Apply the chart's ServiceAccount and RBAC; return the account's name and a token kubeconfig."""
    try:
        lab.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": OPERATOR_NAMESPACE}})
    except ApiError as error:
        if error.status != 409:
            raise
    objects = [o for o in render_chart(*helm_args)
               if o["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}]
    lab.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    account = next(o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount")
    lab.wait_service_account(OPERATOR_NAMESPACE, account)
    return account, lab.token_kubeconfig(OPERATOR_NAMESPACE, account)


@pytest.fixture(scope="session")
def operator(lab: Lab, crd: Path) -> Iterator[OperatorProcess]:
    """The operator with the chart's cluster-wide identity, watching the test namespaces."""
    _, kubeconfig = install_identity(lab)
    # Test namespaces only (the namespace fixture names them test-...): the end-to-end tests run an
    # operator of their own, installed by helm, for their namespaces.
    process = OperatorProcess(kubeconfig, lab.run_dir / "operator.log", ("--namespace=test-*",))
    process.start()
    try:
        yield process
    finally:
        process.stop()


class Jobs:
    """TrainingJobs of one test namespace: create, read, patch and wait."""

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


@pytest.fixture
def jobs(lab: Lab, namespace: str) -> Jobs:
    return Jobs(lab, namespace)


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
    import threading

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
