"""The plan front: candidate plans as points on the peak-memory vs cost plane, and the points no
other dominates. Peaks in bytes; cost in the caller's unit (recomputed FLOPs, or a step-time ratio)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PlanPoint", "knee", "pareto_indices"]


@dataclass(frozen=True, kw_only=True)
class PlanPoint:
    """One candidate plan on the memory-vs-cost plane."""

    label: str
    """Short description, e.g. ``"budget 0.5, 2/6 blocks checkpointed"``."""
    peak_bytes: int
    """Forecast peak of a training step above the baseline (bytes)."""
    cost: float
    """What the plan costs: recomputed FLOPs, or step time relative to the fastest plan."""


def pareto_indices(points: Sequence[PlanPoint], *, cost_rel_tol: float = 0.0) -> list[int]:
    """Indices of the non-dominated points (lower peak and lower cost are better), sorted by peak.

    A point is dominated when another is no worse on both axes and better on one. Among exact
    duplicates the first index is kept. With ``cost_rel_tol`` > 0, a higher-peak point must also
    cost less by more than that fraction of the cheapest lower-peak cost to stay on the front
    (costs that close count as equal).
    """
    if not 0.0 <= cost_rel_tol < 1.0:
        raise ValueError(f"`pareto_indices(cost_rel_tol={cost_rel_tol!r})` must be in [0, 1).")
    order = sorted(range(len(points)), key=lambda i: (points[i].peak_bytes, points[i].cost, i))
    front: list[int] = []
    best_cost = float("inf")
    for i in order:
        if points[i].cost < best_cost * (1.0 - cost_rel_tol):
            front.append(i)
            best_cost = points[i].cost
    return front


def knee(peaks: Sequence[float], costs: Sequence[float]) -> tuple[int, float]:
    """The knee of a front: ``(index, distance)`` of the point closest to the origin once both axes
    are min-max normalized to [0, 1] (an axis with no spread is all 0). Ties go to the smaller
    peak, then the first. The plan search and :func:`lightning_memplan.core.simulate.knee_point`
    both take their knee here.

    Raises:
        ValueError: no point, or ``peaks`` and ``costs`` of different lengths.
    """
    if not peaks or len(peaks) != len(costs):
        raise ValueError(f"`knee(peaks, costs)` needs as many costs as peaks, at least one: got {len(peaks)} "
                         f"peaks and {len(costs)} costs.")

    def norm(xs: Sequence[float]) -> list[float]:
        lo, span = min(xs), max(xs) - min(xs)
        return [(float(x) - lo) / span if span > 0 else 0.0 for x in xs]

    dist = [math.hypot(a, b) for a, b in zip(norm(peaks), norm(costs))]
    best = min(range(len(dist)), key=lambda k: (dist[k], peaks[k], k))
    return best, dist[best]
