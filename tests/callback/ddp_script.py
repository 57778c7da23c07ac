"""Run by test_ddp.py as a script: 2 CPU processes (gloo) under Lightning's DDP strategy.

Each rank writes what it planned and measured to OUT_DIR/rank{r}.json.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from lightning.pytorch import Trainer  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402
from models import TinyNet  # noqa: E402

from lightning_memplan import MemPlanCallback  # noqa: E402


def main(out_dir: str) -> None:
    torch._dynamo.config.optimize_ddp = False  # one graph per model (DDPOptimizer splits it)
    cb = MemPlanCallback("auto", backend="aot_eager", candidate_budgets=(1.0, 0.3), checkpoint=None,
                         remat_budgets=(0.4,))
    trainer = Trainer(
        max_epochs=1, accelerator="cpu", devices=2, strategy="ddp", callbacks=[cb],
        logger=CSVLogger(out_dir), enable_checkpointing=False, enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(TinyNet(batches=6))
    rank = trainer.global_rank
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({
        "rank": rank, "budget": cb.plan.budget if cb.plan else None,
        "candidates": len(cb.plan.candidates) if cb.plan else 0,
        "fallback": cb.fallback_reason, "measured": cb.measured,
        "log_dir": trainer.logger.log_dir if rank == 0 else None,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
