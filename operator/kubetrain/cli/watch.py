"""`kubetrain watch NAME`: a live progress bar from a TrainingJob's status, for terminal users."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from kubetrain.cli.cluster import RECONNECTING, Cluster, connect
from kubetrain.core import api

__all__ = ["describe_status", "watch_job"]

Json = Any


def describe_status(status: Mapping[str, Json]) -> str:
    """One line: phase, nodes (or, while it waits in Kueue, its place in the queue), loss, throughput, ETA,
    restarts."""
    progress = status.get("progress") or {}
    parts = [str(status.get("phase", "Pending")), f"nodes {(status.get('nodes') or {}).get('summary', '0/0')}"]
    position = status.get("queuePosition") or {}
    if "localQueue" in position:
        parts.append(f"position {position['localQueue']} in its LocalQueue ({position.get('clusterQueue')} in its "
                     "ClusterQueue)")
    if "lossText" in progress:
        parts.append(f"loss {progress['lossText']}")
    if "throughputText" in progress:
        parts.append(f"{progress['throughputText']} samples/s")
    if "eta" in progress:
        parts.append(f"ETA {progress['eta']}")
    if status.get("restarts"):
        parts.append(f"restarts {status['restarts']}")
    return " | ".join(parts)


def watch_job(namespace: str, name: str, timeout: int = 86400, console: Console | None = None) -> int:
    """Follow the job until it ends, across lost connections; 0: it succeeded, 1: it failed or was deleted,
    3: ``timeout`` seconds passed first. Raises ApiError for a refusal (401, 403, 404)."""
    return asyncio.run(_watch(connect(namespace), name, timeout, console or Console()))


async def _watch(cluster: Cluster, name: str, timeout: int, console: Console) -> int:
    last_phase = None
    async with cluster, contextlib.aclosing(cluster.watch_job(name, timeout)) as events:
        with Progress(TextColumn("[bold]{task.fields[job]}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TextColumn("{task.fields[line]}"), TimeElapsedColumn(), console=console) as bar:
            task: TaskID = bar.add_task("train", total=None, job=name, line="waiting for status")
            async for kind, job in events:
                if kind == RECONNECTING:
                    bar.console.log(f"{name}: lost the watch ({job}); reconnecting")
                    continue
                if kind == "DELETED":
                    bar.console.log(f"{name}: deleted")
                    return 1
                status = job.get("status") or {}
                progress = status.get("progress") or {}
                bar.update(task, total=progress.get("totalSteps"), completed=progress.get("step", 0),
                           line=describe_status(status))
                phase = status.get("phase")
                if phase != last_phase:
                    bar.console.log(f"{name}: {phase or 'Pending'}: {status.get('message', '')}")
                    last_phase = phase
                if phase == api.Phase.SUCCEEDED:
                    return 0
                if phase == api.Phase.FAILED:
                    return 1
    return 3
