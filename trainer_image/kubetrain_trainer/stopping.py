"""SIGTERM: stop at the next step boundary with a checkpoint, or give up when no boundary can come.

Every rank reads the stop flag once per step and agrees on it in the step's all-reduce, so all stop at the same
step and write one checkpoint together. That needs every peer. When one is gone without closing its
connections (a lost node; a crashed rank under NCCL), the others wait in a collective that never ends, and a
main thread blocked in C++ runs no Python signal handler either: they would sit out the pod's whole grace
period (60 s by default, often minutes for big checkpoints) before the kubelet kills them and the gang
restart can go on.

So SIGTERM is also seen by a watchdog thread, through the signal wakeup file descriptor (written by the C
signal handler, whatever the main thread does). If the training loop then shows no life (no heartbeat: a
step, an evaluation batch, a checkpoint being written) for its patience, no checkpoint can be agreed: the
process says so (``give_up``) and exits with :data:`EXIT_PEER_LOST` at once. The patience is the larger of
:data:`STOP_PATIENCE_MIN_SECONDS` and :data:`STOP_PATIENCE_STEPS` times the slowest step so far, so a healthy
gang always reaches its boundary first.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Final

from .metrics import TrainerMetrics

__all__ = ["EXIT_PEER_LOST", "STOP_PATIENCE_MIN_SECONDS", "STOP_PATIENCE_STEPS", "StopFlag", "stop_patience"]

EXIT_PEER_LOST: Final = 5  # SIGTERM while blocked on a peer that is gone: exited without a checkpoint
STOP_PATIENCE_MIN_SECONDS: Final = 10.0
STOP_PATIENCE_STEPS: Final = 3.0
WATCH_INTERVAL_SECONDS: Final = 0.5

GiveUp = Callable[[int, str], None]  # (step, message): tell the operator why, before the exit


def stop_patience(slowest_step_seconds: float) -> float:
    """How long a rank may show no life after SIGTERM before it gives up on a checkpoint."""
    return max(STOP_PATIENCE_MIN_SECONDS, STOP_PATIENCE_STEPS * slowest_step_seconds)


class StopFlag:
    """Set by SIGTERM; read once per step and agreed across ranks in the step's all-reduce."""

    def __init__(self, give_up: GiveUp | None = None) -> None:
        self.requested = False
        self._give_up = give_up
        self._agreed = threading.Event()  # the ranks agreed to stop (or training ended): nothing to watch

    @contextlib.contextmanager
    def watching(self, metrics: TrainerMetrics) -> Iterator[None]:
        """Around the training loop, on the main thread (before it SIGTERM simply ends the process): the flag
        and its watchdog. The flag's handler stays after it, so that a late SIGTERM still lets the process write
        its last words; the previous wakeup fd comes back."""
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        signal.signal(signal.SIGTERM, self._handle)
        wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        watchdog = threading.Thread(target=self._watch, args=(reader, metrics), name="stop-watchdog", daemon=True)
        watchdog.start()
        try:
            yield
        finally:
            self._agreed.set()
            signal.set_wakeup_fd(wakeup)
            writer.close()  # the watchdog's read ends: it returns
            watchdog.join(timeout=5)
            reader.close()

    def agreed(self) -> None:
        """Every rank agreed to stop at this step: the checkpoint is written under the pod's grace period."""
        self._agreed.set()

    def _handle(self, signum: int, _frame: Any) -> None:
        self.requested = True

    def _watch(self, reader: socket.socket, metrics: TrainerMetrics) -> None:
        try:
            while signal.SIGTERM not in (received := reader.recv(64)):
                if not received:
                    return  # closed: training is over
        except OSError:
            return
        terminated_at = time.time()
        patience = stop_patience(metrics.slowest_step_seconds)
        while not self._agreed.wait(WATCH_INTERVAL_SECONDS):
            silent = time.time() - (metrics.heartbeat_timestamp or terminated_at)
            if silent >= patience:
                self._exit(metrics, silent)

    def _exit(self, metrics: TrainerMetrics, silent: float) -> None:
        if metrics.slowest_step_seconds:
            message = (f"SIGTERM, and no step boundary for {silent:.0f} s (more than {STOP_PATIENCE_MIN_SECONDS:.0f} s "
                       f"and {STOP_PATIENCE_STEPS:.0f} of its slowest steps): blocked on a peer that is gone, so no "
                       f"checkpoint can be agreed; exiting without one (the last checkpoint stands)")
        else:
            message = f"SIGTERM before the first step of this attempt ended ({silent:.0f} s): nothing new to save"
        print(f"kubetrain-trainer: {message}", file=sys.stderr, flush=True)
        if self._give_up is not None:
            self._give_up(metrics.step, message)
        sys.stdout.flush()
        os._exit(EXIT_PEER_LOST)
