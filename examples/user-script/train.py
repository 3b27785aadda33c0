"""Your own DDP training script (CPU, gloo), run by torchrun once per process, reporting to kubetrain.

Learns a noisy linear map from synthetic data. The only kubetrain-specific line is ``report(...)``: it
serves step, loss and throughput as the built-in trainer's metrics, so ``kubectl get tj`` shows progress,
loss and ETA, and a script that hangs is caught by ``failurePolicy.stallTimeoutSeconds``.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from kubetrain_trainer import report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32, help="per process")
    args = parser.parse_args()

    dist.init_process_group("gloo")  # torchrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    target = torch.randn(16, 1, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(100 + rank)  # each rank draws its own samples

    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch_size, 16, generator=data)
        y = x @ target + 0.1 * torch.randn(args.batch_size, 1, generator=data)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)  # the job's loss, so that rank 0 speaks for the whole job
        report(step=step, total_steps=args.steps, loss=mean_loss.item() / world_size,
               samples=args.batch_size * world_size)

    if rank == 0:
        print(f"done: {args.steps} steps, loss {mean_loss.item() / world_size:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
