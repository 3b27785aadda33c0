"""The trainer on this machine's CPUs: data-parallel scaling, the cost of its metrics, the cost of its
checkpoints. Every run is real ``torchrun -m kubetrain_trainer`` (gloo), configured as the operator's pods
configure it (``KUBETRAIN_CONFIG``), on the built-in ``synthetic`` task.

Throughput is read from the trainer's own step log lines (rank 0 prints one every ``logEverySteps``): the
steps between the first logged step after warm-up and the last one, over the wall time between those two
lines, so process start-up (importing torch takes seconds here) and the first slow steps never count.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median
from kubetrain.cli.ports import free_port

__all__ = ["BENCHMARKS", "Launched", "TrainerRun", "launch", "run_trainer", "throughput", "torchrun_env"]

# Per process. At 64 a step here is about 8 ms, much of it per-step Python and dispatch overhead; at 256 it is
# about 16 ms of mostly matmuls, nearer to what a real job's step is made of.
BATCH = 256
LOG_EVERY = 25
RUN_TIMEOUT_S = 240
SCRAPE_INTERVAL_S = 0.5  # 30-60 times more often than Prometheus would scrape: any cost shows


@dataclass(frozen=True)
class TrainerRun:
    nproc: int
    steps: int
    events: tuple[dict[str, Any], ...]
    wall_s: float
    scrapes: int = 0

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == kind]


@dataclass(frozen=True)
class Throughput:
    steps_per_s: float
    samples_per_s: float
    step_s: float


def throughput(run: TrainerRun, batch: int = BATCH, warmup_fraction: float = 0.2,
               window: tuple[float, float] | None = None) -> Throughput:
    """Steady-state rate between the first step line past warm-up and the last step line (of those inside
    ``window``, unix times, when given)."""
    lines = [e for e in run.of("step") if e["step"] >= warmup_fraction * run.steps
             and (window is None or window[0] <= e["time"] <= window[1])]
    if len(lines) < 2:
        raise RuntimeError(f"too few step lines to measure throughput ({len(lines)}); is logEverySteps too big?")
    first, last = lines[0], lines[-1]
    steps = last["step"] - first["step"]
    seconds = last["time"] - first["time"]
    rate = steps / seconds
    return Throughput(rate, rate * batch * run.nproc, seconds / steps)


@contextmanager
def _scraper(port: int) -> Iterator[list[int]]:
    """Scrape http://127.0.0.1:port/metrics every SCRAPE_INTERVAL_S in a thread; yields [successful scrapes]."""
    count = [0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(SCRAPE_INTERVAL_S):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
                    answer.read()
                    count[0] += 1
            except (urllib.error.URLError, OSError):
                pass  # not serving yet, or already gone
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield count
    finally:
        stop.set()
        thread.join(timeout=5)


def torchrun_env() -> dict[str, str]:
    """This process's environment for a torchrun of the bench's own: no rank or rendezvous variables of an
    outer torchrun, no kubetrain settings, and one thread per process (what torchrun sets for several processes;
    set for one too, for a fair base)."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PET_", "KUBETRAIN_", "TORCHELASTIC_"))
           and key not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}}
    return env | {"OMP_NUM_THREADS": "1"}


class Launched:
    """A trainer run in progress (see :func:`launch`); :meth:`finish` waits for it and parses its log."""

    def __init__(self, ctx: Context, *, nproc: int, steps: int, metrics: bool, checkpoint_every: int,
                 label: str) -> None:
        self.nproc, self.steps = nproc, steps
        directory = ctx.workdir / f"trainer-{label or 'run'}-{nproc}p-{time.monotonic_ns()}"
        directory.mkdir(parents=True)
        config = {
            "trainer": {"task": "synthetic", "maxSteps": steps, "batchSize": BATCH, "logEverySteps": LOG_EVERY,
                        "precision": "fp32", "optimizer": {"name": "adamw", "lr": 0.001}},
            "data": {"workers": 0},  # two cores: a loader process per rank would only compete with the ranks
            # everySteps 0: no periodic saves; the final save comes after the last step line, outside the window
            "checkpoint": {"everySteps": checkpoint_every, "keep": 2},
        }
        port = free_port() if metrics else 0
        env = torchrun_env() | {
            "KUBETRAIN_CONFIG": json.dumps(config),
            "KUBETRAIN_CHECKPOINT_DIR": str(directory / "checkpoints"),
            "KUBETRAIN_METRICS_PORT": str(port),
            "KUBETRAIN_TERMINATION_LOG": str(directory / "termination"),
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
            "PYTHONUNBUFFERED": "1",
        }
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                "-m", "kubetrain_trainer"]
        self.out_path, self.log_path = directory / "stdout.txt", directory / "stderr.txt"
        ctx.log(f"torchrun {nproc} process(es), {steps} steps, metrics {'on' if metrics else 'off'}, "
                f"checkpoint every {checkpoint_every or '-'}")
        self.started = time.monotonic()
        with self.out_path.open("wb") as out, self.log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, env=env, stdout=out, stderr=log, start_new_session=True)
        self.scraper = _scraper(port) if metrics else _nothing()
        self.scrapes = self.scraper.__enter__()
        self.scraping = True

    def kill(self) -> None:
        """Stop the run now (no-op once it ended) and its scraper."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.scraping:
            self.scraping = False
            self.scraper.__exit__(None, None, None)

    def finish(self) -> TrainerRun:
        try:
            self.process.wait(timeout=max(1.0, RUN_TIMEOUT_S - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the trainer ran past {RUN_TIMEOUT_S} s; see {self.log_path}") from None
        finally:
            self.kill()
        wall = time.monotonic() - self.started
        if self.process.returncode != 0:
            tail = self.log_path.read_text(errors="replace")[-600:]
            raise RuntimeError(f"the trainer exited {self.process.returncode}: {tail}")
        events = []
        for line in self.out_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
        return TrainerRun(self.nproc, self.steps, tuple(events), wall, self.scrapes[0])


def launch(ctx: Context, *, nproc: int, steps: int, metrics: bool = False, checkpoint_every: int = 0,
           label: str = "") -> Launched:
    """Start ``torchrun --standalone -m kubetrain_trainer`` (its metrics scraped if ``metrics``)."""
    return Launched(ctx, nproc=nproc, steps=steps, metrics=metrics, checkpoint_every=checkpoint_every,
                    label=label)


def run_trainer(ctx: Context, *, nproc: int, steps: int, metrics: bool = False, checkpoint_every: int = 0,
                label: str = "") -> TrainerRun:
    """One trainer run to its end; raises with the log tail when it fails."""
    return launch(ctx, nproc=nproc, steps=steps, metrics=metrics, checkpoint_every=checkpoint_every,
                  label=label).finish()


@contextmanager
def _nothing() -> Iterator[list[int]]:
    yield [0]


def _steps(ctx: Context) -> int:
    return 150 if ctx.quick else 300  # about 2.5 / 5 s of training on one core at BATCH 256


def _best(ctx: Context, key: str) -> Throughput:
    """The fastest of the cached runs for ``key`` (the least disturbed by the machine's other work)."""
    runs: list[TrainerRun] = ctx.cache.get(key, [])
    return max((throughput(r) for r in runs), key=lambda t: t.steps_per_s)


def _ensure_runs(ctx: Context, key: str, count: int, **kwargs: Any) -> None:
    runs: list[TrainerRun] = ctx.cache.setdefault(key, [])
    while len(runs) < count:
        runs.append(run_trainer(ctx, steps=_steps(ctx), label=key, **kwargs))


def _repeats(ctx: Context, full: int = 2) -> int:
    return 1 if ctx.quick else full


SCALING = FigureSpec(
    "trainer.scaling_efficiency_2proc", "",
    Goal(">=", 0.70, "2 DDP processes on this machine's 2 cores, same per-process batch, against 2x the "
                     "samples/s of one process alone (the ideal, efficiency 1.0). DDP keeps 84-98% on GPUs with "
                     "their own interconnect (ANCHORS); here the workers also share the cores with the gloo "
                     "all-reduce over loopback, the torchrun agent and the OS, so 70% is the bar"))
DDP = FigureSpec(
    "trainer.ddp_efficiency_2proc", "",
    Goal(">=", 0.90, "2 DDP processes against 2 independent single processes run side by side (no "
                     "communication), whose summed samples/s is what this machine can give two processes at "
                     "all: the difference is DDP's own cost (the gradient all-reduce, which carries the step's "
                     "loss and stop vote; waiting for the slower rank). Near-linear DDP (ANCHORS) allows at most 10%"))
PLAIN = FigureSpec(
    "trainer.ddp_vs_plain_ratio", "x",
    Goal(">=", 0.95, "2 DDP processes of the trainer against a plain PyTorch DDP loop of the same training "
                     "(model, data, batch, optimizer, gradient clipping, DDP settings; bench/ddp_reference.py): "
                     "the trainer's logging, metrics, read-ahead and agreement on loss and stop may cost at most "
                     "5% of a hand-written loop"))


# One round's trainer-against-plain ratio strays by up to 10 % on 2 shared cores, so with 2 or 3 rounds one side's
# best can be a lucky round and the ratio reads 0.89-0.93 where it is 1.00. 5 rounds give each side more chances
# at an undisturbed run, for about 100 s more.
SCALING_ROUNDS = 5


@dataclass(frozen=True)
class Scaling:
    """The best of each kind of run, samples/s: 1 process, 2 DDP processes, 2 independent processes side by
    side, the plain PyTorch DDP loop; and gloo's all-reduce latencies (bench/ddp_reference.py)."""

    one: Throughput
    two: float
    pair: float
    plain: float
    latency: dict[str, float]
    rounds: str = ""  # each round's 2 DDP processes / plain loop, samples/s: how far one round strays

    @property
    def capacity(self) -> float:
        return self.pair / self.one.samples_per_s


def _pair(ctx: Context) -> float:
    """Samples/s of two independent single-process runs started together, over the time both stepped."""
    launched: list[Launched] = []
    try:
        for side in ("a", "b"):
            # Twice the steps: start-up jitter must leave seconds in which both are stepping.
            launched.append(launch(ctx, nproc=1, steps=2 * _steps(ctx), label=f"pair-{side}"))
        a, b = (run.finish() for run in launched)
    finally:
        for run in launched:
            run.kill()
    window = _overlap(a, b)
    return throughput(a, window=window).samples_per_s + throughput(b, window=window).samples_per_s


def _measure_scaling(ctx: Context) -> Scaling:
    # Interleaved (1, pair, 2, plain, 1, pair, 2, plain): a slow spell of the machine then hits every side, not
    # one; the best of each is the run least disturbed by the machine's other work. The trainer's 2 DDP processes
    # and the plain loop they are held against run back to back.
    from bench import ddp_reference

    pairs: list[float] = []
    references: list[dict[str, float]] = []
    for count in range(1, _repeats(ctx, SCALING_ROUNDS) + 1):
        _ensure_runs(ctx, "base", count, nproc=1)
        pairs.append(_pair(ctx))
        _ensure_runs(ctx, "ddp2", count, nproc=2)
        ctx.log("a plain PyTorch DDP loop" + (" and gloo's all-reduce latency" if count == 1 else ""))
        references.append(ddp_reference.measure(torchrun_env(), steps=_steps(ctx), latency=count == 1))
    plains = [r["samples_per_s"] for r in references]
    rounds = " ".join(f"{throughput(run).samples_per_s / 1e3:.1f}k/{plain / 1e3:.1f}k"
                      for run, plain in zip(ctx.cache["ddp2"], plains, strict=False))
    return Scaling(_best(ctx, "base"), _best(ctx, "ddp2").samples_per_s, max(pairs), max(plains), references[0],
                   rounds)


def _gloo_floor(run: Scaling) -> str:
    """What gloo's all-reduce alone costs a DDP step on this machine, and the ceiling that sets."""
    step_ms, grads_ms = run.one.step_s * 1e3, run.latency["grads"]
    # One all-reduce a step: the step's loss and stop vote ride in the gradients' (kubetrain_trainer.StepVotes).
    return (f"; gloo's all-reduce of the gradients here {grads_ms:.1f} ms a step ({run.latency['grads_mb']:.2f} "
            f"MB; the loss and stop vote ride in it, where a collective of their own cost "
            f"{run.latency['floats']:.1f} ms): at most {step_ms / (step_ms + grads_ms):.2f} before any waiting")


def scaling_bench(ctx: Context) -> list[Figure]:
    run = _measure_scaling(ctx)
    one, two, pair, plain = run.one.samples_per_s, run.two, run.pair, run.plain
    efficiency = two / (2 * one)
    busy_spell = one_process_disturbed(run.capacity, os.cpu_count() or 1)
    against_plain = two / plain
    return [
        SCALING.measured(efficiency, f"2 processes {two:.0f} samples/s / 2 x 1 process {one:.0f} samples/s; "
                                     f"synthetic MLP, batch {BATCH}/process",
                         disturbed=busy_spell or capacity_short(efficiency, run.capacity, SCALING.goal)
                         or plain_short(efficiency, plain / (2 * one), against_plain, SCALING.goal),
                         one_proc_samples_per_s=one, two_proc_samples_per_s=two),
        DDP.measured(two / pair, f"2 DDP processes {two:.0f} samples/s / 2 independent processes side by side "
                                 f"{pair:.0f} samples/s (the machine's parallel capacity: {run.capacity:.2f}x one "
                                 f"process){_gloo_floor(run)}",
                     disturbed=busy_spell or plain_short(two / pair, plain / pair, against_plain, DDP.goal),
                     pair_samples_per_s=pair),
        PLAIN.measured(against_plain, f"trainer {two:.0f} samples/s / plain PyTorch DDP loop {plain:.0f} "
                                      f"samples/s, 2 processes each, best of {_repeats(ctx, SCALING_ROUNDS)} "
                                      f"(rounds: {run.rounds})",
                       disturbed=busy_spell, plain_samples_per_s=plain),
    ]


def one_process_disturbed(capacity: float, cores: int) -> str:
    """More than one process per core is impossible: then the single-process run was slowed by other work."""
    return "the 1-process run ran in a busy spell, rerun" if capacity > 1.05 * cores else ""


def capacity_short(efficiency: float, capacity: float, goal: Goal) -> str:
    """Why 2 processes' efficiency against 2x one process misses on a machine that gives two processes less than
    2x one (``capacity``, measured side by side in the same run): what it is against that capacity, when that
    meets the goal. Otherwise (the code's own cost is too high) nothing."""
    scaled = efficiency * 2 / capacity
    if capacity >= 2 or not goal.met_by(scaled):
        return ""
    return (f"this machine gives 2 processes {capacity:.2f}x one, not 2x; against that {scaled:.3f}: a machine "
            "with 2 free cores meets the goal")


def plain_short(efficiency: float, plain_efficiency: float, against_plain: float, goal: Goal) -> str:
    """Why the trainer's DDP efficiency misses where a plain PyTorch DDP loop, measured in the same run, misses
    too (by the same measure, ``plain_efficiency``) and the trainer keeps up with it (``PLAIN``'s goal): then
    PyTorch's DDP on this machine sets the figure, not the trainer. Otherwise nothing."""
    if goal.met_by(efficiency) or goal.met_by(plain_efficiency) or not PLAIN.goal.met_by(against_plain):
        return ""
    return (f"a plain PyTorch DDP loop gets {plain_efficiency:.3f} by the same measure here (gloo on this "
            f"machine, not the trainer); the trainer against it: {against_plain:.3f}")


METRICS = FigureSpec(
    "trainer.metrics_throughput_ratio", "x",
    Goal(">=", 0.97, "the trainer's metrics are plain attribute writes per step, rendered only when scraped; "
                     "serving and being scraped every 0.5 s must keep at least 97% of the steps/s of a run "
                     "with KUBETRAIN_METRICS_PORT=0"))


def metrics_bench(ctx: Context) -> list[Figure]:
    # Side by side: one process with metrics served and scraped, one with port 0, started together, each on
    # one of the two cores, compared over the seconds in which both were stepping: whatever else the machine
    # does then slows both alike. Repeated in pairs; the figure is the median of the pairs' ratios.
    ratios: list[float] = []
    pairs: list[tuple[Throughput, Throughput, int]] = []
    for pair in range(_repeats(ctx, 3) if not ctx.quick else 2):
        # Longer runs than elsewhere: start-up jitter must leave seconds in which both are stepping. The one
        # started first gets ahead in the CPU scheduler's eyes, so the order alternates from pair to pair.
        steps = 2 * _steps(ctx)
        order = (True, False) if pair % 2 == 0 else (False, True)
        launched: dict[bool, Launched] = {}
        try:
            for metrics_on in order:
                launched[metrics_on] = launch(ctx, nproc=1, steps=steps, metrics=metrics_on,
                                              label=f"metrics-{'on' if metrics_on else 'off'}")
            on_result, off_result = launched[True].finish(), launched[False].finish()
        finally:
            for run in launched.values():
                run.kill()
        if on_result.scrapes == 0:
            raise RuntimeError("the metrics endpoint was never scraped successfully")
        overlap = _overlap(on_result, off_result)
        on, off = throughput(on_result, window=overlap), throughput(off_result, window=overlap)
        ratios.append(on.steps_per_s / off.steps_per_s)
        pairs.append((on, off, on_result.scrapes))
    ratio = median(ratios)
    on, off, scrapes = min(pairs, key=lambda p: abs(p[0].steps_per_s / p[1].steps_per_s - ratio))
    spread = f", ratios {' '.join(f'{r:.3f}' for r in ratios)}" if len(ratios) > 1 else ""
    return [METRICS.measured(ratio, f"metrics on {on.steps_per_s:.1f} steps/s, scraped every {SCRAPE_INTERVAL_S} s "
                                    f"({scrapes} scrapes) / port 0 {off.steps_per_s:.1f} steps/s, run side by side"
                                    f"{spread}", on_steps_per_s=on.steps_per_s, off_steps_per_s=off.steps_per_s)]


def _overlap(a: TrainerRun, b: TrainerRun, warmup_fraction: float = 0.2) -> tuple[float, float]:
    """The wall-clock interval in which both runs were past warm-up and still stepping."""
    def span(run: TrainerRun) -> tuple[float, float]:
        times = [e["time"] for e in run.of("step") if e["step"] >= warmup_fraction * run.steps]
        return (min(times), max(times)) if times else (0.0, 0.0)
    (a0, a1), (b0, b1) = span(a), span(b)
    start, end = max(a0, b0), min(a1, b1)
    if end - start < 1.0:
        raise RuntimeError(f"the two runs stepped side by side for only {max(end - start, 0):.1f} s (their "
                           "start-ups took very different times): too short to compare them")
    return start, end


CHECKPOINT_EVERY = 100  # the CRD's default checkpoint.everySteps
CHECKPOINT = FigureSpec(
    "trainer.checkpoint_time_share", "%",
    Goal("<=", 5.0, "with the CRD's default checkpoint.everySteps (100), saving must take at most 5% of the "
                    "training time, measured in one run as the seconds spent saving over the wall time of "
                    "the steps around them"))


def checkpoint_bench(ctx: Context) -> list[Figure]:
    # Long enough for 4 periodic saves inside the measured window (1 with --quick): one save alone is noisy.
    steps = (250 if ctx.quick else 550)
    run = run_trainer(ctx, nproc=1, steps=steps, checkpoint_every=CHECKPOINT_EVERY, label="checkpoint")
    lines = run.of("step")
    first, last = lines[0], lines[-1]  # the first line is at LOG_EVERY steps: before any periodic save
    saves = [e["seconds"] for e in run.of("checkpoint") if first["step"] < e["step"] < last["step"]]
    if not saves:
        raise RuntimeError("no periodic checkpoint inside the measured window")
    wall = last["time"] - first["time"]
    share = 100 * sum(saves) / wall
    step_s = (wall - sum(saves)) / (last["step"] - first["step"])
    save_s = median(saves)
    return [CHECKPOINT.measured(share, f"{len(saves)} saves of {save_s * 1e3:.0f} ms (= {save_s / step_s:.1f} "
                                       f"steps of {step_s * 1e3:.1f} ms) in {wall:.1f} s of training, "
                                       f"every {CHECKPOINT_EVERY} steps",
                                save_ms=save_s * 1e3, step_ms=step_s * 1e3)]


BENCHMARKS = (
    Benchmark("trainer.scaling", "samples/s of 2 DDP processes vs 1, vs 2 independent ones and vs a plain "
                                 "PyTorch DDP loop (gloo, CPU)", (SCALING, DDP, PLAIN), scaling_bench),
    Benchmark("trainer.metrics", "steps/s with metrics served and scraped vs port 0", (METRICS,), metrics_bench),
    Benchmark("trainer.checkpoint", "time spent saving checkpoints vs training", (CHECKPOINT,), checkpoint_bench),
)
