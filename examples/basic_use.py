"""Basic use: one callback in the Trainer plans, compiles and reports memory.

    python examples/basic_use.py          # 3 epochs of the demo GPT on the shipped text
    python examples/basic_use.py --fast   # 1 short epoch, fewer candidate plans (for tests)

On the first batch MemPlanCallback forecasts candidate plans (an activation memory budget x a set
of checkpointed blocks) on the real compiled graphs, takes the knee of the forecast Pareto front,
compiles the model with it for this fit only, and logs predicted vs measured peak memory per epoch.
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

    loader, tok = make_dataloader(block_size=64, batch_size=16)
    model = GPT.from_size("tiny", tok.vocab_size, n_layer=2 if args.fast else 3)
    # inductor on a GPU; on a CPU aot_eager runs the same partitioner without C++ code generation
    backend = "inductor" if torch.cuda.is_available() else "aot_eager"
    callback = MemPlanCallback(
        "auto", backend=backend,
        **({"candidate_budgets": (0.5,), "checkpoint": None} if args.fast else {}),
    )
    trainer = Trainer(max_epochs=1 if args.fast else 3, limit_train_batches=4 if args.fast else None,
                      callbacks=[callback], default_root_dir=args.out, enable_checkpointing=False,
                      enable_progress_bar=not args.fast)
    trainer.fit(model, loader)

    plan = callback.plan
    print(f"plan: budget {plan.budget:g}, checkpointed {list(plan.checkpoint)}, chosen by {plan.reason}")
    print(f"measured peaks per epoch (bytes above each step's start): {callback.measured}")


if __name__ == "__main__":
    main()
