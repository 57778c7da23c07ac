"""Knee search: ours (one Pareto-frontier pass) vs torch's ``KnapsackEvaluator`` (100 dp solves).

Both take the knee as the point closest to the origin after min-max normalizing memory and
recompute runtime. torch samples 100 budgets and solves each with ``dp_knapsack``; ours reads
every optimal point off one DP pass. The "distance" columns evaluate both knees on the exact
frontier's normalization (lower is a better knee; ours is the minimum by construction).
"""
from __future__ import annotations

import math
import time

import numpy as np

from lightning_memplan.bench.solvers import make_instance
from lightning_memplan.core.simulate import knee_point
from lightning_memplan.solvers import dp_knapsack
from lightning_memplan.solvers._problem import quantize_sizes

KNEE_HEADERS = [
    "n", "torch knee budget", "torch ms (100 solves)", "ours knee budget", "ours ms", "speedup",
    "torch knee distance", "ours knee distance",
]


def knee_rows(sizes: list[int], seed: int = 0) -> list[list[str]]:
    """One row per size: both knees, their times and their distances on the exact frontier."""
    from lightning_memplan._torch.partitioner import (
        torch_knapsack_solvers,
        torch_knee_tools,
    )

    GraphInfoProvider, KnapsackEvaluator = torch_knee_tools()  # noqa: N806 - torch's class names
    torch_dp = torch_knapsack_solvers()["dp"]

    rows = []
    for n in sizes:
        memory, runtimes = make_instance(n, seed)
        names = [f"n{i}" for i in range(n)]
        provider = GraphInfoProvider(
            graph_nodes_in_order=names,
            graph_edges=[(names[i], names[i + 1]) for i in range(n - 1)],
            all_recomputable_banned_nodes=names,
            all_node_runtimes=dict(zip(names, runtimes.tolist())),
            all_node_memories=dict(zip(names, memory.tolist())),
        )
        t0 = time.perf_counter()
        torch_budget = KnapsackEvaluator(provider).get_knee_point_memory_budget(
            torch_dp, max_mem_budget=1.0, min_mem_budget=0.0, iterations=100
        )
        t_torch = time.perf_counter() - t0
        knee_point(memory, runtimes)  # warm-up
        t0 = time.perf_counter()
        knee = knee_point(memory, runtimes)
        t_ours = time.perf_counter() - t0
        fr = knee.frontier
        mem_min, mem_span = fr.memory.min(), np.ptp(fr.memory)
        cost = fr.total_runtime - fr.runtime
        cost_min, cost_span = cost.min(), np.ptp(cost)
        # torch's knee plan, as our exact solver realizes that budget
        value, saved, _ = dp_knapsack(memory, runtimes, torch_budget, complete=False)
        used = int(quantize_sizes(memory[saved], fr.scale).sum()) / float(fr.scale)
        d_torch = math.hypot(
            (used - mem_min) / mem_span, (fr.total_runtime - value - cost_min) / cost_span
        )
        rows.append([
            str(n), f"{torch_budget:.4f}", f"{1e3 * t_torch:.0f}", f"{knee.budget:.4f}",
            f"{1e3 * t_ours:.1f}", f"{t_torch / t_ours:.0f}x", f"{d_torch:.4f}",
            f"{knee.distance:.4f}",
        ])
    return rows
