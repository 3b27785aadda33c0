"""A frontier-sized job on simulated nodes (kwok, tests/lab/kwok.py): 4,096 pods of 8 GPUs each placed, running and
restarted, against the same pods created, and deleted and created again, by a plain client in the same run.

The lab is one of its own: two process nodes and 4,096 kwok nodes, whose pods go Running with no process behind
them, so that what is measured is the operator and the control plane, not 2 cores starting processes. Pods are
followed with one watch (a poll listing 4,096 pods would be the heaviest load on the API server).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from bench.cluster import Cluster, bare_objects, job_spec
from bench.registry import Benchmark, Context, FigureSpec
from bench.report import Figure, Goal, median

__all__ = ["BENCHMARKS"]

Json = Any
FRONTIER_NODES = 4096
QUICK_NODES = 256
CLIENT_CONNECTIONS = 16  # the operator's own limit (OperatorConfig.api_connections)
BARE_LABEL = "bench.kubetrain.io/bare"
JOB_LABEL = "kubetrain.io/job-name"
ATTEMPT_LABEL = "kubetrain.io/attempt"
WAIT_S = 900.0
CHECK_S = 0.1

FRONTIER_RUNNING = FigureSpec(
    "scale.frontier_job_running_ratio", "x",
    Goal("<=", 1.2, f"from `create TrainingJob` of {FRONTIER_NODES} nodes (8 GPUs each, on simulated nodes) to all "
                    "its pods Running, against the same pods (and Service) created by a plain client with the "
                    f"operator's {CLIENT_CONNECTIONS} concurrent requests (issue 30)"))
FRONTIER_RESTART = FigureSpec(
    "scale.frontier_restart_ratio", "x",
    Goal("<=", 1.3, f"from one pod of a running {FRONTIER_NODES}-node job failing to every pod of its next attempt "
                    "Running, against a plain client deleting the same pods and creating them again (issue 30)"))


class Watched:
    """Every object of one collection as one watch last showed it (a list of thousands every few seconds would be
    the heaviest load on the API server being measured)."""

    def __init__(self, lab: Cluster, path: str) -> None:
        from tests.lab.jobs import list_version

        self.path = path
        self._objects: dict[str, Json] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self.error: Exception | None = None
        version = list_version(lab.lab.api, self.path)
        self._rest = lab.lab.admin_rest()  # a client of its own: its watch holds a connection
        threading.Thread(target=self._follow, args=(version,), daemon=True).start()

    def _follow(self, version: str) -> None:
        try:
            while not self._stopped:  # a watch ends at its timeout: go on from the last version seen
                for event in self._rest.watch(self.path, version):
                    seen = event["object"]
                    version = seen["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    with self._lock:
                        name = seen["metadata"]["name"]
                        if event["type"] == "DELETED":
                            self._objects.pop(name, None)
                        else:
                            self._objects[name] = seen
                            self._noted(seen)
        except Exception as error:  # reported by wait()
            with self._lock:
                self.error = error

    def wait(self, what: str, done: Callable[[list[Json]], bool], timeout: float = WAIT_S) -> float:
        """time.monotonic() once ``done`` holds for the objects seen, checked every CHECK_S (a check per event would
        scan 4,096 pods thousands of times, on the cores being measured); raises what the watch met, or
        TimeoutError."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if self.error is not None:
                    raise RuntimeError(f"the watch of {self.path} failed: {self.error}")
                if done(list(self._objects.values())):
                    return time.monotonic()
            time.sleep(CHECK_S)
        raise TimeoutError(f"{what}: not after {timeout} s")

    def objects(self) -> list[Json]:
        with self._lock:
            return list(self._objects.values())

    def _noted(self, seen: Json) -> None:
        """What a subclass keeps of each change, under the lock."""

    def stop(self) -> None:
        self._stopped = True


class PodWatch(Watched):
    """Every pod of one namespace as one watch last showed it: labels, phase, and whether it is being deleted."""

    def __init__(self, lab: Cluster, namespace: str) -> None:
        self.namespace = namespace
        self._created: dict[str, float] = {}  # when the watch first showed each pod (by uid), and bound to a node
        self._bound: dict[str, float] = {}
        super().__init__(lab, f"/api/v1/namespaces/{namespace}/pods")

    def pods(self) -> list[Json]:
        return self.objects()

    def _noted(self, seen: Json) -> None:
        now, uid = time.monotonic(), seen["metadata"]["uid"]
        self._created.setdefault(uid, now)
        if seen.get("spec", {}).get("nodeName"):
            self._bound.setdefault(uid, now)

    def milestones(self, match: Callable[[Json], bool], since: float) -> tuple[float, float]:
        """Seconds from ``since`` (monotonic) until the watch had shown every live pod of ``match`` created, and
        bound to a node: where the time to Running went, the creator's part or the scheduler's."""
        with self._lock:
            uids = [p["metadata"]["uid"] for p in self._objects.values()
                    if match(p) and not p["metadata"].get("deletionTimestamp")]
            created = max(self._created[u] for u in uids)
            bound = max(self._bound.get(u, math.inf) for u in uids)
        return created - since, bound - since


def _labelled(key: str, value: str) -> Callable[[Json], bool]:
    return lambda pod: pod["metadata"].get("labels", {}).get(key) == value


def all_running(count: int, match: Callable[[Json], bool]) -> Callable[[list[Json]], bool]:
    """``count`` live pods of ``match``, every one Running (pods being deleted do not count)."""
    def check(pods: list[Json]) -> bool:
        live = [p for p in pods if match(p) and not p["metadata"].get("deletionTimestamp")]
        return len(live) == count and all(p.get("status", {}).get("phase") == "Running" for p in live)
    return check


def none_left(match: Callable[[Json], bool]) -> Callable[[list[Json]], bool]:
    return lambda pods: not any(match(p) for p in pods)


def frontier_spec(nodes: int) -> Json:
    """A job whose every pod fills one simulated node (8 GPUs); the process nodes have none."""
    return job_spec("import time; time.sleep(86400)", nodes) | {
        "gpusPerNode": 8, "procsPerNode": 8, "resources": {"cpu": "1", "memory": "1Gi", "sharedMemory": "1Gi"},
        "failurePolicy": {"backoffLimit": 3}}


def frontier_bench(ctx: Context) -> list[Figure]:
    nodes, rounds = (QUICK_NODES if ctx.quick else FRONTIER_NODES), ctx.rounds(quick=1, full=2)
    lab = Cluster(ctx, kwok_nodes=nodes)
    try:
        lab.start()
        namespace = lab.namespace("frontier")
        watch = PodWatch(lab, namespace)
        try:
            return _measure(ctx, lab, watch, nodes, rounds)
        finally:
            watch.stop()
    finally:
        lab.stop()


def _measure(ctx: Context, lab: Cluster, watch: PodWatch, nodes: int, rounds: int) -> list[Figure]:
    from tests.lab.jobs import Jobs

    namespace = watch.namespace
    jobs = Jobs(lab.lab, namespace)
    spec = frontier_spec(nodes)
    times: dict[str, list[Span]] = {}
    _warm_up(ctx, lab, jobs, watch)
    for number in range(rounds):  # alternating, so that a slow spell hits both
        ctx.log(f"round {number}: a TrainingJob of {nodes} nodes started and restarted, then the same pods from a "
                "plain client")
        spans = {**_job_round(lab, jobs, watch, f"job-{number}", spec),
                 **_bare_round(lab, namespace, watch, f"bare-{number}", spec)}
        for key, value in spans.items():
            times.setdefault(key, []).append(value)
    job, bare, restart, bare_restart = (
        Span(*(median(values) for values in zip(*times[key], strict=True)))
        for key in ("job", "bare", "restart", "bare_restart"))
    return [
        FRONTIER_RUNNING.measured(
            job.running / bare.running,
            f"job p50 {job.running:.1f} s / plain client p50 {bare.running:.1f} s to {nodes} pods Running "
            f"({job.where('job')}; {bare.where('bare')}); {rounds} rounds each",
            job_s=job.running, bare_s=bare.running, pods=nodes,
        ).with_extra(job.extra("job") | bare.extra("bare")),
        FRONTIER_RESTART.measured(
            restart.running / bare_restart.running,
            f"gang restart p50 {restart.running:.1f} s / plain delete-and-create p50 {bare_restart.running:.1f} s "
            f"for {nodes} pods ({restart.where('restart')}; {bare_restart.where('bare_restart')}); {rounds} rounds "
            "each", restart_s=restart.running, bare_restart_s=bare_restart.running, pods=nodes,
        ).with_extra(restart.extra("restart") | bare_restart.extra("bare_restart"))]


class Span(NamedTuple):
    """Seconds from a start until the watch had shown every pod created, every pod bound to a node, every pod
    Running: where the time to Running went, the creator's part or the scheduler's."""

    created: float
    bound: float
    running: float

    def where(self, side: str) -> str:
        return f"{side}: all created at {self.created:.1f} s, bound at {self.bound:.1f} s"

    def extra(self, side: str) -> dict[str, float]:
        return {f"{side}_created_s": self.created, f"{side}_bound_s": self.bound}


def _until_running(watch: PodWatch, what: str, count: int, match: Callable[[Json], bool], since: float) -> Span:
    """Wait for ``count`` pods of ``match`` all Running; the span since ``since``."""
    running = watch.wait(f"{what}: {count} pods Running", all_running(count, match))
    return Span(*watch.milestones(match, since), running - since)


def _warm_up(ctx: Context, lab: Cluster, jobs: Any, watch: PodWatch) -> None:
    """The operator's first job pays once for what every later one finds ready (the node list, the pod watch):
    a job of one pod that no node takes (it would hold a node the measured job needs), made and deleted."""
    from bench.scale import NOWHERE

    ctx.log("warm-up: a one-pod job that no node takes (not counted)")
    jobs.create("warm", frontier_spec(1) | {"scheduling": {"nodeSelector": NOWHERE}})
    of_warm = _labelled(JOB_LABEL, "warm")
    watch.wait("the warm-up job's pod", lambda pods: any(of_warm(p) for p in pods))
    lab.lab.api.delete(f"{jobs.base}/warm")
    delete_pods(lab, watch, of_warm)
    watch.wait("the warm-up job's pod gone", none_left(of_warm))


def _job_round(lab: Cluster, jobs: Any, watch: PodWatch, name: str, spec: Json) -> dict[str, Span]:
    from tests.lab.kwok import EXIT_CODE_ANNOTATION

    nodes = spec["nodes"]
    of_job = _labelled(JOB_LABEL, name)

    def of_attempt(attempt: int) -> Callable[[Json], bool]:
        return lambda p: of_job(p) and _labelled(ATTEMPT_LABEL, str(attempt))(p)
    t0 = time.monotonic()
    jobs.create(name, spec)
    started = _until_running(watch, name, nodes, of_attempt(0), t0)
    t1 = time.monotonic()
    lab.lab.api.merge_patch(f"{watch.path}/{name}-{nodes // 2}",
                            {"metadata": {"annotations": {EXIT_CODE_ANNOTATION: "1"}}})
    restarted = _until_running(watch, f"{name}, attempt 1", nodes, of_attempt(1), t1)
    lab.lab.api.delete(f"{jobs.base}/{name}")
    delete_pods(lab, watch, of_job)
    watch.wait(f"{name}: pods gone", none_left(of_job))
    return {"job": started, "restart": restarted}


def _bare_round(lab: Cluster, namespace: str, watch: PodWatch, name: str, spec: Json) -> dict[str, Span]:
    nodes = spec["nodes"]
    of_bare = _labelled(BARE_LABEL, name)
    objects = bare_objects(name, namespace, spec)
    t0 = time.monotonic()
    lab.create_objects(namespace, objects, CLIENT_CONNECTIONS)
    started = _until_running(watch, name, nodes, of_bare, t0)
    t1 = time.monotonic()
    delete_pods(lab, watch, of_bare)
    watch.wait(f"{name}: pods gone", none_left(of_bare))
    lab.create_pods(namespace, objects[1:], CLIENT_CONNECTIONS)
    restarted = _until_running(watch, f"{name}, again", nodes, of_bare, t1)
    lab.lab.api.delete(f"/api/v1/namespaces/{namespace}/services/{objects[0]['metadata']['name']}")
    delete_pods(lab, watch, of_bare)
    watch.wait(f"{name}: pods gone", none_left(of_bare))
    return {"bare": started, "bare_restart": restarted}


def delete_pods(lab: Cluster, watch: PodWatch, match: Callable[[Json], bool]) -> None:
    """Delete the pods one request each, ``CLIENT_CONNECTIONS`` at a time, as the operator does: one request for
    a collection of 4,096 pods outlasts the API server's 60 s request timeout."""
    import concurrent.futures

    from tests.lab.rest import ApiError

    def delete(name: str) -> None:
        try:
            lab.lab.api.request("DELETE", f"{watch.path}/{name}")
        except ApiError as error:
            if error.status != 404:  # gone already: what was asked
                raise

    names = [p["metadata"]["name"] for p in watch.pods() if match(p)]
    with concurrent.futures.ThreadPoolExecutor(CLIENT_CONNECTIONS) as pool:
        list(pool.map(delete, names))


BENCHMARKS = (
    Benchmark("scale.frontier", f"a {FRONTIER_NODES}-node job on simulated nodes: started and restarted, vs the same "
                                "pods from a plain client", (FRONTIER_RUNNING, FRONTIER_RESTART), frontier_bench,
              needs_lab=True),
)
