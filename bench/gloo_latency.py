"""What one gloo all-reduce costs between processes on this machine: the floor under trainer.ddp_efficiency_2proc.

Run it under torchrun (not part of ``python -m bench``: it explains a figure, it has no goal of its own)::

    OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --standalone --nproc-per-node=2 \
        bench/gloo_latency.py

Rank 0 prints the mean time of one all-reduce for three sizes: a few floats (what the trainer's per-step
agreement on loss and stop cost as a collective of its own, before it rode in DDP's), the synthetic benchmark
model's gradients (0.56 MB) and ten times that; then the same as one JSON
line (``gloo {...}``), which :func:`measure` reads: ``trainer.ddp_efficiency_2proc`` reports the ceiling it sets.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping

import torch
import torch.distributed as dist

SIZES = (("floats", "a few floats (loss, stop)", 3), ("grads", "0.56 MB (the synthetic MLP's gradients)", 140_000),
         ("big", "5.6 MB", 1_400_000))
WARMUP, TIMED = 20, 200


def measure(env: Mapping[str, str], timeout_s: float = 120) -> dict[str, float]:
    """Milliseconds per all-reduce by size key (floats, grads, big), 2 processes under torchrun in ``env``."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           __file__], env=dict(env), capture_output=True, text=True, timeout=timeout_s, check=True)
    line = next(line for line in done.stdout.splitlines() if line.startswith("gloo "))
    return {key: float(value) for key, value in json.loads(line[len("gloo "):]).items()}


def main() -> None:
    dist.init_process_group("gloo")
    results = {}
    for key, label, numel in SIZES:
        tensor = torch.ones(numel)
        for _ in range(WARMUP):
            dist.all_reduce(tensor)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(TIMED):
            dist.all_reduce(tensor)
        results[key] = (time.perf_counter() - started) / TIMED * 1e3
        if dist.get_rank() == 0:
            print(f"all_reduce of {label}: {results[key]:.2f} ms (world size {dist.get_world_size()})", flush=True)
    if dist.get_rank() == 0:
        print("gloo " + json.dumps(results), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
