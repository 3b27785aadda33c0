"""`kubetrain logs NAME`: the output of every pod of one attempt, each line prefixed by its node.

Read through the API server (pods/log), so it works on any cluster the user's kubeconfig reaches.
Workers' lines carry their global rank (``[rank3]: ...``, see api.LOG_LINE_PREFIX), which ``--rank``
filters on. An attempt whose pods are gone still has its failure records in the job's status, with the
tail of each failed pod's log (the kubelet's FallbackToLogsOnError), so a post-mortem outlives a gang restart.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubetrain.core import api
from kubetrain.core.status import pod_state

__all__ = ["LogPod", "failure_lines", "keep_line", "pods_of_attempt", "prefixed", "show_logs"]

Json = Any

# Seconds between tries while a pod's container has not started, and while the next attempt's pods appear.
POLL_SECONDS = 1.0
_FINISHED = (api.Phase.SUCCEEDED, api.Phase.FAILED)
# A followed pod that prints nothing for this long ends its stream (the client needs a finite read timeout).
FOLLOW_READ_TIMEOUT_SECONDS = 86400


@dataclass(frozen=True)
class LogPod:
    name: str
    node_index: int
    attempt: int


def pods_of_attempt(pods: Iterable[Mapping[str, Json]], attempt: int | None) -> tuple[int | None, list[LogPod]]:
    """The pods of ``attempt`` (None: the newest one present), in node order, and that attempt."""
    found = []
    for pod in pods:
        labels = pod.get("metadata", {}).get("labels", {})
        try:
            found.append(LogPod(pod["metadata"]["name"], int(labels[api.LABEL.NODE_INDEX]),
                                int(labels[api.LABEL.ATTEMPT])))
        except (KeyError, ValueError):
            continue  # not a pod the operator made
    if attempt is None:
        attempt = max((pod.attempt for pod in found), default=None)
    return attempt, sorted((pod for pod in found if pod.attempt == attempt), key=lambda pod: pod.node_index)


def keep_line(line: str, rank: int | None) -> bool:
    """With ``rank``, only that rank's lines (torchrun's own lines carry no rank and are dropped)."""
    if rank is None:
        return True
    match = api.LOG_LINE_RANK.match(line)
    return match is not None and int(match.group(1)) == rank


def prefixed(pod: LogPod, line: str) -> str:
    return f"node-{pod.node_index} | {line}"


def failure_lines(status: Mapping[str, Json], attempt: int) -> list[str]:
    """What the job's status remembers of ``attempt``'s failures: one header per pod, then its log tail."""
    lines = []
    for record in status.get("failures") or []:
        if record.get("attempt") != attempt:
            continue
        where = record.get("pod") or "the attempt"
        code = f", exit code {record['exitCode']}" if "exitCode" in record else ""
        lines.append(f"{where}: {record.get('reason', 'Failed')}{code} at {record.get('time', '?')}")
        lines += [f"  {line}" for line in str(record.get("logTail") or record.get("message") or "").splitlines()]
    return lines


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """Whole lines from a byte stream that splits them anywhere."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


class _Cluster:
    """The few API calls `kubetrain logs` makes, with the user's kubeconfig (synchronous)."""

    def __init__(self, namespace: str) -> None:
        from kubernetes import client

        from kubetrain.cli.client import load_configuration

        api_client = client.ApiClient(load_configuration(pool_size=8))  # one stream per pod at once
        # Typed as Any: with _preload_content=False the calls return raw responses, not the models the stubs say.
        self.core: Any = client.CoreV1Api(api_client)
        self.custom: Any = client.CustomObjectsApi(api_client)
        self.namespace = namespace

    def job(self, name: str) -> Json:
        return self.custom.get_namespaced_custom_object(api.GROUP, api.VERSION, self.namespace, api.PLURAL, name)

    def pods(self, job: Mapping[str, Json]) -> list[Json]:
        from kubetrain.core.naming import job_selector

        selector = job_selector(job["metadata"]["name"], job["metadata"].get("uid", ""))
        listing = self.core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False)
        items: list[Json] = json.loads(listing.data)["items"]
        return items

    def container_ended(self, pod: str) -> bool:
        """Whether the pod's trainer container has finished, or the pod is gone."""
        from kubernetes.client.exceptions import ApiException

        try:
            found = json.loads(self.core.read_namespaced_pod(pod, self.namespace, _preload_content=False).data)
        except ApiException as error:
            if _status_code(error) == 404:
                return True
            raise
        state = pod_state(found)  # the operator's own summary: its trainer container's exit, the pod's phase
        return state.finished or state.exit_code is not None

    def log_chunks(self, pod: str, follow: bool) -> Iterator[bytes]:
        """The container's log; raises ApiException while it has not started (400) or is gone (404)."""
        response = self.core.read_namespaced_pod_log(pod, self.namespace, container=api.CONTAINER_NAME,
                                                     follow=follow, _preload_content=False,
                                                     _request_timeout=(10, FOLLOW_READ_TIMEOUT_SECONDS))
        yield from response.stream(4096, decode_content=True)


Write = Callable[[str], None]


def _status_code(error: Exception) -> int | None:
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


def _pod_lines(cluster: _Cluster, pod: LogPod, follow: bool) -> Iterator[str]:
    """One pod's lines; when following, waits for its container to start, and goes on where a stream ended while
    the container still runs (the kubelet ends a follow at once for a container created but not yet running,
    and answers 404 for a pod placed on it that it has not seen yet). A pod that is gone ends it."""
    from kubernetes.client.exceptions import ApiException

    seen = 0
    while True:
        try:
            for number, line in enumerate(_lines(cluster.log_chunks(pod.name, follow))):
                if number >= seen:  # a stream opened again starts from the top: skip what was shown
                    seen += 1
                    yield line
            if not follow or cluster.container_ended(pod.name):
                return
        except ApiException as error:
            if _status_code(error) == 404:
                # The pod is gone; or it exists and its kubelet has not seen it yet (just placed): wait for it.
                if not follow or cluster.container_ended(pod.name):
                    return
            elif _status_code(error) != 400:
                raise
            elif not follow:  # 400: the container has not started (yet, or ever: the reason says which)
                yield f"(no output: {json.loads(error.body or '{}').get('message', error.reason)})"
                return
        time.sleep(POLL_SECONDS)


def _stream_pods(cluster: _Cluster, pods: Sequence[LogPod], rank: int | None, write: Write) -> None:
    """Follow every pod at once, each in a thread; lines are written by this thread only, whole."""
    lines: queue.Queue[tuple[LogPod, str | None]] = queue.Queue()

    def pump(pod: LogPod) -> None:
        try:
            for line in _pod_lines(cluster, pod, follow=True):
                lines.put((pod, line))
        except Exception as error:  # any failure ends this pod's stream, and the output says so
            lines.put((pod, f"(log stream failed: {type(error).__name__}: {error})"))
        finally:
            lines.put((pod, None))

    for pod in pods:
        threading.Thread(target=pump, args=(pod,), daemon=True).start()
    running = len(pods)
    while running:
        pod, line = lines.get()
        if line is None:
            running -= 1
        elif keep_line(line, rank):
            write(prefixed(pod, line))


def _print_attempt(cluster: _Cluster, job: Mapping[str, Json], attempt: int | None, rank: int | None,
                   write: Write) -> int:
    """Everything one attempt printed so far, pod after pod; its failure records once its pods are gone."""
    status = job.get("status") or {}
    _, pods = pods_of_attempt(cluster.pods(job), attempt)
    for pod in pods:
        for line in _pod_lines(cluster, pod, follow=False):
            if keep_line(line, rank) or line.startswith("(no output"):
                write(prefixed(pod, line))
    if pods:
        return 0
    wanted = attempt if attempt is not None else int(status.get("attempt", 0))
    recorded = failure_lines(status, wanted)
    if not recorded:
        write(f"{job['metadata']['name']}: no pods of attempt {wanted}, and no failures of it in the status")
        return 1
    write(f"the pods of attempt {wanted} are gone; its failures, as the job's status recorded them:")
    for line in recorded:
        write(line)
    return 0


def _follow(cluster: _Cluster, name: str, attempt: int | None, rank: int | None, write: Write) -> int:
    """Stream the attempt's pods until they end; without ``attempt``, go on with each new attempt until the
    job ends. 0: it succeeded (or the given attempt ended), 1: it failed or was deleted."""
    from kubernetes.client.exceptions import ApiException

    shown: set[int] = set()
    while True:
        try:
            job = cluster.job(name)
        except ApiException as error:
            if _status_code(error) != 404:
                raise
            write(f"{name}: deleted")
            return 1
        chosen, pods = pods_of_attempt(cluster.pods(job), attempt)
        if pods and chosen is not None and chosen not in shown:
            if shown:
                write(f"--- attempt {chosen} ---")
            _stream_pods(cluster, pods, rank, write)
            shown.add(chosen)
            if attempt is not None:
                return 0
            continue
        phase = (job.get("status") or {}).get("phase")
        if phase in _FINISHED:
            return 0 if phase == api.Phase.SUCCEEDED else 1
        time.sleep(POLL_SECONDS)


def show_logs(namespace: str, name: str, *, follow: bool = False, attempt: int | None = None,
              rank: int | None = None, write: Write = print) -> int:
    """`kubetrain logs`: 0 when there was something to show (following: the job succeeded), 1 otherwise."""
    cluster = _Cluster(namespace)
    if follow:
        return _follow(cluster, name, attempt, rank, write)
    return _print_attempt(cluster, cluster.job(name), attempt, rank, write)
