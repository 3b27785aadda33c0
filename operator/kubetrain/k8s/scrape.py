"""One scrape of the trainer's metrics endpoint (rank 0 of pod 0), read by core/progress.py; and, when the
heartbeat stops, each rank's stack (its ``/stacks`` on the same port), read by core/hangs.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import aiohttp

from kubetrain.core import api
from kubetrain.core.hangs import RankStack, Silent, parse_stack
from kubetrain.core.progress import read_progress
from kubetrain.core.status import CheckpointAnswer, CheckpointAsk, Scrape

__all__ = ["SCRAPE_TIMEOUT_SECONDS", "ask_checkpoint", "fetch_progress", "fetch_stacks"]

# How long one scrape may take: the reconcile loop must never wait on a slow trainer.
SCRAPE_TIMEOUT_SECONDS = 3.0
# How long a stall's restart waits for all of its ranks' stacks.
STACKS_DEADLINE_SECONDS = 30.0
WHOLE_REQUEST = aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS)
# A rank's stack: the time counts from its connection, not from its turn in the session's queue (fetch_stacks).
FROM_CONNECTION = aiohttp.ClientTimeout(sock_connect=SCRAPE_TIMEOUT_SECONDS, sock_read=SCRAPE_TIMEOUT_SECONDS)


async def fetch_progress(session: aiohttp.ClientSession, pod_ip: str, port: int = api.METRICS_PORT) -> Scrape:
    """Scrape one endpoint; a failed Scrape when it cannot be read (connection refused, timeout, HTTP error)."""
    text, error = await _read(session, "GET", f"http://{pod_ip}:{port}/metrics", 200, WHOLE_REQUEST)
    return Scrape(error=error) if error else read_progress(text)


async def fetch_stacks(session: aiohttp.ClientSession, pods: Sequence[tuple[str, str]], procs_per_node: int,
                       base_port: int = api.METRICS_PORT) -> list[RankStack | Silent]:
    """Every rank's stack, asked at once (the session's connection limit queues them): ``pods`` are (name, IP);
    local rank r serves ``base_port`` + r. Each rank gets SCRAPE_TIMEOUT_SECONDS from its connection on, and all
    of them STACKS_DEADLINE_SECONDS: a wide gang is not waited on for long before its restart."""
    ranks = [(name, ip, local_rank) for name, ip in pods for local_rank in range(procs_per_node)]
    tasks = [asyncio.ensure_future(_fetch_stack(session, f"http://{ip}:{base_port + local_rank}{api.STACKS_PATH}",
                                                name, local_rank)) for name, ip, local_rank in ranks]
    if tasks:
        await asyncio.wait(tasks, timeout=STACKS_DEADLINE_SECONDS)
    for task in tasks:
        task.cancel()  # a no-op for those done
    return [task.result() if task.done() and not task.cancelled()
            else Silent(name, local_rank, f"not read within the {STACKS_DEADLINE_SECONDS:.0f}s given to all ranks")
            for task, (name, _, local_rank) in zip(tasks, ranks, strict=True)]


async def _fetch_stack(session: aiohttp.ClientSession, url: str, pod: str, local_rank: int) -> RankStack | Silent:
    text, error = await _read(session, "GET", url, 200, FROM_CONNECTION)
    if error:
        return Silent(pod, local_rank, error)
    try:
        return parse_stack(json.loads(text))
    except (ValueError, KeyError, TypeError):
        return Silent(pod, local_rank, "its port serves no stack: not kubetrain_trainer's server")


async def ask_checkpoint(session: aiohttp.ClientSession, pod_ip: str | None, ask: CheckpointAsk,
                         port: int = api.METRICS_PORT) -> CheckpointAnswer:
    """``POST /checkpoint`` to rank 0: the gang saves at its next step (202), or why it could not be asked."""
    if pod_ip is None:
        return CheckpointAnswer(ask, "rank 0 has no address yet")
    _, error = await _read(session, "POST", f"http://{pod_ip}:{port}{api.CHECKPOINT_PATH}", 202, WHOLE_REQUEST)
    return CheckpointAnswer(ask, error)


async def _read(session: aiohttp.ClientSession, method: str, url: str, expected: int,
                timeout: aiohttp.ClientTimeout) -> tuple[str, str | None]:
    """One request to a trainer: (the answer's text, None), or ("", why there is none)."""
    try:
        async with session.request(method, url, timeout=timeout) as response:
            if response.status != expected:
                return "", f"{url} answered HTTP {response.status}"
            return await response.text(), None
    except TimeoutError:
        return "", f"{url} did not answer within {SCRAPE_TIMEOUT_SECONDS:.0f}s"
    except (aiohttp.ClientError, UnicodeDecodeError) as error:
        return "", f"{url}: {type(error).__name__}: {error}"[:256]
