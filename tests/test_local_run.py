"""`kubetrain run` of your own program (`spec.command`): kubetrain's own environment, the program's progress."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kubetrain.cli.local import path_with_interpreter, plan_local_run
from kubetrain.core.spec import parse

VENV_BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent

REPORTING_SCRIPT = """\
import time
import torch  # only kubetrain's environment has it
from kubetrain_trainer import report
for step in range(1, 21):
    report(step=step, total_steps=20, loss=1.0 / step, samples=8)
    time.sleep(0.1)
"""


def job(command: list[str], procs: int = 1) -> dict[str, object]:
    return {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "mine"},
            "spec": {"nodes": 1, "procsPerNode": procs, "gpusPerNode": 0, "command": command,
                     "resources": {"cpu": "1", "memory": "1Gi"}}}


def test_the_interpreters_directory_goes_first_on_path_once() -> None:
    assert path_with_interpreter("/v/bin/python3", "/usr/bin:/v/bin:/bin") == "/v/bin:/usr/bin:/bin"
    assert path_with_interpreter("/v/bin/python3", "") == "/v/bin"


def test_every_agent_runs_with_kubetrains_environment_first_on_path(tmp_path: Path) -> None:
    plan = plan_local_run(parse(job(["python", "train.py"])), tmp_path, 29500, 9500, path="/usr/bin:/bin")
    assert [env["PATH"] for env in plan.environments] == [f"{VENV_BIN}:/usr/bin:/bin"]
    assert plan.commands[0][-3:] == ("--no-python", "python", "train.py")


def run_by_venv_path(tmp_path: Path, spec: dict[str, object]) -> subprocess.CompletedProcess[str]:
    """`.venv/bin/kubetrain run` as the README's first command runs it: venv not activated, not on PATH."""
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"), "COLUMNS": "200",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(VENV_BIN / "kubetrain"), "run", "job.yaml", "--workdir", str(tmp_path / "work")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_run_of_a_python_command_uses_kubetrains_environment_and_shows_the_reported_end(tmp_path: Path) -> None:
    (tmp_path / "script.py").write_text(REPORTING_SCRIPT)
    result = run_by_venv_path(tmp_path, job(["python", "script.py"], procs=2))
    logs = "\n".join(p.read_text() for p in sorted((tmp_path / "work" / "mine" / "logs").glob("*.log")))
    assert result.returncode == 0, result.stdout + result.stderr + logs
    assert "succeeded: step 20, loss 0.05;" in result.stdout
    assert "20/20" in result.stdout  # the bar's last state


@pytest.mark.slow
def test_run_of_a_silent_program_says_it_reported_no_progress(tmp_path: Path) -> None:
    result = run_by_venv_path(tmp_path, job(["python", "-c", "import time; time.sleep(2)"]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no progress metrics from the program" in result.stdout
    assert "succeeded: the program reported no progress;" in result.stdout


def test_the_user_script_example_is_a_valid_job() -> None:
    example = yaml.safe_load((REPO / "examples" / "user-script" / "trainingjob.yaml").read_text())
    assert parse(example).spec.command == ("python", "examples/user-script/train.py")


# A worker whose checkpoint after SIGTERM takes 45 s: longer than torchrun's own 30 s before SIGKILL.
SLOW_CHECKPOINT_ON_SIGTERM = """\
import os, pathlib, signal, time
done = pathlib.Path(os.environ["KUBETRAIN_CHECKPOINT_DIR"])
def checkpoint(*_):
    time.sleep(45)
    (done / "checkpoint-after-sigterm").write_text("written")
    raise SystemExit(0)
signal.signal(signal.SIGTERM, checkpoint)
(done / "started").write_text("")
time.sleep(600)
"""


# Runs argv[1:] with Ctrl-C as a terminal gives it: tests started in the background of a non-interactive shell
# (`bash .ci/run &`) inherit SIGINT ignored, and Python then never raises KeyboardInterrupt (as `nohup` wants).
WITH_DEFAULT_SIGINT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                       "os.execv(sys.argv[1], sys.argv[1:])")


@pytest.mark.slow
def test_a_checkpoint_after_sigterm_gets_the_jobs_grace_period_not_torchruns_30_s(tmp_path: Path) -> None:
    """Ctrl-C of `kubetrain run` is a pod's SIGTERM: torchrun forwards it and waits the job's
    terminationGracePeriodSeconds (here 120) before SIGKILL, so a 45 s checkpoint completes."""
    spec = job(["python", "-c", SLOW_CHECKPOINT_ON_SIGTERM])
    spec["spec"]["runPolicy"] = {"terminationGracePeriodSeconds": 120}  # type: ignore[index]
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    checkpoints = tmp_path / "work" / "mine" / "checkpoints"
    run = subprocess.Popen([sys.executable, "-c", WITH_DEFAULT_SIGINT, str(VENV_BIN / "kubetrain"), "run", "job.yaml",
                            "--workdir", str(tmp_path / "work")],
                           cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "COLUMNS": "200"})
    try:
        deadline = time.monotonic() + 120
        while not (checkpoints / "started").exists():
            assert run.poll() is None and time.monotonic() < deadline, "the program never started"
            time.sleep(0.2)
        run.send_signal(signal.SIGINT)  # Ctrl-C
        output, _ = run.communicate(timeout=120)
    finally:
        run.kill()
    assert (checkpoints / "checkpoint-after-sigterm").read_text() == "written", output
    assert "stopping: the trainer writes a checkpoint first" in output


@pytest.mark.slow
def test_output_to_a_pipe_keeps_long_paths_whole(tmp_path: Path) -> None:
    """A log file or a pipe has no width: the checkpoint path is printed unbroken, whatever its length."""
    workdir = tmp_path / ("a-rather-long-directory-name-" * 4) / "work"
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job(["python", "-c", "pass"])))
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    result = subprocess.run([str(VENV_BIN / "kubetrain"), "run", "job.yaml", "--workdir", str(workdir)],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert str(workdir / "mine" / "checkpoints") in result.stdout, result.stdout
