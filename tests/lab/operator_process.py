"""`kubetrain operator` as a local process of a lab (no image can run here), restartable, its log in a file.

Shared by the operator tests (tests/operator_fixtures.py) and the benchmarks (bench/cluster.py); the
identity it runs with comes from :func:`tests.lab.chart.install_identity`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from kubetrain.cli.ports import free_port
from tests.lab.procs import stop_group, wait_for


class OperatorProcess:
    """`kubetrain operator` as a child process, restartable, with its log in a file."""

    def __init__(self, kubeconfig: Path, log_path: Path, args: tuple[str, ...],
                 progress_interval: float | None = 2) -> None:
        """``progress_interval``: seconds between reads of a running job's progress (tests see it change soon);
        None: the operator's default."""
        self.kubeconfig = kubeconfig
        self.log_path = log_path
        self.args = args
        self.progress_interval = progress_interval
        self.metrics_port = free_port()
        self.liveness_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "kubetrain", "operator", *self.args,
                f"--metrics-port={self.metrics_port}",
                f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz"]
        if self.progress_interval is not None:
            argv.append(f"--progress-interval={self.progress_interval:g}")
        env = os.environ | {"KUBECONFIG": str(self.kubeconfig)}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        wait_for(self.alive, 60, "the operator's liveness endpoint", interval=0.2)

    def alive(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"the operator exited with {self.process.returncode}; see {self.log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as answer:
            text: str = answer.read().decode()
            return text

    def kill(self, signum: int = signal.SIGKILL) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signum)
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")
