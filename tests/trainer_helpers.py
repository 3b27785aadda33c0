"""Helpers for the trainer tests: run the trainer as the operator's pods do (torchrun configured by PET_*
variables, configuration in KUBETRAIN_CONFIG), parse its JSON log lines, scrape its metrics."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parent.parent
TRAINER_SRC = REPO / "trainer_image"
VENV_BIN = Path(sys.executable).parent
TORCHRUN = str(VENV_BIN / "torchrun")


def trainer_env(config: Mapping[str, Any], ckpt: Path, *, nproc: int | None = None, metrics_port: int = 0,
                extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PET_", "KUBETRAIN_", "TORCHELASTIC_")) and k not in {"RANK", "WORLD_SIZE",
                                                                                   "LOCAL_RANK", "MASTER_ADDR",
                                                                                   "MASTER_PORT"}}
    env.update({
        "OMP_NUM_THREADS": "1",  # CPU time is scarce: one thread per process, as torchrun would set
        "PYTHONPATH": os.pathsep.join([str(TRAINER_SRC), str(REPO / "tests"), env.get("PYTHONPATH", "")]),
        "KUBETRAIN_CONFIG": json.dumps(config),
        "KUBETRAIN_CHECKPOINT_DIR": str(ckpt),
        "KUBETRAIN_METRICS_PORT": str(metrics_port),
        "PYTHONUNBUFFERED": "1",
    })
    if nproc is not None:
        # Exactly what the operator sets in each pod (one node here).
        env.update({
            "PET_NNODES": "1",
            "PET_NPROC_PER_NODE": str(nproc),
            "PET_RDZV_BACKEND": "c10d",
            "PET_RDZV_ENDPOINT": "127.0.0.1:0",
            "PET_RDZV_ID": f"test-{uuid.uuid4().hex[:8]}",
            "PET_MAX_RESTARTS": "0",
            # torchrun >= 2.4 shares one TCPStore across rendezvous rounds, so restarted workers read the
            # dead workers' gloo addresses and fail to connect; the image sets this too (see Dockerfile).
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        })
    env.update(extra or {})
    return env


def command(nproc: int | None) -> list[str]:
    """torchrun when ``nproc`` is given, else a plain single process (no torchrun env at all)."""
    if nproc is None:
        return [sys.executable, "-m", "kubetrain_trainer"]
    return [TORCHRUN, "-m", "kubetrain_trainer"]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def events(self) -> list[dict[str, Any]]:
        return parse_events(self.stdout)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == kind]

    def losses(self) -> dict[int, float]:
        return {e["step"]: e["loss"] for e in self.of("step")}


def parse_events(stdout: str) -> list[dict[str, Any]]:
    out = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def run_trainer(config: Mapping[str, Any], ckpt: Path, *, nproc: int | None = 2, timeout: float = 150,
                extra: Mapping[str, str] | None = None, metrics_port: int = 0) -> Result:
    proc = subprocess.run(command(nproc), env=trainer_env(config, ckpt, nproc=nproc, extra=extra,
                                                          metrics_port=metrics_port),
                          capture_output=True, text=True, timeout=timeout, cwd=REPO, check=False)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def start_trainer(config: Mapping[str, Any], ckpt: Path, *, nproc: int | None = 2, metrics_port: int = 0,
                  extra: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(command(nproc), env=trainer_env(config, ckpt, nproc=nproc, metrics_port=metrics_port,
                                                            extra=extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)


def stop_process_group(proc: subprocess.Popen[str]) -> None:
    """Kill what a test started, if it is still running: its session, and torchrun's workers, which have
    sessions of their own (a worker the test froze with SIGSTOP would otherwise outlive it)."""
    if proc.poll() is None:
        workers = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        for worker in workers:
            with contextlib.suppress(psutil.NoSuchProcess):
                worker.kill()
        proc.wait(timeout=30)


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """All samples of a metrics endpoint, by sample name."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return samples


def wait_for(condition: Callable[[], Any], timeout: float, what: str, proc: subprocess.Popen[str] | None = None) -> Any:
    """Poll ``condition`` until it returns a truthy value; fail early if ``proc`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except OSError:
            value = None
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} while waiting for {what}: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
