"""A failed worker: the gang restarted in place by the kubelet (RestartAllContainers) against the same job restarted
with new pods (``failurePolicy.restartInPlace: false``), both on the lab's real node (kubelet + containerd: the
process kubelet cannot restart in place), in the same round.

A round runs the README's example job (2 nodes, checkpoints on a claim) both ways, SIGKILLs pod 1's workers once
the job is past a checkpoint, and times each from the kill to rank 0's first training step after it resumed, read
from the time stamps of rank 0's own log lines.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from bench.cluster import Cluster
from bench.recovery import json_lines, training_again
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median

__all__ = ["BENCHMARKS"]

Json = Any
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "trainingjob-cpu.yaml"
CLAIM = ROOT / "examples" / "storage" / "checkpoints-pvc.yaml"

IN_PLACE = FigureSpec(
    "operator.inplace_restart_ratio", "x",
    Goal("<=", 0.5, "from a worker's death (SIGKILL of pod 1's workers) to rank 0 training again from the last "
                    "checkpoint, with the gang restarted in place by the kubelet against the same job restarted "
                    "with new pods, on the lab's real node in the same round. In place, nothing is deleted, "
                    "scheduled, given an IP or mounted again; only the processes start again"))


def _create(lab: Any, namespace: str, name: str, *, in_place: bool) -> None:
    claim = yaml.safe_load(CLAIM.read_text())
    claim["metadata"]["name"] = f"{name}-checkpoints"
    lab.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(claim))
    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["name"] = name
    spec = job["spec"]
    spec["resources"]["cpu"] = "600m"  # two pods and the operator on a 2-CPU machine
    spec["trainer"] |= {"maxSteps": 1_000_000, "logEverySteps": 1}
    spec["checkpoint"] |= {"claimName": f"{name}-checkpoints", "everySteps": 20}
    spec["failurePolicy"] = {"restartInPlace": in_place}
    lab.kubectl("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(job))


def _rank0_events(lab: Any, namespace: str, name: str) -> list[Json]:
    """The JSON lines of pod 0's current container's log (rank 0 alone logs them); [] while it has none."""
    result = lab.kubectl("logs", "-n", namespace, f"{name}-0", check=False)
    return json_lines(result.stdout) if result.returncode == 0 else []


def _recovery_seconds(ctx: Context, cluster: Cluster, namespace: str, name: str, *, in_place: bool) -> float:
    from tests.lab.jobs import Jobs, kill_workers
    from tests.lab.procs import wait_for

    lab = cluster.lab
    jobs = Jobs(lab, namespace)
    _create(lab, namespace, name, in_place=in_place)
    jobs.wait(name, lambda s: int((s.get("lastCheckpoint") or {}).get("step", 0)) >= 20, "a checkpoint",
              timeout=600)
    ctx.log(f"in place: killing the workers of {name}-1")
    killed_at = time.time()
    kill_workers(lab, namespace, f"{name}-1")
    seconds = training_again(partial(_rank0_events, lab, namespace, name), f"{namespace}/{name}", killed_at,
                             timeout=600) - killed_at
    status = jobs.get(name)["status"]
    if (status.get("attempt"), status.get("restarts")) != ((0, 1) if in_place else (1, 1)):
        raise RuntimeError(f"{name}: attempt {status.get('attempt')}, restarts {status.get('restarts')}: {status}")
    lab.api.delete(f"{jobs.base}/{name}")
    wait_for(lambda: not jobs.pods(name), 180, f"the pods of {name} to be gone", interval=0.5)  # 2 CPUs: one job
    return seconds


def in_place_bench(ctx: Context) -> list[Figure]:
    cluster = Cluster(ctx, real_node=True)  # a lab of its own, as bench/gang.py's
    rounds = ctx.rounds(quick=1, full=3)
    in_place_s: list[float] = []
    new_pods_s: list[float] = []
    try:
        cluster.start()
        namespace = cluster.namespace("inplace")
        for number in range(rounds):
            in_place_s.append(_recovery_seconds(ctx, cluster, namespace, f"inplace-{number}", in_place=True))
            new_pods_s.append(_recovery_seconds(ctx, cluster, namespace, f"newpods-{number}", in_place=False))
            ctx.log(f"in-place round {number}: in place {in_place_s[-1]:.1f} s, new pods {new_pods_s[-1]:.1f} s")
    finally:
        cluster.stop()
    return [IN_PLACE.measured(
        median(in_place_s) / median(new_pods_s),
        f"a worker's death to rank 0 training again: in place p50 {median(in_place_s):.1f} s / with new pods p50 "
        f"{median(new_pods_s):.1f} s; {rounds} round(s), 2 nodes on the real kubelet + containerd",
        in_place_p50_s=median(in_place_s), new_pods_p50_s=median(new_pods_s))]


BENCHMARKS = (
    Benchmark("operator.inplace", "a failed worker: the gang restarted in place vs with new pods (real node)",
              (IN_PLACE,), in_place_bench, needs_lab=True),
)
