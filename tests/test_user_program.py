"""A user's own program (`spec.command`, not the built-in trainer) reporting with `kubetrain_trainer.report`,
on the lab's real API server with the operator: progress, loss and ETA in `kubectl get tj`, and its
heartbeat driving the Stalled condition when it hangs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from tests.lab.jobs import Jobs
from tests.lab.lab import Lab
from tests.lab.procs import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.usefixtures("operator")]

Json = Any
STALL_TIMEOUT = 20
# Attempt 0 reports 40 of 100 steps (one per 0.25 s), then hangs alive; attempt 1 finishes at once.
REPORT_THEN_HANG = (
    "import os, sys, time\n"
    "from kubetrain_trainer import report\n"
    "if os.environ['KUBETRAIN_ATTEMPT'] != '0':\n"
    "    sys.exit(0)\n"
    "for step in range(1, 41):\n"
    "    time.sleep(0.25)\n"
    "    report(step=step, total_steps=100, loss=2.0 / step, samples=16)\n"
    "time.sleep(600)\n"
)


def condition(status: Json, kind: str) -> Json:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def test_a_reporting_program_shows_progress_and_its_hang_is_caught_as_a_stall(lab: Lab, jobs: Jobs) -> None:
    jobs.create("mine", {
        "nodes": 1, "procsPerNode": 1, "command": ["python", "-c", REPORT_THEN_HANG],
        "resources": {"cpu": "100m", "memory": "512Mi", "sharedMemory": "64Mi"},
        "failurePolicy": {"stallTimeoutSeconds": STALL_TIMEOUT},
        "runPolicy": {"terminationGracePeriodSeconds": 5},
    })
    status = jobs.wait("mine", lambda s: s.get("progress", {}).get("step") == 40 and "eta" in s["progress"],
                       "step 40 and an ETA scraped from the program", timeout=120)
    progress = status["progress"]
    assert progress["summary"] == "40% (40/100)"
    assert progress["lossText"] == "0.05"
    table = lab.kubectl("get", "tj", "mine", "-n", jobs.namespace, "-o", "wide").stdout
    header, row = table.splitlines()[:2]
    assert {"PROGRESS", "LOSS", "STEP", "ETA"} <= set(header.split()), table
    assert "40% (40/100)" in row and " 0.05 " in row and f" {progress['eta']} " in row, table
    # 60 steps left at about 0.25 s each: the ETA comes from the program's own step times.
    assert progress["eta"] in {"14s", "15s", "16s", "17s", "18s", "19s", "20s"}, progress

    status = jobs.wait("mine", lambda s: condition(s, "Stalled").get("status") == "True",
                       "the Stalled condition", timeout=120)
    assert f"stallTimeoutSeconds={STALL_TIMEOUT}" in condition(status, "Stalled")["message"]
    status = jobs.wait("mine", lambda s: bool(s.get("failures")), "the stall's post-mortem")
    failure = status["failures"][0]
    assert failure["reason"] == "NoHeartbeat", failure
    silent = (datetime.fromisoformat(failure["time"]) - datetime.fromisoformat(progress["heartbeatTime"]))
    assert STALL_TIMEOUT <= silent.total_seconds() <= STALL_TIMEOUT + 10, (failure, progress)
    # kopf posts events from a queue of its own, after the status write that carries the post-mortem.
    wait_for(lambda: any(e["reason"] == "NoHeartbeat" for e in jobs.events("mine")), 30, "the stall's event",
             interval=0.5)
    status = jobs.wait_phase("mine", "Succeeded", timeout=180)
    assert status["restarts"] == 1


# Three ranks all-reduce a step at a time over gloo; at step 10 rank 2 sleeps before its all-reduce, and ranks
# 0 and 1 wait in theirs. Attempt 1 finishes at once.
ONE_RANK_BEHIND = (
    "import os, sys, time\n"
    "import torch, torch.distributed as dist\n"
    "from kubetrain_trainer import report\n"
    "if os.environ['KUBETRAIN_ATTEMPT'] != '0':\n"
    "    sys.exit(0)\n"
    "dist.init_process_group('gloo')\n"
    "for step in range(1, 1000):\n"
    "    if step == 10 and dist.get_rank() == 2:\n"
    "        time.sleep(600)\n"
    "    dist.all_reduce(torch.ones(1))\n"
    "    report(step=step, total_steps=1000, loss=1.0, samples=3)\n"
    "    time.sleep(0.2)\n"
)
SLEEP_LINE = ONE_RANK_BEHIND.splitlines().index("        time.sleep(600)") + 1
ALL_REDUCE_LINE = SLEEP_LINE + 1


def test_a_hang_names_the_rank_that_is_not_in_the_collective_the_others_wait_in(lab: Lab, jobs: Jobs) -> None:
    jobs.create("behind", {
        "nodes": 1, "procsPerNode": 3, "command": ["python", "-c", ONE_RANK_BEHIND],
        "resources": {"cpu": "100m", "memory": "2Gi", "sharedMemory": "64Mi"},
        "failurePolicy": {"stallTimeoutSeconds": STALL_TIMEOUT},
        "runPolicy": {"terminationGracePeriodSeconds": 5},
    })
    status = jobs.wait("behind", lambda s: bool(s.get("failures")), "the stall's post-mortem", timeout=240)
    failure = status["failures"][0]
    assert failure["reason"] == "NoHeartbeat", failure
    hang = failure["hang"]
    node = lab.api.get(f"/api/v1/namespaces/{jobs.namespace}/pods/behind-0")["spec"]["nodeName"]
    assert hang["culprits"] == [{"rank": 2, "pod": "behind-0", "node": node,
                                 "where": f"at <string>:{SLEEP_LINE} in <module>"}], hang
    assert hang["summary"] == (f"rank 2 (pod behind-0 on {node}) is at <string>:{SLEEP_LINE} in <module>; "
                               f"ranks 0-1 are waiting in all_reduce at <string>:{ALL_REDUCE_LINE} in <module>")
    assert hang["summary"] in failure["message"] and hang["summary"] in condition(status, "Stalled")["message"]
    assert [group["ranks"] for group in hang["stacks"]] == ["2", "0-1"], hang
    assert hang["stacks"][1]["stack"].endswith("in all_reduce"), hang
    status = jobs.wait_phase("behind", "Succeeded", timeout=180)
    assert status["restarts"] == 1
