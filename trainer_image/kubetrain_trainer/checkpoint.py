"""World-size independent, atomic checkpoints with torch.distributed.checkpoint (DCP).

Layout under the checkpoint path (a volume shared by every pod of the job)::

    step_000000200/            one complete checkpoint
        .metadata, *.distcp     model + optimizer (DCP: each rank writes its shards, replicas written once)
        rng/rank<r>.pt          this rank's RNG states (used when the world size is unchanged)
        trainer_state.json      step, epoch, data position, counters; written last
    .tmp-step_000000300-<id>/  a save in progress (removed at the next start)

Atomicity: every rank writes into ``.tmp-step_N-<id>``, a directory whose random id rank 0 picks for this save
alone, so a straggler of an earlier attempt (a pod on a lost node that still runs) never writes into it;
after a barrier rank 0 writes ``trainer_state.json``, fsyncs it and renames the directory to ``step_N``
(one atomic rename on POSIX), so a reader sees a complete checkpoint or none. A complete ``step_N`` is never
removed to make room for a new one of the same step (a resumed attempt saving the step it resumed from):
the new one is dropped instead, so no crash can leave the job without its newest checkpoint.
Only directories named ``step_N`` that hold both ``.metadata`` and
``trainer_state.json`` count as valid. The newest ``keep`` are kept.

World-size independence: DCP stores tensors by fully-qualified name with their global shape, and
loading re-shards them onto the current world (DDP replicas or FSDP2 shards alike); the data position is
a global sample count (see :mod:`kubetrain_trainer.data`); the LR schedule is a pure function of the step,
so it needs no state of its own. RNG states are restored per rank only when the world size is unchanged;
otherwise each rank reseeds from ``seed + rank + step`` (documented, deterministic).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

__all__ = ["Checkpointer", "TrainState", "list_checkpoints"]

STEP_DIR = re.compile(r"^step_(\d{9})$")
STATE_FILE = "trainer_state.json"


@dataclass
class TrainState:
    """Everything besides tensors that a resume needs."""

    step: int = 0
    epoch: int = 0
    epoch_samples: int = 0  # samples consumed in this epoch, counted over all ranks
    samples_total: float = 0.0
    tokens_total: float = 0.0
    flops_total: float = 0.0
    world_size: int = 1
    seed: int = 0
    saved_at: float = 0.0
    last_loss: float | None = None  # so that a resumed attempt reports a loss before its first step


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / STATE_FILE).is_file() and (child / ".metadata").is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


class Checkpointer:
    """Saves and restores model, optimizer, RNG and :class:`TrainState`; every rank calls every method."""

    def __init__(self, root: Path, keep: int, rank: int, world_size: int) -> None:
        self.root = root
        self.keep = keep
        self.rank = rank
        self.world_size = world_size

    def _barrier(self) -> None:
        if dist.is_initialized() and self.world_size > 1:
            dist.barrier()

    def prepare(self) -> None:
        """Create the directory and drop saves that a crash left half-written (rank 0 only)."""
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True)
            for child in self.root.glob(".tmp-step_*"):
                shutil.rmtree(child)
        self._barrier()

    def latest(self) -> tuple[int, Path] | None:
        """The newest complete checkpoint as rank 0 sees it, the same answer on every rank."""
        found = list_checkpoints(self.root) if self.rank == 0 else []
        choice: list[Any] = [found[-1] if found else None]
        if dist.is_initialized() and self.world_size > 1:
            dist.broadcast_object_list(choice, src=0)
        latest: tuple[int, Path] | None = choice[0]
        if latest is not None and not (latest[1] / STATE_FILE).is_file():
            raise RuntimeError(f"rank {self.rank}: rank 0 resumes from {latest[1]}, which this rank cannot see; "
                               "the checkpoint path must be one volume shared by every pod")
        return latest

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainState) -> float:
        """Write checkpoint ``step_<state.step>``; returns the seconds it took."""
        start = time.monotonic()
        name = f"step_{state.step:09d}"
        tmp = self._scratch_dir(name)
        if self.rank == 0:
            (tmp / "rng").mkdir(parents=True)
        self._barrier()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp_save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp)
        torch.save(_rng_state(), tmp / "rng" / f"rank{self.rank}.pt")
        self._barrier()
        if self.rank == 0:
            state.saved_at = time.time()
            with open(tmp / STATE_FILE, "w", encoding="utf-8") as fh:
                json.dump(asdict(state), fh)
                fh.flush()
                os.fsync(fh.fileno())
            self._publish(tmp, self.root / name)
            for _, old in list_checkpoints(self.root)[: -self.keep]:
                shutil.rmtree(old)
        self._barrier()
        return time.monotonic() - start

    def _scratch_dir(self, name: str) -> Path:
        """A directory only this save writes into: rank 0 names it, and every rank learns the name."""
        choice = [f".tmp-{name}-{uuid.uuid4().hex[:12]}" if self.rank == 0 else None]
        if dist.is_initialized() and self.world_size > 1:
            dist.broadcast_object_list(choice, src=0)
        return self.root / str(choice[0])

    def _publish(self, tmp: Path, final: Path) -> None:
        """Rename the finished save into place (rank 0); an existing complete save of the step stays."""
        if any(path == final for _, path in list_checkpoints(self.root)):
            shutil.rmtree(tmp)  # the same step, resumed from it: same state, and no window without it
            return
        if final.exists():  # incomplete: not a checkpoint (list_checkpoints skips it), safe to replace
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.root)

    def load(self, path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> TrainState:
        """Restore ``path`` into ``model`` and ``optimizer`` (re-sharded onto this world)."""
        state = TrainState(**json.loads((path / STATE_FILE).read_text(encoding="utf-8")))
        model_sd, optim_sd = get_state_dict(model, optimizer)
        # DCP loads in place: into the tensors (or shards) that this world's model and optimizer hold.
        dcp_load({"model": model_sd, "optim": optim_sd}, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
        rng_file = path / "rng" / f"rank{self.rank}.pt"
        if state.world_size == self.world_size and rng_file.is_file():
            rng = torch.load(rng_file, weights_only=True)
            torch.set_rng_state(rng["cpu"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"])
        else:
            torch.manual_seed(state.seed + self.rank + state.step)
        return state
