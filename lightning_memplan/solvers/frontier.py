"""The runtime-vs-memory Pareto frontier of a knapsack instance, for all budgets in one pass.

One quantized DP row over every capacity from 0 to the total memory gives, for each budget, the
best runtime that can be kept; the frontier is the staircase of capacities where that value
strictly increases. This replaces torch's knee search, which runs 100 separate solves.

Any finite sizes >= 0 work: when the total memory would span more than
:data:`~lightning_memplan.solvers._problem.MAX_QUANTA` quanta at ``scale``, the frontier is computed
at ``scale / 2**k`` steps per unit (the least ``k`` that fits; :attr:`ParetoFrontier.scale` says
which), so the row stays at most about 8 MiB however large the sizes are.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from lightning_memplan.solvers import _kernels
from lightning_memplan.solvers._problem import (
    DEFAULT_SCALE,
    effective_scale,
    quantize_sizes,
    validate,
    validate_scale,
)


@dataclass(frozen=True, kw_only=True)
class ParetoFrontier:
    """Every Pareto-optimal (memory, runtime) point of a knapsack instance.

    Invariants: ``memory`` and ``runtime`` have equal length >= 1, are strictly increasing, and
    point ``k`` is the best runtime of any plan whose quantized memory is at most ``memory[k]``.
    The first point is the plan that saves only zero-size items; the last saves everything with
    positive runtime.
    """

    memory: np.ndarray
    """Quantized memory of each optimal plan, in the normalized units of the input (float64;
    ``inf`` for a plan whose memory exceeds the float range, only with sizes near ``1e308``)."""
    runtime: np.ndarray
    """Runtime kept (summed runtime of saved items) of each optimal plan (float64)."""
    total_runtime: float
    """Summed runtime of all items (saving everything)."""
    scale: Fraction
    """Quantization steps per unit of memory used to compute the frontier: the ``scale`` asked
    for, or that divided by a power of two when the total memory would span more than
    ``MAX_QUANTA`` quanta."""

    def best_runtime(self, budget: float) -> float:
        """Best runtime kept within ``budget`` (normalized units); 0-budget plans included."""
        k = int(np.searchsorted(self.memory, budget * (1 + 1e-12), side="right")) - 1
        return float(self.runtime[max(k, 0)]) if k >= 0 else float(self.runtime[0])

    def normalized(self) -> tuple[np.ndarray, np.ndarray]:
        """Min-max normalized ``(memory, recompute cost)`` of every point, each in [0, 1].

        Recompute cost is ``total_runtime - runtime``: 0 when everything is saved.
        """
        recompute = self.total_runtime - self.runtime
        return _minmax(self.memory), _minmax(recompute)


def _minmax(x: np.ndarray) -> np.ndarray:
    span = float(x.max() - x.min()) if x.size else 0.0
    return (x - x.min()) / span if span > 0 else np.zeros_like(x)


def pareto_frontier(
    memory: Sequence[float] | np.ndarray,
    runtimes: Sequence[float] | np.ndarray,
    *,
    scale: int = DEFAULT_SCALE,
) -> ParetoFrontier:
    """All optimal (memory used, runtime kept) points for every budget, from one DP pass.

    Args:
        memory: per-item memory, normalized units (finite, >= 0).
        runtimes: per-item value of saving it (finite, >= 0).
        scale: quantization steps per unit (sizes rounded up, as in ``dp``); coarsened by a power
            of two when ``total_memory * scale`` exceeds ``MAX_QUANTA``.

    Cost: ``n x total_memory x scale`` cell updates, ``total_memory x scale`` float64 of memory
    (at most about ``n x MAX_QUANTA`` updates and ``8 x MAX_QUANTA`` bytes).
    """
    problem = validate(memory, runtimes, 0.0)
    mem, rt = problem.memory, problem.runtimes
    base = float(np.sum(rt[mem == 0]))
    cand = np.flatnonzero((mem > 0) & (rt > 0))
    try:
        total: float | Fraction = math.fsum(mem[cand])
    except OverflowError:  # beyond the float range: sum exactly
        total = sum((Fraction(float(m)) for m in mem[cand]), Fraction(0))
    s = effective_scale(total, validate_scale(scale))
    qc = np.ascontiguousarray(quantize_sizes(mem[cand], s))
    capacity = int(qc.sum())
    best = _kernels.frontier_row(qc, np.ascontiguousarray(rt[cand]), capacity)
    steps = np.flatnonzero(np.diff(best) > 0) + 1
    idx = np.concatenate(([0], steps))
    # idx / s with s = numerator / 2**j (effective_scale divides by powers of two): one rounding,
    # and a point beyond the float range reads inf
    with np.errstate(over="ignore"):
        memory = np.ldexp(idx / float(s.numerator), s.denominator.bit_length() - 1)
    return ParetoFrontier(
        memory=memory,
        runtime=best[idx] + base,
        total_runtime=float(rt.sum()),
        scale=s,
    )
