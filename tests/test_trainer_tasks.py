"""Tasks beyond digits: GPT on the stdlib sources with FSDP2 over gloo, the user entrypoint contract,
and the failure exits (invalid configuration, non-finite loss)."""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import pytest

from tests.trainer_helpers import run_trainer

pytestmark = pytest.mark.slow

TINY_GPT = {
    "trainer": {"task": "gpt", "strategy": "fsdp", "maxSteps": 30, "batchSize": 16, "logEverySteps": 5,
                "optimizer": {"lr": 0.003}, "warmupSteps": 3,
                "options": {"layers": "1", "heads": "2", "embd": "32", "blockSize": "64", "corpusBytes": "400000"}},
    "data": {"workers": 0},
    "checkpoint": {"everySteps": 15},
}


def test_gpt_on_stdlib_sources_learns_under_fsdp2_and_resumes_on_one_process(tmp_path: Path) -> None:
    result = run_trainer(TINY_GPT, tmp_path, nproc=2)
    assert result.returncode == 0, result.stderr[-3000:]
    losses = result.losses()
    assert losses[5] < math.log(256) + 0.1  # starts near uniform over bytes
    assert losses[30] < losses[5] - 1.0, losses  # and learns the byte statistics of Python source
    assert result.of("eval")[-1]["loss"] < losses[5] - 1.0
    # FSDP2: each rank wrote its own shards into the one checkpoint.
    assert len(list((tmp_path / "step_000000030").glob("*.distcp"))) == 2

    config = {**TINY_GPT, "trainer": {**TINY_GPT["trainer"], "maxSteps": 35}}
    resumed = run_trainer(config, tmp_path, nproc=None)  # FSDP2 shards of 2 ranks re-sharded onto 1
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert resumed.of("resume")[0]["step"] == 30
    assert resumed.losses()[35] < losses[5] - 1.0


def test_gpt_streams_file_shards_from_the_data_volume(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for source in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:8]:
        (data / source.name).write_bytes(source.read_bytes())
    config = {**TINY_GPT, "trainer": {**TINY_GPT["trainer"], "strategy": "ddp", "maxSteps": 20,
                                      "options": {**TINY_GPT["trainer"]["options"], "corpus": "files"}},
              "data": {"workers": 2}}
    result = run_trainer(config, tmp_path / "ckpt", nproc=None, extra={"KUBETRAIN_DATA_DIR": str(data)})
    assert result.returncode == 0, result.stderr[-3000:]
    losses = result.losses()
    assert losses[20] < losses[5] - 0.5, losses


def test_a_user_entrypoint_brings_its_own_model_data_and_loss(tmp_path: Path) -> None:
    config = {"trainer": {"entrypoint": "trainer_helpers_entry:build", "maxSteps": 60, "logEverySteps": 20,
                          "optimizer": {"name": "sgd", "lr": 0.05}, "gradAccumulation": 2},
              "data": {"workers": 0}}
    termination = tmp_path / "termination-log"
    result = run_trainer(config, tmp_path / "ckpt", nproc=None, extra={"KUBETRAIN_TERMINATION_LOG": str(termination)})
    assert result.returncode == 0, result.stderr[-3000:]
    losses = result.losses()
    assert losses[60] < 0.05 * losses[20] or losses[60] < 0.01, losses
    assert result.of("start")[0]["samples_per_step"] == 64  # 32 per micro-batch x 2 accumulated
    report = json.loads(termination.read_text())
    assert (report["reason"], report["exitCode"], report["step"]) == ("Completed", 0, 60)


def test_non_finite_loss_fails_after_five_consecutive_steps_with_exit_code_4(tmp_path: Path) -> None:
    config = {"trainer": {"entrypoint": "trainer_helpers_entry:build", "maxSteps": 50,
                          "options": {"scale": "inf"}},
              "data": {"workers": 0}}
    termination = tmp_path / "termination-log"
    result = run_trainer(config, tmp_path / "ckpt", nproc=None,
                         extra={"KUBETRAIN_TERMINATION_LOG": str(termination)})
    assert result.returncode == 4, result.stderr[-3000:]
    assert [e["consecutive"] for e in result.of("nonfinite")] == [1, 2, 3, 4, 5]
    assert "NaN/inf for 5 consecutive steps" in result.stderr
    assert json.loads(termination.read_text())["reason"] == "NonFiniteLoss"


def test_an_unknown_key_exits_with_code_2_and_names_the_key(tmp_path: Path) -> None:
    result = run_trainer({"trainer": {"task": "digits", "maxStep": 5}}, tmp_path, nproc=None)
    assert result.returncode == 2
    assert "trainer: unknown key(s) maxStep" in result.stderr
