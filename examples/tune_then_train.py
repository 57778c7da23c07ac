"""Plan once, train long: ``plan_memory`` forecasts the plans on one batch and saves the choice as
JSON; the long run loads it and trains without searching again.

    python examples/tune_then_train.py           # plan, save plan.json, train 3 epochs with it
    python examples/tune_then_train.py --fast

``plan_memory`` leaves the model, the trainer and torch's settings as they were; the plan file is
plain JSON (budget, solver, checkpointed blocks, the forecast and every candidate) that can be
reviewed, versioned and reused by other runs of the same model and batch shape.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from lightning.pytorch import Trainer, seed_everything

from lightning_memplan import MemPlanCallback
from lightning_memplan.demo import GPT, make_dataloader
from lightning_memplan.tuner import plan_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fast", action="store_true", default=os.environ.get("MEMPLAN_FAST") == "1",
                        help="a short run (also: MEMPLAN_FAST=1)")
    parser.add_argument("--out", default="memplan_out", help="directory for plan.json and logs")
    args = parser.parse_args()
    seed_everything(0)
    backend = "inductor" if torch.cuda.is_available() else "aot_eager"
    loader, tok = make_dataloader(block_size=64, batch_size=16)
    model = GPT.from_size("tiny", tok.vocab_size, n_layer=2 if args.fast else 3)

    # 1. plan (one batch, no training) and save
    plan = plan_memory(Trainer(logger=False), model, train_dataloaders=loader, backend=backend,
                       **({"candidate_budgets": (1.0, 0.3), "checkpoint": None} if args.fast else {}))
    path = plan.save(Path(args.out) / "plan.json")
    print(f"saved {path}: budget {plan.budget:g}, checkpointed {list(plan.checkpoint)}, "
          f"{len(plan.candidates)} candidates forecast")

    # 2. the long run: the callback takes the plan as it is
    callback = MemPlanCallback(plan=path, backend=backend)
    trainer = Trainer(max_epochs=1 if args.fast else 3, limit_train_batches=4 if args.fast else None,
                      callbacks=[callback], default_root_dir=args.out, enable_checkpointing=False,
                      enable_progress_bar=not args.fast)
    trainer.fit(model, loader)
    print(f"trained with budget {callback.plan.budget:g} from {path}; measured peaks {callback.measured}")


if __name__ == "__main__":
    main()
