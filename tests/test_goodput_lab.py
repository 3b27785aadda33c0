"""status.goodput on the lab's real API server with the operator: a job with one injected failure (its pod
SIGKILLed mid-training) ends Succeeded, and its buckets add up to its wall time; `kubectl get tj -o wide` shows
the share, and the operator's metric has the same figures."""

from __future__ import annotations

import re
import signal
import time
from datetime import datetime
from typing import Any

import pytest

from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.operator_process import OperatorProcess

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("operator")]

Json = Any
BUCKETS = ("queued", "starting", "training", "stalled", "restarting", "lost")
# 20 steps, one per 0.25 s, then: attempt 0 waits to be killed, attempt 1 stays 10 s more (reads of rank 0 every
# 2 s see it train for whole seconds) and succeeds. No checkpoint: attempt 0's training is all computed again.
REPORT_THEN_WAIT = (
    "import os, time\n"
    "from kubetrain_trainer import report\n"
    "for step in range(1, 21):\n"
    "    time.sleep(0.25)\n"
    "    report(step=step, total_steps=20, loss=1.0 / step, samples=16)\n"
    "time.sleep(600 if os.environ['KUBETRAIN_ATTEMPT'] == '0' else 10)\n"
)


def known(status: Json) -> bool:
    condition = next((c for c in status.get("conditions", []) if c["type"] == "ProgressKnown"), {})
    return condition.get("status") == "True" and status.get("progress", {}).get("step") == 20


def test_a_job_with_one_failure_accounts_its_whole_wall_time(lab: Lab, jobs: Jobs, operator: OperatorProcess) -> None:
    jobs.create("goodput", {
        "nodes": 1, "procsPerNode": 1, "command": ["python", "-c", REPORT_THEN_WAIT],
        "resources": {"cpu": "100m", "memory": "512Mi", "sharedMemory": "64Mi"},
        "runPolicy": {"terminationGracePeriodSeconds": 5},
    })
    jobs.wait("goodput", known, "rank 0 read at step 20", timeout=120)
    time.sleep(3)  # whole seconds of training after the first read, for the restart to count as lost
    lab.kill_pod(jobs.namespace, "goodput-0", signal.SIGKILL)
    status = jobs.wait_phase("goodput", "Succeeded", timeout=180)
    assert status["restarts"] == 1 and status["attempt"] == 1

    goodput = status["goodput"]
    created = datetime.fromisoformat(jobs.get("goodput")["metadata"]["creationTimestamp"])
    wall = (datetime.fromisoformat(status["completionTime"]) - created).total_seconds()
    accounted = sum(goodput[f"{bucket}Seconds"] for bucket in BUCKETS)
    assert abs(accounted - wall) <= 1, (goodput, wall)
    assert goodput["trainingSeconds"] > 0 and goodput["restartingSeconds"] > 0, goodput
    assert goodput["lostSeconds"] > 0, f"attempt 0 saved no checkpoint: its training is lost: {goodput}"
    assert goodput["share"] == pytest.approx(goodput["trainingSeconds"] / accounted, abs=1e-3)

    table = lab.kubectl("get", "tj", "goodput", "-n", jobs.namespace, "-o", "wide").stdout
    header, row = table.splitlines()[:2]
    assert "GOODPUT" in header.split(), table
    assert f" {goodput['shareText']} " in row, table

    series = dict(re.findall(rf'kubetrain_job_goodput_seconds\{{bucket="(\w+)",job_namespace="{jobs.namespace}",'
                             rf'training_job="goodput"\}} ([0-9.e+]+)', operator.metrics()))
    assert {bucket: float(value) for bucket, value in series.items()} == {
        bucket: float(goodput[f"{bucket}Seconds"]) for bucket in BUCKETS}
