"""Prometheus metrics of one training process, served on ``KUBETRAIN_METRICS_PORT + LOCAL_RANK``.

Every series carries the labels ``rank`` and ``local_rank``. The training loop only assigns plain Python
attributes of :class:`TrainerMetrics` (a few hundred nanoseconds per step); the text is rendered when
Prometheus scrapes, on the metrics server's own thread and straight from those attributes (no metric
objects), which keeps the step-time overhead negligible and lets counters *continue* from a checkpoint's
value after a resume (a prometheus-client Counter could only start at zero).

Which rank serves what: the job-wide series (the same value on every rank: progress, loss, learning rate,
samples, tokens, FLOPs, checkpoints, evaluation; marked *job* below) are served by rank 0 only, which is the
rank the operator scrapes; every rank serves its own series (``trainer_step``, ``trainer_world_size``, the
heartbeat, step durations and phases, checkpoint durations, GPU), so ``count(trainer_world_size)`` still
counts the ranks that answer. A user program's :func:`kubetrain_trainer.report` serves what it is told on
every rank.

Progress (what the operator reads from rank 0 of pod 0, port 9400):

=========================================  =======  ===============================================
name                                       type     meaning
=========================================  =======  ===============================================
trainer_steps_total                        counter  job: optimizer steps of the job so far
                                                    (continues from the checkpoint on resume)
trainer_step                               gauge    the same value as a gauge (every rank)
trainer_total_steps                        gauge    job: planned optimizer steps of the whole run
trainer_epoch                              gauge    job: current epoch (0-based)
trainer_loss_last                          gauge    job: last step's training loss averaged over all ranks
                                                    (NaN before the first step; after a resume,
                                                    the checkpoint's last loss until the next step)
trainer_loss                               summary  job: _sum/_count of the (all-reduced) step losses
trainer_samples_per_second                 gauge    job: samples/s over the last log interval
trainer_last_step_timestamp_seconds        gauge    unix time of the last optimizer step
trainer_heartbeat_timestamp_seconds        gauge    unix time the training loop last showed life: a step,
                                                    an evaluation batch, a checkpoint being written
                                                    (the operator's stall detection reads this)
trainer_checkpoint_last_step               gauge    job: step of the newest complete checkpoint (-1: none)
trainer_resumed_from_step                  gauge    job: step this attempt resumed from (-1: fresh start)
trainer_world_size                         gauge    processes in the job (every rank: count them)
=========================================  =======  ===============================================

Throughput and health: trainer_samples_total, trainer_tokens_total (counters, job),
trainer_learning_rate, trainer_grad_norm (all-reduced; gauges, job), trainer_step_duration_seconds
(histogram), trainer_step_phase_seconds_total{phase="data_wait|forward_backward|optimizer|checkpoint"}
(counter, this rank; data_wait is the time each step waited for its batches, so data_wait over
trainer_step_duration_seconds_sum is the share of step time spent starved), trainer_checkpoint_duration_seconds
(histogram), trainer_nonfinite_loss_total (counter, job), trainer_model_flops_total (counter, job model FLOPs;
MFU = rate / (world size x peak)), trainer_mfu_ratio (gauge, job, only when the task reports FLOPs and a GPU
peak is known), trainer_eval_loss and trainer_eval_metric{name} (gauges, job, after each evaluation).

GPU (only when CUDA and NVML are present; see :mod:`kubetrain_trainer.gpu`): trainer_gpu_utilization_ratio,
trainer_gpu_memory_used_bytes, trainer_gpu_memory_total_bytes, trainer_gpu_power_watts,
trainer_gpu_temperature_celsius, trainer_gpu_allocator_allocated_bytes, trainer_gpu_allocator_reserved_bytes,
trainer_gpu_allocator_peak_bytes, trainer_gpu_alloc_retries_total, trainer_gpu_ooms_total.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Final

from .exposition import ExpositionServer, header, label_text, number, render_families

__all__ = ["JOB_WIDE", "PHASES", "Histogram", "MetricsServer", "TrainerMetrics", "serve"]

PHASES = ("data_wait", "forward_backward", "optimizer", "checkpoint")
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Families (names without a counter's _total) that are the same on every rank: rank 0 alone serves them.
JOB_WIDE: Final = frozenset({
    "trainer_steps", "trainer_total_steps", "trainer_epoch", "trainer_loss_last", "trainer_loss",
    "trainer_learning_rate", "trainer_grad_norm", "trainer_samples", "trainer_tokens", "trainer_model_flops",
    "trainer_samples_per_second", "trainer_mfu_ratio", "trainer_checkpoint_last_step", "trainer_resumed_from_step",
    "trainer_nonfinite_loss", "trainer_eval_loss", "trainer_eval_metric",
})


@dataclass
class Histogram:
    """A cumulative histogram kept as plain counts (observed from one thread)."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        """Record ``value`` ``times`` times (a reporter that learns of k steps at once, each about ``value``)."""
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.total += value * times
        self.n += times

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0
        for bound, count in zip([*map(str, self.buckets), "+Inf"], self.counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out


@dataclass(frozen=True)
class _Series:
    """One gauge or counter of :class:`TrainerMetrics` with only the rank labels; its header is made once."""

    name: str  # a counter's without _total, as in JOB_WIDE and TrainerMetrics.unreported
    kind: str
    doc: str
    read: Callable[[TrainerMetrics], float | None]  # None: absent (not known yet)

    @cached_property
    def sample(self) -> str:
        return self.name + "_total" if self.kind == "counter" else self.name

    @cached_property
    def head(self) -> str:
        return header(self.sample, self.kind, self.doc)


SERIES: Final = (
    _Series("trainer_steps", "counter", "Optimizer steps of the job (continues after resume).", lambda m: m.step),
    _Series("trainer_step", "gauge", "Current optimizer step of the job.", lambda m: m.step),
    _Series("trainer_total_steps", "gauge", "Planned optimizer steps of the run.", lambda m: m.total_steps),
    _Series("trainer_epoch", "gauge", "Current epoch (0-based).", lambda m: m.epoch),
    _Series("trainer_world_size", "gauge", "Processes in the job.", lambda m: m.world_size),
    _Series("trainer_loss_last", "gauge", "Last training loss, averaged over all ranks.", lambda m: m.loss_last),
    _Series("trainer_learning_rate", "gauge", "Learning rate of the last step.", lambda m: m.learning_rate),
    _Series("trainer_grad_norm", "gauge", "Gradient norm before clipping (last step).", lambda m: m.grad_norm),
    _Series("trainer_samples", "counter", "Samples consumed by the job (all ranks).", lambda m: m.samples_total),
    _Series("trainer_tokens", "counter", "Tokens consumed by the job (all ranks).", lambda m: m.tokens_total),
    _Series("trainer_model_flops", "counter", "Model FLOPs of the job (all ranks).", lambda m: m.model_flops_total),
    _Series("trainer_samples_per_second", "gauge", "Job-wide samples per second.", lambda m: m.samples_per_second),
    _Series("trainer_mfu_ratio", "gauge", "Model FLOPs utilisation against the GPU's peak.", lambda m: m.mfu),
    _Series("trainer_last_step_timestamp_seconds", "gauge", "Unix time of the last step.",
            lambda m: m.last_step_timestamp),
    _Series("trainer_heartbeat_timestamp_seconds", "gauge",
            "Unix time the training loop last showed life (a step, an evaluation batch, a checkpoint being written).",
            lambda m: m.heartbeat_timestamp or None),
    _Series("trainer_checkpoint_last_step", "gauge", "Step of the newest checkpoint (-1: none).",
            lambda m: m.checkpoint_last_step),
    _Series("trainer_resumed_from_step", "gauge", "Step this attempt resumed from (-1: fresh start).",
            lambda m: m.resumed_from_step),
    _Series("trainer_nonfinite_loss", "counter", "Steps whose loss was NaN or infinite.", lambda m: m.nonfinite_total),
    _Series("trainer_eval_loss", "gauge", "Loss on the held-out set at the last evaluation.", lambda m: m.eval_loss),
)
HISTOGRAMS: Final = (
    ("trainer_step_duration_seconds", "Duration of an optimizer step.", "step_duration"),
    ("trainer_checkpoint_duration_seconds", "Duration of a checkpoint save.", "checkpoint_duration"),
)


@dataclass(eq=False)  # identity hashing, as a collector's
class TrainerMetrics:
    """The values the loop updates; rendered by :meth:`render` at scrape time, on the server's thread."""

    rank: int
    local_rank: int
    world_size: int
    step: int = 0
    total_steps: int = 0
    epoch: int = 0
    loss_last: float = float("nan")
    loss_sum: float = 0.0
    loss_count: int = 0
    learning_rate: float = 0.0
    grad_norm: float = 0.0
    samples_total: float = 0.0
    tokens_total: float = 0.0
    model_flops_total: float = 0.0
    samples_per_second: float = 0.0
    mfu: float | None = None
    last_step_timestamp: float = 0.0
    heartbeat_timestamp: float = 0.0
    slowest_step_seconds: float = 0.0  # of this process (see stopping.py)
    checkpoint_last_step: int = -1
    resumed_from_step: int = -1
    nonfinite_total: int = 0
    eval_loss: float | None = None
    eval_metrics: dict[str, float] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    step_duration: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS))
    checkpoint_duration: Histogram = field(default_factory=lambda: Histogram(CHECKPOINT_BUCKETS))
    # Each is called at scrape time with the label names and values and yields prometheus-client families.
    extra_collectors: list[Callable[[list[str], list[str]], Iterable[Any]]] = field(default_factory=list)
    # False until the run has restored its checkpoint: before that, step 0 and "no resume" would be
    # reported (and read by the operator) for a run that is about to continue from step N.
    started: bool = False
    # Families this process cannot know (a user program's learning rate, say): left out, never shown as 0.
    unreported: frozenset[str] = frozenset()
    # Whether to serve the JOB_WIDE families; None: rank 0 only (the one the operator scrapes).
    job_wide: bool | None = None

    def render(self) -> str:
        """This process's exposition (empty before the run started)."""
        if not self.started:
            return ""
        left_out = self.unreported if self.serves_job_wide else self.unreported | JOB_WIDE
        labels = self._labels
        out = [f"{s.head}{s.sample}{labels} {number(value)}\n" for s in SERIES
               if s.name not in left_out and (value := s.read(self)) is not None]
        out.extend(self._render_labelled(left_out))
        names, values = ["rank", "local_rank"], [str(self.rank), str(self.local_rank)]
        out.append(render_families(f for extra in self.extra_collectors for f in extra(names, values)))
        return "".join(out)

    @property
    def serves_job_wide(self) -> bool:
        return self.rank == 0 if self.job_wide is None else self.job_wide

    @cached_property
    def _labels(self) -> str:
        return label_text(self._label_map)

    @cached_property
    def _label_map(self) -> dict[str, str]:
        return {"rank": str(self.rank), "local_rank": str(self.local_rank)}

    def _render_labelled(self, left_out: frozenset[str]) -> Iterator[str]:
        """The summary, the histograms and the families with a label beyond the rank's."""
        labels, more = self._labels, self._label_map
        if "trainer_loss" not in left_out:
            yield header("trainer_loss", "summary", "Training loss (all-reduced) per step.")
            yield f"trainer_loss_count{labels} {number(self.loss_count)}\n"
            yield f"trainer_loss_sum{labels} {number(self.loss_sum)}\n"
        if "trainer_step_phase_seconds" not in left_out:
            yield header("trainer_step_phase_seconds_total", "counter", "Time per phase of the step on this rank.")
            for phase, seconds in self.phase_seconds.items():
                yield f"trainer_step_phase_seconds_total{label_text({**more, 'phase': phase})} {number(seconds)}\n"
        for name, doc, attribute in HISTOGRAMS:
            if name in left_out:
                continue
            hist: Histogram = getattr(self, attribute)
            yield header(name, "histogram", doc)
            for bound, count in hist.cumulative():
                yield f"{name}_bucket{label_text({**more, 'le': bound})} {number(count)}\n"
            yield f"{name}_count{labels} {number(float(sum(hist.counts)))}\n{name}_sum{labels} {number(hist.total)}\n"
        if self.eval_metrics and "trainer_eval_metric" not in left_out:
            yield header("trainer_eval_metric", "gauge", "Held-out metrics at the last evaluation.")
            for key, value in sorted(self.eval_metrics.items()):
                yield f"trainer_eval_metric{label_text({**more, 'name': key})} {number(value)}\n"


@dataclass
class MetricsServer:
    port: int
    close: Callable[[], None]


def serve(metrics: TrainerMetrics, port: int, on_checkpoint: Callable[[], None] | None = None) -> MetricsServer:
    """Serve ``metrics`` alone (no process collectors) on ``port``; port 0 is not allowed here.
    ``on_checkpoint``: what ``POST /checkpoint`` does (none: it answers 501)."""
    server = ExpositionServer(port, metrics.render, on_checkpoint=on_checkpoint)
    return MetricsServer(port=port, close=server.close)
