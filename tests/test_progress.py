"""Rank 0's metrics page to progress: absurd values never break a reconcile, and a page that cannot be read
is a failed scrape (progress unknown), not "no progress"."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from datetime import UTC, datetime

import aiohttp
import pytest

from kubetrain.cli.ports import free_port
from kubetrain.core.progress import parse_progress, read_progress
from kubetrain.core.status import Scrape, progress_status
from kubetrain.k8s import scrape as scrape_module
from kubetrain.k8s.scrape import fetch_progress
from tests.status_schema import assert_valid_status

NOW = datetime(2026, 11, 1, 10, 10, tzinfo=UTC)
GOOD = """\
trainer_step 250
trainer_total_steps 1000
trainer_epoch 2
trainer_loss_last 0.5
trainer_samples_per_second 512
trainer_last_step_timestamp_seconds 1793527200
trainer_checkpoint_last_step 200
trainer_resumed_from_step -1
trainer_step_duration_seconds_count 250
trainer_step_duration_seconds_sum 125
"""


def page(**values: str) -> str:
    lines = dict(line.split(" ") for line in GOOD.splitlines())
    lines |= {f"trainer_{name}": value for name, value in values.items()}
    return "".join(f"{name} {value}\n" for name, value in lines.items())


def test_a_good_page() -> None:
    progress = parse_progress(GOOD)
    assert progress is not None
    assert (progress.step, progress.total_steps, progress.epoch, progress.loss) == (250, 1000, 2, 0.5)
    assert progress.samples_per_second == 512 and progress.checkpoint_step == 200
    assert progress.resumed_from_step == 0 and progress.seconds_per_step == 0.5
    assert progress.heartbeat == datetime(2026, 11, 1, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize("step", ["NaN", "+Inf", "-Inf", "-3", "1e30"])
def test_a_step_that_is_no_step_is_no_progress(step: str) -> None:
    scrape = read_progress(page(step=step))
    assert not scrape.failed and scrape.progress is None


@pytest.mark.parametrize(("metric", "value"), [
    ("loss_last", "NaN"), ("loss_last", "+Inf"), ("samples_per_second", "-100"), ("samples_per_second", "+Inf"),
    ("samples_per_second", "NaN"), ("samples_per_second", "1e300"), ("total_steps", "1e30"),
    ("total_steps", "-5"), ("epoch", "NaN"), ("epoch", "+Inf"), ("last_step_timestamp_seconds", "1e30"),
    ("last_step_timestamp_seconds", "-1e9"), ("last_step_timestamp_seconds", "NaN"),
    ("checkpoint_last_step", "+Inf"), ("resumed_from_step", "1e30"), ("resumed_from_step", "-7"),
    ("step_duration_seconds_sum", "-1"), ("step_duration_seconds_count", "0"),
    ("step_duration_seconds_sum", "+Inf"),
])
def test_absurd_values_never_break_the_status(metric: str, value: str) -> None:
    progress = parse_progress(page(**{metric: value}))
    assert progress is not None and progress.step == 250  # the rest of the page still counts
    assert_valid_status({"progress": progress_status(progress, None, 64, NOW)})


@pytest.mark.parametrize("text", ["trainer_step{ 3\n", "trainer_step abc\n", "\x00\x01garbage {{{\n"])
def test_a_page_that_does_not_parse_is_a_failed_scrape(text: str) -> None:
    scrape = read_progress(text)
    assert scrape.failed and scrape.progress is None and "does not parse" in (scrape.error or "")
    assert parse_progress(text) is None


def scrape(port: int) -> Scrape:
    async def go() -> Scrape:
        async with aiohttp.ClientSession() as session:
            return await fetch_progress(session, "127.0.0.1", port)
    return asyncio.run(go())


def test_connection_refused_is_a_failed_scrape() -> None:
    result = scrape(free_port())
    assert result.failed and result.progress is None
    assert "127.0.0.1" in (result.error or "")


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield server.getsockname()[1]


def test_a_rank_0_that_does_not_answer_is_a_failed_scrape(silent_port: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrape_module, "SCRAPE_TIMEOUT_SECONDS", 0.2)
    result = scrape(silent_port)
    assert result.failed and "did not answer" in (result.error or "")


def test_the_loops_heartbeat_wins_over_the_last_steps_time() -> None:
    """A long checkpoint write or evaluation: no step for a while, but the loop is alive."""
    beating = parse_progress(page(heartbeat_timestamp_seconds="1793527500"))
    assert beating is not None and beating.heartbeat == datetime.fromtimestamp(1793527500, UTC)
    older = parse_progress(GOOD)  # a trainer (or report()) without the series: the last step's time
    assert older is not None and older.heartbeat == datetime.fromtimestamp(1793527200, UTC)
