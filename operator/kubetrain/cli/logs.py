"""`kubetrain logs NAME`: the output of every pod of one attempt, each line prefixed by its node.

Read through the API server (pods/log), so it works on any cluster the user's kubeconfig reaches.
Workers' lines carry their global rank (``[rank3]: ...``, see api.LOG_LINE_PREFIX), which ``--rank``
filters on. An attempt whose pods are gone still has its failure records in the job's status, with the
tail of each failed pod's log (the kubelet's FallbackToLogsOnError), so a post-mortem outlives a gang restart.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubetrain.cli.cluster import Cluster, connect
from kubetrain.core import api
from kubetrain.core.status import pod_state
from kubetrain.k8s.transport import HTTP_NOT_FOUND, ApiError

__all__ = ["LogPod", "failure_lines", "keep_line", "lines_of", "pods_of_attempt", "prefixed", "show_logs"]

Json = Any

# Seconds between tries while a pod's container has not started, and while the next attempt's pods appear.
POLL_SECONDS = 1.0
_FINISHED = (api.Phase.SUCCEEDED, api.Phase.FAILED)
# A followed pod that prints nothing for this long ends its stream (the client needs a finite read timeout).
FOLLOW_READ_TIMEOUT_SECONDS = 86400
HTTP_BAD_REQUEST = 400  # pods/log: the container has not started


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
        lines += _hang_lines(record.get("hang") or {})
    return lines


def _hang_lines(hang: Mapping[str, Json]) -> list[str]:
    """A stall's stacks, as the ranks answered before the restart: each distinct stack once."""
    lines = []
    for group in hang.get("stacks") or []:
        lines.append(f"  stack of rank(s) {group.get('ranks', '?')}, innermost last:")
        lines += [f"    {line}" for line in str(group.get("stack", "")).splitlines()]
    return lines


async def lines_of(chunks: AsyncIterable[bytes]) -> AsyncGenerator[str, None]:
    """Whole lines from a byte stream that splits them anywhere."""
    pending = b""
    async for chunk in chunks:
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


Write = Callable[[str], None]


async def _container_ended(cluster: Cluster, pod: str) -> bool:
    """Whether the pod's trainer container has finished, or the pod is gone."""
    try:
        found = await cluster.pod(pod)
    except ApiError as error:
        if error.status == HTTP_NOT_FOUND:
            return True
        raise
    state = pod_state(found)  # the operator's own summary: its trainer container's exit, the pod's phase
    return state.finished or state.exit_code is not None


async def _pod_lines(cluster: Cluster, pod: LogPod, follow: bool) -> AsyncGenerator[str, None]:
    """One pod's lines; when following, waits for its container to start, and goes on where a stream ended while
    the container still runs (the kubelet ends a follow at once for a container created but not yet running,
    and answers 404 for a pod placed on it that it has not seen yet). A pod that is gone ends it."""
    seen = 0
    while True:
        try:
            chunks = cluster.log_chunks(pod.name, follow, read_timeout=FOLLOW_READ_TIMEOUT_SECONDS)
            async with contextlib.aclosing(lines_of(chunks)) as lines:
                number = 0
                async for line in lines:
                    if number >= seen:  # a stream opened again starts from the top: skip what was shown
                        seen += 1
                        yield line
                    number += 1
            if not follow or await _container_ended(cluster, pod.name):
                return
        except ApiError as error:
            if error.status == HTTP_NOT_FOUND:
                # The pod is gone; or it exists and its kubelet has not seen it yet (just placed): wait for it.
                if not follow or await _container_ended(cluster, pod.name):
                    return
            elif error.status != HTTP_BAD_REQUEST:
                raise
            elif not follow:  # 400: the container has not started (yet, or ever: the message says which)
                yield f"(no output: {error.message})"
                return
        await asyncio.sleep(POLL_SECONDS)


async def _pump(cluster: Cluster, pod: LogPod, rank: int | None, write: Write) -> None:
    """Follow one pod; each line is written whole. Any failure ends this pod's stream, and the output says so."""
    try:
        async with contextlib.aclosing(_pod_lines(cluster, pod, follow=True)) as lines:
            async for line in lines:
                if keep_line(line, rank):
                    write(prefixed(pod, line))
    except Exception as error:
        write(prefixed(pod, f"(log stream failed: {type(error).__name__}: {error})"))


async def _stream_attempt(cluster: Cluster, job: Mapping[str, Json], attempt: int, rank: int | None,
                          write: Write) -> None:
    """Follow every pod of ``attempt`` at once (one task each, one event loop), also a pod made after the first
    look: a gang's pods are created together, but a listing can come between two of the creates (a follow then
    showed node 1 alone for a whole attempt). Ends once every followed pod has ended and a last look finds no
    other."""
    pumps: dict[str, asyncio.Task[None]] = {}
    while True:
        _, pods = pods_of_attempt(await cluster.pods(job), attempt)
        new = [pod for pod in pods if pod.name not in pumps]
        for pod in new:
            pumps[pod.name] = asyncio.create_task(_pump(cluster, pod, rank, write))
        if not new and all(task.done() for task in pumps.values()):
            return
        await asyncio.wait(pumps.values(), timeout=POLL_SECONDS or None)


async def _print_attempt(cluster: Cluster, job: Mapping[str, Json], attempt: int | None, rank: int | None,
                         write: Write) -> int:
    """Everything one attempt printed so far, pod after pod; its failure records once its pods are gone."""
    status = job.get("status") or {}
    _, pods = pods_of_attempt(await cluster.pods(job), attempt)
    for pod in pods:
        async with contextlib.aclosing(_pod_lines(cluster, pod, follow=False)) as lines:
            async for line in lines:
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


async def _follow(cluster: Cluster, name: str, attempt: int | None, rank: int | None, write: Write) -> int:
    """Stream the attempt's pods until they end; without ``attempt``, go on with each new attempt until the
    job ends. 0: it succeeded (or the given attempt ended), 1: it failed or was deleted."""
    shown: set[int] = set()
    while True:
        try:
            job = await cluster.job(name)
        except ApiError as error:
            if error.status != HTTP_NOT_FOUND:
                raise
            write(f"{name}: deleted")
            return 1
        chosen, pods = pods_of_attempt(await cluster.pods(job), attempt)
        if pods and chosen is not None and chosen not in shown:
            if shown:
                write(f"--- attempt {chosen} ---")
            await _stream_attempt(cluster, job, chosen, rank, write)
            shown.add(chosen)
            if attempt is not None:
                return 0
            continue
        phase = (job.get("status") or {}).get("phase")
        if phase in _FINISHED:
            return 0 if phase == api.Phase.SUCCEEDED else 1
        await asyncio.sleep(POLL_SECONDS)


async def _show(cluster: Cluster, name: str, *, follow: bool, attempt: int | None, rank: int | None,
                write: Write) -> int:
    async with cluster:
        if follow:
            return await _follow(cluster, name, attempt, rank, write)
        return await _print_attempt(cluster, await cluster.job(name), attempt, rank, write)


def show_logs(namespace: str, name: str, *, follow: bool = False, attempt: int | None = None,
              rank: int | None = None, write: Write = print) -> int:
    """`kubetrain logs`: 0 when there was something to show (following: the job succeeded), 1 otherwise.
    Raises ApiError when the API server refuses (404: no such job), kopf.LoginError without credentials."""
    return asyncio.run(_show(connect(namespace), name, follow=follow, attempt=attempt, rank=rank, write=write))
