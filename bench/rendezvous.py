"""Bursts of small two-node `command:` jobs, each a real torchrun c10d rendezvous: does every gang form?

Left to itself, torchrun decides which agent hosts the c10d store by resolving the endpoint's name: if node 0's
lookup of its own name fails (its DNS record not yet served), it makes itself a client, and the gang waits out
the whole rendezvous timeout on a store nobody hosts (2 of 24 jobs in a burst on the lab), which is why node 0
is told that it hosts (``launch.rendezvous_conf``). The figure is the share of jobs whose gang formed and
finished, without a restart, well within the rendezvous timeout; the baseline is every job created. The same
burst of `kubetrain run` processes checks the local path, which shares the launch builder.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.cluster import cluster, job_spec
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median
from tests.lab.procs import kill_tree

__all__ = ["BENCHMARKS"]

Json = Any
# A worker that needs no torch of its own: the rendezvous is the agents' (torchrun's), which is what is measured.
WORKER = "import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)"
# How long a round waits for its gangs: a stuck one waits rendezvousTimeoutSeconds (600 s), far beyond this.
ROUND_DEADLINE_S = 240.0
POLL_S = 0.5

CLUSTER_FORMED = FigureSpec(
    "operator.rendezvous_burst_formed", "ratio",
    Goal(">=", 1.0, "share of the two-pod jobs of a burst (24 at once, 3 rounds) that ran to Succeeded without a "
                    "restart within 240 s, far inside their 600 s rendezvous timeout; the baseline is every "
                    "job created: a gang that waits on a store nobody hosts is a miss"))
LOCAL_FORMED = FigureSpec(
    "local.rendezvous_burst_formed", "ratio",
    Goal(">=", 1.0, "the same for `kubetrain run` of a two-node job, 24 runs started at once, 3 rounds (about "
                    "15 GB: 300 MB of each torchrun agent is its own): share that exited 0 within 240 s"))


def _rounds(ctx: Context) -> int:
    return 1 if ctx.quick else 3


def cluster_burst_bench(ctx: Context) -> list[Figure]:
    per_round = 8 if ctx.quick else 24
    formed: list[float] = []
    stuck: list[str] = []
    for number in range(_rounds(ctx)):
        ctx.log(f"rendezvous burst {number + 1}: {per_round} two-pod jobs at once")
        done, left = _cluster_round(ctx, per_round)
        formed += done.values()
        stuck += [f"round {number + 1}: {name} {phase}" for name, phase in left.items()]
    total = len(formed) + len(stuck)
    return [CLUSTER_FORMED.measured(
        len(formed) / total, _detail(formed, stuck, f"{_rounds(ctx)} round(s) of {per_round} jobs"),
        formed=len(formed), waiting=len(stuck))]


def _cluster_round(ctx: Context, count: int) -> tuple[dict[str, float], dict[str, str]]:
    """``count`` jobs created at once in a namespace of their own, deleted (until gone) afterwards."""
    from tests.lab.jobs import Jobs

    lab = cluster(ctx)
    namespace = lab.namespace("rendezvous")
    jobs = Jobs(lab.lab, namespace)
    try:
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda i: jobs.create(f"burst-{i}", job_spec(WORKER, 2)), range(count)))
        return _wait_succeeded(jobs, t0)
    finally:
        lab.delete_namespace(namespace, until_gone=True)


def _wait_succeeded(jobs: Any, t0: float) -> tuple[dict[str, float], dict[str, str]]:
    """Seconds from the burst's start to each job's Succeeded (restarts 0); the phases of the others at the
    deadline (a job that restarted or failed counts as not formed)."""
    done: dict[str, float] = {}
    phases: dict[str, str] = {}
    while time.monotonic() - t0 < ROUND_DEADLINE_S:
        for job in jobs.lab.api.get(jobs.base)["items"]:
            name, status = job["metadata"]["name"], job.get("status") or {}
            phases[name] = f"{status.get('phase', 'no status')}, restarts {status.get('restarts', 0)}"
            if status.get("phase") == "Succeeded" and not status.get("restarts") and name not in done:
                done[name] = time.monotonic() - t0
        if phases and all(name in done or phase.startswith("Failed") for name, phase in phases.items()):
            break
        time.sleep(POLL_S)
    return done, {name: phase for name, phase in phases.items() if name not in done}


def local_burst_bench(ctx: Context) -> list[Figure]:
    per_round = 4 if ctx.quick else 24
    document = {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "burst"},
                "spec": job_spec(WORKER, 2)}
    path = ctx.workdir / "rendezvous-burst.yaml"
    path.write_text(yaml.safe_dump(document))
    formed: list[float] = []
    stuck: list[str] = []
    for number in range(_rounds(ctx)):
        ctx.log(f"local rendezvous burst {number + 1}: {per_round} `kubetrain run` of two nodes at once")
        runs = [_start_local(path, ctx.workdir / f"local-{number}-{i}") for i in range(per_round)]
        done, left = _wait_exited(runs, time.monotonic())
        formed += [seconds for i, (seconds, code) in done.items() if code == 0]
        stuck += [f"round {number + 1}: run {i} exit {code}" for i, (_, code) in done.items() if code != 0]
        stuck += [f"round {number + 1}: run {i} still waiting" for i in left]
    total = len(formed) + len(stuck)
    return [LOCAL_FORMED.measured(
        len(formed) / total, _detail(formed, stuck, f"{_rounds(ctx)} round(s) of {per_round} runs"),
        formed=len(formed), waiting=len(stuck))]


def _wait_exited(runs: list[subprocess.Popen[bytes]], t0: float) -> tuple[dict[int, tuple[float, int]], list[int]]:
    """Each run's seconds to its exit and its exit code; the runs still going at the deadline, killed."""
    done: dict[int, tuple[float, int]] = {}
    while len(done) < len(runs) and time.monotonic() - t0 < ROUND_DEADLINE_S:
        for i, run in enumerate(runs):
            if i not in done and (code := run.poll()) is not None:
                done[i] = (time.monotonic() - t0, code)
        time.sleep(POLL_S)
    left = [i for i in range(len(runs)) if i not in done]
    for i in left:
        kill_tree(runs[i].pid)  # the run and its agents, which run in sessions of their own
        runs[i].wait()
    return done, left


def _start_local(path: Path, workdir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "kubetrain", "run", str(path), "--workdir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def _detail(formed: list[float], stuck: list[str], what: str) -> str:
    slowest = f"; formed in p50 {median(formed):.1f} s, slowest {max(formed):.1f} s" if formed else ""
    waiting = f"; not formed: {', '.join(stuck[:5])}" if stuck else ""
    return f"{len(formed)} of {len(formed) + len(stuck)} formed ({what}){slowest}{waiting}"


BENCHMARKS = (
    Benchmark("operator.rendezvous", "bursts of two-pod jobs: every gang's rendezvous forms",
              (CLUSTER_FORMED,), cluster_burst_bench, needs_lab=True),
    Benchmark("local.rendezvous", "bursts of two-node `kubetrain run`: every rendezvous forms",
              (LOCAL_FORMED,), local_burst_bench),
)
