"""A controller's work queue of keys, on asyncio (no kopf, no API client).

A key is processed by one worker at a time; a key added again while it is processed is processed once more
after (the triggers of a 512-pod gang's creation make a few passes, not 512). Keys added for later wait on a
timer of their own (``loop.call_at``), never a poll; a failed key comes back after a backoff that grows with
its consecutive failures, until it succeeds or is forgotten. Ready keys wait in two lanes (lanes.py): a free
worker takes the oldest prompt key, and a routine one only when no prompt key waits.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar, cast

__all__ = ["WorkQueue"]

K = TypeVar("K", bound=Hashable)
R = TypeVar("R")  # why a key was queued, handed to process with it
LOGGER = logging.getLogger("kubetrain.k8s.workqueue")


class WorkQueue(Generic[K, R]):
    """Keys to process with ``process(key, reason)``; ``reason`` says what queued the key (its first add since
    it was last processed, or its first prompt one after routine ones). ``backoff(failures)``: seconds before
    the retry of a key that failed that often. Ready keys are served by up to ``workers`` tasks, started as keys
    come and ended when none is left; ``routine(reason)`` says which keys wait in the routine lane."""

    def __init__(self, process: Callable[[K, R], Awaitable[None]], *, backoff: Callable[[int], float],
                 workers: int = 16, routine: Callable[[R], bool] = lambda _: False) -> None:
        self._process = process
        self._backoff = backoff
        self._routine = routine
        self._workers_max = workers
        self._workers: set[asyncio.Task[None]] = set()
        self._ready: tuple[deque[K], deque[K]] = (deque(), deque())  # the prompt lane, the routine lane
        self._queued: dict[K, R] = {}  # ready keys, with why (a lane may hold a key run or moved meanwhile)
        self._active: set[K] = set()
        self._again: dict[K, R] = {}  # added while active: once more after
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._timer_context: contextvars.Context | None = None  # see add_at
        self._failures: dict[K, int] = {}
        self._idle_waiters: list[asyncio.Future[None]] = []

    def add(self, key: K, reason: R) -> None:
        """Process ``key`` soon (once more after the pass that runs now, if one does)."""
        if key in self._active:
            self._once_more(key, reason)
        elif key not in self._queued:
            self._queued[key] = reason
            self._ready[self._routine(reason)].append(key)
            self._start_workers()
        elif self._moves_up(self._queued[key], reason):
            self._queued[key] = reason
            self._ready[False].append(key)

    def _once_more(self, key: K, reason: R) -> None:
        """One more pass after the running one, for the first reason, or the first prompt one after routine ones."""
        if key not in self._again or self._moves_up(self._again[key], reason):
            self._again[key] = reason

    def _moves_up(self, queued: R, reason: R) -> bool:
        """Whether a key queued for a routine reason goes to the prompt lane: someone now waits on it."""
        return self._routine(queued) and not self._routine(reason)

    def add_at(self, key: K, when: float, reason: R) -> None:
        """Process ``key`` at ``when`` (time.monotonic()), or at an earlier time already asked for."""
        pending = self._timers.get(key)
        if pending is not None and pending[0] <= when:
            return
        self.cancel(key)
        # Every timer fires in one context, its first caller's: the workers a timer starts need kopf's posting
        # variables (kopf.event), which any handler's context has. call_at would otherwise copy each caller's
        # context, and every waiting timer (one resync per job) would keep that kopf event's body alive.
        if self._timer_context is None:
            self._timer_context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        handle = loop.call_at(loop.time() + max(0.0, when - time.monotonic()), self._fire, key, reason,
                              context=self._timer_context)
        self._timers[key] = (when, handle)

    def add_after(self, key: K, delay: float, reason: R) -> None:
        self.add_at(key, time.monotonic() + delay, reason)

    def reschedule(self, key: K, delay: float, reason: R) -> None:
        """Process ``key`` in ``delay`` seconds, instead of when its timer would have fired."""
        self.cancel(key)
        self.add_after(key, delay, reason)

    def add_rate_limited(self, key: K, reason: R) -> float:
        """Count a failure of ``key`` and process it again after the backoff for that count (not sooner for an
        earlier timer): its delay."""
        delay = self.next_backoff(key)
        self._failures[key] = self.failures(key) + 1
        self.reschedule(key, delay, reason)
        return delay

    def next_backoff(self, key: K) -> float:
        """The delay before the retry if ``key`` failed now."""
        return self._backoff(self.failures(key) + 1)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    def succeeded(self, key: K) -> None:
        """Its failures are over: the next one backs off from the start."""
        self._failures.pop(key, None)

    def due(self, key: K) -> float | None:
        """When its timer fires (time.monotonic()), None without one."""
        pending = self._timers.get(key)
        return None if pending is None else pending[0]

    def cancel(self, key: K) -> None:
        """Drop its timer."""
        pending = self._timers.pop(key, None)
        if pending is not None:
            pending[1].cancel()

    def forget(self, key: K) -> None:
        """Drop everything about ``key`` but a pass that runs now."""
        self.cancel(key)
        self._failures.pop(key, None)
        self._queued.pop(key, None)
        self._again.pop(key, None)

    def busy(self, key: K) -> bool:
        return key in self._active

    def running(self) -> int:
        """How many passes run now, in its workers and in callers' tasks (``run``)."""
        return len(self._active)

    def again(self, key: K) -> bool:
        """Whether another pass of ``key`` follows the one that runs now (it was added meanwhile)."""
        return key in self._again

    async def run(self, key: K, reason: R) -> None:
        """Process ``key`` in the caller's task now, as a worker would; if a pass of it runs, once more after
        that instead (and return at once)."""
        if key in self._active:
            self._once_more(key, reason)
            return
        self._queued.pop(key, None)
        self._active.add(key)
        try:
            while True:
                self.cancel(key)  # this pass decides when the key is due next
                try:
                    await self._process(key, reason)
                except Exception:  # a process that raises still gets its key retried
                    LOGGER.exception("processing %s failed", key)
                    self.add_rate_limited(key, reason)
                if key not in self._again:
                    break
                reason = self._again.pop(key)
        finally:
            self._active.discard(key)
            self._note_idle()

    async def drained(self) -> None:
        """Return once no key is ready or being processed (timers may still be pending)."""
        while self._queued or self._active or self._workers:
            waiter = asyncio.get_running_loop().create_future()
            self._idle_waiters.append(waiter)
            await waiter

    def close(self) -> None:
        for key in list(self._timers):
            self.cancel(key)
        for worker in list(self._workers):
            worker.cancel()

    def _fire(self, key: K, reason: R) -> None:
        self._timers.pop(key, None)
        self.add(key, reason)

    def _start_workers(self) -> None:
        while len(self._workers) < min(self._workers_max, len(self._queued)):
            worker = asyncio.get_running_loop().create_task(self._work(), name="work queue worker")
            self._workers.add(worker)

    async def _work(self) -> None:
        try:
            while (key := self._next_ready()) is not None:
                await self.run(key, self._queued[key])
                # A pass with nothing to write awaits nothing: without this, 200 keys due at once (jobs created
                # together, so resynced together) would hold every other event for their whole run.
                await asyncio.sleep(0)
        finally:  # in the step that saw nothing left, so a key added next starts a worker
            self._workers.discard(cast("asyncio.Task[None]", asyncio.current_task()))
            self._note_idle()

    def _next_ready(self) -> K | None:
        """The oldest prompt key, else the oldest routine one; None when no key is ready."""
        for routine, lane in enumerate(self._ready):
            while lane:
                key = lane.popleft()
                if key in self._queued and self._routine(self._queued[key]) == bool(routine):
                    return key
                # else it was run by a caller meanwhile, forgotten, or moved to the prompt lane
        return None

    def _note_idle(self) -> None:
        if self._queued or self._active or self._workers:
            return
        waiters, self._idle_waiters = self._idle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
