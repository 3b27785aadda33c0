"""What the trainer's own machinery costs a step, measured in-process against a baseline in the same run.

Every trainer run here is the real code path: :func:`kubetrain_trainer.config.parse_config`,
:func:`kubetrain_trainer.tasks.build_task` (the built-in ``synthetic`` task),
:class:`kubetrain_trainer.loop.Trainer` and its ``run()`` (DDP over gloo with world size 1 on an in-memory
store, exactly what ``python -m kubetrain_trainer`` does without torchrun), with its metrics served by
:func:`kubetrain_trainer.metrics.serve` and scraped while it trains. Running it in this process rather than
as ``python -m kubetrain_trainer`` keeps torch's start-up (seconds here) out of the budget and lets the
trainer and the bare loop alternate run by run, so that a busy spell of this shared 2-core machine hits both.

- ``trainer.step_time_vs_bare_loop``: time per step of ``Trainer.run()`` (metrics served, scraped every 2 s)
  over a bare loop written below (same model, data, batch, AdamW, gradient clipping, DDP world size 1, one
  thread each), over the steps past warm-up. Time is this process's CPU time (``time.process_time``: the
  loop and every thread it starts), which other processes on a shared machine inflate far less than the
  wall clock; best of 4 interleaved runs per side (3 with ``--quick``). The wall-clock ratios are printed too.
- ``trainer.data_wait_share``: ``trainer_step_phase_seconds_total{phase="data_wait"}`` over
  ``trainer_step_duration_seconds_sum``, both read from the trainer's endpoint (deltas between a scrape past
  warm-up and the final one), configured with ``data.workers: 2`` (the CRD's default; the synthetic task's
  in-memory ``TensorDataset`` is then gathered in the training process, a batch at a time and read ahead on a
  thread, as :mod:`kubetrain_trainer.data` documents).
- ``trainer.scrape_p95_500_series``: p95 of HTTP GET /metrics plus parsing, against the real
  :class:`~kubetrain_trainer.metrics.TrainerMetrics` collector (with extra labelled series to make 500),
  interleaved with scrapes of an empty registry (the HTTP floor), reported next to it.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median, percentile
from kubetrain.cli.ports import free_port

__all__ = [
    "BENCHMARKS",
    "PhaseTotals",
    "bare_loop",
    "count_series",
    "data_wait_share",
    "padding_collector",
    "ratio",
    "run_trainer_inprocess",
    "scrape",
]

BATCH = 256
LOG_EVERY = 25
WARMUP_FRACTION = 0.25  # steps before this fraction of the run are not timed (first batches, allocator warm-up)
SCRAPE_EVERY_S = 2.0  # while training: 7-15x more often than Prometheus (15-30 s), so any cost shows
PHASE_SCRAPE_EVERY_S = 0.5  # the data-wait runs: often enough that a scrape lands past warm-up
TARGET_SERIES = 500
LR = 1e-3
GRAD_CLIP = 1.0  # the trainer's default gradClip; the bare loop clips too, as nanoGPT-style loops do


# ---------------------------------------------------------------- pure arithmetic (unit-tested)


def ratio(numerator_s: float, denominator_s: float) -> float:
    """``numerator / denominator``; a ratio of two non-positive times is meaningless, so it raises."""
    if numerator_s <= 0 or denominator_s <= 0:
        raise ValueError(f"times must be positive: {numerator_s} / {denominator_s}")
    return numerator_s / denominator_s


@dataclass(frozen=True)
class PhaseTotals:
    """The trainer's cumulative step counters at one scrape."""

    step: float
    data_wait: float
    forward_backward: float
    optimizer: float
    step_seconds: float  # trainer_step_duration_seconds_sum
    steps_observed: float  # trainer_step_duration_seconds_count

    def minus(self, earlier: PhaseTotals) -> PhaseTotals:
        return PhaseTotals(*(a - b for a, b in zip(self.values(), earlier.values(), strict=True)))

    def values(self) -> tuple[float, ...]:
        return (self.step, self.data_wait, self.forward_backward, self.optimizer, self.step_seconds,
                self.steps_observed)


def data_wait_share(delta: PhaseTotals) -> float:
    """Percent of step time spent waiting for data, over an interval (a difference of two scrapes)."""
    if delta.step_seconds <= 0:
        raise ValueError("no step time in the interval")
    return 100.0 * delta.data_wait / delta.step_seconds


def parse_exposition(text: str) -> dict[str, float]:
    """Series -> value of one exposition, read as Prometheus's own (Go) text parser reads it: one sample per
    line that is neither blank nor a comment, the value after the last space (prometheus-client writes no
    timestamps). Counting what the server sends this way keeps the scraper's cost the server's, not that of
    prometheus-client's pure-Python reference parser (about 11 ms for 500 series here, on its own)."""
    series: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        key, _, value = line.rpartition(" ")
        series[key] = float(value)
    return series


def _name_and_labels(key: str) -> tuple[str, dict[str, str]]:
    name, _, rest = key.partition("{")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return name, labels


def phases_from_exposition(text: str) -> PhaseTotals:
    """The step counters from one ``/metrics`` text (Prometheus exposition format)."""
    found: dict[str, float] = {}
    for key, value in parse_exposition(text).items():
        name, labels = _name_and_labels(key)
        if name == "trainer_step":
            found["step"] = value
        elif name == "trainer_step_phase_seconds_total":
            found[labels["phase"]] = value
        elif name == "trainer_step_duration_seconds_sum":
            found["sum"] = value
        elif name == "trainer_step_duration_seconds_count":
            found["count"] = value
    missing = {"step", "data_wait", "forward_backward", "optimizer", "sum", "count"} - set(found)
    if missing:
        raise RuntimeError(f"the trainer's endpoint lacks {sorted(missing)}")
    return PhaseTotals(found["step"], found["data_wait"], found["forward_backward"], found["optimizer"],
                       found["sum"], found["count"])


def count_series(text: str) -> int:
    """Series (samples) in one exposition."""
    return len(parse_exposition(text))


# ---------------------------------------------------------------- plumbing


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        body: bytes = answer.read()
    return body.decode("utf-8")


@dataclass
class _Scraper:
    """Scrapes a port every ``every_s`` in a thread, keeping each exposition's step counters."""

    port: int
    every_s: float
    seen: list[PhaseTotals] = field(default_factory=list)
    errors: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.seen.append(phases_from_exposition(scrape(self.port)))
            except (OSError, RuntimeError):
                self.errors += 1  # not started yet (no step series before the restore): counted, not fatal

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread for both sides (the other core is the OS's, the loader's, the other engineer's)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _process_group() -> Iterator[Any]:
    """The trainer's own one-process group (``init_distributed`` without torchrun), torn down after."""
    import torch.distributed as dist

    from kubetrain_trainer.distributed import init_distributed, teardown

    if dist.is_available() and dist.is_initialized():
        raise RuntimeError("a torch.distributed process group already exists in this process")
    sigterm = signal.getsignal(signal.SIGTERM)  # Trainer.run() installs its graceful-stop handler
    ctx = init_distributed({})
    try:
        yield ctx
    finally:
        teardown()
        signal.signal(signal.SIGTERM, sigterm)


def _task(ctx: Any) -> Any:
    from kubetrain_trainer.config import parse_config
    from kubetrain_trainer.tasks import TaskContext, build_task

    cfg = parse_config(_config(steps=1, workers=0, checkpoints=Path("/nonexistent")), env={})
    return build_task(TaskContext(trainer=cfg.trainer, options=cfg.trainer.options, data_dir=Path(cfg.data.path),
                                  rank=ctx.rank, world_size=ctx.world_size, device=ctx.device))


def _config(*, steps: int, workers: int, checkpoints: Path) -> dict[str, Any]:
    return {
        "trainer": {"task": "synthetic", "maxSteps": steps, "batchSize": BATCH, "logEverySteps": LOG_EVERY,
                    "precision": "fp32", "gradClip": GRAD_CLIP, "optimizer": {"name": "adamw", "lr": LR}},
        "data": {"workers": workers},
        # everySteps 0: no periodic saves; the final save comes after the last step line, outside the window
        "checkpoint": {"path": str(checkpoints), "everySteps": 0, "keep": 1, "resume": False},
    }


@dataclass(frozen=True)
class StepTime:
    """Seconds per step past warm-up: wall clock, and this process's CPU time (all its threads)."""

    wall_s: float
    cpu_s: float


class _StepClock(io.TextIOBase):
    """Stands in for stdout during ``Trainer.run()``: stamps each JSON step line as it is written (the
    trainer prints one every ``logEverySteps``, right after the step), parsing only afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple[str, float, float]] = []

    def write(self, text: str) -> int:
        if text.startswith('{"event": "step"'):
            self.marks.append((text, time.monotonic(), time.process_time()))
        return len(text)

    def step_time(self, first_step: float) -> StepTime:
        stamped = [(json.loads(text)["step"], wall, cpu) for text, wall, cpu in self.marks]
        stamped = [m for m in stamped if m[0] >= first_step]
        if len(stamped) < 2:
            raise RuntimeError(f"too few step lines past warm-up ({len(stamped)})")
        (s0, w0, c0), (s1, w1, c1) = stamped[0], stamped[-1]
        return StepTime((w1 - w0) / (s1 - s0), (c1 - c0) / (s1 - s0))


@dataclass(frozen=True)
class TrainerResult:
    step: StepTime  # from the trainer's own step lines
    delta: PhaseTotals | None  # counters past warm-up, from the endpoint (None: no scrape landed there)
    scrapes: int


def run_trainer_inprocess(ctx: Context, dctx: Any, *, steps: int, workers: int, label: str,
                          scrape_every_s: float = SCRAPE_EVERY_S) -> TrainerResult:
    """One ``Trainer(...).run()`` with metrics served and scraped; its step lines and endpoint read back."""
    import torch

    from kubetrain_trainer.config import parse_config
    from kubetrain_trainer.loop import Trainer
    from kubetrain_trainer.metrics import TrainerMetrics, serve
    from kubetrain_trainer.stopping import StopFlag
    from kubetrain_trainer.tasks import TaskContext, build_task

    directory = ctx.workdir / f"overhead-{label}-{time.monotonic_ns()}"
    cfg = parse_config(_config(steps=steps, workers=workers, checkpoints=directory / "checkpoints"), env={})
    metrics = TrainerMetrics(rank=dctx.rank, local_rank=dctx.local_rank, world_size=dctx.world_size)
    port = free_port()
    server = serve(metrics, port)
    scraper = _Scraper(port, scrape_every_s)
    trainer: Trainer | None = None
    clock = _StepClock()
    try:
        torch.manual_seed(cfg.trainer.seed)
        task = build_task(TaskContext(trainer=cfg.trainer, options=cfg.trainer.options,
                                      data_dir=Path(cfg.data.path), rank=dctx.rank,
                                      world_size=dctx.world_size, device=dctx.device))
        trainer = Trainer(cfg, dctx, task, metrics, StopFlag())
        with contextlib.redirect_stdout(clock):  # the trainer's JSON step lines
            code = trainer.run()
        if code != 0:
            raise RuntimeError(f"the trainer returned {code}")
        scraper.stop()
        final = phases_from_exposition(scrape(port))
    finally:
        scraper.stop()
        server.close()
        if trainer is not None:  # read-ahead thread or DataLoader workers: stop them now, not at garbage collection
            trainer.stream.close()
    step = clock.step_time(WARMUP_FRACTION * steps)
    early = [s for s in scraper.seen if s.step >= WARMUP_FRACTION * steps and s.step < final.step]
    return TrainerResult(step, final.minus(early[0]) if early else None, len(scraper.seen) + 1)


def bare_loop(model: Any, dataset: Any, *, steps: int, warmup: int, batch: int = BATCH) -> StepTime:
    """The textbook single-process loop (DDP with world size 1, as the trainer): time per step past warm-up."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - the conventional alias
    from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: N817 - the name everyone uses
    from torch.utils.data import DataLoader

    ddp = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    loader = DataLoader(dataset, batch_size=batch, shuffle=True, drop_last=True)
    batches = iter(loader)
    started, started_cpu = time.monotonic(), time.process_time()
    for step in range(steps):
        if step == warmup:
            started, started_cpu = time.monotonic(), time.process_time()
        try:
            x, y = next(batches)
        except StopIteration:
            batches = iter(loader)
            x, y = next(batches)
        loss = F.cross_entropy(ddp(x), y)
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
    timed = steps - warmup
    return StepTime((time.monotonic() - started) / timed, (time.process_time() - started_cpu) / timed)


# ---------------------------------------------------------------- benchmarks

STEP_RATIO = FigureSpec(
    "trainer.step_time_vs_bare_loop", "x",
    Goal("<=", 1.03, "the trainer's step (sampler, per-step all-reduce of loss/stop/norm, LR schedule, NaN "
                     "guard, metrics served and scraped every 2 s) may cost at most 3% over a bare PyTorch "
                     "loop on the same model, data, batch and optimizer"))
DATA_WAIT = FigureSpec(
    "trainer.data_wait_share", "%",
    Goal("<=", 2.0, "with cheap in-memory data and the CRD's default data settings (workers 2, prefetch 2) the "
                    "loop should almost never wait for a batch: at most 2% of step time, read from the "
                    "trainer's own trainer_step_phase_seconds_total{phase=\"data_wait\"}"))
SCRAPE = FigureSpec(
    "trainer.scrape_p95_500_series", "ms",
    Goal("<=", 5.0, "Prometheus scrapes every 15-30 s with a timeout of 10 s; at 500 series one GET + parse "
                    "must stay under 5 ms at p95 so that scrapes never matter to the trainer or to Prometheus"))


def _steps(ctx: Context) -> int:
    return 150 if ctx.quick else 200  # about 2.5 / 3.5 s per run at BATCH 256 on one idle core


@dataclass
class _OverheadRuns:
    """What the interleaved rounds of overhead_bench measured."""

    trainer: list[StepTime] = field(default_factory=list)
    bare: list[StepTime] = field(default_factory=list)
    cpu_ratios: list[float] = field(default_factory=list)
    wall_ratios: list[float] = field(default_factory=list)
    shares: list[float] = field(default_factory=list)  # data-wait share with 2 workers
    inline_shares: list[float] = field(default_factory=list)  # the same, loading inline
    scrapes: int = 0


def overhead_bench(ctx: Context) -> list[Figure]:
    # Rounds of (trainer, bare loop) and, every other round, the trainer with 2 workers; the order rotates
    # from round to round so that neither side always runs first or right after the loader processes
    # exit. Step time is CPU time per step of this process (every thread: the loop, the metrics server,
    # the scraper), which the other work on this shared machine inflates far less than the wall clock;
    # the figure is the best of each side (the run least disturbed, as timeit advises), the per-round
    # ratios and the wall clock are printed next to it.
    rounds = 3 if ctx.quick else 4
    steps = _steps(ctx)
    warmup = math.ceil(WARMUP_FRACTION * steps / LOG_EVERY) * LOG_EVERY  # the trainer's first timed line
    runs = _OverheadRuns()
    with _one_thread(), _process_group() as dctx:
        def trainer_side(times: dict[str, StepTime]) -> None:
            result = run_trainer_inprocess(ctx, dctx, steps=steps, workers=0, label="w0")
            times["trainer"] = result.step
            if result.delta is not None:
                runs.inline_shares.append(data_wait_share(result.delta))
            runs.scrapes += result.scrapes

        def bare_side(times: dict[str, StepTime]) -> None:
            import torch

            torch.manual_seed(1234)
            task = _task(dctx)  # the same model class and data as the trainer's synthetic task
            times["bare"] = bare_loop(task.model, task.train_dataset, steps=steps, warmup=warmup)

        def workers_side(_times: dict[str, StepTime]) -> None:
            result = run_trainer_inprocess(ctx, dctx, steps=steps, workers=2, label="w2",
                                           scrape_every_s=PHASE_SCRAPE_EVERY_S)
            if result.delta is None:
                raise RuntimeError(f"no scrape landed past warm-up and before the end ({result.scrapes} scrapes)")
            runs.shares.append(data_wait_share(result.delta))

        for round_ in range(rounds):
            times: dict[str, StepTime] = {}
            sides: list[tuple[str, Callable[[dict[str, StepTime]], None]]] = [
                ("trainer", trainer_side), ("bare loop", bare_side)]
            if round_ % 2 == 0:
                sides.append(("trainer, 2 workers", workers_side))
            shift = round_ % len(sides)
            for name, side in sides[shift:] + sides[:shift]:
                ctx.log(f"round {round_ + 1}/{rounds}: {name}")
                side(times)
            runs.cpu_ratios.append(ratio(times["trainer"].cpu_s, times["bare"].cpu_s))
            runs.wall_ratios.append(ratio(times["trainer"].wall_s, times["bare"].wall_s))
            runs.trainer.append(times["trainer"])
            runs.bare.append(times["bare"])
    return _overhead_figures(runs, rounds=rounds, steps=steps, warmup=warmup)


def _overhead_figures(runs: _OverheadRuns, *, rounds: int, steps: int, warmup: int) -> list[Figure]:
    best_trainer, best_bare = min(t.cpu_s for t in runs.trainer), min(b.cpu_s for b in runs.bare)
    t_cpu, b_cpu = median([t.cpu_s for t in runs.trainer]), median([t.cpu_s for t in runs.bare])
    t_wall, b_wall = median([t.wall_s for t in runs.trainer]), median([t.wall_s for t in runs.bare])
    return [
        STEP_RATIO.measured(
            ratio(best_trainer, best_bare),
            f"CPU time per step, best of {rounds} interleaved runs each: trainer {best_trainer * 1e3:.2f} ms / bare "
            f"loop {best_bare * 1e3:.2f} ms; per-round ratios {' '.join(f'{r:.3f}' for r in runs.cpu_ratios)} "
            f"(median {median(runs.cpu_ratios):.3f}, medians {t_cpu * 1e3:.2f} / {b_cpu * 1e3:.2f} ms); wall "
            f"clock medians {t_wall * 1e3:.2f} / {b_wall * 1e3:.2f} ms, ratios "
            f"{' '.join(f'{r:.3f}' for r in runs.wall_ratios)}; synthetic MLP, batch {BATCH}, AdamW, DDP world 1, "
            f"1 thread, steps {warmup}-{steps}, {runs.scrapes} scrapes",
            trainer_cpu_ms=t_cpu * 1e3, bare_cpu_ms=b_cpu * 1e3, median_ratio=median(runs.cpu_ratios),
            wall_ratio=median(runs.wall_ratios)),
        DATA_WAIT.measured(
            median(runs.shares),
            f"data_wait / step time, from the endpoint, data.workers 2, median of {len(runs.shares)} runs "
            f"({' '.join(f'{s:.2f}' for s in runs.shares)}); 0 workers (loading inline) "
            + (f"{median(runs.inline_shares):.1f}%" if runs.inline_shares else "n/a")
            + "; in-memory data: gathered a batch at a time in the process, read ahead on a thread"),
    ]


def padding_collector(count: int) -> Callable[[list[str], list[str]], Iterable[Any]]:
    """An extra collector for ``TrainerMetrics.extra_collectors``: ``count`` labelled gauge series."""
    from prometheus_client.core import GaugeMetricFamily

    def collect(names: list[str], values: list[str]) -> Iterable[Any]:
        family = GaugeMetricFamily("trainer_bench_extra", "Padding series (benchmark only).",
                                   labels=[*names, "series"])
        for i in range(count):
            family.add_metric([*values, str(i)], float(i))
        yield family
    return collect


def _realistic_metrics() -> Any:
    """A :class:`TrainerMetrics` of rank 0 mid-run (the rank that serves the job-wide families too): every
    optional family present, histograms filled."""
    from kubetrain_trainer.metrics import TrainerMetrics

    m = TrainerMetrics(rank=0, local_rank=0, world_size=16, started=True, step=1200, total_steps=5000, epoch=2,
                       loss_last=1.234, loss_sum=2000.0, loss_count=1200, learning_rate=3e-4, grad_norm=0.8,
                       samples_total=1.2e6, tokens_total=1.2e9, model_flops_total=1e18, samples_per_second=4e3,
                       mfu=0.41, last_step_timestamp=time.time(), checkpoint_last_step=1000, resumed_from_step=0,
                       eval_loss=1.5, eval_metrics={"accuracy": 0.91, "perplexity": 4.5})
    for i in range(1200):
        m.step_duration.observe(0.1 + (i % 7) * 0.05)
    for _ in range(10):
        m.checkpoint_duration.observe(3.0)
    return m


def _timed_scrapes(port: int, empty_port: int, rounds: int) -> tuple[dict[int, list[float]], dict[int, list[float]]]:
    """Wall and CPU seconds of GET + parse per target, the two targets interleaved so drift hits both alike."""
    wall: dict[int, list[float]] = {port: [], empty_port: []}
    cpu: dict[int, list[float]] = {port: [], empty_port: []}

    def timed(target: int) -> tuple[float, float]:
        started, started_cpu = time.perf_counter(), time.process_time()
        parse_exposition(scrape(target))
        return time.perf_counter() - started, time.process_time() - started_cpu

    for _ in range(20):  # warm-up
        timed(port)
        timed(empty_port)
    for i in range(rounds):
        for target in ((port, empty_port) if i % 2 == 0 else (empty_port, port)):
            w, c = timed(target)
            wall[target].append(w)
            cpu[target].append(c)
    return wall, cpu


def _reference_parse_seconds(text: str) -> list[float]:
    """prometheus-client's own parser on the same text: for the record."""
    from prometheus_client.parser import text_string_to_metric_families

    reference: list[float] = []
    for _ in range(10):
        started = time.perf_counter()
        for family in text_string_to_metric_families(text):
            for _sample in family.samples:
                pass
        reference.append(time.perf_counter() - started)
    return reference


def scrape_bench(ctx: Context) -> list[Figure]:
    from prometheus_client import CollectorRegistry, start_http_server

    from kubetrain_trainer.metrics import serve

    metrics = _realistic_metrics()
    port, empty_port = free_port(), free_port()
    server = serve(metrics, port)
    empty_server, empty_thread = start_http_server(empty_port, registry=CollectorRegistry(auto_describe=False))
    try:
        own = count_series(scrape(port))
        metrics.extra_collectors.append(padding_collector(max(TARGET_SERIES - own, 0)))
        text = scrape(port)
        series = count_series(text)
        if count_series(scrape(empty_port)) != 0:
            raise RuntimeError("the empty registry serves series")
        wall, cpu = _timed_scrapes(port, empty_port, 150 if ctx.quick else 400)
        reference = _reference_parse_seconds(text)
    finally:
        server.close()
        empty_server.shutdown()
        empty_server.server_close()
        empty_thread.join(timeout=5)

    def ms(values: list[float], pct: float) -> float:
        return percentile(values, pct) * 1e3

    p95 = ms(wall[port], 95)
    return [SCRAPE.measured(
        p95, f"{series} series ({own} of the real TrainerMetrics collector + {series - own} extra labelled, "
             f"{len(text) // 1024} KiB); p50 {ms(wall[port], 50):.2f} ms, min {ms(wall[port], 0):.2f} ms, CPU p95 "
             f"{ms(cpu[port], 95):.2f} ms; empty registry p95 {ms(wall[empty_port], 95):.2f} ms, p50 "
             f"{ms(wall[empty_port], 50):.2f} ms, min {ms(wall[empty_port], 0):.2f} ms; "
             f"GET + line parse, {len(wall[port])} scrapes each, interleaved; prometheus-client's Python "
             f"parser alone {median(reference) * 1e3:.1f} ms",
        series=float(series), empty_p95_ms=ms(wall[empty_port], 95), p50_ms=ms(wall[port], 50),
        cpu_p95_ms=ms(cpu[port], 95))]


BENCHMARKS = (
    Benchmark("trainer.overhead", "trainer step time vs a bare loop, and data-wait share with 2 workers (in-process)",
              (STEP_RATIO, DATA_WAIT), overhead_bench),
    Benchmark("trainer.scrape", "p95 GET + parse of the trainer's endpoint at 500 series vs an empty registry",
              (SCRAPE,), scrape_bench),
)
