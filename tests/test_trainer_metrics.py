"""Metrics served while training under torchrun, then a pod-style SIGTERM: checkpoint, stop, resume."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import psutil
import pytest

from kubetrain.cli.ports import free_port_range
from tests.trainer_helpers import (
    Result,
    run_trainer,
    scrape,
    start_trainer,
    stop_process_group,
    wait_for,
)

pytestmark = pytest.mark.slow

# Every name documented in kubetrain_trainer.metrics that a CPU run exports (as sample names).
PROGRESS = [
    "trainer_steps_total", "trainer_step", "trainer_total_steps", "trainer_epoch", "trainer_loss_last",
    "trainer_loss_sum", "trainer_loss_count", "trainer_samples_per_second", "trainer_last_step_timestamp_seconds",
    "trainer_heartbeat_timestamp_seconds", "trainer_checkpoint_last_step", "trainer_resumed_from_step",
    "trainer_world_size",
]
HEALTH = [
    "trainer_samples_total", "trainer_tokens_total", "trainer_model_flops_total", "trainer_learning_rate",
    "trainer_grad_norm", "trainer_step_duration_seconds_bucket", "trainer_step_duration_seconds_count",
    "trainer_step_duration_seconds_sum", "trainer_step_phase_seconds_total",
    "trainer_checkpoint_duration_seconds_count", "trainer_nonfinite_loss_total",
]

PER_RANK = [
    "trainer_step", "trainer_world_size", "trainer_last_step_timestamp_seconds", "trainer_heartbeat_timestamp_seconds",
    "trainer_step_phase_seconds_total",
    "trainer_step_duration_seconds_bucket", "trainer_step_duration_seconds_count", "trainer_step_duration_seconds_sum",
    "trainer_checkpoint_duration_seconds_bucket", "trainer_checkpoint_duration_seconds_count",
    "trainer_checkpoint_duration_seconds_sum",
]

CONFIG = {
    "trainer": {"task": "digits", "maxSteps": 1_000_000, "batchSize": 32, "logEverySteps": 2,
                "optimizer": {"lr": 0.003}},
    "data": {"workers": 1},
    "checkpoint": {"everySteps": 5},
}


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    (labels_value,) = samples[name]
    return labels_value[1]


def test_metrics_while_training_then_sigterm_checkpoints_and_the_next_start_resumes(tmp_path: Path) -> None:
    port = free_port_range(2)
    termination = tmp_path / "termination-log"
    proc = start_trainer(CONFIG, tmp_path / "ckpt", nproc=2, metrics_port=port,
                         extra={"KUBETRAIN_TERMINATION_LOG": str(termination)})
    try:
        # Wait until a checkpoint exists and a few steps later, so every gauge has a real value.
        rank0 = wait_for(lambda: (s := scrape(port)) and value(s, "trainer_checkpoint_last_step") >= 5
                         and value(s, "trainer_step") >= 8 and s, 120, "training with a checkpoint", proc)
        rank1 = scrape(port + 1)
        for name in PROGRESS + HEALTH:
            assert name in rank0, name
        # Rank 1 serves its own series; the job-wide ones (the same on every rank) are rank 0's alone.
        assert set(rank1) == set(PER_RANK), sorted(set(rank1) ^ set(PER_RANK))
        assert {lbl["rank"] for lbl, _ in rank0["trainer_step"]} == {"0"}
        assert {(lbl["rank"], lbl["local_rank"]) for lbl, _ in rank1["trainer_step"]} == {("1", "1")}
        # No GPU here: GPU series are absent, not zero.
        assert not [n for n in rank0 if n.startswith("trainer_gpu_")]
        assert value(rank0, "trainer_total_steps") == 1_000_000
        assert value(rank0, "trainer_world_size") == 2
        assert value(rank0, "trainer_resumed_from_step") == -1
        assert 0 < value(rank0, "trainer_loss_last") < 5
        assert value(rank0, "trainer_samples_per_second") > 0
        assert abs(value(rank0, "trainer_last_step_timestamp_seconds") - time.time()) < 60
        assert value(rank0, "trainer_steps_total") == value(rank0, "trainer_step")
        assert value(rank0, "trainer_samples_total") == 64 * value(rank0, "trainer_step")
        phases = {lbl["phase"]: v for lbl, v in rank0["trainer_step_phase_seconds_total"]}
        assert set(phases) == {"data_wait", "forward_backward", "optimizer", "checkpoint"}
        assert phases["forward_backward"] > 0
        # The loss gauge is all-reduced: both ranks report the job's loss for the same step.
        later0 = scrape(port)
        assert value(later0, "trainer_step") >= value(rank0, "trainer_step")

        proc.send_signal(signal.SIGTERM)  # what the kubelet does to the pod's PID 1 (torchrun)
        out, err = proc.communicate(timeout=90)
    finally:
        stop_process_group(proc)
    stopped = Result(proc.returncode, out, err).of("stopped")
    assert len(stopped) == 1, err[-3000:]
    step = stopped[0]["step"]
    assert (tmp_path / "ckpt" / f"step_{step:09d}" / "trainer_state.json").is_file()
    assert json.loads(termination.read_text()) == {"reason": "Stopped", "exitCode": 143, "step": step,
                                                   "message": "SIGTERM: checkpoint saved"}
    # torchrun itself reports a signal death as exit code 1: the termination message carries the reason.
    assert proc.returncode == 1

    config = {**CONFIG, "trainer": {**CONFIG["trainer"], "maxSteps": step + 4}}
    resumed = run_trainer(config, tmp_path / "ckpt", nproc=None)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.of("resume")[0]["step"] == step
    assert resumed.of("done")[0]["step"] == step + 4


def test_sigterm_to_a_single_process_exits_with_143_after_a_checkpoint(tmp_path: Path) -> None:
    config = {**CONFIG, "trainer": {**CONFIG["trainer"], "logEverySteps": 1}, "checkpoint": {"everySteps": 0}}
    proc = start_trainer(config, tmp_path / "ckpt", nproc=None)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # wait until training is under way
            if '"event": "step"' in line:
                break
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        stop_process_group(proc)
    assert proc.returncode == 143, err[-3000:]
    (stopped,) = Result(proc.returncode, out, err).of("stopped")
    assert (tmp_path / "ckpt" / f"step_{stopped['step']:09d}" / "trainer_state.json").is_file()


def test_a_sigterm_that_reaches_one_rank_stops_both_at_the_same_step(tmp_path: Path) -> None:
    """Rank 1 alone is told to stop: its vote reaches rank 0 inside DDP's gradient all-reduce (StepVotes), and
    rank 0, which got no signal, saves and stops at the same step."""
    port = free_port_range(2)
    config = {**CONFIG, "trainer": {**CONFIG["trainer"], "logEverySteps": 1}, "checkpoint": {"everySteps": 0}}
    proc = start_trainer(config, tmp_path / "ckpt", nproc=2, metrics_port=port)
    try:
        wait_for(lambda: (s := scrape(port)) and value(s, "trainer_step") >= 3, 120, "training under way", proc)
        (rank1,) = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.environ().get("RANK") == "1"]
        rank1.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        stop_process_group(proc)
    (stopped,) = Result(proc.returncode, out, err).of("stopped")  # rank 0 logs it: rank 0 stopped too
    state = json.loads((tmp_path / "ckpt" / f"step_{stopped['step']:09d}" / "trainer_state.json").read_text())
    assert state["step"] == stopped["step"] and state["world_size"] == 2
    assert Result(proc.returncode, out, err).of("step")[-1]["step"] == stopped["step"], "no step after the vote"
