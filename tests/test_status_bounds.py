"""A TrainingJob of the largest size the CRD takes keeps a small status in its worst cases: every message, list
and record is bounded whatever the number of pods (etcd refuses an object over 1.5 MB, and every watcher of the
job reads each write)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from kubetrain.core import api
from kubetrain.core.lifecycle import reconcile
from kubetrain.core.schema import crd_schema
from kubetrain.core.spec import TrainingJob, parse
from kubetrain.core.status import some_names
from tests.invalid_specs import base_job
from tests.pods import pod, states
from tests.status_schema import assert_valid_status

NOW = datetime(2026, 11, 1, 10, 10, tzinfo=UTC)
NODES = api.MAX_NODES
# What the docs promise (docs/trainingjob-reference.md, status): the worst case below stays under it.
STATUS_BUDGET_BYTES = 96 * 1024
Json = Any


def job(**spec: Json) -> TrainingJob:
    document = base_job()
    document["metadata"] |= {"uid": "uid-1", "generation": 1}
    document["spec"] |= {"nodes": NODES, **spec}
    return parse(document)


def running(**extra: Json) -> dict[str, Json]:
    return {"phase": "Running", "attempt": 0, "restarts": 0, "startTime": "2026-11-01T10:00:00Z",
            "runningTime": "2026-11-01T10:01:00Z", "nodes": {"desired": NODES}} | extra


LONG = "x" * 5000  # longer than any bound: a scheduler's or a traceback's words
RDZV_TIMEOUT = "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError " + LONG


def _all_failed() -> tuple[TrainingJob, dict[str, Json], list[Json]]:
    """Every pod failed at once with long last words (with a long history of failures before)."""
    history = [{"attempt": 0, "reason": "Error", "message": LONG[:1024], "logTail": LONG[:2048]}] * 20
    pods = [pod(i, "Failed", exit_code=1, message=LONG, finished_at="2026-11-01T10:05:00Z") for i in range(NODES)]
    return job(), running(failures=history), states(*pods)


def _unschedulable() -> tuple[TrainingJob, dict[str, Json], list[Json]]:
    pods = [pod(i, "Pending", unschedulable=LONG) for i in range(NODES)]
    return job(), running(phase="Pending"), states(*pods)


def _rendezvous_timed_out() -> tuple[TrainingJob, dict[str, Json], list[Json]]:
    pods = [pod(0, "Failed", exit_code=1, message=RDZV_TIMEOUT)] + [pod(i, "Pending") for i in range(1, NODES)]
    return job(), running(), states(*pods)


def _all_but_one_vanished() -> tuple[TrainingJob, dict[str, Json], list[Json]]:
    return job(), running(), states(pod(0))


def _shrunk_to_one() -> tuple[TrainingJob, dict[str, Json], list[Json]]:
    return (job(nodes=1, elastic={"minNodes": 1, "maxNodes": NODES}), running(),
            states(*(pod(i) for i in range(NODES))))


def _many_excluded_nodes() -> tuple[TrainingJob, dict[str, Json], list[Json]]:
    excluded = [{"node": f"node-{i:0>200}", "reason": LONG[:256], "failures": 2, "time": "2026-11-01T10:04:00Z"}
                for i in range(64)]
    pods = [pod(i, "Pending", unschedulable=LONG) for i in range(NODES)]
    return job(), running(phase="Pending", excludedNodes=excluded), states(*pods)


WORST_CASES = [_all_failed, _unschedulable, _rendezvous_timed_out, _all_but_one_vanished, _shrunk_to_one,
               _many_excluded_nodes]


@pytest.mark.parametrize("case", WORST_CASES, ids=lambda c: c.__name__.strip("_"))
def test_the_largest_job_keeps_a_bounded_status(case: Any) -> None:
    the_job, status, pods = case()
    decision = reconcile(the_job, status, pods, NOW)
    assert_valid_status(decision.status)  # every maxLength and maxItems of the CRD
    size = len(json.dumps(decision.status))
    print(f"{case.__name__}: {size} bytes")
    assert size < STATUS_BUDGET_BYTES, f"{size} bytes"
    assert all(len(e.message) <= 4 * 1024 for e in decision.events)


def test_messages_name_a_few_pods_and_count_the_rest() -> None:
    decision = reconcile(*_rendezvous_timed_out(), NOW)
    failed = next(c for c in decision.status["conditions"] if c["type"] == "Failed")
    assert "pod(s) valid-1, valid-2, valid-3, valid-4, valid-5 and 4090 more never started in time" in failed["message"]
    assert some_names(["a", "b"]) == "a, b"
    assert some_names([str(i) for i in range(7)]) == "0, 1, 2, 3, 4 and 2 more"


def test_the_crd_takes_the_largest_job_and_no_larger() -> None:
    spec = crd_schema()["properties"]["spec"]["properties"]
    assert spec["nodes"]["maximum"] == NODES == 4096
    assert spec["elastic"]["properties"]["maxNodes"]["maximum"] == NODES
    assert spec["elastic"]["properties"]["minNodes"]["maximum"] == NODES
