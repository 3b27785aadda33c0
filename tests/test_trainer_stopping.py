"""SIGTERM to a rank whose peer is gone: it gives up on a checkpoint it cannot agree on, instead of waiting out
the pod's grace period in a collective that never ends (see kubetrain_trainer.stopping)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from kubetrain.cli.ports import free_port_range
from kubetrain_trainer.metrics import TrainerMetrics
from kubetrain_trainer.stopping import STOP_PATIENCE_MIN_SECONDS, STOP_PATIENCE_STEPS, StopFlag, stop_patience
from tests.trainer_helpers import parse_events, scrape, start_trainer, stop_process_group, wait_for

CONFIG = {
    "trainer": {"task": "digits", "maxSteps": 1_000_000, "batchSize": 32, "logEverySteps": 1,
                "optimizer": {"lr": 0.003}},
    "data": {"workers": 0},
    "checkpoint": {"everySteps": 0},
}


def test_the_patience_is_a_floor_or_a_few_of_the_slowest_steps() -> None:
    assert stop_patience(0.0) == STOP_PATIENCE_MIN_SECONDS
    assert stop_patience(100.0) == STOP_PATIENCE_STEPS * 100.0


def test_watching_takes_sigterm_then_gives_the_wakeup_fd_back_and_leaves_no_thread() -> None:
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    metrics = TrainerMetrics(rank=0, local_rank=0, world_size=1)
    flag = StopFlag()
    handler = signal.getsignal(signal.SIGTERM)
    try:
        with flag.watching(metrics):
            assert "stop-watchdog" in {t.name for t in threading.enumerate()}
            metrics.heartbeat_timestamp = time.time()  # a loop that shows life: the watchdog must let it be
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for(lambda: flag.requested, 5, "the flag set by SIGTERM")
    finally:
        signal.signal(signal.SIGTERM, handler)  # the flag's handler stays after training: not in pytest
    assert "stop-watchdog" not in {t.name for t in threading.enumerate()}
    assert signal.set_wakeup_fd(before) == before, "the previous wakeup fd is back"


@pytest.mark.slow
def test_a_rank_blocked_on_a_frozen_peer_exits_without_a_checkpoint_after_its_patience(tmp_path: Path) -> None:
    """Rank 1 is frozen (SIGSTOP: its connections stay open, as a lost node's do), then rank 0 alone gets
    SIGTERM. It is blocked in the step's all-reduce, where no Python signal handler runs: before the watchdog
    it waited there for the 30-minute collective timeout, or the pod's grace period."""
    port = free_port_range(2)
    termination = tmp_path / "termination-log"
    proc = start_trainer(CONFIG, tmp_path / "ckpt", nproc=2, metrics_port=port,
                         extra={"KUBETRAIN_TERMINATION_LOG": str(termination)})
    workers: dict[str | None, psutil.Process] = {}
    try:
        wait_for(lambda: (s := scrape(port)) and s["trainer_step"][0][1] >= 3, 120, "training under way", proc)
        workers = {p.environ().get("RANK"): p for p in psutil.Process(proc.pid).children(recursive=True)
                   if p.environ().get("RANK") is not None and p.name().startswith("python")}
        workers["1"].send_signal(signal.SIGSTOP)
        time.sleep(1)  # rank 0 reaches the next all-reduce and waits there
        signalled = time.monotonic()
        workers["0"].send_signal(signal.SIGTERM)
        workers["0"].wait(timeout=STOP_PATIENCE_MIN_SECONDS + 30)  # torchrun's child: no exit code for us
        waited = time.monotonic() - signalled
    finally:
        stop_process_group(proc)
        for worker in workers.values():  # the frozen one above all: torchrun may have gone already
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
    assert waited < STOP_PATIENCE_MIN_SECONDS + 10, waited
    record = json.loads(termination.read_text())
    assert record["reason"] == "PeerLost" and record["exitCode"] == 5
    assert "blocked on a peer that is gone" in record["message"] and record["step"] >= 3
    assert not list((tmp_path / "ckpt").glob("step_*")), "no checkpoint was agreed, none was written"


@pytest.mark.slow
def test_a_checkpoint_asked_of_one_rank_is_written_by_the_gang_at_the_next_step(tmp_path: Path) -> None:
    """POST /checkpoint to rank 1 (not the one that writes the logs): its vote rides in the step's all-reduce,
    so both ranks save that step together, and training goes on."""
    port = free_port_range(2)
    ckpt = tmp_path / "ckpt"
    config = CONFIG | {"checkpoint": {"everySteps": 0}}
    proc = start_trainer(config, ckpt, nproc=2, metrics_port=port)
    try:
        wait_for(lambda: (s := scrape(port)) and s["trainer_step"][0][1] >= 3, 120, "training under way", proc)
        assert not list(ckpt.glob("step_*")), "everySteps 0: no checkpoint until one is asked for"
        request = urllib.request.Request(f"http://127.0.0.1:{port + 1}/checkpoint", method="POST")
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 202
        (saved,) = wait_for(lambda: list(ckpt.glob("step_*/trainer_state.json")), 60, "the asked checkpoint", proc)
        step = json.loads(saved.read_text())["step"]
        wait_for(lambda: scrape(port)["trainer_step"][0][1] > step + 2, 60, "training after the checkpoint", proc)
    finally:
        stop_process_group(proc)
    out = proc.stdout.read() if proc.stdout else ""
    asked = [e["step"] for e in parse_events(out) if e.get("event") == "checkpoint_asked"]
    assert asked == [step], out[-2000:]
    assert len(list(ckpt.glob("step_*"))) == 1, "asked once, saved once"
