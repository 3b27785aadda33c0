"""Sharded data: a resumable DistributedSampler for map-style datasets and a file-sharded iterable dataset.

Map-style datasets
    :class:`ResumableDistributedSampler` permutes the whole dataset with ``seed + epoch`` (the same
    permutation on every rank and for every world size), skips the samples the job has already consumed
    this epoch (a *global* count, so a checkpoint resumes exactly even when the world size changes), and
    deals the rest round-robin to ranks, like :class:`torch.utils.data.DistributedSampler`.

    drop_last policy: with ``dropLast: true`` (the default) the tail that does not divide evenly by the
    world size is dropped, and the DataLoader drops a final partial batch; every rank therefore runs the
    same number of steps and no rank waits in a collective for a peer that ran out of data. With
    ``dropLast: false`` the sampler pads by repeating the first indices (as DistributedSampler does) and
    partial batches are kept; step counts stay equal because every rank gets the same number of samples.

Large data on a volume
    :class:`ShardedFileDataset` splits a directory of files across ``rank x DataLoader worker`` with
    :func:`assign_files`, each reader streaming only its files.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, IterableDataset, get_worker_info

__all__ = [
    "ResumableDistributedSampler",
    "ShardedFileDataset",
    "assign_files",
    "build_loader",
    "epoch_permutation",
    "rank_positions",
]

T = TypeVar("T")


def epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool) -> list[int]:
    """The global order of one epoch: identical on every rank and for every world size."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


def rank_positions(order: Sequence[int], skip: int, world: int, rank: int, drop_last: bool) -> list[int]:
    """This rank's indices: ``order`` minus its first ``skip`` entries, evened out and dealt round-robin."""
    rest = list(order[skip:])
    if drop_last:
        rest = rest[: len(rest) - len(rest) % world]
    elif rest and len(rest) % world:
        pad = world - len(rest) % world
        rest += (rest * math.ceil(pad / len(rest)))[:pad]
    return rest[rank::world]


class ResumableDistributedSampler(DistributedSampler[Any]):
    """DistributedSampler that can start an epoch after ``skip`` globally consumed samples."""

    def __init__(  # noqa: PLR0917 - the DistributedSampler signature, plus the seed up front
        self, dataset: Dataset[Any], num_replicas: int, rank: int, seed: int, shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.skip = 0

    def set_position(self, epoch: int, skip: int) -> None:
        """Start ``epoch`` after ``skip`` samples (counted over all ranks) were consumed."""
        self.set_epoch(epoch)
        self.skip = skip

    def _indices(self) -> list[int]:
        order = epoch_permutation(len(self.dataset), self.seed, self.epoch, self.shuffle)  # type: ignore[arg-type]
        return rank_positions(order, self.skip, self.num_replicas, self.rank, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        return iter(self._indices())

    def __len__(self) -> int:
        remaining = len(self.dataset) - self.skip  # type: ignore[arg-type]
        if self.drop_last:
            return remaining // self.num_replicas
        return math.ceil(remaining / self.num_replicas)


def _worker_init(_worker_id: int) -> None:
    # torchrun forwards SIGTERM to the whole process group, DataLoader workers included; a worker that died
    # of it would break the main process's graceful stop. Workers exit when the main process closes the
    # loader (or dies: they watch their parent), so ignoring SIGTERM here is safe.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def build_loader(
    dataset: Dataset[Any], sampler: ResumableDistributedSampler | None, *, batch_size: int, workers: int,
    prefetch_factor: int, drop_last: bool, pin_memory: bool, collate_fn: Callable[[list[Any]], Any] | None = None,
) -> DataLoader[Any]:
    """A DataLoader tuned for training: worker processes kept across epochs, pinned memory on GPU."""
    extra: dict[str, Any] = {}
    if workers > 0:
        # Persistent workers avoid re-forking (and re-importing) every epoch; prefetch keeps the GPU fed. Not
        # for iterable datasets: their workers hold copies that would never see set_epoch.
        extra = {"persistent_workers": not isinstance(dataset, IterableDataset), "prefetch_factor": prefetch_factor,
                 "worker_init_fn": _worker_init}
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        # Pinned host memory makes .to(device, non_blocking=True) a real async copy.
        pin_memory=pin_memory,
        drop_last=drop_last,
        collate_fn=collate_fn,
        **extra,
    )


def assign_files(files: Sequence[T], rank: int, world: int, worker: int, workers: int) -> list[T]:
    """Files read by one (rank, worker) pair: disjoint across pairs and together all of ``files``."""
    readers = world * max(workers, 1)
    reader = rank * max(workers, 1) + worker
    return list(files[reader::readers])


class ShardedFileDataset(IterableDataset[tuple[torch.Tensor, torch.Tensor]]):
    """Streams (inputs, next-byte targets) windows from files, split across ranks and DataLoader workers.

    For data too big for a map-style dataset: each (rank, DataLoader worker) reads its own files, so no
    file is read twice per epoch. Ranks may get unequal sample counts with this dataset; the training loop
    therefore equalises step counts (it stops every rank at the planned step).
    """

    def __init__(self, files: Sequence[Path], window: int, rank: int, world: int, epoch: int = 0) -> None:
        self.files = sorted(files)
        self.window = window
        self.rank = rank
        self.world = world
        self.epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = assign_files(self.files, self.rank, self.world, worker, workers)
        g = torch.Generator()
        g.manual_seed(self.epoch)  # a new file order every epoch
        for i in torch.randperm(len(mine), generator=g).tolist():
            data = torch.frombuffer(bytearray(mine[i].read_bytes()), dtype=torch.uint8)
            for start in range(0, len(data) - self.window, self.window):
                chunk = data[start : start + self.window + 1].long()
                yield chunk[:-1], chunk[1:]  # inputs and next-byte targets
