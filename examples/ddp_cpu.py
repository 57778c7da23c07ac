"""DDP on CPU: 2 processes (gloo). Rank 0 decides the plan, every rank trains with it, and the
logged measured peak is the maximum over ranks.

    python examples/ddp_cpu.py
    python examples/ddp_cpu.py --fast

Lightning starts the second process by running this script again, so keep the work under
``if __name__ == "__main__":``. ``optimize_ddp = False`` keeps one compiled graph per model
(torch's DDPOptimizer would split it at bucket boundaries).
"""
from __future__ import annotations

import argparse
import os

import torch
from lightning.pytorch import Trainer, seed_everything

from lightning_memplan import MemPlanCallback
from lightning_memplan.demo import GPT, make_dataloader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fast", action="store_true", default=os.environ.get("MEMPLAN_FAST") == "1",
                        help="a short run (also: MEMPLAN_FAST=1)")
    parser.add_argument("--out", default="memplan_out", help="log directory (default: memplan_out)")
    args = parser.parse_args()
    seed_everything(0)
    torch._dynamo.config.optimize_ddp = False

    loader, tok = make_dataloader(block_size=64, batch_size=8)
    model = GPT.from_size("tiny", tok.vocab_size, n_layer=2 if args.fast else 3)
    callback = MemPlanCallback(
        "auto", backend="aot_eager",
        **({"candidate_budgets": (0.5,), "checkpoint": None} if args.fast else {}),
    )
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1 if args.fast else 2,
                      limit_train_batches=4 if args.fast else None, callbacks=[callback],
                      default_root_dir=args.out, enable_checkpointing=False,
                      enable_progress_bar=not args.fast)
    trainer.fit(model, loader)
    plan = callback.plan
    print(f"rank {trainer.global_rank}: budget {plan.budget:g}, checkpointed {list(plan.checkpoint)}, "
          f"{len(plan.candidates)} candidates, measured {callback.measured}")


if __name__ == "__main__":
    main()
