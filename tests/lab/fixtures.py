"""Pytest plugin: a session-wide ``lab`` and a fresh ``namespace`` per test; ``real_lab`` and
``real_namespace`` for tests on the real node; ``kueue_lab``, a lab with Kueue; ``own_lab`` for a module's own.

Enable with ``pytest_plugins = ["tests.lab.fixtures"]``. Each lab is started on first use only, so runs that
select none of its tests don't pay for it. ``KUBETRAIN_LAB_NODES`` / ``KUBETRAIN_LAB_GPUS`` size ``lab``.
``real_lab`` is a lab of its own whose one node is a real kubelet + containerd running the project's images:
pods of the process-node tests never land there, and examples apply to it unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.lab.chart import CRD, install_identity, wait_crd_established
from tests.lab.jobs import Jobs
from tests.lab.lab import LAB_HOME, Lab, prune_run_dirs
from tests.lab.namespaces import delete_namespace
from tests.lab.operator_process import OperatorProcess


@contextlib.contextmanager
def own_lab(kind: str = "", **options: Any) -> Iterator[Lab]:
    """A started lab in ``LAB_HOME/pytest-[<kind>-]<pid>``, stopped on exit; ``options`` go to Lab. Skips without
    root. Finished labs of the same kind are pruned first (their newest run dirs kept for their logs)."""
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, a bridge, mounts)")
    prefix = f"pytest-{kind}-" if kind else "pytest-"
    prune_run_dirs(prefix)
    run_dir = LAB_HOME / f"{prefix}{os.getpid()}"
    shutil.rmtree(run_dir, ignore_errors=True)
    with Lab(run_dir, **options) as the_lab:
        yield the_lab


@contextlib.contextmanager
def own_operator_lab(kind: str, **options: Any) -> Iterator[Lab]:
    """``own_lab`` with the CRD and the operator running with the chart's identity, watching the namespaces
    ``<kind>-*`` (:func:`jobs_namespace` makes them)."""
    with own_lab(kind, **options) as lab:
        lab.kubectl("apply", "--server-side", "-f", str(CRD))
        wait_crd_established(lab)
        _, kubeconfig = install_identity(lab)
        operator = OperatorProcess(kubeconfig, lab.run_dir / "operator.log", (f"--namespace={kind}-*",))
        operator.start()
        try:
            yield lab
        finally:
            operator.stop()


@contextlib.contextmanager
def jobs_namespace(lab: Lab, kind: str) -> Iterator[Jobs]:
    """The jobs of a fresh namespace ``<kind>-<random>`` (what :func:`own_operator_lab`'s operator watches)."""
    with _namespace(lab, f"{kind}-{uuid.uuid4().hex[:6]}") as name:
        yield Jobs(lab, name)


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    with own_lab(nodes=int(os.environ.get("KUBETRAIN_LAB_NODES", "2")),
                 gpus_per_node=int(os.environ.get("KUBETRAIN_LAB_GPUS", "2"))) as the_lab:
        yield the_lab


@pytest.fixture(scope="session")
def kueue_lab() -> Iterator[Lab]:
    """One lab with Kueue for every test that needs it (Kueue's own and the operator's side of its contract): two
    nodes of 4 GPUs each."""
    with own_lab("kueue", nodes=2, gpus_per_node=4, kueue=True) as the_lab:
        yield the_lab


REAL_NODE_TOOLS = ("podman", "mmdebstrap", "runc", "iptables", "gcc")


@pytest.fixture(scope="session")
def real_lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.skip("the lab needs root (network namespaces, a bridge, mounts, cgroups)")
    missing = [tool for tool in REAL_NODE_TOOLS if shutil.which(tool) is None]
    if missing:  # a failure, not a skip: .ci/run installs them, and a skip would hide the whole real node
        pytest.fail(f"the real node needs {', '.join(missing)}: see .ci/run's apt line")
    run_dir = LAB_HOME / f"pytest-real-{os.getpid()}"
    shutil.rmtree(run_dir, ignore_errors=True)
    the_lab = Lab(run_dir, nodes=0, real_node=True)
    the_lab.start()
    try:
        yield the_lab
    finally:
        the_lab.stop()


@pytest.fixture
def namespace(lab: Lab, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (default ServiceAccount ready); deleted afterwards, leftover pods force-deleted."""
    yield from _fresh_namespace(lab, request)


@pytest.fixture
def real_namespace(real_lab: Lab, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _fresh_namespace(real_lab, request)


def _fresh_namespace(lab: Lab, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = "".join(ch if ch.isalnum() else "-" for ch in request.node.name.lower())[:40].strip("-")
    with _namespace(lab, f"{slug}-{uuid.uuid4().hex[:5]}") as name:
        yield name


@contextlib.contextmanager
def _namespace(lab: Lab, name: str) -> Iterator[str]:
    """A new namespace, its default ServiceAccount ready; deleted afterwards, leftover pods force-deleted."""
    lab.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    lab.wait_service_account(name)
    try:
        yield name
    finally:
        delete_namespace(lab, name)


def pod_log_text(lab: Lab, namespace: str, pod: str, container: str = "trainer") -> str:
    path: Path = lab.pod_log(namespace, pod, container)
    return path.read_text(errors="replace") if path.exists() else ""
