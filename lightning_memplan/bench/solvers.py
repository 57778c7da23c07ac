"""Solver benchmark: ours vs torch's four knapsack solvers, side by side, on seeded instances.

Instances: ``n`` items, memory log-uniform over [1, 1e4] normalized to sum 1 (torch normalizes
activation bytes the same way), runtimes log-uniform over [1e3, 1e12] (FLOP counts), one budget
(normalized memory). For every (n, solver) it reports, ours next to torch's:

* median wall time over repeats (ms) and the speedup torch / ours;
* peak resident memory added by one call (MiB, from ``VmHWM`` after resetting it; Linux; median
  over instances);
* the worst optimality gap against the best feasible plan any solver found (%);
* budget violations (plans over ``max_memory`` in real units), crashes and time-outs;
* for our exact solvers, "suboptimal" answers: ``dp``/``hirschberg`` against HiGHS solving the same
  quantized problem in integers, ``ilp`` against the best feasible plan found by anyone.

Then the one-pass :func:`pareto_frontier` against 100 separate ``dp_knapsack`` solves (what torch's
``KnapsackEvaluator.get_knee_point_memory_budget`` runs), and our ``dp`` against the
memory-bandwidth floor of an ``n x W`` float64 table. torch is imported only here.
"""
from __future__ import annotations

import math
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from lightning_memplan.solvers import (
    dp_knapsack,
    get_solver,
    hirschberg_knapsack,
    ilp_solve,
    pareto_frontier,
)
from lightning_memplan.solvers._problem import fits, quantize_budget, quantize_sizes

SOLVERS = ("greedy", "dp", "hirschberg", "ilp")
_Solver = Callable[[list[float], list[float], float], tuple[float, list[int], list[int]]]


def make_instance(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded instance: (normalized memory summing to 1, runtimes in FLOPs)."""
    rng = np.random.default_rng(seed)
    memory = np.exp(rng.uniform(0.0, math.log(1e4), n))
    memory /= memory.sum()
    runtimes = np.exp(rng.uniform(math.log(1e3), math.log(1e12), n))
    return memory, runtimes


def _torch_solvers() -> dict[str, _Solver]:
    from lightning_memplan._torch.partitioner import torch_knapsack_solvers

    return torch_knapsack_solvers()


def _peak_rss_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _current_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


@dataclass
class _Outcome:
    times: list[float] = field(default_factory=list)
    peaks: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    violations: int = 0
    crashes: int = 0
    timeouts: int = 0
    suboptimal: int = 0


def _call(fn: _Solver, memory: list[float], runtimes: list[float], budget: float):
    return fn(memory, runtimes, budget)


def _run_isolated(
    fn: _Solver, memory: list[float], runtimes: list[float], budget: float, timeout: float
) -> tuple[str, object, float]:
    """Run one call in a forked process; ('ok', result, seconds) | ('timeout'|'crash', msg, 0)."""
    ctx = mp.get_context("fork")
    with ctx.Pool(1) as pool:
        t0 = time.perf_counter()
        job = pool.apply_async(_call, (fn, memory, runtimes, budget))
        try:
            res = job.get(timeout)
        except mp.TimeoutError:
            pool.terminate()
            return "timeout", f">{timeout:.0f} s", 0.0
        except Exception as exc:  # noqa: BLE001 - a crash of the peer is a result
            return "crash", repr(exc), 0.0
        return "ok", res, time.perf_counter() - t0


def _measure(
    fn: _Solver, memory: list[float], runtimes: list[float], budget: float, repeats: int
) -> tuple[tuple[float, list[int], list[int]], float, float | None]:
    """(result, median seconds, peak MiB added by one call or None)."""
    fn(memory, runtimes, budget)  # warm-up (numba cache load, imports)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = fn(memory, runtimes, budget)
        times.append(time.perf_counter() - t0)
    peak = None
    if _reset_peak_rss():
        before = _current_rss_bytes()
        fn(memory, runtimes, budget)
        after = _peak_rss_bytes()
        peak = max(0, (after or before) - before) / 2**20
    return res, statistics.median(times), peak


def _quantized_optimum(memory: np.ndarray, runtimes: np.ndarray, budget: float) -> float:
    """The quantized problem's optimum, solved independently by HiGHS in integers."""
    q = quantize_sizes(memory, 10_000).astype(np.float64)
    cap = float(quantize_budget(budget, 10_000))
    return ilp_solve(q, runtimes, cap, time_limit=120.0).value


def solver_table(
    sizes: Sequence[int], seeds: Sequence[int], budget: float, repeats: int, torch_timeout: float
) -> list[list[str]]:
    """Rows of the side-by-side table (strings), one per (n, solver)."""
    torch_solvers = _torch_solvers()
    rows: list[list[str]] = []
    for n in sizes:
        ours = {name: _Outcome() for name in SOLVERS}
        peer = {name: _Outcome() for name in SOLVERS}
        for seed in seeds:
            memory, runtimes = make_instance(n, seed)
            mem_l, rt_l = memory.tolist(), runtimes.tolist()
            values: dict[tuple[str, str], float] = {}
            for name in SOLVERS:
                res, t, peak = _measure(get_solver(name), mem_l, rt_l, budget, repeats)
                out = ours[name]
                out.times.append(t)
                if peak is not None:
                    out.peaks.append(peak)
                if fits(memory, res[1], budget):
                    values[("ours", name)] = res[0]
                else:
                    out.violations += 1
                tf = torch_solvers[name]
                po = peer[name]
                if name == "ilp":
                    status, tres, tt = _run_isolated(tf, mem_l, rt_l, budget, torch_timeout)
                    if status == "timeout":
                        po.timeouts += 1
                        continue
                    if status == "crash":
                        po.crashes += 1
                        continue
                    po.times.append(tt)
                    res_t = tres
                else:
                    try:
                        res_t, tt, tpeak = _measure(tf, mem_l, rt_l, budget, repeats)
                    except Exception:  # noqa: BLE001 - a crash of the peer is a result
                        po.crashes += 1
                        continue
                    po.times.append(tt)
                    if tpeak is not None:
                        po.peaks.append(tpeak)
                assert isinstance(res_t, tuple)
                if fits(memory, res_t[1], budget):
                    values[("torch", name)] = math.fsum(runtimes[res_t[1]])
                else:
                    po.violations += 1
            best = max(values.values())
            for (who, name), v in values.items():
                (ours if who == "ours" else peer)[name].gaps.append(100.0 * (best - v) / best)
            qopt = _quantized_optimum(memory, runtimes, budget)
            for name, fn in (("dp", dp_knapsack), ("hirschberg", hirschberg_knapsack)):
                raw = fn(memory, runtimes, budget, complete=False)[0]
                if raw < qopt * (1 - 1e-9):
                    ours[name].suboptimal += 1
            if values.get(("ours", "ilp"), -1.0) < best * (1 - 1e-9):
                ours["ilp"].suboptimal += 1
        for name in SOLVERS:
            o, p = ours[name], peer[name]
            rows.append(_row(n, name, o, p, len(seeds)))
    return rows


def _fmt_ms(times: list[float]) -> str:
    return f"{1e3 * statistics.median(times):.2f}" if times else "-"


def _row(n: int, name: str, o: _Outcome, p: _Outcome, count: int) -> list[str]:
    speed = (
        f"{statistics.median(p.times) / statistics.median(o.times):.1f}x"
        if o.times and p.times
        else "-"
    )
    # median over instances: one call's VmHWM can catch an unrelated allocation (GC, arenas)
    peak = lambda xs: f"{statistics.median(xs):.1f}" if xs else "-"  # noqa: E731
    gap = lambda xs: f"{max(xs):.2g}" if xs else "-"  # noqa: E731
    torch_fail = f"{p.violations}/{p.crashes}/{p.timeouts}"
    return [
        str(n), name, _fmt_ms(o.times), _fmt_ms(p.times), speed, peak(o.peaks), peak(p.peaks),
        gap(o.gaps), gap(p.gaps), f"{o.violations}/{o.crashes}", torch_fail,
        "-" if name == "greedy" else f"{o.suboptimal}/{count}",
    ]


SOLVER_HEADERS = [
    "n", "solver", "ours ms", "torch ms", "speedup", "ours MiB", "torch MiB",
    "ours gap %", "torch gap %", "ours viol/crash", "torch viol/crash/timeout", "ours subopt",
]


def frontier_rows(n: int, seed: int, budgets: int = 100) -> list[list[str]]:
    """One ``pareto_frontier`` pass vs ``budgets`` separate torch ``dp_knapsack`` solves."""
    from lightning_memplan._torch.partitioner import torch_knapsack_solvers

    torch_dp = torch_knapsack_solvers()["dp"]

    memory, runtimes = make_instance(n, seed)
    mem_l, rt_l = memory.tolist(), runtimes.tolist()
    grid = [i / (budgets - 1) for i in range(budgets)]
    pareto_frontier(memory, runtimes)  # warm-up
    t0 = time.perf_counter()
    fr = pareto_frontier(memory, runtimes)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch_values = [torch_dp(mem_l, rt_l, b) for b in grid]
    t_torch = time.perf_counter() - t0
    torch_viol = sum(not fits(memory, res[1], b) for res, b in zip(torch_values, grid))
    ours_check = max(
        abs(fr.best_runtime(b) - dp_knapsack(memory, runtimes, b, complete=False)[0])
        / max(fr.best_runtime(b), 1.0)
        for b in grid[:: max(1, budgets // 10)]
    )
    return [
        [
            f"frontier n={n}", f"{len(fr.memory)} points, all budgets", f"{1e3 * t_ours:.1f}",
            f"{1e3 * t_torch:.1f} ({budgets} solves)", f"{t_torch / t_ours:.0f}x",
            f"{ours_check:.1e}", f"{torch_viol}/{budgets}",
        ]
    ]


FRONTIER_HEADERS = [
    "what", "ours", "ours ms", "torch ms", "speedup", "ours vs dp (rel)", "torch viol",
]


def floor_row(n: int, seed: int, budget: float) -> list[str]:
    """Our ``dp`` against the time to stream an ``n x W`` float64 table through memory once."""
    memory, runtimes = make_instance(n, seed)
    width = quantize_budget(budget, 10_000) + 1
    table = np.ones(n * width)
    out = np.empty_like(table)
    np.copyto(out, table)
    t0 = time.perf_counter()
    for _ in range(3):
        np.copyto(out, table)
    bandwidth = 3 * 2 * table.nbytes / (time.perf_counter() - t0)  # bytes/s, read + write
    floor = table.nbytes / bandwidth
    _, t, _ = _measure(get_solver("dp"), memory.tolist(), runtimes.tolist(), budget, 5)
    return [
        f"dp n={n} W={width}", f"{n * width * 8 / 2**20:.0f} MiB table",
        f"{bandwidth / 1e9:.1f} GB/s", f"{1e3 * floor:.2f}", f"{1e3 * t:.2f}", f"{t / floor:.2f}",
    ]


FLOOR_HEADERS = ["what", "n x W float64", "bandwidth", "floor ms", "ours ms", "ours / floor"]


