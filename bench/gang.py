"""Kubernetes' own gang scheduler against no gang: what placing a 64-pod job whole costs over placing its pods
one by one.

A lab of its own serving scheduling.k8s.io/v1beta1 PodGroups (``Lab(gang=True)``: kube-scheduler with its
GenericWorkload gate). Rounds alternate: the PodGroup of a 64-node job (minCount 64, as the operator makes it)
and its 64 pods pointing at it, against the same 64 pods with no group; both created by a plain client with the
operator's 16 concurrent requests from the operator's own manifests, timed to the last pod bound to a node. The
pods run ``sleep`` in the exec-only image (a process each, no torch), so 64 of them fit the 2 cores.
"""

from __future__ import annotations

import time
from typing import Any

from bench.cluster import POLL_S, Cluster, bare_objects, job_spec
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median

__all__ = ["BENCHMARKS"]

Json = Any
GANG_PODS = 64
CLIENT_CONNECTIONS = 16  # the operator's own limit (OperatorConfig.api_connections)
IMAGE = "bench.kubetrain.io/exec-only:1"

GANG_PLACEMENT = FigureSpec(
    "scheduler.gang_placement_ratio", "x",
    Goal("<=", 1.3, f"from creating a {GANG_PODS}-pod gang (its PodGroup, minCount {GANG_PODS}, and its pods) to "
                    "every pod bound by kube-scheduler, against the same pods with no group, same lab, same "
                    "client: placing a gang whole may cost at most 30 % more than placing its pods (issue 28)"))


def gang_bench(ctx: Context) -> list[Figure]:
    from tests.lab.images import exec_only_image

    lab = Cluster(ctx, gang=True)
    try:
        lab.start()
        lab.lab.images.put_first(IMAGE, exec_only_image(lab.run_dir / "exec-only-image"))
        namespace = lab.namespace("gang")
        return [_measure(ctx, lab, namespace)]
    finally:
        lab.stop()


def _measure(ctx: Context, lab: Cluster, namespace: str) -> Figure:
    pods, rounds = (16 if ctx.quick else GANG_PODS), ctx.rounds(quick=2, full=5)
    spec = job_spec("", pods) | {"image": IMAGE, "command": ["sleep", "600"]}
    gang_s: list[float] = []
    plain_s: list[float] = []
    for number in range(rounds + 1):  # round 0 warms both paths up and is not counted
        ctx.log(f"gang placement, round {number}{' (warm-up)' if number == 0 else ''}: {pods} pods in a "
                "PodGroup, then without")
        gang, plain = (_placed_seconds(lab, namespace, f"{kind}-{number}", spec, gang=kind == "gang")
                       for kind in ("gang", "plain"))
        if number > 0:
            gang_s.append(gang)
            plain_s.append(plain)
    return GANG_PLACEMENT.measured(
        median(gang_s) / median(plain_s),
        f"gang p50 {median(gang_s):.2f} s / no group p50 {median(plain_s):.2f} s to {pods} pods bound; "
        f"{rounds} rounds each", gang_p50_s=median(gang_s), plain_p50_s=median(plain_s), pods=pods)


def _placed_seconds(lab: Cluster, namespace: str, name: str, spec: Json, *, gang: bool) -> float:
    """Create the objects, time until every pod is bound, then remove them (their processes stopped)."""
    selector = f"bench.kubetrain.io/bare={name}"
    objects = bare_objects(name, namespace, spec, gang=gang)
    t0 = time.monotonic()
    lab.create_objects(namespace, objects, CLIENT_CONNECTIONS)
    seconds = _wait_bound(lab, namespace, selector, spec["nodes"]) - t0
    lab.delete_pods(namespace, selector)
    lab.wait_no_pods(namespace, selector, timeout=180)
    return seconds


def _wait_bound(lab: Cluster, namespace: str, selector: str, count: int, timeout: float = 180) -> float:
    """Poll until ``count`` pods of ``selector`` have a node; time.monotonic() then."""
    deadline = time.monotonic() + timeout
    while (bound := sum(1 for p in lab.pods(namespace, selector) if p["spec"].get("nodeName"))) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{bound}/{count} pods {selector} bound in {namespace} after {timeout} s")
        time.sleep(POLL_S)
    return time.monotonic()


BENCHMARKS = (
    Benchmark("scheduler.gang", f"{GANG_PODS} pods placed whole by kube-scheduler's gang policy vs the same pods "
              "with no group", (GANG_PLACEMENT,), gang_bench, needs_lab=True),
)
