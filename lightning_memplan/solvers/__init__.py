"""Exact 0/1 knapsack solvers for activation checkpointing, with torch's solver signature.

``get_solver(name)`` returns ``f(memory, runtimes, max_memory) -> (value, saved_idx,
recomputed_idx)``, the signature of ``torch._functorch._activation_checkpointing.knapsack``'s
solvers, so the two can be compared side by side. ``pareto_frontier`` returns every optimal
(memory, runtime) point for all budgets in one pass.

Guarantees (all solvers): a plan never exceeds ``max_memory`` in real units; saved and recomputed
indices partition ``range(n)``; zero-size items are always saved; items larger than the budget are
never saved; bad input raises ``ValueError`` naming the argument. ``dp`` and ``hirschberg`` are
optimal for the problem quantized at ``scale`` (10,000 steps per unit by default; coarsened by a
power of two when the budget would span more than ``MAX_QUANTA`` = 2**20 quanta); ``ilp`` is
optimal on the real values unless its time limit hits (then it warns). Sizes may be any finite
numbers >= 0, however large or small (``1e-300`` next to ``1e30``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from lightning_memplan.solvers._problem import DEFAULT_SCALE
from lightning_memplan.solvers.dp import dp_knapsack, hirschberg_knapsack
from lightning_memplan.solvers.frontier import ParetoFrontier, pareto_frontier
from lightning_memplan.solvers.greedy import greedy_knapsack
from lightning_memplan.solvers.ilp import (
    IlpResult,
    SolverTimeLimitWarning,
    ilp_knapsack,
    ilp_solve,
)

SolverName = Literal["greedy", "dp", "hirschberg", "ilp"]
Solver = Callable[[list[float], list[float], float], tuple[float, list[int], list[int]]]
"""``(memory, runtimes, max_memory) -> (value, saved_idx, recomputed_idx)``, torch's signature."""

_SOLVERS: dict[str, Solver] = {
    "greedy": greedy_knapsack,
    "dp": dp_knapsack,
    "hirschberg": hirschberg_knapsack,
    "ilp": ilp_knapsack,
}
SOLVER_NAMES: tuple[str, ...] = tuple(_SOLVERS)


def get_solver(name: SolverName) -> Solver:
    """The solver registered as ``name`` (one of ``"greedy" "dp" "hirschberg" "ilp"``)."""
    try:
        return _SOLVERS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"`get_solver(name={name!r})`: unknown solver. Expected one of "
            f"{', '.join(repr(n) for n in SOLVER_NAMES)}."
        ) from None


__all__ = [
    "DEFAULT_SCALE",
    "IlpResult",
    "ParetoFrontier",
    "SOLVER_NAMES",
    "Solver",
    "SolverName",
    "SolverTimeLimitWarning",
    "dp_knapsack",
    "get_solver",
    "greedy_knapsack",
    "hirschberg_knapsack",
    "ilp_knapsack",
    "ilp_solve",
    "pareto_frontier",
]
