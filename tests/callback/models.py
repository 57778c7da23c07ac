"""Tiny LightningModules for callback tests (small, so compiles stay fast on 2 CPU cores)."""
from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 2 * width)
        self.fc2 = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class TinyNet(LightningModule):
    """A residual MLP with repeated blocks; logs its loss like a real module."""

    def __init__(self, width: int = 32, depth: int = 3, batch: int = 16, batches: int = 4, last: int = 0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 1)
        self._width, self._batch, self._batches = width, batch, batches
        self._last = last  # rows of an incomplete last batch (DataLoader's default drop_last=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        n = self._batch * self._batches + self._last
        x = torch.randn(n, self._width, generator=g)
        return DataLoader(TensorDataset(x, x[:, :1].clone()), batch_size=self._batch)


class Wrapper(LightningModule):
    """The common layout: the network is an attribute, and training_step calls ``self.model(x)``."""

    def __init__(self) -> None:
        super().__init__()
        self.model = TinyNet()

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.model(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return self.model.train_dataloader()
