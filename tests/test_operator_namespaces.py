"""An operator that watches namespaces by a pattern serves every namespace that matches, also one made while
it starts, and leaves the others alone.

kopf resolves a pattern by listing the namespaces and then watching them from a second listing whose items it
ignores: a namespace made between the two was missed until it next changed (its jobs got no status for
minutes). The operator therefore watches jobs cluster-wide and matches their namespace itself.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.lab.chart import install_identity
from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.namespaces import delete_namespace
from tests.lab.operator_process import OperatorProcess
from tests.lab.procs import wait_for
from tests.test_operator import spec

pytestmark = pytest.mark.lab
MAKING_AFTER_START_S = 3  # namespaces keep coming this long after the operator answers its liveness probe
MOST_NAMESPACES = 60


class NamespaceMaker(threading.Thread):
    """Makes namespaces ``<prefix>-0``, ``-1``, ..., each with a suspended job, until told to stop."""

    def __init__(self, lab: Lab, prefix: str) -> None:
        super().__init__(daemon=True)
        self.lab = lab
        self.prefix = prefix
        self.made: list[str] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set() and len(self.made) < MOST_NAMESPACES:
            self.made.append(make_namespace_with_a_job(self.lab, f"{self.prefix}-{len(self.made)}"))
            time.sleep(0.02)


def make_namespace_with_a_job(lab: Lab, name: str) -> str:
    lab.api.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    Jobs(lab, name).create("job", spec("print(1)", runPolicy={"suspend": True}))
    return name


def test_every_matching_namespace_is_served_also_one_made_while_the_operator_starts(lab: Lab, crd: Path) -> None:
    prefix = f"starting-{uuid.uuid4().hex[:6]}"
    _, kubeconfig = install_identity(lab)
    operator = OperatorProcess(kubeconfig, lab.run_dir / f"operator-{prefix}.log", (f"--namespace={prefix}-*",))
    maker = NamespaceMaker(lab, prefix)
    outside = f"outside-{prefix}"
    maker.start()
    try:
        operator.start()
        time.sleep(MAKING_AFTER_START_S)
        maker.stopping.set()
        maker.join(timeout=60)
        make_namespace_with_a_job(lab, outside)
        unserved = list(maker.made)

        def all_served() -> bool:
            unserved[:] = [name for name in unserved if not Jobs(lab, name).status("job").get("phase")]
            return not unserved
        try:
            wait_for(all_served, 60, "a status on every job", interval=0.5)
        except TimeoutError:
            raise AssertionError(f"no status on the jobs of {unserved} (of {len(maker.made)} namespaces); "
                                 f"the operator's log: {operator.log()[-2000:]}") from None
        assert len(maker.made) >= 10, "namespaces before and after the start"
        assert Jobs(lab, outside).status("job") == {}, "a namespace outside the pattern is not the operator's"
    finally:
        maker.stopping.set()
        operator.stop()
        for name in [*maker.made, outside]:
            delete_namespace(lab, name)
