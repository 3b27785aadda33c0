"""The work queue's semantics (kubetrain/k8s/workqueue.py), on a bare event loop: no cluster, no kopf."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from kubetrain.k8s.workqueue import WorkQueue


@dataclass
class Recorder:
    """A process that records its passes, each taking ``hold`` (an event to wait on, when set)."""

    passes: list[tuple[str, str]] = field(default_factory=list)
    started: list[float] = field(default_factory=list)
    running: set[str] = field(default_factory=set)
    overlaps: int = 0
    most_at_once: int = 0
    hold: asyncio.Event | None = None
    fail: set[str] = field(default_factory=set)

    async def __call__(self, key: str, reason: str) -> None:
        if key in self.running:
            self.overlaps += 1
        self.running.add(key)
        self.most_at_once = max(self.most_at_once, len(self.running))
        self.passes.append((key, reason))
        self.started.append(time.monotonic())
        try:
            if self.hold is not None:
                await self.hold.wait()
            await asyncio.sleep(0)
            if key in self.fail:
                raise RuntimeError(f"{key} failed")
        finally:
            self.running.discard(key)


def doubling(failures: int) -> float:
    return 0.01 * 2.0 ** (failures - 1)


def on_a_loop(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout=5))


def test_a_key_added_while_it_runs_runs_once_more_after_and_never_twice_at_once() -> None:
    recorder = Recorder(hold=asyncio.Event())
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling)

    async def test() -> None:
        assert recorder.hold is not None
        queue.add("a", "first")
        await asyncio.sleep(0.01)
        assert queue.busy("a") and not queue.again("a")
        for n in range(20):
            queue.add("a", f"again {n}")
        assert queue.again("a")  # the pass that runs can tell that another follows
        recorder.hold.set()
        await queue.drained()

    on_a_loop(test)
    assert recorder.passes == [("a", "first"), ("a", "again 0")]  # the first reason of the adds folded
    assert recorder.overlaps == 0


def test_adds_of_a_queued_key_fold_into_one_pass() -> None:
    recorder = Recorder()
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling)

    async def test() -> None:
        for _ in range(5):
            queue.add("a", "event")
        queue.add("b", "event")
        await queue.drained()

    on_a_loop(test)
    assert sorted(recorder.passes) == [("a", "event"), ("b", "event")]


def test_run_processes_in_the_callers_task_and_takes_the_key_off_the_queue() -> None:
    recorder = Recorder()
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling)

    async def test() -> None:
        queue.add("a", "queued")
        await queue.run("a", "inline")  # before any worker took it
        assert recorder.passes == [("a", "inline")]
        await queue.drained()

    on_a_loop(test)
    assert recorder.passes == [("a", "inline")]


def test_a_delayed_key_runs_when_due_and_the_earlier_of_two_times_wins() -> None:
    recorder = Recorder()
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling)

    async def test() -> None:
        start = time.monotonic()
        queue.add_after("a", 0.6, "late")
        queue.add_after("a", 0.2, "soon")
        queue.add_after("a", 0.7, "later still")  # an earlier time is already asked for
        due = queue.due("a")
        assert due is not None and 0.19 < due - start < 0.3
        await asyncio.sleep(0.02)
        assert recorder.passes == [], "not before it is due"
        while not recorder.passes:
            await asyncio.sleep(0.01)
        await queue.drained()
        assert recorder.passes == [("a", "soon")]
        assert recorder.started[0] - start >= 0.2
        assert queue.due("a") is None
        await asyncio.sleep(0.6)

    on_a_loop(test)
    assert recorder.passes == [("a", "soon")], "one timer per key"


def test_reschedule_replaces_the_timer() -> None:
    recorder = Recorder()
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling)

    async def test() -> None:
        queue.add_after("a", 0.01, "soon")
        queue.reschedule("a", 10.0, "resync")
        await asyncio.sleep(0.05)
        assert recorder.passes == []
        queue.cancel("a")
        assert queue.due("a") is None

    on_a_loop(test)


def test_a_timer_wakes_the_loop_only_when_due() -> None:
    """No poll: with one key due in a while, the loop has nothing else scheduled."""
    queue: WorkQueue[str, str] = WorkQueue(Recorder(), backoff=doubling)

    async def test() -> None:
        queue.add_after("a", 30.0, "resync")
        loop = asyncio.get_running_loop()
        scheduled = [h for h in getattr(loop, "_scheduled", []) if not h.cancelled()]
        assert len(scheduled) == 1 and scheduled[0].when() - loop.time() > 29
        queue.close()

    asyncio.run(test())  # without on_a_loop's timeout, which is a timer of its own


def test_a_process_that_raises_is_retried_with_backoff() -> None:
    recorder = Recorder(fail={"a"})
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling)

    async def test() -> None:
        start = time.monotonic()
        queue.add("a", "event")  # the process raises: the queue retries it with backoff
        while len(recorder.passes) < 3:
            await asyncio.sleep(0.005)
        assert queue.failures("a") >= 2
        gaps = [later - earlier for earlier, later in zip(recorder.started, recorder.started[1:], strict=False)]
        assert gaps[0] >= 0.01 and gaps[1] >= 0.02, gaps  # 10 ms, then 20 ms
        assert recorder.started[-1] - start < 1
        queue.close()

    on_a_loop(test)


def test_rate_limited_adds_count_failures_and_grow_the_delay_until_a_success() -> None:
    queue: WorkQueue[str, str] = WorkQueue(Recorder(), backoff=doubling)

    async def test() -> None:
        assert queue.next_backoff("a") == pytest.approx(0.01)
        delays = [queue.add_rate_limited("a", "retry") for _ in range(3)]
        assert delays == pytest.approx([0.01, 0.02, 0.04])
        assert queue.failures("a") == 3
        queue.succeeded("a")  # its processing succeeded: the next failure backs off from the start
        assert queue.failures("a") == 0 and queue.next_backoff("a") == pytest.approx(0.01)
        queue.close()

    on_a_loop(test)


def test_forget_drops_the_timer_the_failures_and_a_queued_pass() -> None:
    recorder = Recorder()
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling)

    async def test() -> None:
        queue.add_rate_limited("a", "retry")
        queue.add("b", "event")
        queue.forget("a")
        queue.forget("b")
        assert queue.due("a") is None and queue.failures("a") == 0
        await asyncio.sleep(0.05)
        await queue.drained()

    on_a_loop(test)
    assert recorder.passes == []


def test_workers_are_bounded() -> None:
    recorder = Recorder(hold=asyncio.Event())
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling, workers=2)

    async def test() -> None:
        assert recorder.hold is not None
        for n in range(6):
            queue.add(f"job-{n}", "event")
        await asyncio.sleep(0.02)
        assert len(recorder.running) == 2
        recorder.hold.set()
        await queue.drained()

    on_a_loop(test)
    assert len(recorder.passes) == 6 and recorder.most_at_once == 2


def test_running_counts_the_passes_of_its_workers_and_of_callers_alike() -> None:
    recorder = Recorder(hold=asyncio.Event())
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling, workers=2)

    async def test() -> None:
        assert recorder.hold is not None
        inline = asyncio.create_task(queue.run("job-0", "event"))  # a caller's pass, as a job's kopf worker runs it
        await asyncio.sleep(0)
        assert queue.running() == 1
        for n in (1, 2):
            queue.add(f"job-{n}", "event")
        await asyncio.sleep(0.02)
        assert queue.running() == 3 == len(recorder.running)
        recorder.hold.set()
        await inline
        await queue.drained()
        assert queue.running() == 0

    on_a_loop(test)


def test_keys_due_together_let_other_work_in_between() -> None:
    """200 jobs created together come due together: a new job's event must not wait for all their passes, even
    when a pass awaits nothing (a resync with nothing to write)."""
    ran: list[str] = []

    async def without_io(key: str, reason: str) -> None:
        ran.append(key)

    queue: WorkQueue[str, str] = WorkQueue(without_io, backoff=doubling, workers=1)

    async def test() -> None:
        for n in range(50):
            queue.add(f"job-{n}", "timer")
        while len(ran) < 3:
            await asyncio.sleep(0)
        ran.append("new job's event")
        await queue.drained()

    on_a_loop(test)
    assert len(ran) == 51 and ran.index("new job's event") <= 5, ran[:10]


HELD: contextvars.ContextVar[object] = contextvars.ContextVar("held")


class Cause:
    """Stands for what a kopf handler's context holds: its event (the job's body, a logger)."""


def test_a_waiting_timer_keeps_no_context_of_its_caller() -> None:
    """Timers fire in one context (their first caller's): a handler's context, kept by each key's timer, kept its
    event while the timer waited (1,000 suspended jobs' resync timers held 15 MiB)."""
    queue: WorkQueue[str, str] = WorkQueue(Recorder(), backoff=doubling)

    async def handler(key: str) -> weakref.ref[Cause]:
        cause = Cause()
        HELD.set(cause)
        queue.add_after(key, 60.0, "timer")
        return weakref.ref(cause)

    async def test() -> None:
        causes = [await asyncio.create_task(handler(key)) for key in ("first", "second", "third")]
        await asyncio.sleep(0)  # in a step of its own: the one that awaited the last handler keeps that task
        gc.collect()
        assert [cause() is None for cause in causes] == [False, True, True]
        assert queue.due("second") is not None
        queue.close()

    on_a_loop(test)


def is_routine(reason: str) -> bool:
    return reason.startswith("look")


def test_a_free_worker_takes_a_prompt_key_before_routine_keys_that_came_first() -> None:
    recorder = Recorder(hold=asyncio.Event())
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling, workers=1, routine=is_routine)

    async def test() -> None:
        assert recorder.hold is not None
        queue.add("busy", "job event")  # holds the only worker
        await asyncio.sleep(0.01)
        for n in range(3):
            queue.add(f"running-{n}", "look")
        queue.add("new", "job event")
        queue.add("running-2", "pod changed")  # someone now waits on it: to the prompt lane, behind "new"
        recorder.hold.set()
        await queue.drained()

    on_a_loop(test)
    assert recorder.passes == [("busy", "job event"), ("new", "job event"), ("running-2", "pod changed"),
                               ("running-0", "look"), ("running-1", "look")]


def test_a_routine_pass_to_follow_the_running_one_becomes_prompt_when_someone_waits_on_it() -> None:
    recorder = Recorder(hold=asyncio.Event())
    queue: WorkQueue[str, str] = WorkQueue(recorder, backoff=doubling, workers=1, routine=is_routine)

    async def test() -> None:
        assert recorder.hold is not None
        queue.add("a", "look")
        await asyncio.sleep(0.01)
        queue.add("a", "look again")
        queue.add("a", "pod changed")
        queue.add("a", "look once more")
        recorder.hold.set()
        await queue.drained()

    on_a_loop(test)
    assert recorder.passes == [("a", "look"), ("a", "pod changed")]
