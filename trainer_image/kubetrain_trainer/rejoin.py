"""A peer left the gang: stay alive until torchrun restarts this worker with the peer's replacement.

The operator replaces a lost pod (evicted, preempted, its node gone) alone, at the same attempt, when
``KUBETRAIN_REJOIN_TIMEOUT_SECONDS`` says so. The survivors' torchrun agents restart their workers when the
replacement joins the rendezvous: a membership change, which spends none of ``--max-restarts``. But an agent
sees it only while its workers live: a worker that exits on the lost peer fails its agent, and the pod with it.

So a worker whose gang lost a peer waits here, and ends when its agent stops it (SIGTERM: the new round is
ready) or when the timeout passes (no replacement came: the pod fails and the operator restarts the gang).
A peer is lost when the ranks agreed to stop for another rank's SIGTERM (its pod was evicted: the checkpoint
of that step is written), or when a collective failed because a peer's connection closed (it died at once).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Final

import torch.distributed as dist

__all__ = ["REJOIN_TIMEOUT_ENV", "peer_lost", "rejoin_timeout", "wait_to_rejoin"]

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


def wait_to_rejoin(timeout: float, stopped: Callable[[], bool], *, clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> bool:
    """Wait until ``stopped()`` (this process got SIGTERM) or ``timeout`` seconds pass; whether it was stopped."""
    print(f"kubetrain-trainer: a peer left the gang; waiting up to {timeout:.0f} s for its replacement "
          "(torchrun restarts this worker when it joins)", file=sys.stderr, flush=True)
    deadline = clock() + timeout
    while not stopped():
        if clock() >= deadline:
            return False
        sleep(POLL_SECONDS)
    return True
