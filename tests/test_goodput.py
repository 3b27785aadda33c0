"""status.goodput (core/goodput.py): each reconcile puts the time since the last one in the bucket of the state the
job was in, a restart moves the training since the checkpoint to lost (and since a stall's last heartbeat to
stalled), and the buckets add up to the wall time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kubetrain.core.goodput import BUCKETS, REFRESH_SECONDS, account, worth_writing
from kubetrain.core.lifecycle import reconcile
from kubetrain.core.spec import TrainingJob, parse
from kubetrain.core.status import Progress, parse_time
from tests.invalid_specs import base_job
from tests.pods import pod, states
from tests.status_schema import assert_valid_status

Json = Any
CREATED = "2026-11-01T10:00:00Z"
T0 = datetime(2026, 11, 1, 10, 0, tzinfo=UTC)
KNOWN = {"type": "ProgressKnown", "status": "True", "reason": "MetricsScraped", "message": "",
         "lastTransitionTime": CREATED}
NOT_READ = KNOWN | {"status": "False", "reason": "NotScrapedYet"}
SCRAPE_FAILED = KNOWN | {"status": "False", "reason": "ScrapeFailed"}


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def stamp(seconds: int) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def job(**spec: Json) -> TrainingJob:
    document = base_job()
    document["metadata"] |= {"uid": "uid-1", "generation": 1, "creationTimestamp": CREATED}
    document["spec"] |= spec
    return parse(document)


def total(goodput: dict[str, Json]) -> int:
    return sum(int(goodput[f"{bucket}Seconds"]) for bucket in BUCKETS)


def accounted(status: dict[str, Json], seconds: float, after: dict[str, Json] | None = None) -> dict[str, Json]:
    """The goodput of a reconcile at T0 + seconds that left ``status`` as it was (or decided ``after``)."""
    goodput = account(status, after if after is not None else status, now=at(seconds), created=CREATED)
    assert goodput is not None
    return goodput


def stored(phase: str | None, accounted_at: int = 0, **extra: Json) -> dict[str, Json]:
    status: dict[str, Json] = {"attempt": 0, "goodput": {"accountedAt": stamp(accounted_at)}} | extra
    if phase is not None:
        status["phase"] = phase
    return status


@pytest.mark.parametrize(("status", "bucket"), [
    pytest.param({}, "queued", id="not seen yet: waiting for the operator"),
    pytest.param(stored("Queued"), "queued", id="Kueue's queue"),
    pytest.param(stored("Suspended"), "queued", id="suspended"),
    pytest.param(stored("Pending"), "queued", id="pods not placed"),
    pytest.param(stored("Starting"), "starting", id="pods starting"),
    pytest.param(stored("Running"), "starting", id="running, rank 0 not read yet"),
    pytest.param(stored("Running", conditions=[NOT_READ]), "starting", id="a new attempt, not read yet"),
    pytest.param(stored("Running", conditions=[KNOWN]), "training", id="running, rank 0 read"),
    pytest.param(stored("Running", conditions=[SCRAPE_FAILED]), "training", id="running, rank 0 unreadable"),
    pytest.param(stored("Restarting", attempt=1), "restarting", id="old pods terminating"),
    pytest.param(stored("Pending", attempt=1, failures=[{"attempt": 0}]), "restarting", id="pending after restart"),
    pytest.param(stored("Running", attempt=1, failures=[{"attempt": 0}], conditions=[NOT_READ]), "restarting",
                 id="running after a restart, not read yet"),
    pytest.param(stored("Running", attempt=2, failures=[{"attempt": 0}], conditions=[NOT_READ]), "starting",
                 id="resumed after a suspension: no restart"),
    pytest.param(stored("Running", attempt=1, failures=[{"attempt": 0}], conditions=[KNOWN]), "training",
                 id="training again after a restart"),
])
def test_the_time_goes_to_the_bucket_of_the_stored_state(status: dict[str, Json], bucket: str) -> None:
    goodput = accounted(status, 30)
    assert goodput[f"{bucket}Seconds"] == 30
    assert total(goodput) == 30, goodput
    assert goodput["accountedAt"] == stamp(30)


def test_buckets_add_up_to_the_wall_time_and_share_is_training_over_it() -> None:
    goodput = accounted(stored("Pending"), 10)
    for seconds, phase, conditions in [(25, "Starting", []), (40, "Running", []), (130, "Running", [KNOWN])]:
        status = stored(phase, conditions=conditions) | {"goodput": goodput}
        goodput = accounted(status, seconds)
    assert (goodput["queuedSeconds"], goodput["startingSeconds"], goodput["trainingSeconds"]) == (10, 30, 90)
    assert total(goodput) == 130
    assert goodput["share"] == pytest.approx(90 / 130, abs=1e-4) and goodput["shareText"] == "69%"


def test_whole_seconds_do_not_drift_with_many_reconciles_within_a_second() -> None:
    status = stored("Running", conditions=[KNOWN])
    for tenth in range(1, 101):
        status = status | {"goodput": accounted(status, tenth * 0.37)}
    assert total(status["goodput"]) == 37 and status["goodput"]["accountedAt"] == stamp(37)


def test_a_restart_moves_the_training_since_the_checkpoint_to_lost() -> None:
    before = stored("Running", conditions=[KNOWN], lastCheckpoint={"step": 40, "time": stamp(70)},
                    goodput={"accountedAt": stamp(0), "trainingSeconds": 50, "attemptTrainingSeconds": 50})
    after = before | {"phase": "Restarting", "attempt": 1, "failures": [{"attempt": 0, "reason": "PodFailed"}]}
    goodput = accounted(before, 100, after)
    assert goodput["lostSeconds"] == 30  # from the checkpoint, seen at 70, to the failure at 100
    assert goodput["trainingSeconds"] == 50 + 100 - 30
    assert goodput["attemptTrainingSeconds"] == 0
    assert total(goodput) == 150


def test_a_restart_without_a_checkpoint_in_the_attempt_loses_all_its_training() -> None:
    before = stored("Running", attempt=1, conditions=[KNOWN], lastCheckpoint={"step": 40, "time": stamp(5)},
                    goodput={"accountedAt": stamp(60), "trainingSeconds": 50, "attemptTrainingSeconds": 20})
    after = before | {"phase": "Restarting", "attempt": 2, "failures": [{"attempt": 1, "reason": "PodFailed"}]}
    goodput = accounted(before, 100, after)
    assert goodput["lostSeconds"] == 60  # the attempt's 20 + 40 seconds: the checkpoint is older than it
    assert goodput["trainingSeconds"] == 30


def test_a_stall_moves_the_time_since_the_heartbeat_to_stalled_and_before_it_to_lost() -> None:
    before = stored("Running", conditions=[KNOWN], runningTime=stamp(10),
                    progress={"heartbeatTime": stamp(200)}, lastCheckpoint={"step": 10, "time": stamp(150)},
                    goodput={"accountedAt": stamp(20), "startingSeconds": 20})
    after = before | {"phase": "Restarting", "attempt": 1, "failures": [{"attempt": 0, "reason": "NoHeartbeat"}]}
    goodput = accounted(before, 500, after)
    assert goodput["stalledSeconds"] == 300 and goodput["lostSeconds"] == 50
    assert goodput["trainingSeconds"] == 480 - 350 and total(goodput) == 500


def test_a_resumed_attempt_is_no_restart() -> None:
    before = stored("Suspended", goodput={"accountedAt": stamp(0), "trainingSeconds": 50,
                                          "attemptTrainingSeconds": 50})
    after = before | {"phase": "Pending", "attempt": 1}
    goodput = accounted(before, 10, after)
    assert goodput["lostSeconds"] == 0 and goodput["trainingSeconds"] == 50 and goodput["queuedSeconds"] == 10
    assert goodput["attemptTrainingSeconds"] == 0


def test_a_finished_job_stops_counting() -> None:
    final = {"accountedAt": stamp(100), "trainingSeconds": 100}
    for phase in ("Succeeded", "Failed"):
        assert account(stored(phase) | {"goodput": final}, {}, now=at(5000), created=CREATED) == final
    assert account(stored("Succeeded") | {"goodput": None}, {}, now=at(5000)) is None


def test_missing_accounted_at_counts_from_creation_or_from_now_for_a_job_accounted_never() -> None:
    assert accounted({}, 42)["queuedSeconds"] == 42  # a new job: from its creationTimestamp
    upgraded = {"phase": "Running", "conditions": [KNOWN]}  # a job that ran before goodput was accounted
    goodput = accounted(upgraded, 4200)
    assert total(goodput) == 0 and goodput["accountedAt"] == stamp(4200)
    assert goodput["share"] == 0.0 and goodput["shareText"] == "0%"


def test_a_clock_that_goes_back_counts_nothing_until_it_is_past_accounted_at_again() -> None:
    status = stored("Running", 100, conditions=[KNOWN])
    back = accounted(status, 40)
    assert total(back) == 0 and back["accountedAt"] == stamp(100)
    assert total(accounted(status | {"goodput": back}, 130)) == 30


def test_broken_stored_figures_start_from_zero() -> None:
    status = stored("Running", conditions=[KNOWN]) | {
        "goodput": {"accountedAt": stamp(0), "trainingSeconds": -5, "lostSeconds": "x", "queuedSeconds": True}}
    goodput = accounted(status, 10)
    assert (goodput["trainingSeconds"], goodput["lostSeconds"], goodput["queuedSeconds"]) == (10, 0, 0)


def test_goodput_alone_is_written_now_and_then() -> None:
    status = stored("Queued", conditions=[KNOWN])
    soon = status | {"goodput": accounted(status, 30)}
    late = status | {"goodput": accounted(status, REFRESH_SECONDS)}
    assert not worth_writing(status, soon)
    assert worth_writing(status, late)
    assert worth_writing(status, soon | {"message": "moved"})
    assert worth_writing({"phase": "Queued"}, soon)


def test_gpu_seconds_alone_are_written_with_the_goodput_now_and_then() -> None:
    """A running job whose progress cannot change (no metrics) wrote its status at every reconcile, its
    GPU-seconds grown by 10 s each time: 6 writes a minute a job, measured by bench scale.costs."""
    status = stored("Running", conditions=[KNOWN]) | {"gpuSeconds": 80.0}
    soon = status | {"goodput": accounted(status, 10), "gpuSeconds": 160.0}
    late = status | {"goodput": accounted(status, REFRESH_SECONDS), "gpuSeconds": 2480.0}
    assert not worth_writing(status, soon)
    assert worth_writing(status, late)
    assert worth_writing(status, soon | {"progress": {"step": 7}})


def test_a_job_with_one_failure_through_reconcile_adds_up_to_its_wall_time() -> None:
    """The lifecycle's own statuses, reconcile after reconcile: the buckets sum to completion - creation."""
    trainer = job()
    status: dict[str, Json] = {}
    attempt_0 = [pod(0), pod(1)]
    attempt_1 = [pod(0, attempt=1), pod(1, attempt=1)]
    steps: list[tuple[int, list[Json], Progress | None]] = [
        (5, [], None),  # seen 5 s after its creation: Pending, pods created
        (8, [pod(0, "Pending"), pod(1, "Pending")], None),  # placed: Starting
        (12, attempt_0, None),  # all running
        (20, attempt_0, Progress(step=5)),  # rank 0 read: training
        (60, attempt_0, Progress(step=50, checkpoint_step=40)),  # checkpoint seen at 60
        (90, [pod(0), pod(1, "Failed", exit_code=1)], None),  # a failure: restart
        (95, [], None),  # old pods gone: attempt 1 created
        (100, attempt_1, None),
        (110, attempt_1, Progress(step=45, resumed_from_step=40)),
        (180, [pod(0, "Succeeded", attempt=1, exit_code=0), pod(1, "Succeeded", attempt=1, exit_code=0)], None),
        (500, [], None),  # finished: nothing more counted
    ]
    for seconds, pods, progress in steps:
        status = reconcile(trainer, status, states(*pods), at(seconds), progress).status
        assert_valid_status(status)
    goodput = status["goodput"]
    assert status["phase"] == "Succeeded" and status["restarts"] == 1
    completed, created = parse_time(status["completionTime"]), parse_time(CREATED)
    assert completed is not None and created is not None
    assert total(goodput) == (completed - created).total_seconds() == 180
    assert goodput == goodput | {"queuedSeconds": 5 + 3, "startingSeconds": 4 + 8, "lostSeconds": 30,
                                 "trainingSeconds": 40 + 70, "restartingSeconds": 5 + 5 + 10, "stalledSeconds": 0}
    assert goodput["shareText"] == "61%"


def test_a_restart_in_place_loses_the_training_since_the_checkpoint_and_restarts_until_read() -> None:
    """The same job whose pod 1 the kubelet restarted in place: same attempt, the same accounting as a restart."""
    trainer = job()
    pods = [pod(0, uid="u-0"), pod(1, uid="u-1")]
    restarted = [pod(0, uid="u-0"), pod(1, uid="u-1", restarted=(1, 1, stamp(89)))]
    status: dict[str, Json] = {}
    steps: list[tuple[int, list[Json], Progress | None]] = [
        (5, [], None),
        (12, pods, None),
        (20, pods, Progress(step=5)),
        (60, pods, Progress(step=50, checkpoint_step=40)),  # checkpoint seen at 60
        (90, restarted, None),  # pod 1 restarted in place: Restarting, attempt 0
        (95, restarted, None),  # both ready again, rank 0 not read yet
        (105, restarted, Progress(step=45, resumed_from_step=40)),
        (180, [pod(0, "Succeeded", exit_code=0), pod(1, "Succeeded", exit_code=0)], None),
    ]
    for seconds, current, progress in steps:
        status = reconcile(trainer, status, states(*current), at(seconds), progress).status
        assert_valid_status(status)
    goodput = status["goodput"]
    assert (status["phase"], status["attempt"], status["restarts"]) == ("Succeeded", 0, 1)
    assert total(goodput) == 180
    assert goodput == goodput | {"lostSeconds": 30, "restartingSeconds": 5 + 10, "trainingSeconds": 40 + 75}
