"""Two lanes for the operator's work: what someone waits on first (a job created or changed, a pod that changed,
a retry), the routine looks (a running job's progress read, a resync) after.

After a burst, thousands of routine looks come due within seconds, and each may write a status. Served in the
order they came, a job created then waited behind all of them: for a worker of the work queue, then for one of
the connection slots. Here a freed slot, like a free worker, goes to the oldest prompt caller, and to a routine
one only when no prompt caller waits; routine calls hold only a share of the slots (transport.py). The lane is
the caller's context (``routine_calls``), so that the calls a reconcile makes take its lane without being told.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import AsyncIterator, Iterator

__all__ = ["Slots", "in_routine_lane", "prompt_from_here", "routine_calls"]

_ROUTINE: contextvars.ContextVar[bool] = contextvars.ContextVar("kubetrain_routine_calls", default=False)


@contextlib.contextmanager
def routine_calls(routine: bool = True) -> Iterator[None]:
    """The calls made inside take the routine lane (or, with ``routine`` False, the prompt one)."""
    token = _ROUTINE.set(routine)
    try:
        yield
    finally:
        _ROUTINE.reset(token)


def prompt_from_here() -> None:
    """The rest of the work inside the enclosing ``routine_calls`` takes the prompt lane: a routine look found
    something to act on."""
    _ROUTINE.set(False)


def in_routine_lane() -> bool:
    return _ROUTINE.get()


class Slots:
    """``count`` slots for calls in flight, at most ``routine_max`` of them held by routine calls; a freed slot
    goes to the oldest waiting prompt call, else to the oldest routine one within its share. The share keeps a
    wave of routine writes from taking the API server's every seat the operator has: while the server is slow,
    the routine calls slow down with it, and a job created then still finds it answering. Made in the event loop
    that uses it."""

    def __init__(self, count: int, routine_max: int | None = None) -> None:
        self._free = count
        self._routine_max = count if routine_max is None else max(1, min(count, routine_max))
        self._routine_held = 0
        self._waiting: tuple[deque[asyncio.Future[None]], deque[asyncio.Future[None]]] = (deque(), deque())

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        routine = in_routine_lane()
        await self._acquire(routine)
        try:
            yield
        finally:
            self._release(routine)

    def waiting(self) -> tuple[int, int]:
        """Callers waiting for a slot: (prompt, routine)."""
        prompt, routine = self._waiting
        return len(prompt), len(routine)

    def _may_take(self, routine: bool) -> bool:
        return self._free > 0 and (not routine or self._routine_held < self._routine_max)

    def _take(self, routine: bool) -> None:
        self._free -= 1
        self._routine_held += routine

    async def _acquire(self, routine: bool) -> None:
        lane = self._waiting[routine]
        if self._may_take(routine) and not lane:
            self._take(routine)
            return
        waiter = asyncio.get_running_loop().create_future()
        lane.append(waiter)
        try:
            await waiter  # the slot is taken for it when it is woken (_hand_on)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(routine)  # handed a slot as it was cancelled: it passes on
            with contextlib.suppress(ValueError):
                lane.remove(waiter)
            raise

    def _release(self, routine: bool) -> None:
        self._free += 1
        self._routine_held -= routine
        self._hand_on()

    def _hand_on(self) -> None:
        """Free slots go straight to waiting callers (so that none arriving meanwhile takes one first)."""
        for routine, lane in enumerate(self._waiting):
            while lane and self._may_take(bool(routine)):
                waiter = lane.popleft()
                if not waiter.done():
                    self._take(bool(routine))
                    waiter.set_result(None)
