"""Pytest plugin: the CRD installed in the lab and the operator running with the chart's identity.

The operator runs as a local process (no image can run here) authenticated with a token of the
ServiceAccount that the chart creates, bound by the RBAC that the chart renders: so every operator
test also proves that the chart's permissions are sufficient. Fixtures only: the helpers behind them are the
lab's (tests/lab/chart.py, operator_process.py, jobs.py), which the benchmarks use too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.lab.chart import CRD, install_identity, wait_crd_established
from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.operator_process import OperatorProcess


@pytest.fixture(scope="session")
def crd(lab: Lab) -> Path:
    lab.kubectl("apply", "--server-side", "-f", str(CRD))
    wait_crd_established(lab)
    return CRD


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


@pytest.fixture
def jobs(lab: Lab, namespace: str) -> Jobs:
    return Jobs(lab, namespace)
