"""Usage tables of a plan: per memory space, and the peak over all spaces with its time step."""
from __future__ import annotations

from dataclasses import dataclass

from tabulate import tabulate

from lightning_memplan.placement.bounds import peak_live
from lightning_memplan.placement.model import Plan

__all__ = ["SpaceUsage", "format_usage", "usage"]


@dataclass(frozen=True, kw_only=True)
class SpaceUsage:
    """One row of the usage table (all sizes in bytes)."""

    name: str
    """The memory space, or ``"all spaces"`` / ``"unplaced"`` for the summary rows."""
    capacity: int | None
    """Bytes the space offers (``None`` for the unplaced row)."""
    buffers: int
    """How many buffers it holds."""
    arena: int
    """Bytes used: the highest ``offset + size`` (for "all spaces": the sum over spaces)."""
    live_peak: int
    """The peak of bytes live at one time step: the lower bound of ``arena``."""
    peak_time: int | None
    """The first time step where ``live_peak`` is reached."""


def usage(plan: Plan) -> list[SpaceUsage]:
    """One row per space, then ``"all spaces"`` (live peak summed over spaces), then ``"unplaced"`` if any."""
    rows: list[SpaceUsage] = []
    for s, space in enumerate(plan.spaces):
        held = [b for b, si in zip(plan.buffers, plan.space) if si == s]
        live, at = peak_live(held)
        rows.append(
            SpaceUsage(
                name=space.name, capacity=space.capacity, buffers=len(held), arena=plan.arena[s], live_peak=live, peak_time=at
            )
        )
    placed = [b for b, si in zip(plan.buffers, plan.space) if si is not None]
    live, at = peak_live(placed)
    rows.append(
        SpaceUsage(
            name="all spaces",
            capacity=sum(s.capacity for s in plan.spaces),
            buffers=len(placed),
            arena=plan.total_arena,
            live_peak=live,
            peak_time=at,
        )
    )
    if plan.unplaced:
        left = [plan.buffers[i] for i in plan.unplaced]
        live, at = peak_live(left)
        rows.append(
            SpaceUsage(
                name="unplaced", capacity=None, buffers=len(left), arena=0, live_peak=live, peak_time=at
            )
        )
    return rows


def format_usage(plan: Plan, *, tablefmt: str = "simple") -> str:
    """The usage table as text (``tabulate`` format ``tablefmt``), with arena / live-peak ratios.
    A partial plan (some buffers unplaced) shows no arena nor ratio: they would not be the arena of
    any placement of all the buffers."""
    partial = bool(plan.unplaced)
    body = [
        [
            r.name,
            r.capacity,
            r.buffers,
            None if partial else r.arena,
            r.live_peak,
            r.peak_time,
            r.arena / r.live_peak if r.live_peak and r.name != "unplaced" and not partial else None,
        ]
        for r in usage(plan)
    ]
    headers = ["space", "capacity B", "buffers", "arena B", "live peak B", "peak at t", "arena/live"]
    return tabulate(body, headers=headers, tablefmt=tablefmt, floatfmt=".3f", missingval="")
