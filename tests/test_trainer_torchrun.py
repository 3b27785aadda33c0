"""The trainer under real torchrun (2 CPU processes over gloo), configured exactly as the operator's pods are.

One uninterrupted digits run (module fixture) is the reference that the other runs are compared with.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.trainer_helpers import Result, run_trainer

pytestmark = pytest.mark.slow

STEPS = 100
DIGITS: dict[str, Any] = {
    "trainer": {"task": "digits", "maxSteps": STEPS, "batchSize": 32, "logEverySteps": 10,
                "optimizer": {"name": "adamw", "lr": 0.003}, "warmupSteps": 5},
    "data": {"workers": 1},
    "checkpoint": {"everySteps": 20, "keep": 2},
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    ckpt = tmp_path_factory.mktemp("reference-ckpt")
    result = run_trainer(DIGITS, ckpt, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    return result, ckpt


def test_digits_loss_falls_and_held_out_accuracy_reaches_0_9(reference: tuple[Result, Path]) -> None:
    result, _ = reference
    losses = result.losses()
    assert sorted(losses) == list(range(10, STEPS + 1, 10))
    assert losses[STEPS] < 0.5 * losses[10], losses
    (evaluation,) = result.of("eval")
    assert evaluation["accuracy"] >= 0.9, evaluation
    assert evaluation["step"] == STEPS


def test_only_rank_0_logs_and_the_logs_carry_step_loss_lr_throughput(reference: tuple[Result, Path]) -> None:
    result, _ = reference
    assert len(result.of("start")) == 1
    assert result.of("start")[0]["world_size"] == 2
    step = result.of("step")[-1]
    assert {"step", "loss", "lr", "samples_per_s", "total_steps"} <= set(step)
    assert step["samples_per_s"] > 0


def test_checkpoints_keep_the_newest_k_and_leave_no_temporary_directory(reference: tuple[Result, Path]) -> None:
    _, ckpt = reference
    names = sorted(p.name for p in ckpt.iterdir())
    assert names == ["step_000000080", "step_000000100"]
    assert (ckpt / "step_000000100" / "trainer_state.json").is_file()


def test_a_killed_worker_resumes_from_the_checkpoint_and_matches_the_uninterrupted_run(
    reference: tuple[Result, Path], tmp_path: Path
) -> None:
    result = run_trainer(DIGITS, tmp_path, nproc=2, extra={
        "PET_MAX_RESTARTS": "1",
        "KUBETRAIN_TEST_KILL_AT_STEP": "50:1",  # rank 1 SIGKILLs itself after step 50 (first attempt only)
    })
    assert result.returncode == 0, result.stderr[-3000:]
    assert "exitcode: -9" in result.stderr  # torchrun saw the worker die of SIGKILL
    (resume,) = result.of("resume")
    assert resume["step"] == 40  # the newest checkpoint before the kill
    steps = [e["step"] for e in result.of("step")]
    assert steps[-1] == STEPS
    # After the restart the run repeats steps 41..50 and continues: same data position, same weights,
    # same optimizer state, same RNG, so the loss follows the uninterrupted run.
    expected = reference[0].losses()
    got = result.losses()
    for step in (60, 80, STEPS):
        assert got[step] == pytest.approx(expected[step], rel=1e-3, abs=1e-4), (step, got, expected)


def test_resume_with_a_different_world_size_continues_from_the_checkpoint(
    reference: tuple[Result, Path], tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference[1], ckpt)
    config = {**DIGITS, "trainer": {**DIGITS["trainer"], "maxSteps": STEPS + 20}}
    result = run_trainer(config, ckpt, nproc=None)  # 2 -> 1 process, and no torchrun at all
    assert result.returncode == 0, result.stderr[-3000:]
    (resume,) = result.of("resume")
    assert (resume["step"], resume["saved_world_size"], resume["world_size"]) == (STEPS, 2, 1)
    losses = result.losses()
    assert sorted(losses) == [110, 120]
    # The restored model is the trained one: the loss stays near where the 2-process run left it.
    assert losses[120] < 0.5 * reference[0].losses()[10]
    assert result.of("eval")[-1]["accuracy"] >= 0.9
