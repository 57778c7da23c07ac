"""Run by test_ddp.py as a script: 2 CPU processes (gloo) under Lightning's ModelParallelStrategy
with tensor parallelism only: each block's two linears split column- then row-wise
(``parallelize_module`` in ``configure_model``), a 4,000-class head and cross-entropy left whole.

Each rank writes what it planned and measured to OUT_DIR/rank{r}.json.
"""
from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.strategies import ModelParallelStrategy  # noqa: E402
from models import WideHead  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

from lightning_memplan import MemPlanCallback  # noqa: E402
from lightning_memplan.callback.memplan_callback import MemPlanWarning  # noqa: E402


class TensorParallelNet(WideHead):
    """WideHead whose blocks' ``fc1`` / ``fc2`` are split over the tensor-parallel mesh: the
    compiled graphs carry functional collectives and their process group (a script object)."""

    def configure_model(self) -> None:
        mesh = self.device_mesh["tensor_parallel"]
        for block in self.blocks:
            parallelize_module(block, mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


def main(out_dir: str) -> None:
    cb = MemPlanCallback(0.5, backend="aot_eager", measure_batches=2, verbose=False, log_plots=False)
    trainer = Trainer(
        max_epochs=1, accelerator="cpu", devices=2, callbacks=[cb],
        strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2),
        logger=False, enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MemPlanWarning)
        trainer.fit(TensorParallelNet(batches=4))
    plan = cb.plan
    Path(out_dir, f"rank{trainer.global_rank}.json").write_text(json.dumps({
        "rank": trainer.global_rank, "budget": plan.budget if plan else None,
        "fallback": cb.fallback_reason, "measured": cb.measured,
        "predicted": plan.predicted_peak_bytes if plan else None,
        "eager_losses": len(cb.eager_losses),
        "warnings": [str(w.message) for w in caught if issubclass(w.category, MemPlanWarning)],
    }))


if __name__ == "__main__":
    main(sys.argv[1])
