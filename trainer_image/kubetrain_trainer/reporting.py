"""Progress, loss and a heartbeat from your own training script, as the built-in trainer reports them.

::

    from kubetrain_trainer import report

    for step in range(start + 1, total + 1):
        loss = train_one_step()
        report(step=step, total_steps=total, loss=loss.item(), samples=global_batch_size)

The first call starts a metrics server on ``KUBETRAIN_METRICS_PORT + LOCAL_RANK`` (the pod's ports; 0
disables) serving the built-in trainer's ``trainer_*`` series (:class:`~kubetrain_trainer.metrics.TrainerMetrics`),
so the operator's scrape of rank 0 fills ``kubectl get tj`` (step, loss, ETA), the step's time is the heartbeat
of stall detection, and the dashboards work. Every rank serves what it reports; the operator reads local rank 0
of pod 0, so report job-wide values there (an all-reduced loss if you have one, ``samples`` for all ranks).

Nothing is made up: no series exists until the first report, families it is not told about (learning rate,
step phases, checkpoints, ...) are left out, the heartbeat moves only when the step does, and the samples
rate is measured between reports. At exit, local rank 0 leaves the last report as the
container's termination message, which the operator (and ``kubetrain run``) read as the final step and loss.
A call costs a few attribute writes and two clock reads; this module imports neither torch nor the operator.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Final, SupportsFloat

from .config import RunEnv
from .metrics import MetricsServer, TrainerMetrics, serve
from .termination import write_termination_message

__all__ = ["Reporter", "report"]

# The samples rate is measured over at least this long, so one fast or slow step does not swing the ETA.
RATE_WINDOW_SECONDS: Final = 5.0
# What report() is not told: these families are left out rather than served as zeros or "no checkpoint".
UNREPORTED: Final = frozenset({
    "trainer_learning_rate", "trainer_grad_norm", "trainer_tokens", "trainer_model_flops",
    "trainer_step_phase_seconds", "trainer_checkpoint_duration_seconds", "trainer_checkpoint_last_step",
    "trainer_resumed_from_step",
})


class Reporter:
    """The metrics of this process, updated by :meth:`report` and served from the first report on."""

    def __init__(self, env: Mapping[str, str] | None = None, rate_window_seconds: float = RATE_WINDOW_SECONDS,
                 ) -> None:
        env = os.environ if env is None else env
        self.env = env
        local_rank = int(env.get("LOCAL_RANK", "0"))
        self.metrics = TrainerMetrics(rank=int(env.get("RANK", "0")), local_rank=local_rank,
                                      world_size=int(env.get("WORLD_SIZE", "1")), unreported=UNREPORTED,
                                      job_wide=True)  # a program's ranks serve what they are told, each
        base = RunEnv.from_env(env).metrics_port
        self.port = base + local_rank if base > 0 else 0
        self.rate_window_seconds = rate_window_seconds
        self.server: MetricsServer | None = None
        self._step_at = 0.0  # monotonic time of the last step change
        self._window_start = 0.0
        self._window_samples = 0.0

    def report(self, step: int, *, total_steps: int | None = None, loss: SupportsFloat | None = None,
               samples: float | None = None, epoch: int | None = None) -> None:
        """Record where training is. ``samples``: samples the whole job consumed since the previous report."""
        m, now = self.metrics, time.monotonic()
        first = not m.started
        if first:
            self._begin(now)
        elif step > m.step:
            advanced = step - m.step
            m.step_duration.observe((now - self._step_at) / advanced, advanced)
        if first or step != m.step:
            m.step, self._step_at = step, now
            m.last_step_timestamp = m.heartbeat_timestamp = time.time()
        if total_steps is not None:
            m.total_steps = total_steps
        if epoch is not None:
            m.epoch = epoch
        if loss is not None:
            self._record_loss(float(loss))
        if samples:
            self._record_samples(samples, now, first)
        m.started = True  # last: a scrape never sees the first report half written

    def close(self) -> None:
        """Stop serving and forget the exit-time message (for tests; a program just exits)."""
        atexit.unregister(self.write_last_words)
        if self.server is not None:
            self.server.close()
            self.server = None

    def write_last_words(self) -> None:
        """The last report as the termination message, once the program reached its total_steps.

        A program that dies before its end leaves the message alone: the kubelet then keeps the tail of its
        log (FallbackToLogsOnError), whose traceback says more than "last report: step N".
        """
        m = self.metrics
        if not m.total_steps or m.step < m.total_steps:
            return
        record: dict[str, object] = {"reason": "Reported", "step": m.step,
                                     "message": f"last report: step {m.step}"}
        if math.isfinite(m.loss_last):
            record["loss"] = m.loss_last
        if m.total_steps:
            record["totalSteps"] = m.total_steps
        write_termination_message(record, self.env)

    def _begin(self, now: float) -> None:
        self._window_start = now
        atexit.register(self.write_last_words)
        if not self.port:
            return
        try:
            self.server = serve(self.metrics, self.port)
        except OSError as exc:  # training goes on; the missing progress is then visible, not hidden
            print(f"kubetrain_trainer.report: cannot serve metrics on port {self.port}: {exc}", file=sys.stderr)

    def _record_loss(self, loss: float) -> None:
        m = self.metrics
        m.loss_last = loss
        if math.isfinite(loss):
            m.loss_sum += loss
            m.loss_count += 1
        else:
            m.nonfinite_total += 1

    def _record_samples(self, samples: float, now: float, first: bool) -> None:
        m = self.metrics
        m.samples_total += samples
        if first:
            return  # consumed before the window opened: unknown over how long
        self._window_samples += samples
        elapsed = now - self._window_start
        if elapsed >= self.rate_window_seconds:
            m.samples_per_second = self._window_samples / elapsed
            self._window_start, self._window_samples = now, 0.0


@functools.cache
def process_reporter() -> Reporter:
    """This process's reporter (made on the first call, from the environment torchrun and the pod set)."""
    return Reporter()


def report(step: int, *, total_steps: int | None = None, loss: SupportsFloat | None = None,
           samples: float | None = None, epoch: int | None = None) -> None:
    """Report this process's training progress (see the module's documentation); call it after each step.

    ``step``: optimizer steps done so far (continue from your checkpoint's step after a restart);
    ``total_steps``: planned steps of the whole run (progress and ETA); ``loss``: the step's loss, a float
    (a tensor works but waits for the GPU); ``samples``: samples the whole job consumed since the previous
    call (the global batch size when called every step); ``epoch``: the current epoch.
    """
    process_reporter().report(step, total_steps=total_steps, loss=loss, samples=samples, epoch=epoch)
