"""The training loop: accumulate, reduce, step, log, evaluate, checkpoint, stop gracefully.

Every rank agrees on each step's summed loss, stop vote and gradient norm (a SIGTERM that reached one pod, a
NaN on one rank), so all stop at the same step. Under DDP the loss and the vote ride in its gradient all-reduce
(parallel.StepVotes); otherwise one collective carries all three. Reading them is the one place per step where
the CPU waits for the GPU.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817 - the name everyone uses
from torch.utils.data import IterableDataset

from .checkpoint import Checkpointer, TrainState
from .config import Config, ConfigError
from .data import Loader, ResumableDistributedSampler, build_loader
from .distributed import DistContext
from .gpu import peak_flops
from .metrics import TrainerMetrics
from .parallel import StepVotes, autocast, build_optimizer, grad_sync, lr_at, to_device, wrap_model
from .stopping import StopFlag
from .tasks import Task

__all__ = ["EXIT_NONFINITE", "EXIT_STOPPED", "MAX_CONSECUTIVE_NONFINITE", "NonFiniteLossError", "train"]

EXIT_STOPPED: Final = 143  # 128 + SIGTERM: stopped on request, checkpoint saved; not a crash
EXIT_NONFINITE: Final = 4
# While a checkpoint is written the heartbeat beats from a thread this often, for at most this long.
KEEP_ALIVE_SECONDS: Final = 5.0
KEEP_ALIVE_LIMIT_SECONDS: Final = 3600.0
MAX_CONSECUTIVE_NONFINITE: Final = 5  # skipped steps in a row (NaN/inf loss or gradient) before failing
# fp16: the GradScaler's overflow skips do not count toward that limit while its scale is at least this.
MIN_CALIBRATING_SCALE: Final = 1.0
# Test hook: "STEP" or "STEP:RANK" makes that rank SIGKILL itself after STEP, in the first torchrun
# attempt only (TORCHELASTIC_RESTART_COUNT == 0), to prove kill-and-resume without timing races.
KILL_AT_STEP_ENV: Final = "KUBETRAIN_TEST_KILL_AT_STEP"


class NonFiniteLossError(RuntimeError):
    pass


def log_json(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "time": round(time.time(), 3), **fields}), flush=True)


@dataclass
class Batches:
    """An endless stream of micro-batches that tracks epoch and the global data position.

    Map-style datasets (with a sampler) resume at the exact sample. Iterable datasets (no sampler) resume at
    the start of the checkpoint's epoch; each rank cycles through its own shard, so a rank with less data
    never leaves its peers waiting in a collective.
    """

    loader: Loader
    sampler: ResumableDistributedSampler | None
    global_batch: int  # samples per micro-step over all ranks
    dataset_len: int
    state: TrainState
    _it: Iterator[Any] | None = None

    def _start_epoch(self, skip: int) -> None:
        if self.sampler is not None:
            self.sampler.set_position(self.state.epoch, skip)
        else:
            set_epoch = getattr(self.loader.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.state.epoch)
        self._it = iter(self.loader)

    def close(self) -> None:
        """End the epoch's iterator now (its read-ahead thread or DataLoader workers), not at garbage collection."""
        it, self._it = self._it, None
        for name in ("close", "_shutdown_workers"):  # a generator's, a multi-process DataLoader iterator's
            stop = getattr(it, name, None)
            if callable(stop):
                stop()

    def next(self) -> Any:
        if self._it is None:
            self._start_epoch(self.state.epoch_samples)
        assert self._it is not None
        try:
            batch = next(self._it)
        except StopIteration:
            self.state.epoch += 1
            self.state.epoch_samples = 0
            self._start_epoch(0)
            batch = next(self._it, None)
            if batch is None:
                raise ValueError("this rank's share of the training data is empty: give the dataset at least "
                                 "one batch per rank (and, for file shards, a file per rank and worker)") from None
        self.state.epoch_samples = min(self.state.epoch_samples + self.global_batch, self.dataset_len)
        return batch


def plan_total_steps(max_steps: int | None, epochs: int | None, batches_per_epoch: int, accumulation: int) -> int:
    if max_steps is not None:
        return max_steps
    assert epochs is not None
    return max(epochs * batches_per_epoch // accumulation, 1)


def evaluate(model: nn.Module, task: Task, loader: Loader, ctx: DistContext, precision: str, *,
             alive: Callable[[], None] = lambda: None) -> dict[str, float]:
    """Mean of each eval metric over the whole held-out set (sums and counts all-reduced); ``alive`` is
    called at every batch, so a long evaluation keeps the heartbeat."""
    if task.eval_fn is None:
        return {}
    model.eval()
    sums: dict[str, list[float]] = {}
    with torch.no_grad(), autocast(precision, ctx.device):
        for batch in loader:
            alive()
            for key, (total, count) in task.eval_fn(model, to_device(batch, ctx.device)).items():
                acc = sums.setdefault(key, [0.0, 0.0])
                acc[0] += total
                acc[1] += count
    model.train()
    keys = sorted(sums)
    packed = torch.tensor([v for k in keys for v in sums[k]], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(packed)
    return {k: packed[2 * i].item() / max(packed[2 * i + 1].item(), 1.0) for i, k in enumerate(keys)}


def beat(m: TrainerMetrics) -> None:
    """The training loop is alive (the heartbeat the operator's stall detection reads)."""
    m.heartbeat_timestamp = time.time()


@contextlib.contextmanager
def keep_alive(m: TrainerMetrics, every: float = KEEP_ALIVE_SECONDS,
               limit: float = KEEP_ALIVE_LIMIT_SECONDS) -> Iterator[None]:
    """Beat from a thread while one long blocking call runs (a checkpoint write), for at most ``limit``
    seconds: a write that hangs longer stops beating, and the operator sees the stall."""
    done = threading.Event()

    def ticker() -> None:
        deadline = time.monotonic() + limit
        while not done.wait(every) and time.monotonic() < deadline:
            beat(m)

    beat(m)
    thread = threading.Thread(target=ticker, name="keep-alive", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        beat(m)


def _kill_hook(ctx: DistContext) -> int | None:
    raw = os.environ.get(KILL_AT_STEP_ENV, "")
    if not raw or ctx.restart_count != 0:
        return None
    step, _, rank = raw.partition(":")
    return int(step) if int(rank or ctx.world_size - 1) == ctx.rank else None


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    stop: bool
    data_s: float
    forward_backward_s: float
    checkpoint: bool = False  # a rank was asked to checkpoint now (POST /checkpoint): all save this step


class Trainer:
    """One process's share of the job: built from the task, run to the planned step count."""

    def __init__(self, cfg: Config, ctx: DistContext, task: Task, metrics: TrainerMetrics, stop: StopFlag, *,
                 checkpoint_asked: threading.Event | None = None) -> None:
        self.cfg, self.tc, self.ctx, self.task, self.metrics, self.stop = cfg, cfg.trainer, ctx, task, metrics, stop
        self.checkpoint_asked = checkpoint_asked
        # DDP's static graph cannot skip the gradient sync (no_sync) of accumulation micro-steps (an internal
        # assert), and is left out under torch.compile, whose DDP graph splitting it was not tested with.
        static = task.static_graph and self.tc.grad_accumulation == 1 and not self.tc.compile
        self.raw_model = wrap_model(task.model, self.tc, ctx, task.shard_units, static)
        self.votes = (StepVotes(self.raw_model, ctx.world_size)
                      if isinstance(self.raw_model, DDP) and ctx.world_size > 1 else None)
        self.optimizer = build_optimizer(self.raw_model, self.tc.optimizer, ctx.device)
        # The compiled module runs the steps; the uncompiled wrapper keeps the plain names checkpoints use.
        self.model: nn.Module = (torch.compile(self.raw_model) if self.tc.compile  # type: ignore[assignment]
                                 else self.raw_model)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.tc.precision == "fp16" and ctx.device.type == "cuda")
        self.ckpt = Checkpointer(Path(cfg.checkpoint.path), cfg.checkpoint.keep, ctx.rank, ctx.world_size)
        self.state = self._restore()
        metrics.step = self.state.step
        metrics.started = True
        self.last_saved = self.state.step if metrics.resumed_from_step >= 0 else -1
        self._build_data()
        self.samples_per_step = self.tc.batch_size * ctx.world_size * self.tc.grad_accumulation
        cuda = ctx.device.type == "cuda"
        self.peak = peak_flops(torch.cuda.get_device_name(ctx.device)) if cuda else None
        self.kill_at = _kill_hook(ctx)

    def _restore(self) -> TrainState:
        """Resume from the newest complete checkpoint, if any and if allowed."""
        self.ckpt.prepare()
        state = TrainState(world_size=self.ctx.world_size, seed=self.tc.seed)
        latest = self.ckpt.latest() if self.cfg.checkpoint.resume else None
        if latest is not None:
            state = self.ckpt.load(latest[1], self.raw_model, self.optimizer)
            self.metrics.resumed_from_step = self.metrics.checkpoint_last_step = state.step
            if state.last_loss is not None:
                self.metrics.loss_last = state.last_loss
            if self.ctx.is_main:
                log_json("resume", step=state.step, epoch=state.epoch, checkpoint=str(latest[1]),
                         saved_world_size=state.world_size, world_size=self.ctx.world_size)
        state.world_size, state.seed = self.ctx.world_size, self.tc.seed
        return state

    def _build_data(self) -> None:
        tc, ctx, data, task = self.tc, self.ctx, self.cfg.data, self.task
        pin = ctx.device.type == "cuda"
        sampler: ResumableDistributedSampler | None = None
        if isinstance(task.train_dataset, IterableDataset):
            if tc.max_steps is None:
                raise ConfigError("trainer.epochs: an iterable (file-sharded) dataset has no known length; "
                                  "set maxSteps")
            train_len, self.batches_per_epoch = 0, -1  # unknown: the dataset shards itself
        else:
            train_len = len(task.train_dataset)  # type: ignore[arg-type]
            sampler = ResumableDistributedSampler(task.train_dataset, ctx.world_size, ctx.rank, tc.seed,
                                                  drop_last=data.drop_last)
            per_rank = len(sampler)
            self.batches_per_epoch = (per_rank // tc.batch_size if data.drop_last
                                      else math.ceil(per_rank / tc.batch_size))
        loader = build_loader(task.train_dataset, sampler, batch_size=tc.batch_size, workers=data.workers,
                              prefetch_factor=data.prefetch_factor, drop_last=data.drop_last, pin_memory=pin,
                              collate_fn=task.collate_fn)
        if self.batches_per_epoch == 0:
            raise ConfigError(f"the training set ({train_len} samples) is smaller than one global batch "
                             f"({tc.batch_size} x {ctx.world_size} ranks)")
        self.total = plan_total_steps(tc.max_steps, tc.epochs, self.batches_per_epoch, tc.grad_accumulation)
        # For an iterable dataset the position is not tracked (dataset_len 0): it resumes at its epoch start.
        self.stream = Batches(loader, sampler, tc.batch_size * ctx.world_size, train_len, self.state)
        self.eval_loader: Loader | None = None
        if task.eval_dataset is not None and task.eval_fn is not None:
            # Padded (drop_last False) so that every rank runs as many eval batches: FSDP needs it.
            eval_sampler = ResumableDistributedSampler(task.eval_dataset, ctx.world_size, ctx.rank, 0,
                                                       shuffle=False, drop_last=False)
            self.eval_loader = build_loader(task.eval_dataset, eval_sampler, batch_size=tc.batch_size, workers=0,
                                            prefetch_factor=2, drop_last=False, pin_memory=pin,
                                            collate_fn=task.collate_fn)

    def run(self) -> int:
        """Train to the planned step; returns 0, or :data:`EXIT_STOPPED` after a graceful stop."""
        m, state = self.metrics, self.state
        m.total_steps, m.step, m.epoch = self.total, state.step, state.epoch
        m.samples_total, m.tokens_total, m.model_flops_total = (state.samples_total, state.tokens_total,
                                                                state.flops_total)
        if self.ctx.is_main:
            log_json("start", total_steps=self.total, step=state.step, world_size=self.ctx.world_size,
                     strategy=self.tc.strategy, device=str(self.ctx.device),
                     batches_per_epoch=self.batches_per_epoch, samples_per_step=self.samples_per_step,
                     data_workers=self.stream.loader.num_workers, threads=torch.get_num_threads())
        self.model.train()
        with self.stop.watching(m):
            return self._train()

    def _train(self) -> int:
        m, state = self.metrics, self.state
        consecutive_bad = 0
        self.window_start, self.window_samples = time.monotonic(), 0
        while state.step < self.total:
            step_start = time.monotonic()
            result = self._forward_backward()
            t_opt = time.monotonic()
            if not (math.isfinite(result.loss) and math.isfinite(result.grad_norm)):
                calibrating = self._scaler_overflow(result)
                consecutive_bad += 0 if calibrating else 1
                self._skip_step(result, consecutive_bad, counted=not calibrating)
                continue
            consecutive_bad = 0
            lr = self._optimizer_step()
            now = time.monotonic()
            _record(m, state, result, lr=lr, step_s=now - step_start, opt_s=now - t_opt)
            if self._after_step(result, lr, now):
                return EXIT_STOPPED
        self._evaluate()
        if self.last_saved != state.step:
            self._save()
        if self.ctx.is_main:
            log_json("done", step=state.step, loss=m.loss_last, eval_loss=m.eval_loss,
                     **{f"eval_{k}": v for k, v in m.eval_metrics.items()})
        return 0

    def _forward_backward(self) -> StepResult:
        """Accumulate gradients over the micro-batches, then agree with every rank on loss, norm and stop."""
        tc, device = self.tc, self.ctx.device
        loss_sum = torch.zeros((), device=device)
        votes: torch.Tensor | None = None
        data_s = fb_s = 0.0
        for micro in range(tc.grad_accumulation):
            t0 = time.monotonic()
            batch = to_device(self.stream.next(), device)
            t1 = time.monotonic()
            last = micro == tc.grad_accumulation - 1
            with grad_sync(self.raw_model, last), autocast(tc.precision, device):
                loss = self.task.loss_fn(self.model, batch) / tc.grad_accumulation
            loss_sum += loss.detach().float()
            if last and self.votes is not None:
                votes = self._votes()
                self.votes.send(torch.cat([loss_sum.reshape(1), votes]))
            scaled: torch.Tensor = self.scaler.scale(loss)  # unchanged unless fp16 on GPU
            torch.autograd.backward(scaled)
            data_s += t1 - t0
            fb_s += time.monotonic() - t1
        self.scaler.unscale_(self.optimizer)
        clip = tc.grad_clip if tc.grad_clip > 0 else math.inf  # inf: measure the norm, change nothing
        norm = torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), clip)
        if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor norm over the shards
            norm = norm.full_tensor()
        votes = self._votes() if votes is None else votes
        loss_val, stop_votes, checkpoint_votes, grad_norm = self._agree(loss_sum, votes, norm.float())
        return StepResult(loss_val, grad_norm, stop_votes > 0, data_s, fb_s, checkpoint=checkpoint_votes > 0)

    def _votes(self) -> torch.Tensor:
        """This rank's say for the step: stop (SIGTERM), and checkpoint now (asked once: the request is taken)."""
        request, asked = self.checkpoint_asked, False
        if request is not None and request.is_set():
            request.clear()
            asked = True
        return torch.tensor([float(self.stop.requested), float(asked)], device=self.ctx.device)

    def _agree(self, loss_sum: torch.Tensor, votes: torch.Tensor,
               norm: torch.Tensor) -> tuple[float, float, float, float]:
        """(the mean loss over the ranks, the stop votes, the checkpoint votes, the gradient norm), the same on
        every rank."""
        world = self.ctx.world_size
        summed = self.votes.summed if self.votes is not None else None
        if summed is not None:  # carried by DDP's all-reduce, whose averaged gradients gave every rank this norm
            loss_val, stops, checkpoints, grad_norm = torch.cat([summed.to(norm.device), norm.reshape(1)]).tolist()
            return loss_val / world, stops, checkpoints, grad_norm  # the step's one CPU-GPU synchronisation
        packed = torch.cat([loss_sum.reshape(1), votes, norm.reshape(1)])
        if world > 1:  # alone, the all-reduce would only add a collective's latency to every step
            dist.all_reduce(packed)
        loss_val, stops, checkpoints, norm_sum = packed.tolist()  # the step's one CPU-GPU synchronisation
        return loss_val / world, stops, checkpoints, norm_sum / world

    def _scaler_overflow(self, result: StepResult) -> bool:
        """An fp16 GradScaler's normal overflow: a finite loss, inf/NaN gradients, and a scale it can still halve.

        The scaler starts at 2**16 and halves after each overflow until gradients fit in fp16; those skipped
        steps are its calibration (and, later, one every few thousand steps), not a diverging job. Below a
        scale of 1 the gradients overflow unscaled: that counts again.
        """
        return (self.scaler.is_enabled() and math.isfinite(result.loss)
                and self.scaler.get_scale() >= MIN_CALIBRATING_SCALE)

    def _skip_step(self, result: StepResult, consecutive: int, *, counted: bool = True) -> None:
        """Drop a NaN/inf update (the weights stay finite); count it and fail after too many in a row, unless
        it is the fp16 scaler's overflow (not ``counted``), whose update() just halved the scale."""
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.update()
        if not counted:
            if self.ctx.is_main:
                log_json("grad_scaler_overflow", step=self.state.step, loss=result.loss,
                         scale=self.scaler.get_scale())
            return
        self.metrics.nonfinite_total += 1
        if self.ctx.is_main:
            log_json("nonfinite", step=self.state.step, loss=result.loss, grad_norm=result.grad_norm,
                     consecutive=consecutive)
        if consecutive >= MAX_CONSECUTIVE_NONFINITE:
            raise NonFiniteLossError(f"loss or gradient was NaN/inf for {consecutive} consecutive steps at step "
                                     f"{self.state.step}; lower the learning rate or check the data")

    def _optimizer_step(self) -> float:
        state = self.state
        lr = lr_at(state.step, self.tc.optimizer.lr, self.tc.warmup_steps, self.total, self.tc.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.scaler.step(self.optimizer)
        self.scaler.update()
        # set_to_none frees gradient memory and skips a memset; the next backward allocates fresh.
        self.optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.samples_total += self.samples_per_step
        state.tokens_total += self.samples_per_step * self.task.tokens_per_sample
        state.flops_total += self.samples_per_step * self.task.flops_per_sample
        return lr

    def _after_step(self, result: StepResult, lr: float, now: float) -> bool:
        """Log, evaluate, checkpoint; True when the job must stop now (SIGTERM somewhere)."""
        step, tc, m = self.state.step, self.tc, self.metrics
        self.window_samples += self.samples_per_step
        if step % tc.log_every_steps == 0 or step == self.total:
            m.samples_per_second = self.window_samples / max(now - self.window_start, 1e-9)
            if self.peak is not None and self.task.flops_per_sample:
                m.mfu = m.samples_per_second * self.task.flops_per_sample / (self.ctx.world_size * self.peak)
            self.window_start, self.window_samples = now, 0
            if self.ctx.is_main:
                log_json("step", step=step, total_steps=self.total, epoch=self.state.epoch,
                         loss=round(result.loss, 6), lr=lr, grad_norm=round(result.grad_norm, 4),
                         samples_per_s=round(m.samples_per_second, 1),
                         **({"mfu": round(m.mfu, 4)} if m.mfu is not None else {}))
        if tc.eval_every_steps and step % tc.eval_every_steps == 0 and step < self.total:
            self._evaluate()
        every = self.cfg.checkpoint.every_steps
        if result.stop:
            self.stop.agreed()  # the checkpoint below has the pod's grace period, not the watchdog's patience
        if result.checkpoint and not result.stop and self.ctx.is_main:
            log_json("checkpoint_asked", step=step)
        if result.stop or result.checkpoint or (every and step % every == 0):
            self._save()
        if result.stop:
            if self.ctx.is_main:
                log_json("stopped", step=step, reason="SIGTERM", exit_code=EXIT_STOPPED)
            return True
        if self.kill_at is not None and step == self.kill_at:
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return False

    def _save(self) -> None:
        with keep_alive(self.metrics):  # one blocking call: a thread beats for it
            seconds = self.ckpt.save(self.raw_model, self.optimizer, self.state)
        self.last_saved = self.state.step
        self.metrics.checkpoint_duration.observe(seconds)
        self.metrics.phase_seconds["checkpoint"] += seconds
        self.metrics.checkpoint_last_step = self.state.step
        if self.ctx.is_main:
            log_json("checkpoint", step=self.state.step, seconds=round(seconds, 3))

    def _evaluate(self) -> None:
        if self.eval_loader is None:
            return
        results = evaluate(self.model, self.task, self.eval_loader, self.ctx, self.tc.precision,
                           alive=functools.partial(beat, self.metrics))
        self.metrics.eval_loss = results.get("loss")
        self.metrics.eval_metrics = {k: v for k, v in results.items() if k != "loss"}
        if self.ctx.is_main:
            log_json("eval", step=self.state.step, **{k: round(v, 5) for k, v in results.items()})


def train(cfg: Config, ctx: DistContext, task: Task, metrics: TrainerMetrics, stop: StopFlag, *,
          checkpoint_asked: threading.Event | None = None) -> int:
    """Run the job's training on this process; returns 0 or :data:`EXIT_STOPPED`. ``checkpoint_asked``: set
    (from another thread) to have the gang checkpoint at its next step."""
    trainer = Trainer(cfg, ctx, task, metrics, stop, checkpoint_asked=checkpoint_asked)
    try:
        return trainer.run()
    finally:
        trainer.stream.close()


def _record(m: TrainerMetrics, state: TrainState, result: StepResult, *, lr: float, step_s: float,
            opt_s: float) -> None:
    m.step, m.epoch = state.step, state.epoch
    m.loss_last, m.learning_rate, m.grad_norm = result.loss, lr, result.grad_norm
    state.last_loss = result.loss
    m.loss_sum += result.loss
    m.loss_count += 1
    m.samples_total, m.tokens_total, m.model_flops_total = state.samples_total, state.tokens_total, state.flops_total
    m.last_step_timestamp = m.heartbeat_timestamp = time.time()
    m.step_duration.observe(step_s)
    m.slowest_step_seconds = max(m.slowest_step_seconds, step_s)
    m.phase_seconds["data_wait"] += result.data_s
    m.phase_seconds["forward_backward"] += result.forward_backward_s
    m.phase_seconds["optimizer"] += opt_s
