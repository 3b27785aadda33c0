"""Prometheus metrics of one training process, served on ``KUBETRAIN_METRICS_PORT + LOCAL_RANK``.

Every series carries the labels ``rank`` and ``local_rank``. The training loop only assigns plain Python
attributes of :class:`TrainerMetrics` (a few hundred nanoseconds per step); the families are built when
Prometheus scrapes, which keeps the step-time overhead negligible and lets counters *continue* from a
checkpoint's value after a resume (a prometheus-client Counter could only start at zero).

Progress (what the operator reads from rank 0 of pod 0, port 9400):

=========================================  =======  ===============================================
name                                       type     meaning
=========================================  =======  ===============================================
trainer_steps_total                        counter  optimizer steps of the job so far (same on every
                                                    rank; continues from the checkpoint on resume)
trainer_step                               gauge    the same value as a gauge
trainer_total_steps                        gauge    planned optimizer steps of the whole run
trainer_epoch                              gauge    current epoch (0-based)
trainer_loss_last                          gauge    last step's training loss averaged over all ranks
                                                    (NaN before the first step; after a resume,
                                                    the checkpoint's last loss until the next step)
trainer_loss                               summary  _sum/_count of the (all-reduced) step losses
trainer_samples_per_second                 gauge    job-wide samples/s over the last log interval
trainer_last_step_timestamp_seconds        gauge    unix time of the last optimizer step (heartbeat)
trainer_checkpoint_last_step               gauge    step of the newest complete checkpoint (-1: none)
trainer_resumed_from_step                  gauge    step this attempt resumed from (-1: fresh start)
trainer_world_size                         gauge    processes in the job
=========================================  =======  ===============================================

Throughput and health: trainer_samples_total, trainer_tokens_total (counters, job-wide),
trainer_learning_rate, trainer_grad_norm (gauges), trainer_step_duration_seconds (histogram),
trainer_step_phase_seconds_total{phase="data_wait|forward_backward|optimizer|checkpoint"} (counter, this
rank), trainer_checkpoint_duration_seconds (histogram), trainer_nonfinite_loss_total (counter),
trainer_model_flops_total (counter, job-wide model FLOPs; MFU = rate / (world size x peak)),
trainer_mfu_ratio (gauge, only when the task reports FLOPs and a GPU peak is known),
trainer_eval_loss and trainer_eval_metric{name} (gauges, after each evaluation).

GPU (only when CUDA and NVML are present; see :mod:`kubetrain_trainer.gpu`): trainer_gpu_utilization_ratio,
trainer_gpu_memory_used_bytes, trainer_gpu_memory_total_bytes, trainer_gpu_power_watts,
trainer_gpu_temperature_celsius, trainer_gpu_allocator_allocated_bytes, trainer_gpu_allocator_reserved_bytes,
trainer_gpu_allocator_peak_bytes, trainer_gpu_alloc_retries_total, trainer_gpu_ooms_total.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

__all__ = ["PHASES", "Histogram", "MetricsServer", "TrainerMetrics", "serve"]

PHASES = ("data_wait", "forward_backward", "optimizer", "checkpoint")
STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


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


@dataclass(eq=False)  # identity hashing: the registry keys collectors by object
class TrainerMetrics:
    """The values the loop updates; read by :meth:`collect` at scrape time."""

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
    checkpoint_last_step: int = -1
    resumed_from_step: int = -1
    nonfinite_total: int = 0
    eval_loss: float | None = None
    eval_metrics: dict[str, float] = field(default_factory=dict)
    phase_seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    step_duration: Histogram = field(default_factory=lambda: Histogram(STEP_BUCKETS))
    checkpoint_duration: Histogram = field(default_factory=lambda: Histogram(CHECKPOINT_BUCKETS))
    extra_collectors: list[Callable[[list[str], list[str]], Iterable[Any]]] = field(default_factory=list)
    # False until the run has restored its checkpoint: before that, step 0 and "no resume" would be
    # reported (and read by the operator) for a run that is about to continue from step N.
    started: bool = False
    # Families this process cannot know (a user program's learning rate, say): left out, never shown as 0.
    unreported: frozenset[str] = frozenset()

    def describe(self) -> Iterable[Any]:
        # Empty: the registry then skips calling collect() at registration time.
        return []

    def collect(self) -> Iterator[Any]:
        if not self.started:
            return
        for family in self._families():
            if family.name not in self.unreported:
                yield family

    def _families(self) -> Iterator[Any]:
        names, values = ["rank", "local_rank"], [str(self.rank), str(self.local_rank)]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=names)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=names)
            c.add_metric(values, value)
            return c

        yield counter("trainer_steps", "Optimizer steps of the job (continues after resume).", self.step)
        yield gauge("trainer_step", "Current optimizer step of the job.", self.step)
        yield gauge("trainer_total_steps", "Planned optimizer steps of the run.", self.total_steps)
        yield gauge("trainer_epoch", "Current epoch (0-based).", self.epoch)
        yield gauge("trainer_world_size", "Processes in the job.", self.world_size)
        yield gauge("trainer_loss_last", "Last training loss, averaged over all ranks.", self.loss_last)
        summary = SummaryMetricFamily("trainer_loss", "Training loss (all-reduced) per step.", labels=names)
        summary.add_metric(values, count_value=self.loss_count, sum_value=self.loss_sum)
        yield summary
        yield gauge("trainer_learning_rate", "Learning rate of the last step.", self.learning_rate)
        yield gauge("trainer_grad_norm", "Gradient norm before clipping (last step).", self.grad_norm)
        yield counter("trainer_samples", "Samples consumed by the job (all ranks).", self.samples_total)
        yield counter("trainer_tokens", "Tokens consumed by the job (all ranks).", self.tokens_total)
        yield counter("trainer_model_flops", "Model FLOPs of the job (all ranks).", self.model_flops_total)
        yield gauge("trainer_samples_per_second", "Job-wide samples per second.", self.samples_per_second)
        if self.mfu is not None:
            yield gauge("trainer_mfu_ratio", "Model FLOPs utilisation against the GPU's peak.", self.mfu)
        yield gauge("trainer_last_step_timestamp_seconds", "Unix time of the last step (heartbeat).",
                    self.last_step_timestamp)
        yield gauge("trainer_checkpoint_last_step", "Step of the newest checkpoint (-1: none).",
                    self.checkpoint_last_step)
        yield gauge("trainer_resumed_from_step", "Step this attempt resumed from (-1: fresh start).",
                    self.resumed_from_step)
        yield counter("trainer_nonfinite_loss", "Steps whose loss was NaN or infinite.", self.nonfinite_total)
        phases = CounterMetricFamily("trainer_step_phase_seconds", "Time per phase of the step on this rank.",
                                     labels=[*names, "phase"])
        for phase, seconds in self.phase_seconds.items():
            phases.add_metric([*values, phase], seconds)
        yield phases
        for name, doc, hist in (
            ("trainer_step_duration_seconds", "Duration of an optimizer step.", self.step_duration),
            ("trainer_checkpoint_duration_seconds", "Duration of a checkpoint save.", self.checkpoint_duration),
        ):
            h = HistogramMetricFamily(name, doc, labels=names)
            h.add_metric(values, hist.cumulative(), sum_value=hist.total)
            yield h
        if self.eval_loss is not None:
            yield gauge("trainer_eval_loss", "Loss on the held-out set at the last evaluation.", self.eval_loss)
        if self.eval_metrics:
            ev = GaugeMetricFamily("trainer_eval_metric", "Held-out metrics at the last evaluation.",
                                   labels=[*names, "name"])
            for key, value in sorted(self.eval_metrics.items()):
                ev.add_metric([*values, key], value)
            yield ev
        for extra in self.extra_collectors:
            yield from extra(names, values)


@dataclass
class MetricsServer:
    port: int
    close: Callable[[], None]


def serve(metrics: TrainerMetrics, port: int) -> MetricsServer:
    """Serve ``metrics`` alone (no process collectors) on ``port``; port 0 is not allowed here."""
    registry = CollectorRegistry(auto_describe=False)
    collector: Collector = metrics  # structural: collect() and describe()
    registry.register(collector)
    server, thread = start_http_server(port, registry=registry)

    def close() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return MetricsServer(port=port, close=close)

