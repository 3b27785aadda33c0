"""Process-group set-up from the torchrun environment, preflight checks and teardown.

Under torchrun the worker env carries RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT.
Without it (``python -m kubetrain_trainer``) the trainer still builds a one-process group on an in-memory
store, so that the rest of the code (DDP, FSDP, distributed checkpoints) has a single path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

import torch
import torch.distributed as dist

__all__ = ["DistContext", "PreflightError", "init_distributed", "preflight", "teardown"]

# Bounded time for the first collective: a peer that never arrives should fail the start in seconds, not
# after the default 10-30 minute collective timeout.
PREFLIGHT_TIMEOUT: Final = timedelta(seconds=120)
# Later collectives (checkpoint saves of big models included) get this long.
COLLECTIVE_TIMEOUT: Final = timedelta(minutes=30)


class PreflightError(RuntimeError):
    """The node is not what the job expects (missing devices, peers that never answer)."""


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str
    restart_count: int  # torchrun's TORCHELASTIC_RESTART_COUNT: restarts of this agent's workers

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    return int(raw) if raw else default


def context_from_env(env: Mapping[str, str], cuda_available: bool) -> DistContext:
    """The rank layout from torchrun's variables (a single process when they are absent)."""
    rank = _int(env, "RANK", 0)
    local_rank = _int(env, "LOCAL_RANK", 0)
    world = _int(env, "WORLD_SIZE", 1)
    local_world = _int(env, "LOCAL_WORLD_SIZE", 1)
    # nccl only makes sense with a GPU per process; gloo runs everywhere, which keeps CPU jobs and CI honest.
    device = torch.device("cuda", local_rank) if cuda_available else torch.device("cpu")
    return DistContext(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        device=device,
        backend="nccl" if cuda_available else "gloo",
        restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
    )


def check_devices(ctx: DistContext, visible: int, cuda_available: bool) -> None:
    """Fail fast when the GPUs this pod expects are not visible (a pure check, easy to test)."""
    if not cuda_available:
        return
    if visible < ctx.local_world_size:
        raise PreflightError(
            f"rank {ctx.rank}: {ctx.local_world_size} processes per node expect as many GPUs, but "
            f"torch.cuda.device_count() is {visible} (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); check the pod's nvidia.com/gpu limit"
        )


def init_distributed(env: Mapping[str, str] | None = None) -> DistContext:
    """Create the process group and pin this process to its device."""
    env = os.environ if env is None else env
    cuda = torch.cuda.is_available()
    ctx = context_from_env(env, cuda)
    check_devices(ctx, torch.cuda.device_count() if cuda else 0, cuda)
    if cuda:
        torch.cuda.set_device(ctx.device)
    if "MASTER_ADDR" in env and "RANK" in env:
        dist.init_process_group(
            ctx.backend,
            timeout=COLLECTIVE_TIMEOUT,
            device_id=ctx.device if cuda else None,
        )
    else:
        # One process, no rendezvous: an in-memory store is all a world of one needs.
        dist.init_process_group(ctx.backend, store=dist.HashStore(), rank=0, world_size=1,  # type: ignore[attr-defined]
                                timeout=COLLECTIVE_TIMEOUT)
    return ctx


def preflight(ctx: DistContext, timeout: timedelta = PREFLIGHT_TIMEOUT) -> None:
    """A first all-reduce that must complete in bounded time and count every rank."""
    ones = torch.ones(1, device=ctx.device)
    work = dist.all_reduce(ones, async_op=True)
    assert work is not None  # async_op=True always returns a handle
    try:
        work.wait(timeout)
    except RuntimeError as exc:
        raise PreflightError(
            f"rank {ctx.rank}: the first collective over {ctx.backend} did not complete within "
            f"{timeout.total_seconds():.0f}s ({exc}); a peer is missing or the network between pods is blocked"
        ) from exc
    if int(ones.item()) != ctx.world_size:
        raise PreflightError(f"rank {ctx.rank}: first all-reduce counted {int(ones.item())} ranks, "
                             f"expected WORLD_SIZE={ctx.world_size}")


def teardown() -> None:
    """Always called on the way out; safe when no group exists."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
