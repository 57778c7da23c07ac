"""Exact quantized dynamic programs: ``dp`` (full decision table) and ``hirschberg`` (O(budget)).

Both solve the problem quantized at ``scale`` steps per unit (sizes rounded up, budget rounded
down; see :mod:`lightning_memplan.solvers._problem`) to optimality, accumulate in float64, and never
exceed ``max_memory`` in real units. Rounding every size up leaves up to one quantum per saved item
unused (with 3,000 items, a fifth of the budget): the quantized optimum is then completed by saving,
in density order, the items that still fit in real units. The value returned is therefore at least
the quantized optimum, and never above the real one.

Any finite sizes >= 0 work, from ``1e-300`` to ``1e308`` in one call: items larger than the budget
are set aside before quantizing, and a budget that would span more than
:data:`~lightning_memplan.solvers._problem.MAX_QUANTA` quanta (``max_memory * scale > 2**20``, e.g.
sizes in bytes) is quantized at ``scale / 2**k`` steps per unit instead, the least ``k`` that fits;
the optimum is then the one of that coarser quantization (the completion step still fills in real
units). Tiny items cost one quantum each in the DP.

Deterministic rules, in this order:

1. zero-size items are always saved (they cost nothing);
2. items larger than the budget, and items with zero runtime, are never saved;
3. the DP visits items by quantized size ascending (then index) and takes an item only when that
   is strictly better, so ties prefer saving smaller items;
4. ``dp``: among optimal plans, the one with the least quantized memory.
   ``hirschberg``: the same inside each leaf; a split gives the first half the smallest share of
   the capacity that reaches the optimum. Both return a plan of optimal value; on ties they may
   pick different plans.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lightning_memplan.solvers import _kernels
from lightning_memplan.solvers._problem import (
    DEFAULT_SCALE,
    Problem,
    effective_scale,
    fill_by_density,
    fits,
    quantize_budget,
    quantize_sizes,
    split_result,
    validate,
    validate_scale,
)

_Kernel = Callable[[np.ndarray, np.ndarray, int], np.ndarray]
"""``(sizes in quanta >= 1, values > 0, capacity in quanta) -> saved mask`` over candidates."""

HIRSCHBERG_LEAF_CELLS = 8 * 8192
"""Hirschberg solves a segment directly once its decision table has at most this many cells
(one bit each, so at most 8 KiB), or when that table is no larger than one DP row."""


def _solve_quantized(
    problem: Problem, scale: int, kernel: _Kernel, *, complete: bool
) -> np.ndarray:
    """Saved mask of the quantized optimum (then completed when ``complete``); re-solves with
    strict rounding if float noise broke real-unit feasibility (see ``_problem``)."""
    mem = problem.memory
    step = effective_scale(problem.max_memory, scale)
    # only items within the budget are quantized: larger ones are never saved, and their quanta
    # could exceed int64 (a size of 1e15 at 10,000 steps per unit is 1e19 quanta)
    within = np.flatnonzero((mem > 0) & (mem <= problem.max_memory) & (problem.runtimes > 0))
    for strict in (False, True):
        qw = quantize_sizes(mem[within], step, strict=strict)
        capacity = quantize_budget(problem.max_memory, step, strict=strict)
        saved = mem == 0
        keep = qw <= capacity
        cand, qw = within[keep], qw[keep]
        # smallest items first (stable): makes the DP's reach bound effective; see _kernels
        order = np.argsort(qw, kind="stable")
        cand, qw = cand[order], qw[order]
        if cand.size:
            qc = np.ascontiguousarray(qw)
            total = int(qc.sum())
            if total <= capacity:
                saved[cand] = True
            else:
                vc = np.ascontiguousarray(problem.runtimes[cand])
                saved[cand] = kernel(qc, vc, capacity)
        if fits(problem.memory, np.flatnonzero(saved), problem.max_memory):
            if complete:
                fill_by_density(problem, saved)
            return saved
    raise AssertionError("strict quantization cannot exceed the budget")  # pragma: no cover


def _dp_kernel(q: np.ndarray, v: np.ndarray, capacity: int) -> np.ndarray:
    keep = np.zeros((q.shape[0], (capacity + 8) // 8), dtype=np.uint8)
    best = _kernels.dp_bits(q, v, capacity, keep)
    start = int(np.flatnonzero(best == best[capacity])[0])  # least memory at the optimum
    mask = np.zeros(q.shape[0], dtype=np.bool_)
    _kernels.backtrack_bits(q, keep, capacity, start, mask)
    return mask


def _hirschberg_kernel(q: np.ndarray, v: np.ndarray, capacity: int) -> np.ndarray:
    leaf = max(HIRSCHBERG_LEAF_CELLS, capacity + 1)
    return _kernels.hirschberg(q, v, capacity, leaf)


def dp_knapsack(
    memory: Sequence[float] | np.ndarray,
    runtimes: Sequence[float] | np.ndarray,
    max_memory: float,
    *,
    scale: int = DEFAULT_SCALE,
    complete: bool = True,
) -> tuple[float, list[int], list[int]]:
    """Exact quantized 0/1 knapsack with a full decision table.

    Args:
        memory: per-item memory, normalized units (finite, >= 0).
        runtimes: per-item value of saving it (runtime avoided; finite, >= 0).
        max_memory: budget in the units of ``memory`` (finite, >= 0).
        scale: quantization steps per unit of memory (a positive int); coarsened by a power of
            two when ``max_memory * scale`` exceeds ``MAX_QUANTA`` (see the module docstring).
        complete: after the quantized optimum, also save the items that still fit in real units
            (density order). ``False`` returns the quantized optimum itself.

    Returns:
        ``(value, saved_idx, recomputed_idx)``: the summed runtime of the saved items and two
        ascending index lists that partition ``range(n)``.

    Memory: ``n x (budget * scale) / 8`` bytes for the decision bits plus one float64 row; at most
    ``n x 128`` KiB plus 8 MiB, as the budget spans at most ``MAX_QUANTA`` quanta.
    """
    problem = validate(memory, runtimes, max_memory)
    saved = _solve_quantized(problem, validate_scale(scale), _dp_kernel, complete=complete)
    return split_result(problem, saved)


def hirschberg_knapsack(
    memory: Sequence[float] | np.ndarray,
    runtimes: Sequence[float] | np.ndarray,
    max_memory: float,
    *,
    scale: int = DEFAULT_SCALE,
    complete: bool = True,
) -> tuple[float, list[int], list[int]]:
    """Exact quantized 0/1 knapsack in O(budget * scale + n) memory (Hirschberg's divide and
    conquer over two float64 rows). Same arguments, result and guarantees as :func:`dp_knapsack`.
    """
    problem = validate(memory, runtimes, max_memory)
    saved = _solve_quantized(problem, validate_scale(scale), _hirschberg_kernel, complete=complete)
    return split_result(problem, saved)
