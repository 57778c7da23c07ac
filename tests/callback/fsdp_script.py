"""Run by test_ddp.py as a script: 2 CPU processes (gloo) under Lightning's ModelParallelStrategy,
each block sharded with FSDP2's ``fully_shard`` in ``configure_model``.

Each rank writes what it planned and measured to OUT_DIR/rank{r}.json. ``fsdp_script.py OUT_DIR
child``: the network is ``self.model``; ``regional``: that layout with ``regional=True``.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from lightning.pytorch import LightningModule, Trainer  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from lightning.pytorch.strategies import ModelParallelStrategy  # noqa: E402
from models import WideHead  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from lightning_memplan import MemPlanCallback  # noqa: E402
from lightning_memplan._torch.fsdp import fsdp2_units  # noqa: E402
from lightning_memplan.callback.memplan_callback import MemPlanWarning  # noqa: E402


class ShardedNet(WideHead):
    """WideHead (a cross-entropy over 4,000 classes in training_step) whose blocks are torch's
    ``nn.TransformerEncoderLayer`` (over the batch's 128 rows, as one unbatched sequence) and whose
    blocks and root are FSDP2 units, as Lightning's FSDP2 examples shard. Its forward calls the units
    in a loop: FSDP's hooks break the graph there, so dynamo skips the forward's frame and runs the
    head eagerly; the callback compiles each unit on its own (dynamo would not start at a frame of
    torch's own classes: without that, nothing was compiled)."""

    def __init__(self, batches: int) -> None:
        super().__init__(batches=batches)
        self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
                                     for _ in self.blocks])

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for block in self.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self, mesh=mesh)


class ShardedChild(LightningModule):
    """The common layout under FSDP2: the network (ShardedNet's blocks and head, as a plain module)
    is ``self.model``, training_step calls ``self.model(x)``; its blocks, the network and the
    LightningModule are FSDP2 units."""

    def __init__(self, batches: int) -> None:
        super().__init__()
        net = ShardedNet(batches=batches)
        self.model = nn.Sequential(*net.blocks, net.head)
        self._data, self._classes = net.train_dataloader, net._classes

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for block in self.model[:-1]:
            fully_shard(block, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.model(x), (y[:, 0].abs() * 997).long() % self._classes)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader:
        return self._data()


def _logged(trainer: Trainer, key: str) -> list[str]:
    """Every value of ``key`` in the CSV logger's metrics."""
    with open(Path(trainer.logger.log_dir) / "metrics.csv") as f:
        return [row[key] for row in csv.DictReader(f) if row.get(key)]


def main(out_dir: str, kind: str = "self") -> None:
    cb = MemPlanCallback("auto", backend="aot_eager", candidate_budgets=(1.0, 0.3), checkpoint=None,
                         remat_budgets=(0.4,), measure_batches=5, regional=kind == "regional")
    trainer = Trainer(
        max_epochs=1, accelerator="cpu", devices=2, callbacks=[cb],
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1),
        logger=CSVLogger(out_dir), enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=False,
    )
    model = ShardedNet(batches=12) if kind == "self" else ShardedChild(batches=12)  # 6 batches per rank: 3 or 4 measured windows (a re-plan drops one)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MemPlanWarning)
        trainer.fit(model)
    rank = trainer.global_rank
    shards = {p.to_local().untyped_storage()._cdata: p.to_local().untyped_storage().nbytes()
              for p in model.parameters()}  # FSDP2 pads each shard's storage
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    plan = cb.plan
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "budget": plan.budget if plan else None,
        "candidates": len(plan.candidates) if plan else 0,
        "fallback": cb.fallback_reason, "measured": cb.measured, "module": cb._fit.planned,
        "eager_losses": [dataclasses.asdict(m) for m in cb.eager_losses],
        "predicted": plan.predicted_peak_bytes if plan else None,
        "parameters": plan.breakdown.get("parameters") if plan else None,
        "fsdp_buffers": cb.forecast.breakdown.fsdp_buffers if cb.forecast and cb.forecast.breakdown else None,
        "logged_fsdp_buffers": _logged(trainer, "memplan/fsdp_buffers_bytes") if rank == 0 else [],
        "largest_unit_bytes": max(u.unsharded_bytes for u in fsdp2_units(model).units),
        "local_parameter_bytes": sum(shards.values()), "full_parameter_bytes": full,
        "warnings": [str(w.message) for w in caught if issubclass(w.category, MemPlanWarning)],
        "regional": list(plan.regional) if plan else [],
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
