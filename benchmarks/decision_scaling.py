#!/usr/bin/env python3
"""The ``auto`` decision's cost against depth, with one compile and step as the peer.

    python benchmarks/decision_scaling.py                          # 2, 4, 8, 16 blocks, aot_eager
    python benchmarks/decision_scaling.py --blocks 4 16 32 --backends aot_eager inductor
    python benchmarks/decision_scaling.py --blocks 8 --profile 15  # where the decision's time goes

The model is the forecast benchmark's GPT (``benchmarks/forecast.py``: dim 64, seq 64, batch 4,
AdamW) with ``--blocks`` attention blocks. Each row, in one process and one after the other:

- ``decision``: ``decide_plan`` with ``budget="auto", checkpoint="auto"``, as
  ``MemPlanCallback()`` decides at its first batch (candidates forecast on ``aot_eager``, the
  plan's backend ``--backends``);
- ``compile + step``, the peer: ``forecast(budget=1.0)`` on that backend (one compile of the
  unplanned step, its forward and backward, the search's stand-in loss: the outputs summed) plus
  one training step;
- ``chosen compile``: ``forecast`` of the chosen plan (blocks wrapped) on that backend, the
  compile a fit runs after the decision.

``ratio`` is ``decision / compile + step``; ``growth`` the decision's time over the previous row's
of the same backend. ``candidates`` counts the plans the search forecast; ``chosen`` and its
forecast (MiB above the baseline of the Lightning step, as the search judges a candidate) come
from the decision, ``chosen compile MiB`` from the chosen plan's own forecast, judged the same
way: the two must agree. Timings are wall seconds on
whatever else the machine runs: run it alone.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
import warnings
from pathlib import Path

import torch
from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forecast import GPT  # noqa: E402  (the forecast benchmark's model)

from lightning_memplan import forecast  # noqa: E402
from lightning_memplan.planner.checkpointing import checkpointed  # noqa: E402
from lightning_memplan.planner.decision import decide_plan  # noqa: E402
from lightning_memplan.planner.plan_forecast import sum_outputs  # noqa: E402
from lightning_memplan.planner.settings import PlanSettings  # noqa: E402
from lightning_memplan.planner.step_model import TrainingLoop, lightning_step_memory, step_grad_bytes  # noqa: E402

MiB = 2**20


def _model(blocks: int) -> tuple[GPT, torch.Tensor]:
    torch.manual_seed(0)
    return GPT(vocab=512, dim=64, heads=4, layers=blocks, seq=64), torch.randint(0, 512, (4, 64))


def row(blocks: int, backend: str, profile: int = 0) -> dict[str, object]:
    """One row: the decision, the peer and the chosen plan's compile for ``blocks`` blocks."""
    model, idx = _model(blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    settings = PlanSettings.from_args("decision_scaling", budget="auto", checkpoint="auto", backend=backend)
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    plan = decide_plan(settings, model, model.forward, (idx,), {}, opt, call="decision_scaling")
    if prof is not None:
        prof.disable()
    decision = time.perf_counter() - t0
    if prof is not None:
        print(f"\n{blocks} blocks, {backend}: the decision's {profile} costliest calls (cumulative)")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(profile)

    model, idx = _model(blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t0 = time.perf_counter()
    fc = forecast(model, (idx,), budget=1.0, backend=backend, loss_fn=sum_outputs, optimizer=opt)
    fc.step()
    peer = time.perf_counter() - t0

    model, idx = _model(blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t0 = time.perf_counter()
    with checkpointed(model, plan.checkpoint):
        chosen = forecast(model, (idx,), budget=plan.budget, solver=plan.solver or "dp", backend=backend,
                          loss_fn=sum_outputs, optimizer=opt)
    chosen_s = time.perf_counter() - t0
    _, chosen_peak = lightning_step_memory(chosen, step_grad_bytes(model, TrainingLoop()))
    picked = plan.candidates[plan.chosen] if plan.chosen is not None else None
    return {"blocks": blocks, "backend": backend, "candidates": len(plan.candidates),
            "decision s": round(decision, 1), "compile + step s": round(peer, 1),
            "ratio": round(decision / peer, 2), "chosen": picked.label if picked else f"budget {plan.budget:g}",
            "decision MiB": round(picked.peak_bytes / MiB, 3) if picked and picked.peak_bytes else None,
            "chosen compile s": round(chosen_s, 1),
            "chosen compile MiB": round(chosen_peak / MiB, 3) if chosen_peak else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--blocks", type=int, nargs="+", default=[2, 4, 8, 16], help="depths, one row each")
    p.add_argument("--backends", nargs="+", default=["aot_eager"], choices=["aot_eager", "inductor"],
                   help="the plan's backend (the search forecasts on aot_eager)")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="print the N costliest calls of each decision (cProfile, cumulative)")
    a = p.parse_args(argv)
    if any(b < 1 for b in a.blocks):
        p.error(f"--blocks {a.blocks}: every depth must be >= 1")
    warnings.filterwarnings("ignore")
    rows: list[dict[str, object]] = []
    for backend in a.backends:
        last: float | None = None
        for blocks in a.blocks:
            r = row(blocks, backend, a.profile)
            r["growth"] = round(float(r["decision s"]) / last, 2) if last else None  # type: ignore[arg-type]
            last = float(r["decision s"])  # type: ignore[arg-type]
            rows.append(r)
            print(tabulate([r], headers="keys", tablefmt="plain"), flush=True)
    print()
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
