"""A peer left the gang: stay alive until torchrun restarts this worker with the peer's replacement.

The operator replaces a lost pod (evicted, preempted, its node gone) alone, at the same attempt, when
``KUBETRAIN_REJOIN_TIMEOUT_SECONDS`` says so. The survivors' torchrun agents restart their workers when the
replacement joins the rendezvous: a membership change, which spends none of ``--max-restarts``. But an agent
sees it only while its workers live: a worker that exits on the lost peer fails its agent, and the pod with it.

So a worker whose gang lost a peer waits here, and ends when its agent stops it (SIGTERM: the new round is
ready), when the rendezvous is closed (the peer's agent gave up because its workers failed: no replacement will
join this rendezvous; its pod is restarted in place, and this one must go too, so that node 0's agent starts the
store afresh), or when the timeout passes (no replacement came: the pod fails and the operator restarts the gang).
A peer is lost when the ranks agreed to stop for another rank's SIGTERM (its pod was evicted: the checkpoint
of that step is written), or when a collective failed because a peer's connection closed (it died at once).
"""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from enum import Enum
from typing import Any, Final

import torch.distributed as dist

__all__ = ["REJOIN_TIMEOUT_ENV", "RendezvousWatch", "Waited", "peer_lost", "rejoin_timeout", "wait_to_rejoin"]

REJOIN_TIMEOUT_ENV: Final = "KUBETRAIN_REJOIN_TIMEOUT_SECONDS"
POLL_SECONDS: Final = 0.2
# What gloo and NCCL say when a peer's process is gone (its connections closed, or it aborted).
PEER_GONE_WORDS: Final = ("Connection reset by peer", "Connection closed by peer", "Broken pipe",
                          "remote process exited", "NCCL communicator was aborted")


def rejoin_timeout(env: Mapping[str, str]) -> float | None:
    """Seconds to wait for a lost peer's replacement; None when no replacement will come (not set, or 0)."""
    raw = env.get(REJOIN_TIMEOUT_ENV, "")
    try:
        seconds = float(raw) if raw else 0.0
    except ValueError:
        return None
    return seconds if seconds > 0 else None


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` is a collective that broke because a peer's process is gone."""
    if isinstance(error, dist.DistNetworkError):
        return True
    text = str(error)
    return any(words in text for words in PEER_GONE_WORDS)


class Waited(Enum):
    STOPPED = "stopped"  # SIGTERM: the agent restarts this worker with the replacement (or the pod goes)
    CLOSED = "closed"  # the rendezvous is closed: no replacement will join it
    TIMED_OUT = "timed out"


# How often the rendezvous state is read while waiting: it is one request to node 0's store.
CLOSED_POLL_SECONDS: Final = 0.5


def wait_to_rejoin(timeout: float, stopped: Callable[[], bool], closed: Callable[[], bool] = lambda: False, *,
                   clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Waited:
    """Wait until ``stopped()`` (this process got SIGTERM), ``closed()`` (read every CLOSED_POLL_SECONDS), or
    ``timeout`` seconds pass."""
    print(f"kubetrain-trainer: a peer left the gang; waiting up to {timeout:.0f} s for its replacement "
          "(torchrun restarts this worker when it joins)", file=sys.stderr, flush=True)
    deadline = clock() + timeout
    next_look = clock()
    while not stopped():
        if clock() >= deadline:
            return Waited.TIMED_OUT
        if clock() >= next_look:
            if closed():
                return Waited.CLOSED
            next_look = clock() + CLOSED_POLL_SECONDS
        sleep(POLL_SECONDS)
    return Waited.STOPPED


class RendezvousWatch:
    """Reads whether torchrun's c10d rendezvous of this gang is closed, from node 0's store (PET_RDZV_ENDPOINT,
    PET_RDZV_ID, as torchrun itself reads them). An agent closes it when it exits because its workers failed, not
    when it is stopped by a signal (an evicted pod's). An unreachable store counts as closed: node 0's agent, which
    serves it, is gone, and no replacement can join it either."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._endpoint = env.get("PET_RDZV_ENDPOINT", "")
        self._run_id = env.get("PET_RDZV_ID", "")
        self._backend: Any = None

    def closed(self) -> bool:
        if not self._endpoint or not self._run_id:
            return False  # not under a c10d rendezvous: nothing to read
        try:
            state = self._connect().get_state()
        except Exception:  # the store is gone (its agent ended), or it answers no more
            return True
        return state is not None and bool(getattr(pickle.loads(state[0]), "closed", False))

    def _connect(self) -> Any:
        if self._backend is None:
            from torch.distributed import TCPStore  # type: ignore[attr-defined]  # defined when distributed is built in
            from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

            host, port = self._endpoint.rsplit(":", 1)
            store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=5))
            self._backend = C10dRendezvousBackend(store, self._run_id)
        return self._backend
