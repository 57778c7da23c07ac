"""Run by test_ddp.py as a script: 2 CPU processes (gloo) under Lightning's DDP strategy.

Each rank writes what it planned and measured to OUT_DIR/rank{r}.json. By default the
LightningModule holds the network as ``self.model`` and training_step calls ``self.model(x)``, as
most Lightning code reads (no ``submodule=``: the callback finds what it calls). ``ddp_script.py
OUT_DIR varying``: a fixed budget on batches of varying rows, each rank given other shapes by
Lightning's DistributedSampler.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from models import TinyNet, VaryingRows, Wrapper  # noqa: E402

from lightning_memplan import MemPlanCallback  # noqa: E402


def main(out_dir: str, kind: str = "auto") -> None:
    torch._dynamo.config.optimize_ddp = False  # one graph per model (DDPOptimizer splits it)
    if kind == "varying":
        cb = MemPlanCallback(0.5, backend="aot_eager", measure_batches=3)
        # DistributedSampler (seed 0) deals rank 0 batches of 64 and 96 rows, rank 1 of 128 and 192
        model = VaryingRows(rows=(192, 192, 64, 128, 64, 192, 192, 96, 128, 96, 128, 64, 64, 96, 128, 96))
    elif kind == "regional":
        cb = MemPlanCallback("auto", backend="aot_eager", regional=True)
        model = Wrapper(TinyNet(depth=4, batches=6))
    else:
        cb = MemPlanCallback("auto", backend="aot_eager", candidate_budgets=(1.0, 0.3), checkpoint=None,
                             remat_budgets=(0.4,))
        model = Wrapper(TinyNet(batches=6))
    trainer = Trainer(
        max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", callbacks=[cb],
        logger=CSVLogger(out_dir), enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(model)
    rank = trainer.global_rank
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "budget": cb.plan.budget if cb.plan else None,
        "candidates": len(cb.plan.candidates) if cb.plan else 0,
        "fallback": cb.fallback_reason, "measured": cb.measured, "module": cb._fit.planned,
        "regional": list(cb.plan.regional) if cb.plan else [],
        "log_dir": trainer.logger.log_dir if rank == 0 else None,
        "planned": cb.plan.predicted_peak_bytes if cb.plan else None,
        "rows": [[sig[0][0][0] if sig else None for sig in epoch] for epoch in cb.measured_shapes],
        # the forecast for each measured batch's shapes (the plan's at the planned shapes)
        "forecasts": [[cb.plan.predicted_peak_bytes if sig == cb.planned_signature else cb.shape_forecasts.get(sig)
                       for sig in epoch] for epoch in cb.measured_shapes] if cb.plan else [],
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
