#!/usr/bin/env python3
"""The ``auto`` decision's cost against depth, with one compile and step as the peer.

    python benchmarks/decision_scaling.py                          # 2, 4, 8, 16 blocks, aot_eager
    python benchmarks/decision_scaling.py --blocks 4 16 32 --backends aot_eager inductor
    python benchmarks/decision_scaling.py --blocks 8 --profile 15  # where the decision's time goes

The model is the forecast benchmark's GPT (``benchmarks/forecast.py``: dim 64, seq 64, batch 4,
AdamW) with ``--blocks`` attention blocks. Each row, in one process and one after the other:

- ``whole decision``: ``decide_plan`` with ``budget="auto", checkpoint="auto", regional=False``
  (every candidate partitioned on the joint graph of the whole model);
- ``regional decision``: the same with ``regional=True`` (what ``regional="auto"``, the callback's
  default, does for a search): each block compiled on its own, so the blocks share ONE graph,
  traced and partitioned once per candidate whatever the depth;
- ``compile + step``, the peer: ``forecast(budget=1.0)`` on that backend (one compile of the
  unplanned whole model, its forward and backward, the search's stand-in loss: the outputs summed)
  plus one training step;
- ``regional compile``: ``forecast`` of the regional decision's chosen plan (blocks wrapped, blocks
  compiled on their own) on that backend, the compile a fit runs after the decision.

``ratio`` is ``decision / compile + step``; ``regional growth`` the regional decision's time over
the previous row's of the same backend. ``candidates`` counts the plans the regional search
forecast; each ``chosen`` plan's forecast (``MiB``: above the baseline of the Lightning step, as
the search judges a candidate) comes from its decision, ``compile MiB`` from that plan's own
forecast on ``--backends``, judged the same way: on ``aot_eager`` the two must agree. Timings are
wall seconds on whatever else the machine runs: run it alone.
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


def _decide(blocks: int, backend: str, regional: bool, profile: int) -> tuple[object, float]:
    model, idx = _model(blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    settings = PlanSettings.from_args("decision_scaling", budget="auto", checkpoint="auto", backend=backend,
                                      regional=regional)
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    plan = decide_plan(settings, model, model.forward, (idx,), {}, opt, call="decision_scaling")
    if prof is not None:
        prof.disable()
    seconds = time.perf_counter() - t0
    if prof is not None:
        print(f"\n{blocks} blocks, {backend}, regional={regional}: the decision's {profile} costliest calls")
        pstats.Stats(prof).sort_stats("cumulative").print_stats(profile)
    return plan, seconds


def _compile(blocks: int, backend: str, plan: object | None) -> tuple[float, int | None]:
    """One compile and step: of the unplanned model (``plan`` None), else of ``plan`` (its blocks
    wrapped, its regional blocks compiled on their own); (seconds, Lightning-step peak above the
    baseline, bytes)."""
    model, idx = _model(blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t0 = time.perf_counter()
    if plan is None:
        fc = forecast(model, (idx,), budget=1.0, backend=backend, loss_fn=sum_outputs, optimizer=opt)
        fc.step()
    else:
        with checkpointed(model, plan.checkpoint):
            fc = forecast(model, (idx,), budget=plan.budget, solver=plan.solver or "dp", backend=backend,
                          loss_fn=sum_outputs, optimizer=opt, regional=plan.regional)
    seconds = time.perf_counter() - t0
    return seconds, lightning_step_memory(fc, step_grad_bytes(model, TrainingLoop()))[1]


def _label(plan: object) -> str:
    picked = plan.candidates[plan.chosen] if plan.chosen is not None else None
    return picked.label if picked else f"budget {plan.budget:g}"


def _mib(nbytes: int | None) -> float | None:
    return round(nbytes / MiB, 3) if nbytes is not None else None


def row(blocks: int, backend: str, profile: int = 0) -> dict[str, object]:
    """One row: the whole-model decision (today's exact path), the regional decision (one graph per
    distinct block), the peer (one compile and step of the unplanned model) and each chosen plan's
    own compile."""
    whole, whole_s = _decide(blocks, backend, False, profile)
    regional, regional_s = _decide(blocks, backend, True, profile)
    peer, _ = _compile(blocks, backend, None)
    _, whole_check = _compile(blocks, backend, whole)
    regional_compile, regional_check = _compile(blocks, backend, regional)
    pick = lambda p: p.candidates[p.chosen].peak_bytes if p.chosen is not None else None  # noqa: E731
    return {"blocks": blocks, "backend": backend, "candidates": len(regional.candidates),
            "compile + step s": round(peer, 1),
            "whole decision s": round(whole_s, 1), "whole ratio": round(whole_s / peer, 2),
            "whole chosen": _label(whole), "whole MiB": _mib(pick(whole)), "whole compile MiB": _mib(whole_check),
            "regional decision s": round(regional_s, 1), "regional ratio": round(regional_s / peer, 2),
            "regional chosen": _label(regional), "regional MiB": _mib(pick(regional)),
            "regional compile s": round(regional_compile, 1), "regional compile MiB": _mib(regional_check)}


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
            r["regional growth"] = round(float(r["regional decision s"]) / last, 2) if last else None  # type: ignore[arg-type]
            last = float(r["regional decision s"])  # type: ignore[arg-type]
            rows.append(r)
            print(tabulate([r], headers="keys", tablefmt="plain"), flush=True)
    print()
    print(tabulate(rows, headers="keys", tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
