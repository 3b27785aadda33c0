"""Processes the lab starts: each in its own session, output to a file, always stopped with its tree."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import psutil


def log_line(topic: str, message: str) -> None:
    """A timestamped progress line on stderr (`[lab build 12:00:00] ...`): long builds show they are alive."""
    print(f"[{topic} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive flock: concurrent builders of one cache entry (CI's and a pytest session's) wait in turn."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def heartbeat(say: Callable[[float], None], every: float = 30.0) -> Iterator[None]:
    """Call ``say(seconds elapsed)`` every ``every`` seconds while the block runs."""
    started = time.monotonic()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every):
            say(time.monotonic() - started)
    threading.Thread(target=beat, daemon=True).start()
    try:
        yield
    finally:
        done.set()


def wait_for(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def answers_ok(url: str) -> bool:
    """Whether a plain-HTTP health endpoint (``/ready``, ``/readyz``) answers 200 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def kill_tree(pid: int, grace: float = 10.0) -> None:
    """SIGTERM a process and its descendants, SIGKILL what is left after ``grace`` seconds."""
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    procs = [root, *root.children(recursive=True)]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=5)


def stop_group(process: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM a child started in a session of its own (its whole process group), SIGKILL the group if it
    is still there after ``grace`` seconds. Nothing to do when it has exited."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


class ManagedProcess:
    """A long-running component (etcd, apiserver...) with its log in the run directory."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=self.env,
            )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def check_alive(self) -> None:
        if self.popen is not None and self.popen.poll() is not None:
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}; see {self.log_path}:\n"
                               + self.tail())

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""

    def stop(self, grace: float = 10.0) -> None:
        if self.popen is None:
            return
        kill_tree(self.popen.pid, grace)
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)
