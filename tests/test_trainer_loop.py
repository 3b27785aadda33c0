"""The training loop in this process (a one-process group, as ``python -m kubetrain_trainer`` without torchrun):
the fp16 GradScaler's calibration skips, the batched data path."""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kubetrain_trainer.config import parse_config
from kubetrain_trainer.data import GatherLoader
from kubetrain_trainer.distributed import DistContext, init_distributed, teardown
from kubetrain_trainer.loop import NonFiniteLossError, Trainer, keep_alive
from kubetrain_trainer.metrics import TrainerMetrics
from kubetrain_trainer.stopping import StopFlag
from kubetrain_trainer.tasks import TaskContext, build_task


@pytest.fixture(scope="module")
def group() -> Iterator[DistContext]:
    ctx = init_distributed({})
    yield ctx
    teardown()


def trainer(group: DistContext, tmp_path: Path, **trainer_cfg: Any) -> Trainer:
    raw = {"trainer": {"task": "digits", "maxSteps": 12, "batchSize": 16, "logEverySteps": 4, "precision": "fp32",
                       **trainer_cfg},
           "data": {"workers": 0}, "checkpoint": {"path": str(tmp_path), "everySteps": 0, "resume": False}}
    cfg = parse_config(raw, env={})
    torch.manual_seed(0)
    task = build_task(TaskContext(trainer=cfg.trainer, options=cfg.trainer.options, data_dir=tmp_path, rank=0,
                                  world_size=1, device=group.device))
    return Trainer(cfg, group, task, TrainerMetrics(rank=0, local_rank=0, world_size=1), StopFlag())


class CalibratingScaler:
    """Stands in for an fp16 GradScaler on a GPU: the first ``overflows`` unscales find inf gradients, and each
    update() after one halves the scale, as torch.amp.GradScaler does while it calibrates."""

    def __init__(self, overflows: int, scale: float = 2.0**16) -> None:
        self.overflows, self.scale_value, self.found_inf = overflows, scale, False

    def is_enabled(self) -> bool:
        return True

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        self.found_inf = self.overflows > 0
        if self.found_inf:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.fill_(math.inf)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        assert not self.found_inf, "the loop must not step on overflowed gradients"
        optimizer.step()

    def update(self) -> None:
        if self.found_inf:
            self.overflows -= 1
            self.scale_value /= 2

    def get_scale(self) -> float:
        return self.scale_value


def run(t: Trainer) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return t.run()


def test_fp16_scaler_overflow_skips_while_calibrating_do_not_fail_the_job(group: DistContext, tmp_path: Path) -> None:
    t = trainer(group, tmp_path)
    t.scaler = CalibratingScaler(overflows=8)  # type: ignore[assignment]
    assert run(t) == 0
    assert t.state.step == 12
    assert t.metrics.nonfinite_total == 0  # the loss was finite: nothing non-finite to report


def test_a_scaler_that_never_calibrates_still_fails_after_five_counted_steps(group: DistContext,
                                                                            tmp_path: Path) -> None:
    t = trainer(group, tmp_path)
    t.scaler = CalibratingScaler(overflows=1000, scale=4.0)  # 4 -> 2 -> 1 -> 0.5: then every skip counts
    with pytest.raises(NonFiniteLossError, match="5 consecutive"):
        run(t)
    assert t.metrics.nonfinite_total == 5
    assert t.scaler.get_scale() == 4.0 / 2**8  # 3 calibration halvings, then 5 counted ones


def test_in_memory_data_is_gathered_a_batch_at_a_time_in_the_training_process(group: DistContext,
                                                                             tmp_path: Path) -> None:
    t = trainer(group, tmp_path)
    assert isinstance(t.stream.loader, GatherLoader)  # no DataLoader, no worker processes
    x, y = t.stream.next()
    assert x.shape == (16, 64) and y.shape == (16,)


def test_a_long_blocking_call_keeps_the_heartbeat_then_stops_beating_at_its_limit() -> None:
    """A checkpoint write is one blocking call: a thread beats for it, for at most ``limit`` seconds."""
    metrics = TrainerMetrics(rank=0, local_rank=0, world_size=1)
    beats: list[float] = []
    with keep_alive(metrics, every=0.05, limit=0.3):
        for _ in range(12):  # 0.6 s of "writing"
            time.sleep(0.05)
            beats.append(metrics.heartbeat_timestamp)
    assert len(set(beats[:5])) >= 3, "it beat while the call ran"
    assert beats[-1] == beats[-3], "and stopped beating after its limit (a hung write is a stall)"
    assert metrics.heartbeat_timestamp >= beats[-1], "one last beat when the call returns"
