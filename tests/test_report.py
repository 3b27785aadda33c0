"""`kubetrain_trainer.report`: a user program's progress served as the built-in trainer's `trainer_*` series.

Real metrics servers on free ports, scraped over HTTP and read by the operator's own parser.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from kubetrain.cli.ports import free_port_range
from kubetrain.core.progress import parse_progress
from kubetrain.core.status import progress_status
from kubetrain_trainer import Reporter
from tests.trainer_helpers import REPO, scrape

Samples = dict[str, list[tuple[dict[str, str], float]]]


def value(samples: Samples, name: str) -> float:
    (only,) = samples[name]
    return only[1]


def page(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text: str = response.read().decode()
        return text


@pytest.fixture
def base_port() -> int:
    return free_port_range(4)


@pytest.fixture
def reporters() -> Iterator[list[Reporter]]:
    made: list[Reporter] = []
    yield made
    for reporter in made:
        reporter.close()


def reporter(made: list[Reporter], base_port: int, *, rank: int = 0, local_rank: int = 0, world_size: int = 1,
             window: float = 0.0) -> Reporter:
    env = {"KUBETRAIN_METRICS_PORT": str(base_port), "RANK": str(rank), "LOCAL_RANK": str(local_rank),
           "WORLD_SIZE": str(world_size)}
    made.append(Reporter(env, rate_window_seconds=window))
    return made[-1]


def test_nothing_is_served_before_the_first_report(reporters: list[Reporter], base_port: int) -> None:
    reporter(reporters, base_port)
    with pytest.raises(urllib.error.URLError):
        page(base_port)


def test_report_serves_the_trainer_series_and_a_second_report_updates_them(
        reporters: list[Reporter], base_port: int) -> None:
    r = reporter(reporters, base_port, world_size=2)
    r.report(10, total_steps=100, loss=2.5, samples=64, epoch=1)
    first = scrape(base_port)
    assert value(first, "trainer_step") == 10
    assert value(first, "trainer_steps_total") == 10
    assert value(first, "trainer_total_steps") == 100
    assert value(first, "trainer_loss_last") == 2.5
    assert value(first, "trainer_epoch") == 1
    assert value(first, "trainer_world_size") == 2
    assert value(first, "trainer_samples_total") == 64
    assert abs(value(first, "trainer_last_step_timestamp_seconds") - time.time()) < 5
    # What the program did not say is absent, not zero: its learning rate, step phases, checkpoints.
    for unknown in ("trainer_learning_rate", "trainer_grad_norm", "trainer_step_phase_seconds_total",
                    "trainer_checkpoint_last_step", "trainer_resumed_from_step", "trainer_tokens_total"):
        assert unknown not in first, unknown
    assert {labels["rank"] for labels, _ in first["trainer_step"]} == {"0"}

    time.sleep(0.2)
    r.report(12, loss=1.5, samples=128)
    second = scrape(base_port)
    assert value(second, "trainer_step") == 12
    assert value(second, "trainer_loss_last") == 1.5
    assert value(second, "trainer_loss_sum") == 4.0
    assert value(second, "trainer_loss_count") == 2
    assert value(second, "trainer_samples_total") == 192
    assert value(second, "trainer_total_steps") == 100  # kept from the first report
    # 128 samples over the ~0.2 s since the first report (whose own samples came before any clock ran).
    assert 128 / 1.0 < value(second, "trainer_samples_per_second") < 128 / 0.19
    # Two steps in one report: two step durations of about 0.1 s each.
    assert value(second, "trainer_step_duration_seconds_count") == 2
    assert 0.19 < value(second, "trainer_step_duration_seconds_sum") < 1.0
    assert value(second, "trainer_last_step_timestamp_seconds") > value(first, "trainer_last_step_timestamp_seconds")


def test_the_heartbeat_moves_only_when_the_step_does(reporters: list[Reporter], base_port: int) -> None:
    r = reporter(reporters, base_port)
    r.report(3, loss=1.0)
    beat = value(scrape(base_port), "trainer_last_step_timestamp_seconds")
    time.sleep(0.05)
    r.report(3, loss=0.9)
    assert value(scrape(base_port), "trainer_last_step_timestamp_seconds") == beat


def test_a_non_finite_loss_is_shown_and_counted_not_summed(reporters: list[Reporter], base_port: int) -> None:
    r = reporter(reporters, base_port)
    r.report(1, loss=1.0)
    r.report(2, loss=float("nan"))
    samples = scrape(base_port)
    assert value(samples, "trainer_nonfinite_loss_total") == 1
    assert value(samples, "trainer_loss_sum") == 1.0
    assert value(samples, "trainer_loss_last") != value(samples, "trainer_loss_last")  # NaN


def test_each_rank_serves_its_own_series_on_base_plus_local_rank(reporters: list[Reporter], base_port: int) -> None:
    rank0 = reporter(reporters, base_port, rank=0, local_rank=0, world_size=4)
    rank3 = reporter(reporters, base_port, rank=3, local_rank=1, world_size=4)
    rank3.report(5, loss=0.7)
    # Rank 3 serves on base + its local rank only, and says which rank it is.
    with pytest.raises(urllib.error.URLError):
        page(base_port)
    mine = scrape(base_port + 1)
    assert {(labels["rank"], labels["local_rank"]) for labels, _ in mine["trainer_step"]} == {("3", "1")}
    assert value(mine, "trainer_loss_last") == 0.7
    rank0.report(6, loss=0.4)
    assert value(scrape(base_port), "trainer_step") == 6
    assert value(scrape(base_port + 1), "trainer_step") == 5  # each rank its own


def test_the_operator_reads_step_loss_heartbeat_and_eta_from_a_report(
        reporters: list[Reporter], base_port: int) -> None:
    r = reporter(reporters, base_port)
    r.report(10, total_steps=110, loss=0.25)
    time.sleep(0.5)
    r.report(20, loss=0.125)
    progress = parse_progress(page(base_port))
    assert progress is not None
    assert (progress.step, progress.total_steps, progress.loss) == (20, 110, 0.125)
    assert progress.heartbeat is not None and abs(progress.heartbeat.timestamp() - time.time()) < 5
    # A user program's spec says nothing about samples per step: the ETA comes from its step times.
    status = progress_status(progress, None, None, datetime.now(UTC))
    assert status["summary"] == "18% (20/110)"
    assert status["eta"] in {"4s", "5s", "6s"}  # 90 steps x ~0.05 s


def test_port_zero_serves_nothing_but_still_records(reporters: list[Reporter]) -> None:
    r = reporter(reporters, 0)
    r.report(1, loss=1.0)
    assert r.server is None
    assert r.metrics.step == 1


LAST_WORDS_PROGRAM = (
    "from kubetrain_trainer import report\n"
    "for step in range(1, 6):\n"
    "    report(step=step, total_steps=5, loss=1.0 / step)\n"
)


@pytest.mark.parametrize("local_rank", ["0", "1"])
def test_local_rank_0_leaves_the_last_report_as_termination_message(tmp_path: Path, local_rank: str) -> None:
    log = tmp_path / "termination"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "trainer_image"), "LOCAL_RANK": local_rank,
           "KUBETRAIN_METRICS_PORT": str(free_port_range(2)), "KUBETRAIN_TERMINATION_LOG": str(log)}
    subprocess.run([sys.executable, "-c", LAST_WORDS_PROGRAM], env=env, check=True, timeout=60)
    if local_rank != "0":
        assert not log.exists()
        return
    assert json.loads(log.read_text()) == {"reason": "Reported", "step": 5, "loss": 0.2, "totalSteps": 5,
                                           "message": "last report: step 5"}


def test_a_program_that_dies_before_its_end_leaves_its_log_as_the_message(tmp_path: Path) -> None:
    log = tmp_path / "termination"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "trainer_image"), "LOCAL_RANK": "0",
           "KUBETRAIN_METRICS_PORT": str(free_port_range(1)), "KUBETRAIN_TERMINATION_LOG": str(log)}
    crash = "from kubetrain_trainer import report\nreport(step=3, total_steps=5, loss=0.5)\nraise RuntimeError('boom')"
    result = subprocess.run([sys.executable, "-c", crash], env=env, check=False, timeout=60)
    assert result.returncode == 1
    assert not log.exists(), "the kubelet's fallback to the log tail (the traceback) must win"


def test_importing_report_does_not_import_torch() -> None:
    code = "import sys; from kubetrain_trainer import report; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO / "trainer_image")})
    assert out.stdout.strip() == "False"
