"""The operator's own schedule stays within its budget of looks (--looks-per-second), on the lab.

Each running job is reconciled every --progress-interval to read its progress (and write its status, if it moved),
every other job every 30 s. With more jobs than the budget allows, both periods stretch alike
(core/judgements.periods): here 6 running jobs read every 2 s would make 3 looks a second, and a budget of 1
stretches that to every 6 s. The operator's own metric counts its timer reconciles.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest

from tests.lab.chart import install_identity
from tests.lab.fixtures import jobs_namespace
from tests.lab.lab import Lab
from tests.lab.operator_process import OperatorProcess
from tests.lab.procs import wait_for
from tests.test_operator import spec

pytestmark = pytest.mark.lab
JOBS = 6
PROGRESS_S = 2.0
BUDGET = 1  # looks a second: a third of what 6 running jobs every 2 s would take
WINDOW_S = 24.0
TIMER_COUNT = re.compile(r'^kubetrain_reconcile_duration_seconds_count\{handler="timer"\} (\S+)$', re.M)


def timer_reconciles(operator: OperatorProcess) -> float:
    found = TIMER_COUNT.search(operator.metrics())
    return float(found.group(1)) if found else 0.0


def test_running_jobs_are_looked_at_within_the_budget(lab: Lab, crd: Path) -> None:
    kind = f"looks-{uuid.uuid4().hex[:4]}"
    _, kubeconfig = install_identity(lab)
    operator = OperatorProcess(kubeconfig, lab.run_dir / f"operator-{kind}.log",
                               (f"--namespace={kind}-*", f"--looks-per-second={BUDGET}"), progress_interval=PROGRESS_S)
    operator.start()
    try:
        with jobs_namespace(lab, kind) as jobs:
            for number in range(JOBS):
                jobs.create(f"sleeper-{number}", spec("import time; time.sleep(600)", nodes=1))
            wait_for(lambda: all(jobs.status(f"sleeper-{n}").get("phase") == "Running" for n in range(JOBS)), 120,
                     f"{JOBS} jobs Running", interval=0.5)
            time.sleep(8)  # the first progress reads (and their failure's recheck) are behind
            before = timer_reconciles(operator)
            time.sleep(WINDOW_S)
            looks = timer_reconciles(operator) - before
    finally:
        operator.stop()
    unstretched = JOBS / PROGRESS_S * WINDOW_S  # 72
    assert looks >= WINDOW_S * BUDGET / 3, f"{looks} timer reconciles: the jobs are still looked at"
    assert looks <= WINDOW_S * BUDGET * 1.5, (f"{looks} timer reconciles in {WINDOW_S:.0f} s with a budget of "
                                              f"{BUDGET} a second (unstretched: {unstretched:.0f})")
