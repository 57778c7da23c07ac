#!/usr/bin/env python3
"""The GPU check: forecast accuracy, plans vs torch's budgets and block checkpointing, solvers.

    PYTHONPATH=. python benchmarks/gpu_check.py          # on a CUDA machine; about 5 minutes at most
    python benchmarks/gpu_check.py --time-limit 240      # tighter deadline (seconds)

Three sections, then one summary table:

1. **Forecast**: predicted vs measured peak of one training step (forward, loss, backward, AdamW,
   zero_grad) for an MLP, a GPT and a CNN at budgets 1.0 / 0.5 / 0.2 under inductor, via
   ``lightning_memplan.forecast`` and ``measure_peak`` (``torch.cuda.max_memory_allocated`` above
   the bytes in use at the start), with the requested and reserved bytes beside them and a memory
   history trace of one more step. Rows of ``benchmarks/forecast.py``.
2. **Plans**: a 6-layer GPT (dim 512, sequence 512, batch 16): torch's budget alone at 1.0 / 0.7 /
   0.5 / 0.3, every block checkpointed, whole-graph rematerialization (solver ``"remat"``) at the
   search's remat budgets, and ``auto`` (what ``MemPlanCallback(budget="auto", regional=False)``
   decides: the knee
   of the forecast Pareto front over all of them); measured peak, forecast and the median step time,
   timed round-robin. Rows of ``benchmarks/plans.py``.
3. **Solvers**: ``memplan bench --sizes 200 1000 --seeds 1`` (ours vs torch's knapsack solvers), with
   torch's ILP capped at 20 s per call.

Rows that would start after the deadline are reported as skipped, so the script ends in time. On a
machine without CUDA it prints that and exits 0.
"""
from __future__ import annotations

import argparse
import gc
import math
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

GPU = {
    "device": "cuda", "backend": "inductor", "models": ("mlp", "gpt", "cnn"), "budgets": (1.0, 0.5, 0.2),
    "plan_budgets": (1.0, 0.7, 0.5, 0.3), "candidate_budgets": (1.0, 0.7, 0.5, 0.3, 0.1), "steps": 5,
    "gpt": {"layers": 6, "dim": 512, "heads": 8, "seq": 512, "batch": 16, "vocab": 512},
    "bench": ["bench", "--sizes", "200", "1000", "--seeds", "1", "--torch-timeout", "20"],
}
"""The check on a CUDA machine."""
SMOKE = {
    "device": "cpu", "backend": "aot_eager", "models": ("mlp",), "budgets": (1.0,),
    "plan_budgets": (1.0,), "candidate_budgets": (1.0,), "remat_budgets": (0.4,), "steps": 1,
    "gpt": {"layers": 2, "dim": 32, "heads": 2, "seq": 16, "batch": 2, "vocab": 64},
    "bench": ["bench", "--sizes", "50", "--seeds", "1", "--repeats", "1", "--frontier-n", "50"],
}
"""``--smoke``: the same code paths on a CPU with tiny sizes, to test the script (not a measurement)."""
BENCH_RESERVE_S = 60.0
"""Seconds kept back for the solver benchmark when the earlier sections run long."""


class Deadline:
    """Wall-clock budget in seconds, counted from construction."""

    def __init__(self, seconds: float) -> None:
        self._end = time.perf_counter() + seconds

    def left(self) -> float:
        """Seconds left (negative once past)."""
        return self._end - time.perf_counter()


def _cleanup() -> None:
    import torch

    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def forecast_section(cfg: dict[str, Any], deadline: Deadline, row_s: float,
                     reserve: float = BENCH_RESERVE_S) -> list[dict[str, Any]]:
    """Predicted vs measured rows (``forecast.run_row``); a row is skipped when fewer than
    ``row_s`` seconds plus ``reserve`` (kept for the solver benchmark) are left."""
    from forecast import run_row

    rows: list[dict[str, Any]] = []
    backend = "inductor" if cfg["backend"] == "inductor" else "aot_eager_decomp_partition"
    for name in cfg["models"]:
        for budget in cfg["budgets"]:
            if deadline.left() < row_s + reserve:
                rows.append({"model": name, "budget": budget, "error": "skipped (time limit)", "_err": math.nan})
                continue
            try:
                rows.append(run_row(name, backend, budget, cfg["device"], trace=cfg["device"] == "cuda"))
            except Exception as exc:  # noqa: BLE001 - one failed row must not end the check
                rows.append({"model": name, "budget": budget, "error": f"failed: {exc!r}"[:120], "_err": math.nan})
            _cleanup()
            print(f"  forecast {name} budget {budget:g}: {rows[-1].get('error')}", flush=True)
    return rows


def plans_section(cfg: dict[str, Any], deadline: Deadline, row_s: float,
                  reserve: float = BENCH_RESERVE_S) -> list[dict[str, Any]]:
    """Measured peak, forecast and step time of torch's budgets, full block checkpointing and auto."""
    import torch
    from forecast import GPT
    from plans import _compile, _time_round_robin

    from lightning_memplan.planner.checkpointing import repeated_blocks
    from lightning_memplan.planner.decision import decide_plan
    from lightning_memplan.planner.search import DEFAULT_REMAT_BUDGETS
    from lightning_memplan.planner.settings import PlanSettings

    s, dev, backend = cfg["gpt"], cfg["device"], cfg["backend"]
    torch.manual_seed(0)
    model = GPT(vocab=s["vocab"], dim=s["dim"], heads=s["heads"], layers=s["layers"], seq=s["seq"]).to(dev)
    idx = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=dev)
    tgt = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=dev)
    blocks = tuple(repeated_blocks(model))
    plans: list[tuple[str, float, tuple[str, ...], str]] = [
        (f"torch budget {b:g}", b, (), "dp") for b in cfg["plan_budgets"]]
    plans.append(("full block ckpt", 1.0, blocks, "dp"))
    plans += [(f"remat {b:g}", b, (), "remat") for b in cfg.get("remat_budgets", DEFAULT_REMAT_BUDGETS)]
    t0 = time.perf_counter()
    decide_s = math.nan
    if deadline.left() > 3 * row_s + reserve:
        try:
            settings = PlanSettings.from_args("gpu_check", budget="auto", backend=backend, checkpoint="auto",
                                              candidate_budgets=cfg["candidate_budgets"],
                                              remat_budgets=cfg.get("remat_budgets", DEFAULT_REMAT_BUDGETS))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            auto = decide_plan(settings, model, model.forward, (idx,), {}, opt, call="gpu_check")
            decide_s = time.perf_counter() - t0
            label = (f"auto (remat {auto.budget:g})" if auto.solver == "remat"
                     else f"auto (budget {auto.budget:g}, {len(auto.checkpoint)} ckpt)")
            plans.append((label, auto.budget, auto.checkpoint, auto.solver))
            print(f"  auto decided in {decide_s:.1f} s: {plans[-1][0]} of {len(auto.candidates)} candidates",
                  flush=True)
            for i, c in enumerate(auto.candidates):
                mark = " <- chosen" if i == auto.chosen else (" <- knee" if i == auto.knee else "")
                print(f"    candidate {c.label}: forecast {_mib(c.peak_bytes)} MiB, cost {c.cost or 0:.3g} FLOPs{mark}",
                      flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"  auto: decision failed: {exc!r}", flush=True)
        _cleanup()
    rows: list[dict[str, Any]] = []
    compiled: list[tuple[dict[str, Any], Any]] = []
    for label, budget, ckpt, solver in plans:
        row: dict[str, Any] = {"plan": label, "_auto": label.startswith("auto"), "_decide_s": decide_s}
        rows.append(row)
        if deadline.left() < row_s + reserve:
            row["note"] = "skipped (time limit)"
            continue
        try:
            c = _compile(model, idx, tgt, label, budget, ckpt, backend, solver)
            compiled.append((row, c))
            row.update(_peak=c.peak, _pred=c.fc.peak_bytes, _first=c.first)
        except Exception as exc:  # noqa: BLE001
            row["note"] = f"failed: {exc!r}"[:120]
        gc.collect()  # no dynamo reset here: the compiled plans are timed below
        done = f"peak {_mib(row['_peak'])} MiB" if "_peak" in row else ""
        print(f"  {label}: {row.get('note') or done}", flush=True)
    # timed round-robin (one step of each plan per round): drift hits every plan alike
    _time_round_robin(model, [c for _, c in compiled], cfg["steps"], dev == "cuda")
    for row, c in compiled:
        row["_step"] = statistics.median(c.times)
    compiled.clear()
    _cleanup()
    return rows


def _mib(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x / 2**20:.1f}"


def plans_table(rows: list[dict[str, Any]]) -> tuple[list[list[str]], dict[str, float]]:
    """Rows with saving and slowdown relative to torch budget 1.0, and the auto / full ckpt summary."""
    base = next((r for r in rows if r["plan"] == "torch budget 1" and "_peak" in r), None)
    out, facts = [], {}
    for r in rows:
        if "_peak" not in r:
            out.append([r["plan"], "-", "-", "-", "-", "-", "-", r.get("note", "")])
            continue
        saving = (base["_peak"] - r["_peak"]) / base["_peak"] if base else math.nan
        slow = r["_step"] / base["_step"] - 1 if base else math.nan
        err = (r["_pred"] - r["_peak"]) / r["_peak"] if r["_pred"] else math.nan
        out.append([r["plan"], _mib(r["_peak"]), _mib(r["_pred"]), f"{err:+.1%}", f"{r['_step'] * 1e3:.1f}",
                    f"{saving:+.0%}", f"{slow:+.1%}", ""])
        if r["_auto"]:
            facts.update(auto_saving=saving, auto_slowdown=slow)
        if r["plan"] == "full block ckpt":
            facts.update(full_saving=saving, full_slowdown=slow)
    return out, facts


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    """Run the three sections and print the summary; returns 0 (also without CUDA)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--time-limit", type=float, default=280.0, help="seconds for the whole check (default: 280)")
    p.add_argument("--row-seconds", type=float, default=25.0,
                   help="seconds a row is assumed to take when deciding whether to start it (default: 25)")
    p.add_argument("--smoke", action="store_true",
                   help="run the same code on the CPU with tiny sizes (tests the script; measures nothing)")
    p.add_argument("--no-solvers", action="store_true",
                   help="skip section 3 (the solvers are CPU code; on a short device lease the GPU rows matter more)")
    args = p.parse_args(argv)
    import torch

    cfg = SMOKE if args.smoke else GPU
    if not args.smoke and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); nothing to check. "
              "Run it on a CUDA machine.")
        return 0
    import lightning
    from tabulate import tabulate

    from lightning_memplan.cli import main as memplan_main

    warnings.filterwarnings("ignore")
    deadline = Deadline(args.time_limit)
    reserve = 0.0 if args.no_solvers else BENCH_RESERVE_S
    t_all = time.perf_counter()
    where = torch.cuda.get_device_name() if cfg["device"] == "cuda" else "CPU smoke run (not a measurement)"
    print(f"gpu_check: {where}, torch {torch.__version__}, lightning "
          f"{lightning.__version__}, Python {platform.python_version()}", flush=True)

    print(f"\n[1/3] forecast vs measured ({cfg['backend']})", flush=True)
    frows, f_s = _timed(lambda: forecast_section(cfg, deadline, args.row_seconds, reserve))
    cols = ["model", "budget", "partitioner", "predicted MiB", "measured MiB", "error", "requested MiB",
            "requested forecast MiB", "error vs requested", "stream", "reserved MiB", "reserved forecast MiB",
            "trace real/ours, sizes found", "compile s"]
    print(tabulate([[r.get(c, "") for c in cols] for r in frows], headers=cols, tablefmt="github"), flush=True)

    print(f"\n[2/3] plans on a GPT {cfg['gpt']} ({cfg['backend']})", flush=True)
    prows, p_s = _timed(lambda: plans_section(cfg, deadline, args.row_seconds, reserve))
    ptable, facts = plans_table(prows)
    print(tabulate(ptable, headers=["plan", "measured MiB", "forecast MiB", "error", "step ms", "saving",
                                    "slowdown", "note"], tablefmt="github"), flush=True)

    print("\n[3/3] knapsack solvers, ours vs torch's", flush=True)
    if args.no_solvers:
        print("skipped (--no-solvers)", flush=True)
        rc, b_s = None, 0.0
    else:
        rc, b_s = _timed(lambda: memplan_main(cfg["bench"]))

    errs = [abs(r["_err"]) for r in frows if not math.isnan(r.get("_err", math.nan))]
    decide_s = next((r["_decide_s"] for r in prows if r["_auto"]), math.nan)
    pct = lambda x: "-" if x is None or math.isnan(x) else f"{x:+.0%}"  # noqa: E731
    summary = [
        ["forecast", f"{len(errs)}/{len(frows)} rows; |error| median "
         f"{statistics.median(errs):.1%}, max {max(errs):.1%}" if errs else f"0/{len(frows)} rows", f"{f_s:.0f}"],
        ["plans", f"auto: saving {pct(facts.get('auto_saving'))}, slowdown {pct(facts.get('auto_slowdown'))} "
         f"(decided in {decide_s:.0f} s); full block ckpt: saving {pct(facts.get('full_saving'))}, "
         f"slowdown {pct(facts.get('full_slowdown'))}", f"{p_s:.0f}"],
        ["solvers", "skipped" if rc is None else f"memplan bench exit code {rc}", f"{b_s:.0f}"],
        ["total", "", f"{time.perf_counter() - t_all:.0f}"],
    ]
    print("\nSummary")
    print(tabulate(summary, headers=["section", "result", "seconds"], tablefmt="github"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
