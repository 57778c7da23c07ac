"""A byte target: the cheapest plan whose forecast fits ``max_memory``.

    python examples/byte_target.py --max-memory 11MiB
    python examples/byte_target.py --fast

``max_memory`` bounds everything live during a step: parameters, optimizer state and the batch
(the baseline) plus the step's peak. The callback forecasts the candidate plans, keeps those that
fit, and trains with the one that recomputes least. If the measured peak of the first steps still
exceeds the target, it re-plans once with a smaller plan (``replan=True``). If nothing fits, it
warns and trains with the smallest forecast.
"""
from __future__ import annotations

import argparse
import os

import torch
from lightning.pytorch import Trainer, seed_everything

from lightning_memplan import MemPlanCallback
from lightning_memplan.demo import GPT, make_dataloader
from lightning_memplan.units import format_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-memory", default="11MiB", help="byte target, e.g. 11MiB or 20GiB")
    parser.add_argument("--fast", action="store_true", default=os.environ.get("MEMPLAN_FAST") == "1",
                        help="a short run (also: MEMPLAN_FAST=1)")
    parser.add_argument("--out", default="memplan_out", help="log directory (default: memplan_out)")
    args = parser.parse_args()
    seed_everything(0)

    loader, tok = make_dataloader(block_size=64, batch_size=16)
    model = GPT.from_size("tiny", tok.vocab_size, n_layer=2 if args.fast else 3)
    backend = "inductor" if torch.cuda.is_available() else "aot_eager"
    callback = MemPlanCallback(
        max_memory=args.max_memory, backend=backend,
        **({"candidate_budgets": (1.0, 0.3), "checkpoint": None} if args.fast else {}),
    )
    trainer = Trainer(max_epochs=1 if args.fast else 2, limit_train_batches=4 if args.fast else None,
                      callbacks=[callback], default_root_dir=args.out, enable_checkpointing=False,
                      enable_progress_bar=not args.fast)
    trainer.fit(model, loader)

    plan = callback.plan
    total = (plan.baseline_bytes or 0) + (plan.predicted_peak_bytes or 0)
    print(f"target {args.max_memory}: plan budget {plan.budget:g}, checkpointed {list(plan.checkpoint)}, "
          f"forecast {format_bytes(total)} in all ({plan.reason})")


if __name__ == "__main__":
    main()
