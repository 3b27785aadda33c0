"""Pods to status facts: pod summaries, counts, conditions and progress."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from kubetrain.core.manifests import build_pod
from kubetrain.core.spec import parse
from kubetrain.core.status import (
    MAX_COUNT,
    FailureKind,
    Progress,
    count,
    count_nodes,
    format_duration,
    in_range,
    owned_by,
    pod_state,
    progress_status,
    set_condition,
)
from tests.invalid_specs import base_job
from tests.pods import pod, states
from tests.status_schema import assert_valid_status

NOW = datetime(2026, 11, 1, 10, 10, tzinfo=UTC)
Json = Any


@pytest.mark.parametrize(
    ("kwargs", "kind"),
    [
        ({"phase": "Running"}, None),
        ({"phase": "Succeeded", "exit_code": 0}, None),
        ({"phase": "Failed", "exit_code": 1}, FailureKind.ERROR),
        ({"phase": "Failed", "exit_code": 137}, FailureKind.ERROR),
        ({"phase": "Failed", "exit_code": 137, "reason": "OOMKilled"}, FailureKind.OOM),
        ({"phase": "Failed", "exit_code": 143, "disrupted": True}, FailureKind.DISRUPTION),
        ({"phase": "Failed", "pod_reason": "Evicted"}, FailureKind.DISRUPTION),
        ({"phase": "Failed", "exit_code": 1, "pod_reason": "DeletionByTaintManager"}, FailureKind.DISRUPTION),
    ],
)
def test_failure_kind_comes_from_pod_status(kwargs: dict, kind: FailureKind | None) -> None:  # type: ignore[type-arg]
    assert pod_state(pod(0, **kwargs)).failure_kind == kind


def test_pod_state_reads_labels_and_exit() -> None:
    state = pod_state(pod(1, "Failed", attempt=2, exit_code=3, node="node-1"))
    assert (state.index, state.attempt, state.exit_code, state.reason, state.node) == (1, 2, 3, "Error", "node-1")
    assert state.finished and not state.running


def test_counts() -> None:
    pods = states(pod(0), pod(1, "Pending", scheduled=False), pod(2, "Succeeded", exit_code=0),
                  pod(3, "Failed", exit_code=1), pod(4, deleting="2026-11-01T10:09:00Z"))
    counts = count_nodes(5, pods)
    assert (counts.active, counts.ready, counts.succeeded, counts.failed) == (2, 1, 1, 1)
    assert counts.as_status()["summary"] == "1/5"


def test_condition_transition_time_moves_only_on_flip() -> None:
    earlier = datetime(2026, 11, 1, 9, 0, tzinfo=UTC)
    conditions = set_condition([], "Running", True, "AllPodsRunning", "ok", now=earlier, generation=1)
    same = set_condition(conditions, "Running", True, "AllPodsRunning", "still ok", now=NOW, generation=2)
    assert same[0]["lastTransitionTime"] == "2026-11-01T09:00:00Z"
    assert same[0]["message"] == "still ok" and same[0]["observedGeneration"] == 2
    flipped = set_condition(same, "Running", False, "PodFailed", "no", now=NOW, generation=2)
    assert flipped[0]["lastTransitionTime"] == "2026-11-01T10:10:00Z"
    assert len(set_condition(flipped, "Stalled", False, "Fine", "", now=NOW, generation=2)) == 2


def test_progress_with_eta() -> None:
    progress = Progress(step=250, total_steps=1000, loss=0.123456, samples_per_second=512.0, epoch=2)
    status = progress_status(progress, None, samples_per_step=128, now=NOW)
    # 750 steps left at 4 steps/s: 187 s.
    assert status["eta"] == "3m07s"
    assert status["percent"] == 25
    assert status["summary"] == "25% (250/1000)"
    assert status["lossText"] == "0.1235"
    assert status["throughputText"] == "512.0"


def test_progress_without_total_or_finite_loss() -> None:
    status = progress_status(Progress(step=7, loss=float("nan")), None, None, NOW)
    assert status["summary"] == "step 7"
    assert "loss" not in status and status["lossText"] == "nan"


@pytest.mark.parametrize(("seconds", "text"), [(5, "5s"), (65, "1m05s"), (3700, "1h01m"), (90000, "1d01h")])
def test_format_duration(seconds: int, text: str) -> None:
    assert format_duration(seconds) == text


def test_final_report_is_read_from_the_termination_message() -> None:
    state = pod_state(pod(0, "Succeeded", exit_code=0, message='{"step": 300, "loss": 0.05}'))
    assert state.final_report() == {"step": 300, "loss": 0.05}
    assert pod_state(pod(0, "Failed", exit_code=1, message="Traceback ...")).final_report() is None


def test_merge_patch_sets_changes_and_nulls_removed_keys() -> None:
    from kubetrain.core.status import merge_patch

    old = {"phase": "Running", "runningTime": "t", "progress": {"step": 1, "resumedFromStep": 0}, "restarts": 0}
    new = {"phase": "Restarting", "progress": {"step": 1}, "restarts": 0, "attempt": 1}
    assert merge_patch(old, new) == {
        "phase": "Restarting", "runningTime": None, "progress": {"resumedFromStep": None}, "attempt": 1,
    }
    assert merge_patch(new, new) == {}


@pytest.mark.parametrize(
    ("metadata", "uid"),
    [
        ({"labels": {"kubetrain.io/job-uid": "u-2"}}, "u-2"),
        # made before the label existed: its controller reference names the job
        ({"labels": {}, "ownerReferences": [{"kind": "TrainingJob", "uid": "u-1", "controller": True}]}, "u-1"),
        ({"labels": {"kubetrain.io/job-uid": "u-2"},
          "ownerReferences": [{"kind": "TrainingJob", "uid": "u-1", "controller": True}]}, "u-2"),
        ({"ownerReferences": [{"kind": "ReplicaSet", "uid": "r-1", "controller": True}]}, None),
        ({"labels": {"kubetrain.io/job-name": "x"}}, None),  # orphaned: --cascade=orphan strips owners
    ],
)
def test_a_child_belongs_to_the_job_its_uid_label_or_controller_names(metadata: dict[str, object],
                                                                      uid: str | None) -> None:
    assert owned_by(metadata) == uid
    assert pod_state({"metadata": metadata}).job_uid == uid


NAN, INF = float("nan"), float("inf")
ABSURD = [
    pytest.param(Progress(step=10**30, total_steps=100), id="step 1e30"),
    pytest.param(Progress(step=-5, total_steps=-100, epoch=-1), id="negative counts"),
    pytest.param(Progress(step=5, loss=NAN, samples_per_second=NAN, seconds_per_step=NAN), id="NaN"),
    pytest.param(Progress(step=5, total_steps=10, loss=INF, samples_per_second=INF, seconds_per_step=INF),
                 id="infinite"),
    pytest.param(Progress(step=5, total_steps=10, loss=-INF, samples_per_second=-3.0, seconds_per_step=-1.0),
                 id="negative throughput"),
    pytest.param(Progress(step=5, total_steps=2**62, samples_per_second=1e-300, seconds_per_step=1e300,
                          resumed_from_step=-7), id="absurd rates"),
    pytest.param(Progress(step=5, total_steps=10, samples_per_second=1e300, loss=1e308), id="huge"),
    pytest.param(Progress(step=3, heartbeat=datetime(9999, 1, 1, tzinfo=UTC)), id="heartbeat from the future"),
]


@pytest.mark.parametrize("progress", ABSURD)
def test_absurd_progress_never_makes_an_invalid_status(progress: Progress) -> None:
    status = progress_status(progress, 1000, 64, NOW)
    assert_valid_status({"progress": status})
    assert 0 <= status["step"] <= MAX_COUNT
    assert status.get("samplesPerSecond", 0) >= 0 and 0 <= status.get("percent", 0) <= 100


def test_absurd_values_are_left_out_and_sane_ones_kept() -> None:
    status = progress_status(Progress(step=5, total_steps=10, loss=INF, samples_per_second=-3.0), None, 64, NOW)
    assert status["step"] == 5 and status["summary"] == "50% (5/10)"
    assert "loss" not in status and status["lossText"] == "inf"
    assert "samplesPerSecond" not in status and "throughputText" not in status and "eta" not in status
    future = progress_status(Progress(step=3, heartbeat=datetime(9999, 1, 1, tzinfo=UTC)), None, None, NOW)
    assert future["heartbeatTime"] == "2026-11-01T10:10:00Z"  # a clock ahead is not a fresh heartbeat forever


@pytest.mark.parametrize(("value", "expected"), [
    (5, 5), (5.0, 5), (0, 0), (-1, None), (NAN, None), (INF, None), (1e30, None), (10**400, None),
    (True, None), ("5", None), (None, None),
])
def test_count_accepts_only_sane_non_negative_numbers(value: object, expected: int | None) -> None:
    assert count(value) == expected


def test_in_range_is_finite_and_bounded() -> None:
    assert in_range(2.5, 0, 3) == 2.5
    assert in_range(-0.1, 0, 3) is None and in_range(NAN, -INF, INF) is None and in_range(INF, 0, INF) is None


def test_a_pods_state_keeps_where_to_scrape_it_and_whether_to_adopt_it() -> None:
    built = build_pod(parse(base_job()), 0, attempt=0) | {"status": pod(0)["status"] | {"podIP": "10.0.0.7"}}
    state = pod_state(built)
    assert state.ip == "10.0.0.7" and state.has_owner is False  # `render` makes no owner reference
    built["metadata"]["ownerReferences"] = [{"kind": "TrainingJob", "uid": "u", "controller": True}]
    assert pod_state(built).has_owner is True


@pytest.mark.parametrize(("condition", "expected"), [
    ({"status": "False", "reason": "Unschedulable", "message": "minCount (3) cannot be satisfied"},
     "minCount (3) cannot be satisfied"),
    ({"status": "False", "reason": "SchedulerError", "message": "bad affinity"}, "bad affinity"),
    ({"status": "False", "reason": "Unschedulable"}, "Unschedulable"),  # no message: its reason at least
    ({"status": "False", "reason": "SchedulingGated", "message": "waits for its gates"}, None),  # never tried
    ({"status": "True"}, None),
    (None, None),
])
def test_pod_state_keeps_why_the_scheduler_cannot_place_it(condition: Json, expected: str | None) -> None:
    pod = {"metadata": {"name": "job-0", "labels": {}}, "spec": {},
           "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", **condition}] if condition else []}}
    assert pod_state(pod).unschedulable == expected
