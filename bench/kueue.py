"""A TrainingJob under Kueue against the same job outside it: what the operator's side of Kueue's contract (make
the Workload, wait for the admission, read the flavor, then create the pods) adds to a job's start.

Both run in one lab of their own with Kueue (its webhooks see every pod of either), alternating rounds: a job
labelled with a LocalQueue whose ClusterQueue has quota to spare (admitted at once), and the same job unlabelled.
"""

from __future__ import annotations

import time
from typing import Any

from bench.cluster import SLEEPER, Cluster, job_spec
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median, percentile

__all__ = ["BENCHMARKS"]

Json = Any
KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
QUEUE = "bench"

KUEUE_START = FigureSpec(
    "operator.kueue_time_to_running_ratio", "x",
    Goal("<=", 1.3, "from `create TrainingJob` to all its pods Running with the job in a Kueue queue that admits it "
                    "at once, against the same job in no queue, in the same lab: the Workload, Kueue's admission "
                    "and the flavor read may add at most 30 % (issue 28)"))


def _queue(lab: Any, namespace: str) -> None:
    """A LocalQueue on a ClusterQueue with quota to spare (one flavor, no node labels)."""
    api = lab.api
    api.post(f"{KUEUE_API}/resourceflavors", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                                               "metadata": {"name": "bench"}})
    quota = {"cpu": "64", "memory": "256Gi"}
    api.post(f"{KUEUE_API}/clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": "bench"},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": list(quota), "flavors": [
            {"name": "bench", "resources": [{"name": k, "nominalQuota": v} for k, v in quota.items()]}]}]}})
    api.post(f"{KUEUE_API}/namespaces/{namespace}/localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
        "metadata": {"name": QUEUE, "namespace": namespace}, "spec": {"clusterQueue": "bench"}})


def kueue_bench(ctx: Context) -> list[Figure]:
    lab = Cluster(ctx, kueue=True)
    try:
        lab.start()
        namespace = lab.namespace("kueue")
        _queue(lab.lab, namespace)
        return [_measure(ctx, lab, namespace)]
    finally:
        lab.stop()


def _measure(ctx: Context, lab: Cluster, namespace: str) -> Figure:
    base = f"/apis/kubetrain.io/v1alpha1/namespaces/{namespace}/trainingjobs"
    nodes, rounds = 2, (3 if ctx.quick else 15)

    def one(name: str, queued: bool) -> float:
        labels = {"kueue.x-k8s.io/queue-name": QUEUE} if queued else {}
        selector = f"kubetrain.io/job-name={name}"
        t0 = time.monotonic()
        lab.lab.api.post(base, {"apiVersion": "kubetrain.io/v1alpha1", "kind": "TrainingJob",
                                "metadata": {"name": name, "labels": labels}, "spec": job_spec(SLEEPER, nodes)})
        seconds = lab.wait_running(namespace, selector, nodes) - t0
        lab.lab.api.delete(f"{base}/{name}")
        lab.delete_pods(namespace, selector)
        lab.wait_no_pods(namespace, selector)
        return seconds

    queued_s: list[float] = []
    plain_s: list[float] = []
    for number in range(rounds + 1):  # round 0 warms both paths up and is not counted
        ctx.log(f"kueue start, round {number}{' (warm-up)' if number == 0 else ''}: queued job, then plain job")
        queued, plain = one(f"queued-{number}", True), one(f"plain-{number}", False)
        if number > 0:
            queued_s.append(queued)
            plain_s.append(plain)
    ratio = median(queued_s) / median(plain_s)
    return KUEUE_START.measured(
        ratio, f"queued p50 {median(queued_s):.2f} s p90 {percentile(queued_s, 90):.2f} s / plain p50 "
               f"{median(plain_s):.2f} s; Kueue's part {median(queued_s) - median(plain_s):.2f} s; {rounds} rounds of "
               f"{nodes} pods", queued_p50_s=median(queued_s), plain_p50_s=median(plain_s))


BENCHMARKS = (
    Benchmark("operator.kueue", "TrainingJob in a Kueue queue (admitted at once) to pods Running vs the same job "
              "in no queue", (KUEUE_START,), kueue_bench, needs_lab=True),
)
