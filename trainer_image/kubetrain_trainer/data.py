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

Batched fetching
    Indexing a sample at a time and stacking the samples (the DataLoader's default collate) costs a Python
    call and a small tensor per sample: with in-memory data that is most of what loading costs. Datasets
    that can gather a whole batch at once (a ``TensorDataset``, or any map-style dataset with
    ``get_batch(indices: LongTensor) -> batch``) are therefore read through :class:`BatchIndexed`, one
    gather per tensor per batch, in exactly the order per-sample loading would give; a
    :class:`ShardedFileDataset` cuts its batches itself. A task's own ``collate_fn`` turns this off.

    In-memory data (a ``TensorDataset``, or a ``get_batch`` dataset with ``in_memory = True``) is gathered in
    the training process by a :class:`GatherLoader`, even when ``data.workers`` asks for workers: the gather
    takes tens of microseconds, while handing a batch over from a worker process (shared memory, a file
    descriptor, unpickling) costs the training loop about a millisecond per batch, and a DataLoader's own
    bookkeeping another 80 us, which together were most of its data wait. Workers still load the other
    datasets (per-sample ones, ``get_batch`` ones that read or decode, file shards).
"""

from __future__ import annotations

import math
import queue
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    TensorDataset,
    get_worker_info,
)

__all__ = [
    "BatchIndexed",
    "GatherLoader",
    "Loader",
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
    return _epoch_order(n, seed, epoch, shuffle).tolist()


def _epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    if not shuffle:
        return torch.arange(n)
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g)


S = TypeVar("S", list[int], torch.Tensor)


def rank_positions(order: S, skip: int, world: int, rank: int, drop_last: bool) -> S:
    """This rank's indices: ``order`` minus its first ``skip`` entries, evened out and dealt round-robin.

    ``order`` is a list, or a tensor (the loader's form: no round trip through Python ints).
    """
    rest = order[skip:]
    if drop_last:
        rest = rest[: len(rest) - len(rest) % world]
    elif len(rest) and len(rest) % world:
        pad = world - len(rest) % world
        repeats = math.ceil(pad / len(rest))
        rest = (torch.cat([rest, rest.repeat(repeats)[:pad]]) if isinstance(rest, torch.Tensor)
                else rest + (rest * repeats)[:pad])
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

    def index_tensor(self) -> torch.Tensor:
        """This rank's indices for the current position, in order, as one tensor."""
        order = _epoch_order(len(self.dataset), self.seed, self.epoch, self.shuffle)  # type: ignore[arg-type]
        return rank_positions(order, self.skip, self.num_replicas, self.rank, self.drop_last).contiguous()

    def __iter__(self) -> Iterator[int]:
        return iter(self.index_tensor().tolist())

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


class BatchIndexed(Dataset[Any]):
    """A map-style view of ``dataset`` whose item is a whole batch: ``self[indices]`` gathers ``indices`` once
    per tensor (what the DataLoader asks for when its sampler yields lists of indices)."""

    def __init__(self, dataset: Dataset[Any]) -> None:
        self.dataset = dataset

    @staticmethod
    def supports(dataset: Dataset[Any]) -> bool:
        return isinstance(dataset, TensorDataset) or callable(getattr(dataset, "get_batch", None))

    @staticmethod
    def in_memory(dataset: Dataset[Any]) -> bool:
        """Whether a batch is a gather from memory, cheaper inline than handed over by a worker process."""
        return isinstance(dataset, TensorDataset) or (BatchIndexed.supports(dataset)
                                                       and getattr(dataset, "in_memory", False) is True)

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, indices: list[int]) -> Any:
        return self.gather(torch.tensor(indices, dtype=torch.long))

    def gather(self, index: torch.Tensor) -> Any:
        if isinstance(self.dataset, TensorDataset):
            # index_select copies whole rows; t[index] computes an offset per element (2-4x slower here).
            return tuple(t.index_select(0, index) for t in self.dataset.tensors)
        return self.dataset.get_batch(index)  # type: ignore[attr-defined]


class GatherLoader:
    """Batches of an in-memory dataset without a DataLoader: the epoch's indices (from the sampler) as one
    tensor, sliced per batch and gathered at once, ``prefetch`` batches ahead on a thread (torch's gathers
    release the GIL, so they overlap the step); pinned on GPU so that the copy to the device is async."""

    num_workers = 0

    def __init__(self, dataset: Dataset[Any], sampler: ResumableDistributedSampler, *, batch_size: int,
                 drop_last: bool, pin_memory: bool, prefetch: int = 2) -> None:
        self.dataset, self.sampler = dataset, sampler
        self.fetch = BatchIndexed(dataset)
        self.batch_size, self.drop_last, self.pin_memory, self.prefetch = batch_size, drop_last, pin_memory, prefetch

    def __len__(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        batches = self._batches(self.sampler.index_tensor())
        return _read_ahead(batches, self.prefetch) if self.prefetch > 0 else batches

    def _batches(self, order: torch.Tensor) -> Iterator[Any]:
        b = self.batch_size
        end = len(order) - len(order) % b if self.drop_last else len(order)
        for start in range(0, end, b):
            batch = self.fetch.gather(order[start : start + b])
            yield _pinned(batch) if self.pin_memory else batch


_END: Final = object()


def _read_ahead(items: Iterator[Any], depth: int) -> Iterator[Any]:
    """``items``, produced up to ``depth`` ahead by a daemon thread that stops when the consumer does."""
    ready: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False  # the consumer went away (end of training, or an error): drop the rest

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
        except BaseException as error:  # handed to the consumer, raised there with its traceback
            put(_Failed(error))
            return
        put(_END)

    thread = threading.Thread(target=produce, name="batch-read-ahead", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _END:
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)  # never leave it inside a torch op while the interpreter shuts down


@dataclass(frozen=True)
class _Failed:
    error: BaseException


def _pinned(batch: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, tuple | list):
        return type(batch)(_pinned(v) for v in batch)
    if isinstance(batch, dict):
        return {k: _pinned(v) for k, v in batch.items()}
    return batch


Loader = DataLoader[Any] | GatherLoader


def build_loader(
    dataset: Dataset[Any], sampler: ResumableDistributedSampler | None, *, batch_size: int, workers: int,
    prefetch_factor: int, drop_last: bool, pin_memory: bool, collate_fn: Callable[[list[Any]], Any] | None = None,
) -> Loader:
    """A loader tuned for training: whole batches fetched at once, workers kept, pinned memory on GPU."""
    batched = collate_fn is None and sampler is not None and BatchIndexed.supports(dataset)
    if batched and BatchIndexed.in_memory(dataset):
        assert sampler is not None
        return GatherLoader(dataset, sampler, batch_size=batch_size, drop_last=drop_last, pin_memory=pin_memory,
                            prefetch=prefetch_factor)
    extra: dict[str, Any] = {}
    if workers > 0:
        # Persistent workers avoid re-forking (and re-importing) every epoch; prefetch keeps the GPU fed. Not
        # for iterable datasets: their workers hold copies that would never see set_epoch.
        extra = {"persistent_workers": not isinstance(dataset, IterableDataset), "prefetch_factor": prefetch_factor,
                 "worker_init_fn": _worker_init}
    # batch_size None: the loader neither batches nor collates; each item it fetches is already a batch.
    items: Dataset[Any] = dataset
    keys: Any = sampler
    loader_batch: int | None = batch_size
    if collate_fn is None and isinstance(dataset, ShardedFileDataset):
        items, keys, loader_batch = dataset.batched(batch_size, drop_last), None, None
    elif batched and sampler is not None:
        # The same index lists the loader's own batching would make from this sampler (same order, same tail).
        items, keys, loader_batch = BatchIndexed(dataset), BatchSampler(sampler, batch_size, drop_last), None
    return DataLoader(
        items,
        batch_size=loader_batch,
        sampler=keys,
        num_workers=workers,
        # Pinned host memory makes .to(device, non_blocking=True) a real async copy; on CPU it is only a cost.
        pin_memory=pin_memory,
        drop_last=drop_last and loader_batch is not None,
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
    therefore equalises step counts (it stops every rank at the planned step). With a ``batch_size``
    (see :meth:`batched`) it yields whole batches, cut from each file with one view, carrying the
    remainder into the next file as the DataLoader's own batching would.
    """

    def __init__(  # noqa: PLR0917 - the original four, then the batching that build_loader sets
        self, files: Sequence[Path], window: int, rank: int, world: int, epoch: int = 0,
        batch_size: int | None = None, drop_last: bool = True,
    ) -> None:
        self.files = sorted(files)
        self.window = window
        self.rank = rank
        self.world = world
        self.epoch = epoch
        self.batch_size = batch_size
        self.drop_last = drop_last

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batched(self, batch_size: int, drop_last: bool) -> ShardedFileDataset:
        """A copy that yields batches of ``batch_size`` windows (the last partial one unless ``drop_last``)."""
        return ShardedFileDataset(self.files, self.window, self.rank, self.world, self.epoch, batch_size, drop_last)

    def _windows(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Each of this reader's files, in this epoch's order, as (inputs, targets) of shape [n, window]."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        mine = assign_files(self.files, self.rank, self.world, worker, workers)
        g = torch.Generator()
        g.manual_seed(self.epoch)  # a new file order every epoch
        w = self.window
        for i in torch.randperm(len(mine), generator=g).tolist():
            data = torch.frombuffer(bytearray(mine[i].read_bytes()), dtype=torch.uint8)
            n = max((len(data) - 1) // w, 0)  # whole windows that still have a next byte after them
            yield data[: n * w].view(n, w), data[1 : n * w + 1].view(n, w)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.batch_size is None:
            for x, y in self._windows():
                for row in range(len(x)):
                    yield x[row].long(), y[row].long()  # copies: a sample never drags its file along
            return
        b = self.batch_size
        carry_x = carry_y = torch.empty(0, self.window, dtype=torch.uint8)
        for file_x, file_y in self._windows():
            x, y = (torch.cat([carry_x, file_x]), torch.cat([carry_y, file_y])) if len(carry_x) else (file_x, file_y)
            full = len(x) - len(x) % b
            for start in range(0, full, b):
                # .long() copies: a batch sent from a worker then carries its own bytes, not the whole file.
                yield x[start : start + b].long(), y[start : start + b].long()
            carry_x, carry_y = x[full:], y[full:]
        if len(carry_x) and not self.drop_last:
            yield carry_x.long(), carry_y.long()
