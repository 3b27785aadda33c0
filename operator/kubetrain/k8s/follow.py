"""List, then watch from the list's resourceVersion, for good: the loop the pod and node watches share.

A failure is logged and retried with backoff, from where it stopped; a 410 (the API server no longer keeps that
version) lists again. A watch that ends at once without an event counts as a failure: a proxy that closes every
stream must not make a loop of requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from kubetrain.k8s.kube import VersionGoneError

__all__ = ["Cursor", "follow"]

Json = Any
RETRY_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # seconds after consecutive failures of a list or watch
QUICK_END = 1.0  # seconds: a watch that ends sooner without an event was refused, not timed out


class Cursor(Protocol):
    """Where a watch goes on from: the version of the last list or event; None lists first."""

    version: str | None


async def follow(what: str, cursor: Cursor, relist: Callable[[], Awaitable[None]],
                 watch: Callable[[str], AsyncIterator[Json]], apply: Callable[[Json], None], *,
                 log: logging.Logger) -> None:
    """``relist`` sets ``cursor.version`` (and what it lists); ``apply`` takes each event and moves it on."""
    failures = 0
    while True:
        began = time.monotonic()
        try:
            if cursor.version is None:
                await relist()
            events = 0
            async for event in watch(cursor.version or ""):
                apply(event)
                events, failures = events + 1, 0
            if events or time.monotonic() - began >= QUICK_END:
                continue  # the API server ended it at its timeout
            problem = "the watch ended at once"
        except VersionGoneError:
            cursor.version = None
            continue
        except Exception as error:
            problem = str(error) or type(error).__name__
        delay = RETRY_DELAYS[min(failures, len(RETRY_DELAYS) - 1)]
        failures += 1
        log.warning("watching %s failed, again in %.1fs: %s", what, delay, problem)
        await asyncio.sleep(delay)
