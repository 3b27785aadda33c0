"""A hang explained before it is killed: the ranks' stacks compared (core/hangs.py), the stall's failure record
that keeps them, and the trainer's /stacks answer read from a process whose main thread is busy elsewhere."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from typing import Any

import aiohttp
import pytest

from kubetrain.cli.logs import failure_lines
from kubetrain.cli.ports import free_port
from kubetrain.core.hangs import STACK_CHARS, Frame, RankStack, Silent, explain, parse_stack, rank_ranges
from kubetrain.core.lifecycle import declares_stall, reconcile
from kubetrain.k8s.scrape import fetch_stacks
from tests.pods import pod, states
from tests.status_schema import assert_valid_status
from tests.test_policy import KNOWN, NOW, job, running

Json = Any
TORCH = "/venv/lib/python3.11/site-packages/torch/distributed"
SCRIPT = "/workspace/train.py"


def in_all_reduce(rank: int, pod: str = "job-0") -> RankStack:
    return RankStack(rank, pod, (Frame(SCRIPT, 1, "<module>"), Frame(SCRIPT, 30, "step"),
                                 Frame(f"{TORCH}/c10d_logger.py", 81, "wrapper"),
                                 Frame(f"{TORCH}/distributed_c10d.py", 2800, "all_reduce")))


def sleeping(rank: int, pod: str = "job-1") -> RankStack:
    return RankStack(rank, pod, (Frame(SCRIPT, 1, "<module>"), Frame(SCRIPT, 28, "step")))


NODES = {"job-0": "node-a", "job-1": "node-b"}


class TestExplain:
    def test_the_rank_outside_the_collective_the_others_wait_in_is_the_culprit(self) -> None:
        hang = explain([in_all_reduce(0), in_all_reduce(1), sleeping(2)], [], NODES)
        assert hang.culprits == ({"rank": 2, "pod": "job-1", "node": "node-b", "where": "at train.py:28 in step"},)
        assert hang.summary == ("rank 2 (pod job-1 on node-b) is at train.py:28 in step; "
                                "ranks 0-1 are waiting in all_reduce at train.py:30 in step")
        assert [g["ranks"] for g in hang.groups] == ["2", "0-1"]  # the culprit's stack first
        assert hang.groups[1]["stack"].splitlines()[-1] == f"{TORCH}/distributed_c10d.py:2800 in all_reduce"

    def test_ranks_all_waiting_in_the_same_place_name_no_culprit(self) -> None:
        hang = explain([in_all_reduce(r) for r in range(4)], [], NODES)
        assert hang.culprits == ()
        assert "all 4 answering ranks are waiting in all_reduce" in hang.summary and "none is behind" in hang.summary

    def test_off_a_strict_majority_is_the_culprit_when_no_one_is_in_a_collective(self) -> None:
        elsewhere = RankStack(3, "job-1", (Frame(SCRIPT, 1, "<module>"), Frame(SCRIPT, 40, "save")))
        hang = explain([sleeping(0), sleeping(1), sleeping(2), elsewhere], [], NODES)
        assert [c["rank"] for c in hang.culprits] == [3]
        assert "train.py:40 in save" in hang.summary

    def test_a_tie_names_no_culprit(self) -> None:
        elsewhere = RankStack(1, "job-1", (Frame(SCRIPT, 40, "save"),))
        hang = explain([sleeping(0), elsewhere], [], NODES)
        assert hang.culprits == () and "2 places" in hang.summary

    def test_a_rank_that_does_not_answer_is_named_with_why(self) -> None:
        hang = explain([in_all_reduce(0)], [Silent("job-1", 1, "no answer within 3s")], NODES)
        assert hang.culprits[-1] == {"pod": "job-1", "node": "node-b",
                                     "where": "local rank 1 did not answer (no answer within 3s)"}
        assert "no answer from pod job-1 on node-b local rank 1" in hang.summary

    def test_a_deep_stack_is_kept_innermost_within_its_bound(self) -> None:
        deep = RankStack(0, "job-0", tuple(Frame(f"{SCRIPT}{'x' * 200}", n, f"f{n}") for n in range(100)))
        stack = explain([deep], [], NODES).groups[0]["stack"]
        assert len(stack) <= STACK_CHARS
        assert stack.splitlines()[0].startswith("... ") and stack.endswith("in f99")

    def test_rank_ranges(self) -> None:
        assert rank_ranges([7, 0, 1, 2, 5, 8]) == "0-2,5,7-8"
        assert rank_ranges([3]) == "3"


def _stalled(**hang: Json) -> Json:
    status = running(progress={"heartbeatTime": "2026-11-01T10:02:00Z", "step": 5,
                               "updatedAt": "2026-11-01T10:09:55Z"}, conditions=[KNOWN])
    return reconcile(job(failurePolicy={"stallTimeoutSeconds": 300}), status, states(pod(0), pod(1)), NOW, **hang)


def test_a_stall_s_record_keeps_the_hang_and_its_message_names_the_culprit() -> None:
    without = _stalled()
    assert declares_stall(without, NOW)
    hang = explain([in_all_reduce(0), sleeping(1)], [], NODES)
    decision = _stalled(hang=hang)
    record = decision.status["failures"][-1]
    assert record["reason"] == "NoHeartbeat" and record["hang"]["culprits"][0]["rank"] == 1
    assert record["message"].startswith("no training heartbeat for 475s")
    assert "rank 1 (pod job-1 on node-b) is at train.py:28 in step" in record["message"]
    assert_valid_status(decision.status)
    lines = failure_lines(decision.status, 0)
    assert "  stack of rank(s) 1, innermost last:" in lines and f"    {SCRIPT}:28 in step" in lines


def test_a_decision_without_a_new_stall_does_not_ask_for_stacks() -> None:
    decision = reconcile(job(failurePolicy={"stallTimeoutSeconds": 300}),
                         running(progress={"heartbeatTime": "2026-11-01T10:09:00Z"}), states(pod(0), pod(1)), NOW)
    assert not declares_stall(decision, NOW)


BUSY_MAIN_THREAD = textwrap.dedent("""
    import sys, time
    from kubetrain_trainer.metrics import TrainerMetrics, serve
    serve(TrainerMetrics(rank=3, local_rank=0, world_size=4), int(sys.argv[1]))
    def waiting_for_the_others():
        print("serving", flush=True)
        time.sleep(60)
    waiting_for_the_others()
""")


def test_the_trainer_answers_with_its_main_thread_s_stack_while_that_thread_is_busy() -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", BUSY_MAIN_THREAD, str(port)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env={"RANK": "3", "KUBETRAIN_POD_NAME": "job-1",
                                                                       "PATH": "/usr/bin:/bin"})
    try:
        assert process.stdout is not None and process.stdout.readline() == "serving\n"
        time.sleep(0.2)  # into the sleep
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/stacks", timeout=10) as answer:
            stack = parse_stack(json.loads(answer.read()))
        assert (stack.rank, stack.pod) == (3, "job-1")
        assert [f.function for f in stack.frames] == ["<module>", "waiting_for_the_others"]
        assert stack.position == Frame("<string>", 7, "waiting_for_the_others")
        # A process that cannot checkpoint on request (report()'s, this one's) says so.
        refused = urllib.request.Request(f"http://127.0.0.1:{port}/checkpoint", method="POST")
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(refused, timeout=10)
        assert answer.value.code == 501
        # The operator's read: this rank as local rank 0, and a local rank 1 that serves nothing.
        answers = asyncio.run(_operator_reads(port))
        assert answers[0] == stack
        assert isinstance(answers[1], Silent) and answers[1].local_rank == 1
    finally:
        process.kill()
        _, err = process.communicate(timeout=10)
    assert "stack of rank 3" in err and "line 7, in waiting_for_the_others" in err


async def _operator_reads(port: int) -> list[RankStack | Silent]:
    async with aiohttp.ClientSession() as session:
        return await fetch_stacks(session, [("job-1", "127.0.0.1")], 2, base_port=port)
