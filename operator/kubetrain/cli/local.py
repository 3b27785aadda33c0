"""`kubetrain run job.yaml`: the same TrainingJob on this machine, without a cluster.

Each of the job's nodes becomes one local torchrun agent; the agents meet through a real c10d
rendezvous on 127.0.0.1, exactly as the pods do through ``<job>-0.<job>``. The image is not pulled:
the Python environment that runs kubetrain stands in for it (its ``bin`` first on PATH, so ``python`` and
``torchrun`` in ``command:`` are the ones kubetrain runs with, activated or not). Checkpoints and logs go
under ``--workdir``, so running the same file again resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kubetrain.cli.ports import free_port, free_port_range
from kubetrain.core import api
from kubetrain.core.launch import Placement, launch_env, program_args
from kubetrain.core.progress import parse_progress
from kubetrain.core.spec import TrainingJob
from kubetrain.core.status import Progress as TrainingProgress

__all__ = ["LocalRun", "plan_local_run", "run_local"]

@dataclass(frozen=True)
class LocalRun:
    """The commands and environments of one local run (pure data, for tests and --dry-run)."""

    commands: tuple[tuple[str, ...], ...]
    environments: tuple[Mapping[str, str], ...]
    checkpoint_dir: Path
    log_dir: Path
    metrics_port: int


def path_with_interpreter(executable: str, path: str) -> str:
    """PATH with the directory of ``executable`` first: the environment's own ``python`` and ``torchrun``.

    Not resolved: a virtual environment's python is a symlink, and only its own path finds the venv.
    """
    first = str(Path(executable).parent)
    return os.pathsep.join([first, *(entry for entry in path.split(os.pathsep) if entry and entry != first)])


def plan_local_run(job: TrainingJob, workdir: Path, rendezvous_port: int, metrics_port: int,
                   path: str = os.defpath) -> LocalRun:
    """One torchrun agent per node of the job, all on this machine; ``path``: the PATH kubetrain was given.

    ``metrics_port`` is the first of nodes x processes consecutive ports: rank r serves on base + r.
    """
    spec = job.spec
    run_dir = workdir / job.name
    checkpoint_dir, log_dir = run_dir / "checkpoints", run_dir / "logs"
    command = (sys.executable, "-m", "torch.distributed.run", *program_args(job))
    environments = []
    for index in range(spec.nodes):
        placement = Placement(
            rendezvous_endpoint=f"127.0.0.1:{rendezvous_port}",
            metrics_port=metrics_port + index * spec.procs_per_node,
            checkpoint_dir=str(checkpoint_dir),
            data_dir=str(run_dir / "data"),
        )
        env = launch_env(job, index, 0, placement) | {
            api.ENV.NAMESPACE: "local",
            api.ENV.POD_NAME: f"{job.name}-{index}",
            api.ENV.TERMINATION_LOG: str(log_dir / f"node-{index}.termination"),
            "PATH": path_with_interpreter(sys.executable, path),
        }
        env |= {e["name"]: e["value"] for e in spec.env if "value" in e}
        environments.append(env)
    return LocalRun(tuple(command for _ in range(spec.nodes)), tuple(environments), checkpoint_dir, log_dir,
                    metrics_port)


def _scrape(port: int) -> TrainingProgress | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as response:
            return parse_progress(response.read().decode())
    except (urllib.error.URLError, OSError):
        return None  # not serving yet, or finished


def _stop(processes: list[subprocess.Popen[bytes]], grace_seconds: int) -> None:
    """SIGTERM every agent (and its workers), SIGKILL what is left after the job's grace period, as a pod."""
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def run_local(job: TrainingJob, workdir: Path, console: Console) -> int:
    """Run the job here with a live progress bar; return the first non-zero exit code, or 0."""
    ranks = job.spec.nodes * job.spec.procs_per_node
    plan = plan_local_run(job, workdir, free_port(), free_port_range(ranks), os.environ.get("PATH", os.defpath))
    plan.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    for stale in plan.log_dir.glob("node-*.termination"):
        stale.unlink()  # a previous run's last words must not pass for this run's
    spec = job.spec
    console.print(f"[bold]{job.name}[/]: {spec.nodes} node(s) x {spec.procs_per_node} process(es) on this machine; "
                  f"checkpoints in {plan.checkpoint_dir}, logs in {plan.log_dir}")
    processes: list[subprocess.Popen[bytes]] = []
    for index, (command, env) in enumerate(zip(plan.commands, plan.environments, strict=True)):
        log = (plan.log_dir / f"node-{index}.log").open("wb")
        processes.append(subprocess.Popen(command, env=os.environ | dict(env), stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
        log.close()  # the child holds its own descriptor
    last: TrainingProgress | None = None
    try:
        last = _follow(job, plan, processes, console)
    except KeyboardInterrupt:
        console.print("stopping: the trainer writes a checkpoint first (run again to resume)")
    finally:
        _stop(processes, spec.run_policy.termination_grace_period_seconds)
    codes = [p.returncode for p in processes]
    failed = next((code for code in codes if code != 0), 0)
    report = _final_report(plan.log_dir)
    if failed:
        reason = f": {report.get('reason')}: {report.get('message', '')}" if report else ""
        console.print(f"[red]failed[/] (exit codes {codes}){reason}; logs in {plan.log_dir}")
    else:
        console.print(f"[green]succeeded[/]: {_summary(report, last)}; checkpoints in {plan.checkpoint_dir}")
    return failed


def _follow(job: TrainingJob, plan: LocalRun, processes: list[subprocess.Popen[bytes]],
            console: Console) -> TrainingProgress | None:
    """The live bar until every agent exits; the last progress scraped from rank 0."""
    spec = job.spec
    waiting = "starting" if spec.command is None else "no progress metrics from the program"
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn())
    last: TrainingProgress | None = None
    with Progress(*columns, console=console) as bar:
        task = bar.add_task(job.name, total=None, count="", detail=waiting)
        while any(p.poll() is None for p in processes):
            time.sleep(1.0)
            last = _scrape(plan.metrics_port) or last
            if last is not None:
                total = last.total_steps or spec.total_steps
                bar.update(task, completed=last.step, total=total, count=f"{last.step}/{total or '?'}",
                           detail=_describe(last))
        report = _final_report(plan.log_dir)
        if "step" in report:
            total = report.get("totalSteps") or spec.total_steps
            bar.update(task, completed=report["step"], total=total, count=f"{report['step']}/{total or '?'}")
    return last


def _describe(progress: TrainingProgress) -> str:
    detail = f"loss {progress.loss:.4g}" if progress.loss is not None else ""
    if progress.samples_per_second:
        detail += f" | {progress.samples_per_second:.0f} samples/s"
    return detail


def _summary(report: Mapping[str, Any], last: TrainingProgress | None) -> str:
    """The final step and loss: the program's last words, else the last progress scraped."""
    facts = {key: report[key] for key in ("step", "loss", "evalLoss", "evalAccuracy") if key in report}
    if not facts and last is not None:
        facts = {"step": last.step} | ({"loss": last.loss} if last.loss is not None else {})
    if not facts:
        return "the program reported no progress"
    return ", ".join(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}"
                     for key, value in facts.items())


def _final_report(log_dir: Path) -> dict[str, Any]:
    """The trainer's last words (its termination message), or {} when it left none."""
    path = log_dir / "node-0.termination"
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return report if isinstance(report, dict) else {}
