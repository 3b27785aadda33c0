"""A peer left the gang: the survivors stay alive until torchrun restarts them with its replacement
(kubetrain_trainer.rejoin), which is what lets the operator replace one lost pod instead of the whole gang."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch.distributed as dist

from kubetrain.cli.ports import free_port_range
from kubetrain.core.launch import KEEP_ALIVE_MISSES, keep_alive_seconds
from kubetrain_trainer.rejoin import Waited, peer_lost, rejoin_timeout, wait_to_rejoin
from tests.trainer_helpers import parse_events, scrape, start_trainer, stop_process_group, wait_for

GLOO_RESET = ("[gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:25482: Connection reset by peer. This is "
              "typically caused by a remote worker hanging or bugs in the application.")


@pytest.mark.parametrize(("raw", "seconds"), [("", None), ("0", None), ("75", 75.0), ("soon", None)])
def test_the_operator_says_how_long_to_wait(raw: str, seconds: float | None) -> None:
    assert rejoin_timeout({"KUBETRAIN_REJOIN_TIMEOUT_SECONDS": raw} if raw else {}) == seconds


@pytest.mark.parametrize(("error", "lost"), [
    (RuntimeError(f"Got the following error when running the callback: RuntimeError: {GLOO_RESET}"), True),
    (dist.DistNetworkError("failed to recv, got 0 bytes"), True),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), False),
    (ValueError("bad batch"), False),
])
def test_a_peer_is_lost_only_when_its_connection_closed(error: BaseException, lost: bool) -> None:
    assert peer_lost(error) is lost


def test_the_wait_ends_when_the_agent_stops_the_worker_or_at_the_timeout() -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    assert wait_to_rejoin(10, lambda: now[0] >= 3, clock=lambda: now[0], sleep=sleep) is Waited.STOPPED
    now[0] = 0.0
    assert wait_to_rejoin(10, lambda: False, clock=lambda: now[0], sleep=sleep) is Waited.TIMED_OUT
    assert 10 <= now[0] < 10.5
    now[0], looks = 0.0, []
    assert wait_to_rejoin(10, lambda: False, lambda: looks.append(now[0]) or now[0] >= 4, clock=lambda: now[0],
                          sleep=sleep) is Waited.CLOSED
    assert 4 <= now[0] < 5 and len(looks) <= 10, "the rendezvous is read twice a second, not at every poll"


CONFIG = {"trainer": {"task": "digits", "maxSteps": 300, "batchSize": 32, "logEverySteps": 50},
          "data": {"workers": 0}, "checkpoint": {"everySteps": 0}}


def _agent(index: int, tmp_path: Path, rendezvous: int, metrics: int, run_id: str, *,
           config: dict[str, Any] = CONFIG) -> subprocess.Popen[str]:
    """Node ``index`` of a 3-node gang on this machine, launched as the operator launches a pod's agent (its
    rendezvous settings)."""
    conf = (f"is_host={'true' if index == 0 else 'false'},join_timeout=120,read_timeout=120,"
            f"keep_alive_interval={keep_alive_seconds(3)},keep_alive_max_attempt={KEEP_ALIVE_MISSES}")
    return start_trainer(config, tmp_path / "ckpt", nproc=1, metrics_port=metrics + index, extra={
        "PET_NNODES": "3", "PET_RDZV_ENDPOINT": f"127.0.0.1:{rendezvous}", "PET_RDZV_ID": run_id,
        "PET_RDZV_CONF": conf, "KUBETRAIN_REJOIN_TIMEOUT_SECONDS": "120"})


def test_a_node_that_leaves_is_replaced_and_the_others_resume_with_it_from_its_stop(tmp_path: Path) -> None:
    """Real torchrun agents: node 2 gets SIGTERM (an eviction), the gang saves that step, nodes 0 and 1 wait alive,
    a new node 2 joins, and all three resume from the saved step and finish; the survivors' agents never fail."""
    base = free_port_range(4)
    rendezvous, metrics = base, base + 1
    run_id = f"rejoin-{uuid.uuid4().hex[:8]}"
    agents = [_agent(i, tmp_path, rendezvous, metrics, run_id) for i in range(3)]
    try:
        wait_for(lambda: _step(metrics) >= 20, 120, "the gang past step 20", agents[0])
        agents[2].terminate()
        agents[2].communicate(timeout=60)
        agents.append(_agent(2, tmp_path, rendezvous, metrics, run_id))
        results = [agent.communicate(timeout=240) for agent in (agents[0], agents[1], agents[3])]
        assert [a.returncode for a in (agents[0], agents[1], agents[3])] == [0, 0, 0], [r[1][-2000:] for r in results]
        assert "waiting up to 120 s for its replacement" in results[0][1]
        events = parse_events(results[0][0])  # rank 0's: it alone logs
        (stopped,) = [e["step"] for e in events if e["event"] == "stopped"]
        assert [e["step"] for e in events if e["event"] == "resume"] == [stopped]
        assert events[-1]["event"] == "exit" and events[-1]["step"] == CONFIG["trainer"]["maxSteps"]
    finally:
        for agent in agents:
            stop_process_group(agent)


def _step(port: int) -> float:
    try:
        return max((value for _, value in scrape(port).get("trainer_step", [])), default=0.0)
    except OSError:
        return 0.0


def test_a_node_whose_worker_dies_closes_the_rendezvous_and_the_gang_restarted_in_place_resumes(
        tmp_path: Path) -> None:
    """What a kubelet's restart in place relies on, with real torchrun agents: node 2's worker is SIGKILLed, its
    agent exits 1 and closes the rendezvous; nodes 0 and 1, waiting for a replacement, see it closed and end too
    (not after their 120 s); the three started again with the same rendezvous id (as the kubelet restarts the
    pods' containers, node 0's store afresh) resume from the last checkpoint and finish."""
    base = free_port_range(4)
    rendezvous, metrics = base, base + 1
    run_id = f"in-place-{uuid.uuid4().hex[:8]}"
    config = CONFIG | {"checkpoint": {"everySteps": 10}}
    agents = [_agent(i, tmp_path, rendezvous, metrics, run_id, config=config) for i in range(3)]
    try:
        wait_for(lambda: _step(metrics) >= 25, 120, "the gang past step 25", agents[0])
        for worker in psutil.Process(agents[2].pid).children(recursive=True):
            worker.send_signal(signal.SIGKILL)
        started = time.monotonic()
        ends = [agent.communicate(timeout=90) for agent in agents]
        assert [a.returncode for a in agents] == [1, 1, 1], [e[1][-2000:] for e in ends]
        assert time.monotonic() - started < 60, "the survivors did not sit out their wait for a replacement"
        assert "closed the gang's rendezvous" in ends[0][1] + ends[1][1]
        again = [_agent(i, tmp_path, rendezvous, metrics, run_id, config=config) for i in range(3)]
        agents += again
        results = [agent.communicate(timeout=240) for agent in again]
        assert [a.returncode for a in again] == [0, 0, 0], [r[1][-2000:] for r in results]
        events = parse_events(results[0][0])
        (resumed,) = [e["step"] for e in events if e["event"] == "resume"]
        assert resumed >= 20 and events[-1]["step"] == CONFIG["trainer"]["maxSteps"]
    finally:
        for agent in agents:
            stop_process_group(agent)
