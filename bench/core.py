"""The pure core's speed: the reconcile decision and local validation, each against the cost of merely
reading the same input (a JSON round-trip, a YAML parse) timed in the same process a moment apart."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal

__all__ = ["BENCHMARKS"]

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "trainingjob-cpu.yaml"
Json = Any


def per_call(fn: Callable[[], object], baseline: Callable[[], object], *, budget_s: float,
             repeats: int = 7) -> tuple[float, float]:
    """Seconds per call of ``fn`` and of ``baseline``: the best of ``repeats`` timed loops of each, the loops of
    the two alternating, so that a busy spell of the machine slows both rather than one.

    The minimum is the figure least disturbed by other processes on a shared machine (timeit's advice).
    """
    def loop_size(f: Callable[[], object]) -> int:
        f()  # warm caches (CEL programs, schema lookups) before timing
        start, calls = time.perf_counter(), 0
        while time.perf_counter() - start < 0.02:
            f()
            calls += 1
        return max(1, int(calls * (budget_s / repeats) / 0.02))

    def timed(f: Callable[[], object], calls: int) -> float:
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        return (time.perf_counter() - t0) / calls

    sizes = loop_size(fn), loop_size(baseline)
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        best[0] = min(best[0], timed(fn, sizes[0]))
        best[1] = min(best[1], timed(baseline, sizes[1]))
    return best[0], best[1]


def running_job_inputs(nodes: int = 2) -> tuple[Any, dict[str, Json], list[Json], datetime]:
    """A running job as the operator sees it: the parsed job, its stored status and its pods as the API
    returns them (rendered by the operator's own manifests, with a running status filled in)."""
    from kubetrain.core.lifecycle import reconcile
    from kubetrain.core.manifests import build_pods
    from kubetrain.core.spec import parse
    from kubetrain.core.status import pod_state

    body = yaml.safe_load(EXAMPLE.read_text())
    body["spec"]["nodes"] = nodes
    created = datetime(2026, 1, 1, tzinfo=UTC)
    body["metadata"] |= {"namespace": "bench", "uid": "0d1c5e6e-0000-4000-8000-000000000000", "generation": 1,
                         "creationTimestamp": created.isoformat().replace("+00:00", "Z")}
    job = parse(body)
    started = (created + timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
    pods = []
    for number, pod in enumerate(build_pods(job, 0)):
        pod["metadata"] |= {"uid": f"pod-{number}", "resourceVersion": str(100 + number),
                            "creationTimestamp": body["metadata"]["creationTimestamp"]}
        pod["spec"]["nodeName"] = f"node-{number}"
        pod["status"] = {
            "phase": "Running", "podIP": f"10.0.0.{number + 2}", "startTime": started,
            "conditions": [{"type": t, "status": "True", "lastTransitionTime": started}
                           for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
            "containerStatuses": [{"name": "trainer", "ready": True, "restartCount": 0, "image": "x",
                                   "imageID": "x", "state": {"running": {"startedAt": started}}}],
        }
        pods.append(pod)
    now = created + timedelta(seconds=60)
    status: dict[str, Json] = {}
    for _ in range(2):  # the status a running job carries after its first reconciles
        status = reconcile(job, status, [pod_state(p) for p in pods], now).status
    return job, status, pods, now


RECONCILE = FigureSpec(
    "core.reconcile_vs_json_ratio", "x",
    Goal("<=", 5.0, "a reconcile decides from the job's status and its pods; deciding should cost at most 5 "
                     "times decoding those same objects from JSON, which the operator's client does on every "
                     "reconcile anyway, so the API round-trips, not the decision, bound reconcile latency"))


def reconcile_bench(ctx: Context) -> list[Figure]:
    from kubetrain.core.lifecycle import reconcile
    from kubetrain.core.status import merge_patch, pod_state

    job, status, pods, now = running_job_inputs()
    wire = json.dumps({"status": status, "pods": pods})

    def decide() -> None:  # what handlers._reconcile does between reading and writing
        decision = reconcile(job, status, [pod_state(p) for p in pods], now)
        merge_patch(status, decision.status)

    def decode() -> None:
        json.loads(wire)

    budget = 0.3 if ctx.quick else 1.0
    decide_s, decode_s = per_call(decide, decode, budget_s=budget)
    return [RECONCILE.measured(decide_s / decode_s,
                               f"reconcile {decide_s * 1e6:.0f} us / json.loads of status+2 pods "
                               f"{decode_s * 1e6:.0f} us", reconcile_us=decide_s * 1e6, json_us=decode_s * 1e6)]


VALIDATE = FigureSpec(
    "core.validate_vs_yaml_ratio", "x",
    Goal("<=", 10.0, "`kubetrain validate` checks the CRD's OpenAPI schema and CEL rules; 10 times a bare "
                     "yaml.safe_load of the same file keeps it a few milliseconds per file, fine for editors "
                     "and pre-commit hooks"))


def validate_bench(ctx: Context) -> list[Figure]:
    from kubetrain.cli.commands import file_problems

    def validate() -> None:
        assert not file_problems(EXAMPLE)

    def parse_only() -> None:
        yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))

    budget = 0.3 if ctx.quick else 1.0
    validate_s, parse_s = per_call(validate, parse_only, budget_s=budget)
    return [VALIDATE.measured(validate_s / parse_s,
                              f"validate {validate_s * 1e3:.2f} ms / yaml.safe_load {parse_s * 1e3:.2f} ms "
                              f"of {EXAMPLE.name}", validate_ms=validate_s * 1e3, yaml_ms=parse_s * 1e3)]


BENCHMARKS = (
    Benchmark("core.reconcile", "reconcile decision vs decoding its inputs", (RECONCILE,), reconcile_bench),
    Benchmark("core.validate", "local validation vs parsing the YAML", (VALIDATE,), validate_bench),
)
