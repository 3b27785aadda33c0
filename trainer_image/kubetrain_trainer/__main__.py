"""kubetrain's built-in trainer: DDP/FSDP2, sharded data, atomic resumable checkpoints, Prometheus metrics.

Run it
------
One process (CPU or one GPU; no torchrun needed)::

    KUBETRAIN_CONFIG='{"trainer": {"task": "digits", "maxSteps": 200}}' \\
    KUBETRAIN_CHECKPOINT_DIR=/tmp/ckpt python -m kubetrain_trainer

torchrun on one node, 4 processes (one per GPU, or CPU processes over gloo)::

    KUBETRAIN_CHECKPOINT_DIR=/tmp/ckpt torchrun --nproc-per-node 4 -m kubetrain_trainer

Two nodes (run on each; this is what the operator's pods do, through PET_* variables)::

    PET_NNODES=2 PET_NPROC_PER_NODE=8 PET_RDZV_BACKEND=c10d PET_RDZV_ENDPOINT=job-0.job:29400 \\
    PET_RDZV_ID=job-uid-0 KUBETRAIN_CHECKPOINT_DIR=/checkpoints torchrun -m kubetrain_trainer

Configuration: ``KUBETRAIN_CONFIG`` (JSON; see :mod:`kubetrain_trainer.config`); tasks and the user
entrypoint contract: :mod:`kubetrain_trainer.tasks`; metrics: :mod:`kubetrain_trainer.metrics` (each rank
serves ``KUBETRAIN_METRICS_PORT`` (default 9400) + LOCAL_RANK; 0 disables).

Exit codes (of each worker process)
-----------------------------------
- 0: training finished (final checkpoint written).
- 1: unexpected error (traceback on stderr).
- 2: invalid configuration (a user error; retrying will not help).
- 3: preflight failed (devices missing, peers unreachable).
- 4: loss or gradient NaN/inf for 5 consecutive steps (each such step is skipped and counted).
- 5: SIGTERM while blocked on a peer that is gone: no checkpoint could be agreed (see :mod:`.stopping`); or a
  peer left and no replacement joined within ``KUBETRAIN_REJOIN_TIMEOUT_SECONDS`` (see :mod:`.rejoin`).
- 143: stopped by SIGTERM after saving a checkpoint (a graceful stop, not a crash).

Under torchrun the container's exit code is torchrun's: 0 when every worker exited 0, otherwise 1 (a
SIGTERM to torchrun also ends in 1). The worker's reason is therefore also written as one JSON line to the
Kubernetes termination message (``/dev/termination-log``, or ``KUBETRAIN_TERMINATION_LOG``) by local rank 0,
e.g. ``{"reason": "Stopped", "exitCode": 143, "step": 1200}``; reasons: Stopped, ConfigError,
PreflightFailed, NonFiniteLoss, PeerLost, Error, and Completed (exit 0, with the final loss and held-out metrics).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Final

import torch

from .config import Config, ConfigError, RunEnv, load_config
from .distributed import DistContext, PreflightError, init_distributed, preflight, teardown
from .gpu import gpu_collector
from .loop import EXIT_NONFINITE, EXIT_STOPPED, NonFiniteLossError, log_json, train
from .metrics import MetricsServer, TrainerMetrics, serve
from .rejoin import RendezvousWatch, Waited, peer_lost, rejoin_timeout, wait_to_rejoin
from .stopping import EXIT_PEER_LOST, StopFlag
from .tasks import Task, TaskContext, build_task
from .termination import write_termination_message

EXIT_ERROR: Final = 1
EXIT_CONFIG: Final = 2
EXIT_PREFLIGHT: Final = 3


def _termination_message(reason: str, code: int, step: int | None, message: str = "", **extra: float) -> None:
    """Tell Kubernetes why this container ended (it reads the file into the pod status)."""
    write_termination_message({"reason": reason, "exitCode": code, "step": step, "message": message, **extra})


def _arguments_answered(argv: list[str]) -> int | None:
    """The trainer takes no arguments (its configuration is KUBETRAIN_CONFIG): answer --help, refuse the rest.

    Without this, `torchrun -m kubetrain_trainer --help` would start training and write checkpoints.
    """
    if not argv:
        return None
    if argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    print(f"kubetrain-trainer: unexpected arguments {argv}: it is configured through KUBETRAIN_CONFIG "
          "(see --help)", file=sys.stderr)
    return EXIT_CONFIG


def _report_end(code: int, metrics: TrainerMetrics) -> None:
    """The termination message of a run that ended by itself (Completed) or on SIGTERM (Stopped)."""
    if code == EXIT_STOPPED:
        _termination_message("Stopped", code, metrics.step, "SIGTERM: checkpoint saved")
        return
    evals = {"evalLoss": metrics.eval_loss} if metrics.eval_loss is not None else {}
    # Where this attempt resumed: the operator may never have scraped a short attempt.
    resumed = {"resumedFromStep": metrics.resumed_from_step} if metrics.resumed_from_step >= 0 else {}
    _termination_message("Completed", code, metrics.step, f"loss {metrics.loss_last:.4g}",
                         loss=metrics.loss_last, **resumed,
                         **evals, **{f"eval{k[:1].upper()}{k[1:]}": v for k, v in metrics.eval_metrics.items()})


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # The graceful SIGTERM handler is installed when the training loop starts; until then SIGTERM keeps its
    # default action (exit at once): there is nothing to save yet, and a process blocked in rendezvous or
    # in loading could not run a Python handler anyway.
    stop = StopFlag(give_up=lambda step, message: _termination_message("PeerLost", EXIT_PEER_LOST, step, message))
    try:
        cfg = load_config()
        run_env = RunEnv.from_env(os.environ)
    except ConfigError as exc:
        print(f"kubetrain-trainer: invalid configuration: {exc}", file=sys.stderr)
        _termination_message("ConfigError", EXIT_CONFIG, None, str(exc))
        return EXIT_CONFIG

    try:
        ctx = init_distributed()
        preflight(ctx)
    except PreflightError as exc:
        print(f"kubetrain-trainer: preflight failed: {exc}", file=sys.stderr)
        _termination_message("PreflightFailed", EXIT_PREFLIGHT, None, str(exc))
        teardown()
        return EXIT_PREFLIGHT

    return _run(cfg, run_env, ctx, stop)


def _run(cfg: Config, run_env: RunEnv, ctx: DistContext, stop: StopFlag) -> int:
    """Train with metrics served; every failure ends as an exit code and a termination message."""
    metrics = TrainerMetrics(rank=ctx.rank, local_rank=ctx.local_rank, world_size=ctx.world_size)
    server: MetricsServer | None = None
    rejoin = rejoin_timeout(os.environ)
    checkpoint_asked = threading.Event()  # POST /checkpoint on the metrics port
    try:
        server = _serve_metrics(metrics, run_env, ctx, checkpoint_asked.set)
        code = train(cfg, ctx, _seeded_task(cfg, ctx), metrics, stop, checkpoint_asked=checkpoint_asked)
        if code == EXIT_STOPPED and not stop.requested and rejoin is not None:
            return _await_replacement(rejoin, stop, metrics)  # the gang stopped for a peer's SIGTERM, not ours
        _report_end(code, metrics)
        return code
    except ConfigError as exc:
        print(f"kubetrain-trainer: invalid configuration: {exc}", file=sys.stderr)
        _termination_message("ConfigError", EXIT_CONFIG, metrics.step, str(exc))
        return EXIT_CONFIG
    except NonFiniteLossError as exc:
        print(f"kubetrain-trainer: {exc}", file=sys.stderr)
        _termination_message("NonFiniteLoss", EXIT_NONFINITE, metrics.step, str(exc))
        return EXIT_NONFINITE
    except Exception as exc:
        if rejoin is not None and peer_lost(exc):
            print(f"kubetrain-trainer: {type(exc).__name__}: {exc}", file=sys.stderr)
            return _await_replacement(rejoin, stop, metrics)
        traceback.print_exc()
        _termination_message("Error", EXIT_ERROR, metrics.step, f"{type(exc).__name__}: {exc}")
        return EXIT_ERROR
    finally:
        if server is not None:
            server.close()
        teardown()
        if ctx.is_main:
            log_json("exit", step=metrics.step)


def _await_replacement(timeout: float, stop: StopFlag, metrics: TrainerMetrics) -> int:
    """A peer left: alive until torchrun restarts this worker with its replacement (rejoin.py)."""
    waited = wait_to_rejoin(timeout, lambda: stop.requested, RendezvousWatch(os.environ).closed)
    if waited is Waited.STOPPED:
        _termination_message("Stopped", EXIT_STOPPED, metrics.step, "SIGTERM while waiting for a lost peer's "
                             "replacement (the last checkpoint stands)")
        return EXIT_STOPPED
    if waited is Waited.CLOSED:
        message = ("a peer's torchrun gave up (its workers failed) and closed the gang's rendezvous: no replacement "
                   "can join it; the gang starts again")
    else:
        message = f"a peer left the gang and no replacement joined within {timeout:.0f} s"
    print(f"kubetrain-trainer: {message}", file=sys.stderr)
    _termination_message("PeerLost", EXIT_PEER_LOST, metrics.step, message)
    return EXIT_PEER_LOST


def _serve_metrics(metrics: TrainerMetrics, run_env: RunEnv, ctx: DistContext,
                   on_checkpoint: Callable[[], None]) -> MetricsServer | None:
    collector = gpu_collector(ctx.device)
    if collector is not None:
        metrics.extra_collectors.append(collector)
    if run_env.metrics_port > 0:
        return serve(metrics, run_env.metrics_port + ctx.local_rank, on_checkpoint)
    return None


def _seeded_task(cfg: Config, ctx: DistContext) -> Task:
    # Identical initial weights on every rank (FSDP2 shards each rank's local copy); afterwards each
    # rank draws its own random numbers (dropout and the like).
    torch.manual_seed(cfg.trainer.seed)
    task = build_task(TaskContext(trainer=cfg.trainer, options=cfg.trainer.options,
                                  data_dir=Path(cfg.data.path), rank=ctx.rank, world_size=ctx.world_size,
                                  device=ctx.device))
    torch.manual_seed(cfg.trainer.seed + ctx.rank)
    return task


def run(argv: list[str]) -> int:
    """The command line: ``--help`` answered here, anything else refused, no arguments trains."""
    answered = _arguments_answered(argv)
    return main() if answered is None else answered


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
