"""A user's own task for the entrypoint contract test: ``trainer.entrypoint: "trainer_helpers_entry:build"``."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional alias
from torch import nn
from torch.utils.data import TensorDataset

from kubetrain_trainer.tasks import Task, TaskContext


def _loss(model: nn.Module, batch: Any) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x).squeeze(-1), y)


def build(ctx: TaskContext) -> Task:
    """Linear regression y = 3 x0 - 2 x1 + 0.5: a model, datasets and a loss, nothing else."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 2, generator=g)
    y = 3 * x[:, 0] - 2 * x[:, 1] + 0.5
    scale = float(ctx.options.get("scale", "1"))
    return Task(model=nn.Linear(2, 1), train_dataset=TensorDataset(x, y * scale), loss_fn=_loss)
