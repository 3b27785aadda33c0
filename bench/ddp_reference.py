"""What this machine gives DDP without kubetrain: the references of the ``trainer.scaling`` benchmark.

Two measures, one torchrun of 2 processes (gloo), on the bench's ``synthetic`` task (model and data built by
the trainer's own task code, as in ``bench.trainer``'s runs):

- **a plain PyTorch DDP loop**, what a user who writes DDP by hand gets at best for the same training: the same
  model, data and batch, AdamW, fp32, gradients clipped at the trainer's default norm, batches gathered by
  index from memory, ``DistributedDataParallel`` with the settings the trainer uses (``gradient_as_bucket_view``,
  ``static_graph``); no logging, metrics, checkpoints or agreement on loss and stop.
  ``trainer.ddp_vs_plain_ratio`` compares the trainer against it.
- **gloo's all-reduce latency** for a few floats, the model's gradients and ten times that: the floor under
  ``trainer.ddp_efficiency_2proc``.

Run by hand::

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node=2 \
        bench/ddp_reference.py --steps 300 --latency

Rank 0 prints what it measured, then one JSON line (``ddp-reference {...}``) that :func:`measure` reads.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from kubetrain_trainer.config import parse_config
from kubetrain_trainer.tasks import Task, TaskContext, synthetic_task

BATCH = 256  # bench.trainer.BATCH (this script runs as a file under torchrun, outside the bench package)
WARMUP, TIMED = 20, 200


def measure(env: Mapping[str, str], *, steps: int = 0, latency: bool = False,
            timeout_s: float = 180) -> dict[str, float]:
    """Run this script with 2 processes under torchrun in ``env``: ``samples_per_s`` of the plain loop (when
    ``steps``) and milliseconds per all-reduce by size (``floats``, ``grads``, ``big``, when ``latency``)."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", __file__,
            "--steps", str(steps)] + (["--latency"] if latency else [])
    done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout_s, check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith("ddp-reference "))
    return {key: float(value) for key, value in json.loads(line[len("ddp-reference "):]).items()}


def synthetic(rank: int, world: int) -> tuple[Task, float]:
    """The task, and the gradient norm the trainer clips at by default."""
    config = parse_config({"trainer": {"task": "synthetic"}}, env={})
    task = synthetic_task(TaskContext(trainer=config.trainer, options={}, data_dir=Path("."), rank=rank,
                                      world_size=world, device=torch.device("cpu")))
    return task, config.trainer.grad_clip


def plain_loop(task: Task, clip: float, steps: int) -> float:
    """Samples/s of all ranks over the steps after the first 20 %."""
    rank, world = dist.get_rank(), dist.get_world_size()
    inputs, labels = task.train_dataset.tensors  # type: ignore[attr-defined]
    model = DistributedDataParallel(task.model, gradient_as_bucket_view=True, static_graph=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.001)
    generator = torch.Generator().manual_seed(rank)
    started = 0.0
    for step in range(steps):
        if step == steps // 5:
            started = time.perf_counter()
        index = torch.randint(len(inputs), (BATCH,), generator=generator)
        loss = task.loss_fn(model, (inputs[index], labels[index]))
        optimizer.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
    return (steps - steps // 5) * BATCH * world / (time.perf_counter() - started)


def all_reduce_ms(numel: int) -> float:
    tensor = torch.ones(numel)
    for _ in range(WARMUP):
        dist.all_reduce(tensor)
    dist.barrier()
    started = time.perf_counter()
    for _ in range(TIMED):
        dist.all_reduce(tensor)
    return (time.perf_counter() - started) / TIMED * 1e3


def latencies(model: nn.Module) -> dict[str, float]:
    grads = sum(p.numel() for p in model.parameters())
    sizes = {"floats": (3, "a few floats (loss, stop)"),
             "grads": (grads, f"the synthetic model's gradients ({grads * 4 / 1e6:.2f} MB)"),
             "big": (10 * grads, f"ten times that ({grads * 40 / 1e6:.1f} MB)")}
    results = {"grads_mb": grads * 4 / 1e6}
    for key, (numel, label) in sizes.items():
        results[key] = all_reduce_ms(numel)
        if dist.get_rank() == 0:
            print(f"all_reduce of {label}: {results[key]:.2f} ms", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="steps of the plain DDP loop (0: none)")
    parser.add_argument("--latency", action="store_true", help="also time gloo's all-reduces")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    task, clip = synthetic(dist.get_rank(), dist.get_world_size())
    results: dict[str, float] = {}
    if args.steps:
        results["samples_per_s"] = plain_loop(task, clip, args.steps)
        if dist.get_rank() == 0:
            print(f"plain DDP loop: {results['samples_per_s']:.0f} samples/s", flush=True)
    if args.latency:
        results |= latencies(task.model)
    if dist.get_rank() == 0:
        print("ddp-reference " + json.dumps(results), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
