"""Greedy 0/1 knapsack by value density (runtime per unit of memory).

Not optimal; fast (one sort and one scan) and never over budget in real units.

Order: zero-size items first (always saved), then by ``runtime / memory`` descending, ties by
index ascending. Each item is saved when it still fits; items with zero runtime are never saved
unless they are zero-size.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from lightning_memplan.solvers._problem import fill_by_density, split_result, validate


def greedy_knapsack(
    memory: Sequence[float] | np.ndarray,
    runtimes: Sequence[float] | np.ndarray,
    max_memory: float,
) -> tuple[float, list[int], list[int]]:
    """Greedy by density. Same arguments and result as :func:`~lightning_memplan.solvers.dp_knapsack`
    (without ``scale``: the greedy works on the real values)."""
    problem = validate(memory, runtimes, max_memory)
    saved = problem.memory == 0
    fill_by_density(problem, saved)
    return split_result(problem, saved)
