"""Built-in tasks and the user entrypoint contract.

Built-in tasks (no downloads; each learns something real):

- ``digits``: an MLP on scikit-learn's handwritten digits (1,797 8x8 images, 10 classes); 20% held out.
  Options: ``hidden`` (default 128).
- ``gpt``: a byte-level GPT on the Python standard library's own source files (``sysconfig`` stdlib
  path), 5% held out. Options: ``layers`` (2), ``heads`` (2), ``embd`` (64), ``blockSize`` (128),
  ``corpusBytes`` (2000000), ``corpus`` (``stdlib``, or ``files``: stream every file under ``data.path``
  through the file-sharded :class:`~kubetrain_trainer.data.ShardedFileDataset`, no held-out set; needs
  ``maxSteps``). The GPT task reports tokens and model FLOPs, hence MFU.
- ``synthetic``: random inputs labelled by a fixed random teacher, for benchmarks. Options:
  ``features`` (256), ``hidden`` (512), ``classes`` (16), ``samples`` (65536).

User entrypoint contract (``trainer.entrypoint: "package.module:function"``): the function is called once per
process as ``function(ctx: TaskContext) -> Task``. It returns the (unwrapped) model, map-style train and
optional eval datasets, and ``loss_fn(model, batch) -> scalar tensor``; the trainer moves every tensor in
the batch to the device, wraps the model for DDP/FSDP, shards the data, checkpoints, and reports metrics.
Optional: ``eval_fn(model, batch) -> {name: (sum, count)}`` (averaged over all ranks), ``collate_fn``,
``tokens_per_sample`` and ``flops_per_sample`` (for throughput and MFU), ``shard_units`` (the submodules
that FSDP shards one by one, e.g. transformer blocks), ``static_graph`` (True when every step uses the same
parameters in the same order: DDP then skips re-checking its buckets each step). Without a ``collate_fn``, a
``TensorDataset`` or a dataset with ``get_batch(indices: LongTensor) -> batch`` is read a whole batch per
gather instead of a sample at a time (:mod:`kubetrain_trainer.data`), which is much cheaper for in-memory data;
such a dataset gathered from memory (a ``TensorDataset``, or ``in_memory = True`` on the class) is read in the
training process, without DataLoader workers. Users who bring a whole script use ``command:`` in the
TrainingJob instead; then this package is not involved.
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import sysconfig
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional alias
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from .config import ConfigError, TrainerConfig
from .data import ShardedFileDataset
from .models import GPT, MLP, GPTConfig, gpt_flops_per_token

__all__ = ["Task", "TaskContext", "build_task", "load_entrypoint"]

LossFn = Callable[[nn.Module, Any], torch.Tensor]
EvalFn = Callable[[nn.Module, Any], dict[str, tuple[float, float]]]


@dataclass(frozen=True)
class TaskContext:
    """What a task builder may use; the same on every rank except ``rank``."""

    trainer: TrainerConfig
    options: Mapping[str, str]
    data_dir: Path
    rank: int
    world_size: int
    device: torch.device


@dataclass
class Task:
    model: nn.Module
    train_dataset: Dataset[Any]
    loss_fn: LossFn
    eval_dataset: Dataset[Any] | None = None
    eval_fn: EvalFn | None = None
    collate_fn: Callable[[list[Any]], Any] | None = None
    tokens_per_sample: int = 0
    flops_per_sample: float = 0.0
    shard_units: list[nn.Module] = field(default_factory=list)
    static_graph: bool = False  # True: the same parameters in the same order every step (see DDP)


def _opt_int(options: Mapping[str, str], key: str, default: int) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"trainer.options.{key}: {raw!r} is not an integer") from None


def _check_options(options: Mapping[str, str], allowed: set[str], task: str) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ConfigError(f"trainer.options: unknown key(s) {', '.join(unknown)} for task {task} "
                          f"(allowed: {', '.join(sorted(allowed))})")


def classification_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def classification_eval(model: nn.Module, batch: Any) -> dict[str, tuple[float, float]]:
    x, y = batch
    logits = model(x)
    n = float(y.numel())
    loss = F.cross_entropy(logits, y, reduction="sum").item()
    correct = (logits.argmax(dim=-1) == y).sum().item()
    return {"loss": (loss, n), "accuracy": (float(correct), n)}


def _split(n: int, held_out: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator()
    g.manual_seed(seed)
    perm = torch.randperm(n, generator=g)
    cut = int(n * (1 - held_out))
    return perm[:cut], perm[cut:]


def load_digits_arrays() -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's digits (1,797 x 64 pixels in 0..16, labels 0..9).

    Read straight from the CSV that scikit-learn ships: importing scikit-learn costs every process about
    2.5 s of CPU at start-up (it pulls in scipy), more than the whole digits run.
    """
    spec = importlib.util.find_spec("sklearn")
    locations = list(spec.submodule_search_locations or []) if spec else []
    csv = Path(locations[0], "datasets", "data", "digits.csv.gz") if locations else None
    if csv is None or not csv.is_file():
        from sklearn.datasets import load_digits

        x_np, y_np = load_digits(return_X_y=True)
        return torch.tensor(x_np, dtype=torch.float32), torch.tensor(y_np, dtype=torch.long)
    with gzip.open(csv, "rt", encoding="ascii") as fh:
        rows = [[float(v) for v in line.split(",")] for line in fh if line.strip()]
    table = torch.tensor(rows, dtype=torch.float32)
    return table[:, :-1], table[:, -1].long()


def digits_task(ctx: TaskContext) -> Task:
    _check_options(ctx.options, {"hidden"}, "digits")
    x, y = load_digits_arrays()
    x = x / 16.0
    # A fixed split (seed 0, not the run's seed) so that every run is judged on the same held-out set.
    train_idx, test_idx = _split(len(y), 0.2, seed=0)
    model = MLP(64, _opt_int(ctx.options, "hidden", 128), 10)
    return Task(
        model=model,
        train_dataset=TensorDataset(x[train_idx], y[train_idx]),
        eval_dataset=TensorDataset(x[test_idx], y[test_idx]),
        loss_fn=classification_loss,
        eval_fn=classification_eval,
        flops_per_sample=6.0 * sum(p.numel() for p in model.parameters()),
        static_graph=True,
    )


def synthetic_task(ctx: TaskContext) -> Task:
    _check_options(ctx.options, {"features", "hidden", "classes", "samples"}, "synthetic")
    features = _opt_int(ctx.options, "features", 256)
    classes = _opt_int(ctx.options, "classes", 16)
    samples = _opt_int(ctx.options, "samples", 65536)
    g = torch.Generator()
    g.manual_seed(7)  # the data is part of the task, not of the run: same on every rank and every seed
    x = torch.randn(samples, features, generator=g)
    teacher = torch.randn(features, classes, generator=g)
    y = (x @ teacher).argmax(dim=1)
    cut = samples - samples // 10
    model = MLP(features, _opt_int(ctx.options, "hidden", 512), classes)
    return Task(
        model=model,
        train_dataset=TensorDataset(x[:cut], y[:cut]),
        eval_dataset=TensorDataset(x[cut:], y[cut:]),
        loss_fn=classification_loss,
        eval_fn=classification_eval,
        flops_per_sample=6.0 * sum(p.numel() for p in model.parameters()),
        static_graph=True,
    )


def stdlib_corpus(limit: int) -> bytes:
    """Python's own standard library sources, in a fixed order, up to ``limit`` bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks: list[bytes] = []
    total = 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= limit:
            break
    corpus = b"".join(chunks)[:limit]
    if len(corpus) < 10_000:
        raise ConfigError(f"gpt task: the stdlib corpus under {root} has only {len(corpus)} bytes")
    return corpus


class ByteWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of ``block`` bytes with next-byte targets."""

    in_memory = True  # get_batch is a gather from memory: cheaper in the training process than from a worker

    def __init__(self, data: torch.Tensor, block: int) -> None:
        self.data = data
        self.block = block

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.block : (i + 1) * self.block + 1].long()
        return chunk[:-1], chunk[1:]

    def get_batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows ``indices`` as one [batch, block] gather each (:class:`~kubetrain_trainer.data.BatchIndexed`)."""
        windows = self.data.unfold(0, self.block + 1, self.block).index_select(0, indices)  # [batch, block + 1]
        return windows[:, :-1].long().contiguous(), windows[:, 1:].long().contiguous()


def lm_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def lm_eval(model: nn.Module, batch: Any) -> dict[str, tuple[float, float]]:
    x, y = batch
    logits = model(x)
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1), reduction="sum").item()
    return {"loss": (loss, float(y.numel()))}


def gpt_task(ctx: TaskContext) -> Task:
    _check_options(ctx.options, {"layers", "heads", "embd", "blockSize", "corpusBytes", "corpus"}, "gpt")
    cfg = GPTConfig(
        block_size=_opt_int(ctx.options, "blockSize", 128),
        n_layer=_opt_int(ctx.options, "layers", 2),
        n_head=_opt_int(ctx.options, "heads", 2),
        n_embd=_opt_int(ctx.options, "embd", 64),
    )
    if cfg.n_embd % cfg.n_head:
        raise ConfigError(f"trainer.options: embd={cfg.n_embd} must be a multiple of heads={cfg.n_head}")
    model = GPT(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    source = ctx.options.get("corpus", "stdlib")
    train: Dataset[Any]
    held_out: Dataset[Any] | None
    if source == "files":
        files = sorted(p for p in ctx.data_dir.rglob("*") if p.is_file())
        if not files:
            raise ConfigError(f"gpt task: corpus 'files' but no file under data.path {ctx.data_dir}")
        train = ShardedFileDataset(files, cfg.block_size, ctx.rank, ctx.world_size)
        held_out = None
    elif source == "stdlib":
        corpus = torch.frombuffer(bytearray(stdlib_corpus(_opt_int(ctx.options, "corpusBytes", 2_000_000))),
                                  dtype=torch.uint8)
        cut = len(corpus) - len(corpus) // 20
        train, held_out = ByteWindows(corpus[:cut], cfg.block_size), ByteWindows(corpus[cut:], cfg.block_size)
    else:
        raise ConfigError(f"trainer.options.corpus: {source!r} is not one of stdlib, files")
    return Task(
        model=model,
        train_dataset=train,
        eval_dataset=held_out,
        loss_fn=lm_loss,
        eval_fn=lm_eval,
        tokens_per_sample=cfg.block_size,
        flops_per_sample=gpt_flops_per_token(cfg, n_params) * cfg.block_size,
        shard_units=list(model.blocks),
        static_graph=True,
    )


BUILTIN: dict[str, Callable[[TaskContext], Task]] = {
    "digits": digits_task,
    "gpt": gpt_task,
    "synthetic": synthetic_task,
}


def load_entrypoint(spec: str) -> Callable[[TaskContext], Task]:
    """Import ``package.module:function``; errors name the entrypoint."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"trainer.entrypoint {spec!r}: cannot import {module_name!r}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ConfigError(f"trainer.entrypoint {spec!r}: {module_name} has no callable {attr!r}")
    return fn  # type: ignore[no-any-return]


def build_task(ctx: TaskContext) -> Task:
    cfg = ctx.trainer
    builder = load_entrypoint(cfg.entrypoint) if cfg.entrypoint else BUILTIN[cfg.task or "digits"]
    task = builder(ctx)
    if not isinstance(task, Task):
        raise ConfigError(f"trainer: the task builder returned {type(task).__name__}, expected "
                          "kubetrain_trainer.tasks.Task")
    return task
