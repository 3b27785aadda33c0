"""Recovery from a lost pod: the pod replaced alone while the others wait, against a gang restart of the same job,
both measured on the run's lab in the same round (the built-in trainer, 3 nodes, checkpoints on a claim).

A round evicts pod 1 of one job (replaced alone) and pod 0 of another (node 0 hosts the rendezvous, so the gang
restarts), and times each from the eviction to rank 0's first training step after it resumed from the step the
eviction saved, read from the time stamps of rank 0's own log lines.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.cluster import Cluster, cluster
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median

__all__ = ["BENCHMARKS", "json_lines", "training_again"]

Json = Any
NODES = 3

REPLACEMENT = FigureSpec(
    "operator.pod_replacement_ratio", "x",
    Goal("<=", 1.5, "from the eviction of one pod to rank 0 training again from the step the eviction saved, "
                    "with the pod replaced alone (the others wait, alive, at the same attempt) against the "
                    "gang restart of the same job, measured in the same round. The replacement pays what a fresh "
                    "gang does not: the rendezvous lets the lost agent go only after 5 missed 1-s heartbeats, "
                    "and the survivors then stop their workers and meet again; the gang restart's own costs on "
                    "a cluster (placing every pod again, in a shared cluster perhaps not at once) do not show on "
                    "a lab whose pods start in 0.1 s. It may cost half again a gang restart here, not more"))


def _job(claim: str) -> Json:
    return {
        "nodes": NODES, "procsPerNode": 1,
        "resources": {"cpu": "100m", "memory": "1Gi", "sharedMemory": "64Mi"},
        "trainer": {"task": "digits", "maxSteps": 1_000_000, "batchSize": 32, "logEverySteps": 1},
        "data": {"workers": 0},
        "checkpoint": {"claimName": claim, "everySteps": 0},
        "runPolicy": {"terminationGracePeriodSeconds": 30},
    }


def json_lines(text: str) -> list[Json]:
    """The JSON objects of a log's lines (after torchrun's prefix), in order."""
    events = []
    for line in text.splitlines():
        start = line.find("{")
        if start >= 0:
            try:
                events.append(json.loads(line[start:]))
            except ValueError:
                continue
    return events


def training_again(rank0_events: Callable[[], list[Json]], what: str, since: float, timeout: float = 300) -> float:
    """The wall time of rank 0's first step after a resume logged after ``since``, from ``rank0_events()`` (rank 0's
    log, read again until it has them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = rank0_events()
        resumed = next((e for e in events if e.get("event") == "resume" and e["time"] > since), None)
        if resumed is not None:
            step = next((e for e in events if e.get("event") == "step" and e["time"] > resumed["time"]), None)
            if step is not None:
                return float(step["time"])
        time.sleep(0.5)
    raise TimeoutError(f"{what}: rank 0 did not train again within {timeout:.0f} s")


def _rank0_events(lab: Cluster, namespace: str, name: str) -> list[Json]:
    """The JSON lines of pod 0's log (rank 0 alone logs them); [] while it has none."""
    try:
        return json_lines(lab.lab.pod_log(namespace, f"{name}-0").read_text())
    except (OSError, KeyError):
        return []


def _recovery_seconds(ctx: Context, lab: Cluster, namespace: str, name: str, evicted: int) -> float:
    from tests.lab.jobs import Jobs

    jobs = Jobs(lab.lab, namespace)
    lab.lab.create_volume(namespace, f"{name}-checkpoints")
    jobs.create(name, _job(f"{name}-checkpoints"))
    jobs.wait(name, lambda s: int((s.get("progress") or {}).get("step", 0)) >= 20, "past step 20", timeout=180)
    ctx.log(f"recovery: evicting {name}-{evicted}")
    evicted_at = time.time()
    lab.lab.api.post(f"/api/v1/namespaces/{namespace}/pods/{name}-{evicted}/eviction",
                     {"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": f"{name}-{evicted}", "namespace": namespace}})
    seconds = training_again(partial(_rank0_events, lab, namespace, name), f"{namespace}/{name}",
                             evicted_at) - evicted_at
    status = jobs.get(name)["status"]
    expected_attempt = 0 if evicted else 1
    if status.get("attempt") != expected_attempt:
        raise RuntimeError(f"{name}: attempt {status.get('attempt')}, expected {expected_attempt}: {status}")
    lab.lab.api.delete(f"{jobs.base}/{name}")
    return seconds


def replacement_bench(ctx: Context) -> list[Figure]:
    lab = cluster(ctx)
    namespace = lab.namespace("recovery")
    rounds = 1 if ctx.quick else 3
    replaced_s: list[float] = []
    restarted_s: list[float] = []
    try:
        for number in range(rounds):
            replaced_s.append(_recovery_seconds(ctx, lab, namespace, f"replaced-{number}", evicted=1))
            restarted_s.append(_recovery_seconds(ctx, lab, namespace, f"restarted-{number}", evicted=0))
            ctx.log(f"recovery round {number}: pod replaced {replaced_s[-1]:.1f} s, gang restart "
                    f"{restarted_s[-1]:.1f} s")
    finally:
        lab.delete_namespace(namespace)
    return [REPLACEMENT.measured(
        median(replaced_s) / median(restarted_s),
        f"eviction to rank 0 training again: pod 1 replaced alone p50 {median(replaced_s):.1f} s / pod 0 evicted, "
        f"gang restart p50 {median(restarted_s):.1f} s; {rounds} round(s), {NODES} nodes",
        replaced_p50_s=median(replaced_s), restarted_p50_s=median(restarted_s))]


BENCHMARKS = (
    Benchmark("operator.replace", "one lost pod replaced alone vs a gang restart of the same job",
              (REPLACEMENT,), replacement_bench, needs_lab=True),
)
