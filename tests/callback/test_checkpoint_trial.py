"""Checkpointed blocks must recompute what they computed: a plan with blocks that do not (they append
to a cache they are passed, as a KV cache is appended to) is found out in a trial step by the
planner, never in the user's first backward (lightning_memplan.planner.checkpointing.recompute_trial)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_memplan import MemPlanCallback
from lightning_memplan.callback.memplan_callback import MemPlanWarning
from lightning_memplan.plan import MemPlan
from lightning_memplan.planner.checkpointing import checkpointed, recompute_trial
from lightning_memplan.planner.plan_forecast import sum_outputs


class _CachingBlock(nn.Module):
    """Attention over every key the cache holds for this block, after appending its own."""

    def __init__(self, index: int, width: int) -> None:
        super().__init__()
        self.index, self.q, self.k, self.out = index, nn.Linear(width, width), nn.Linear(width, width), \
            nn.Linear(width, width)

    def forward(self, x: torch.Tensor, cache: dict[int, list[torch.Tensor]]) -> torch.Tensor:
        cache.setdefault(self.index, []).append(self.k(x))
        keys = torch.cat(cache[self.index], dim=1)
        attn = (self.q(x) @ keys.transpose(1, 2)).softmax(-1)
        return x + self.out(attn @ keys)


class _CachingNet(LightningModule):
    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([_CachingBlock(i, width) for i in range(2)])
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache: dict[int, list[torch.Tensor]] = {}  # a fresh cache per call, as a model's own KV cache
        for block in self.blocks:
            x = block(x, cache)
        return self.head(x).squeeze(-1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self) -> DataLoader:
        g = torch.Generator().manual_seed(0)
        return DataLoader(TensorDataset(torch.randn(16, 8, 16, generator=g), torch.randn(16, 8, generator=g)),
                          batch_size=4)


def test_the_trial_step_finds_a_block_that_does_not_recompute_what_it_computed() -> None:
    net = _CachingNet()
    x = torch.randn(4, 8, 16)
    before = [b.clone() for b in net.parameters()]
    recompute_trial(net, net.forward, (x,), {}, sum_outputs)  # no checkpointing: fine
    with checkpointed(net, ["blocks.1"]), pytest.raises(Exception, match=r"(?i)recomputed|size|shape"):
        recompute_trial(net, net.forward, (x,), {}, sum_outputs)
    assert all(p.grad is None for p in net.parameters())  # no gradient accumulated by the trial
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


def test_a_plan_whose_blocks_fail_when_recomputed_falls_back_and_training_goes_on(tmp_path: Path) -> None:
    cb = MemPlanCallback(plan=MemPlan(budget=1.0, solver="dp", checkpoint=("blocks.1",), backend="aot_eager"),
                         backend="aot_eager")
    net = _CachingNet()
    trainer = Trainer(max_epochs=2, callbacks=[cb], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                      default_root_dir=tmp_path)
    with pytest.warns(MemPlanWarning, match=r"failed when recomputed"):
        trainer.fit(net)
    assert trainer.global_step == 8  # every batch trained
    assert cb.plan is None and cb.fallback_reason is not None and "recomputed" in cb.fallback_reason
    assert not any("forward" in m.__dict__ for m in net.modules())
