"""Exact 0/1 knapsack on the real (unquantized) values with SciPy's HiGHS MILP solver.

Improvements over torch's ``ilp_knapsack``: an item counts as saved when HiGHS returns x > 0.5
(not only exactly 1.0); the relative MIP gap is 0 (torch stops at HiGHS's default 1e-4); the
objective is scaled so the largest runtime is 1 (raw FLOP counts made HiGHS take minutes); the
memory row is scaled by the budget; an optional time limit returns the best feasible plan found,
with a :class:`SolverTimeLimitWarning`. The plan is then checked in exact arithmetic; if HiGHS's
feasibility tolerance let it exceed the budget by a hair, the constraint is tightened and the
problem solved again. Finally, any unsaved item that still fits is saved (this only raises the
value; it recovers items below HiGHS's absolute tolerances).

Before HiGHS runs, a Dembo-Hammer reduction fixes every item whose choice is forced in all optimal
plans (an LP bound against the greedy plan's value); HiGHS then sees only the small core. That
makes 3,000 items take milliseconds instead of seconds.

Deterministic rules: zero-size items are always saved; items larger than the budget and items with
zero runtime are never saved; HiGHS itself is deterministic for a given input.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_memplan._native_io import silence_native_output
from lightning_memplan.solvers._problem import (
    Problem,
    fill_by_density,
    fits,
    split_result,
    validate,
)

DEFAULT_TIME_LIMIT = 60.0
"""Seconds HiGHS may search before the best plan found so far is returned."""


class SolverTimeLimitWarning(UserWarning):
    """The ILP hit its time limit: the plan is feasible but not proven optimal."""


@dataclass(frozen=True, kw_only=True)
class IlpResult:
    """Outcome of :func:`ilp_solve`."""

    value: float
    """Summed runtime of the saved items."""
    saved: list[int]
    """Ascending indices of saved items."""
    recomputed: list[int]
    """Ascending indices of the other items."""
    optimal: bool
    """True when HiGHS proved optimality (gap 0); False when the time limit stopped it."""
    status: str
    """HiGHS's message, for the record."""


def _validate_time_limit(time_limit: float) -> float:
    try:
        t = float(time_limit)
    except (TypeError, ValueError):
        t = math.nan
    if not (t > 0) or math.isnan(t):
        raise ValueError(f"`time_limit` must be a positive number of seconds, got {time_limit!r}.")
    return t


def _reduce(problem: Problem, cand: np.ndarray, incumbent: float) -> tuple[np.ndarray, np.ndarray]:
    """Items of ``cand`` whose value is fixed in every optimal plan (Dembo-Hammer reduction).

    With ``d`` the density of the LP relaxation's break item, every plan's value is at most
    ``U = d * max_memory + sum(max(0, r_k - d * m_k))`` (a Lagrangian bound). Forcing an item
    against its reduced cost ``r_j - d * m_j`` lowers that bound by ``|r_j - d * m_j|``; if the
    result falls below the value of a known feasible plan (``incumbent``), no optimal plan does
    that, so the item is fixed. Returns boolean masks over ``cand``: (always saved, never saved).
    A relative margin of 1e-9 keeps float rounding from fixing an item wrongly.
    """
    m, r = problem.memory[cand], problem.runtimes[cand]
    order = np.argsort(-(r / m), kind="stable")
    with np.errstate(over="ignore"):  # sizes near 1e308: an infinite tail sum is still right here
        cum = np.cumsum(m[order])
    b = int(np.searchsorted(cum, problem.max_memory, side="right"))
    d = float(r[order[min(b, cand.size - 1)]] / m[order[min(b, cand.size - 1)]])
    reduced = r - d * m
    bound = d * problem.max_memory + float(np.sum(np.maximum(reduced, 0.0)))
    margin = 1e-9 * (abs(bound) + abs(incumbent)) + 1e-300
    fixed_in = (reduced > 0) & (bound - reduced < incumbent - margin)
    fixed_out = (reduced < 0) & (bound + reduced < incumbent - margin)
    return fixed_in, fixed_out


def _milp(
    mem: np.ndarray, rt: np.ndarray, budget: float, limit: float
) -> tuple[np.ndarray | None, bool, str]:
    """HiGHS on one knapsack (all items candidates): (x > 0.5 mask or None, optimal, message)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    c = -rt / rt.max()
    a = mem / budget
    with silence_native_output("stdout"):
        res = milp(
            c=c,
            constraints=LinearConstraint(a[np.newaxis, :], ub=1.0),
            integrality=np.ones_like(c),
            bounds=Bounds(0, 1),
            options={"time_limit": limit, "mip_rel_gap": 0.0, "presolve": True},
        )
    if res.x is None:
        return None, False, str(res.message)
    return res.x > 0.5, bool(res.status == 0), str(res.message)


def ilp_solve(
    memory: Sequence[float] | np.ndarray,
    runtimes: Sequence[float] | np.ndarray,
    max_memory: float,
    *,
    time_limit: float = DEFAULT_TIME_LIMIT,
) -> IlpResult:
    """Solve exactly with HiGHS; the result says whether optimality was proven.

    Args:
        memory: per-item memory, normalized units (finite, >= 0).
        runtimes: per-item value of saving it (finite, >= 0).
        max_memory: budget in the units of ``memory`` (finite, >= 0).
        time_limit: seconds for HiGHS (> 0); on expiry the best feasible plan is returned.
    """
    from lightning_memplan.solvers.greedy import greedy_knapsack

    problem = validate(memory, runtimes, max_memory)
    limit = _validate_time_limit(time_limit)
    mem, rt, budget = problem.memory, problem.runtimes, problem.max_memory
    saved = mem == 0
    cand = np.flatnonzero((mem > 0) & (mem <= budget) & (rt > 0))
    optimal, status = True, "trivial: every candidate fits"
    if cand.size and not fits(mem, cand, budget):
        g_value, g_saved, _ = greedy_knapsack(mem, rt, budget)
        # the bound covers candidates only: compare it with the candidates' part of the greedy value
        fixed_in, fixed_out = _reduce(problem, cand, g_value - math.fsum(rt[saved]))
        core = cand[~fixed_in & ~fixed_out]
        base = saved.copy()
        base[cand[fixed_in]] = True
        room = budget - math.fsum(mem[base])
        trial = base.copy()
        status = f"reduced to {core.size} of {cand.size} items; "
        if core.size and room > 0:
            ub = room
            for _attempt in range(8):
                x, optimal, message = _milp(mem[core], rt[core], ub, limit)
                if x is None:  # nothing feasible within the limit: the greedy plan is
                    trial = np.zeros_like(saved)
                    trial[g_saved] = True
                    break
                trial = base.copy()
                trial[core[x]] = True
                if fits(mem, np.flatnonzero(trial), budget):
                    break
                ub -= max(2.0 * (math.fsum(mem[trial]) - budget), 4 * math.ulp(ub))
            else:  # pragma: no cover - one tightening suffices in practice
                raise RuntimeError("HiGHS kept returning plans over the budget")
            status += message
        if not fits(mem, np.flatnonzero(trial), budget):  # float noise in `room`
            trial = np.zeros_like(saved)
            trial[g_saved] = True
            optimal = False
            status += "; fixed items exceeded the budget by rounding, greedy plan used"
        saved = trial
    elif cand.size:
        saved[cand] = True
    fill_by_density(problem, saved)
    if not optimal:
        warnings.warn(
            f"ilp_knapsack stopped at time_limit={limit!r} s before proving optimality "
            f"({status}); returning the best feasible plan found.",
            SolverTimeLimitWarning,
            stacklevel=2,
        )
    value, s, r = split_result(problem, saved)
    return IlpResult(value=value, saved=s, recomputed=r, optimal=optimal, status=status)


def ilp_knapsack(
    memory: Sequence[float] | np.ndarray,
    runtimes: Sequence[float] | np.ndarray,
    max_memory: float,
    *,
    time_limit: float = DEFAULT_TIME_LIMIT,
) -> tuple[float, list[int], list[int]]:
    """Torch's solver signature over :func:`ilp_solve` (warns when the time limit hit)."""
    res = ilp_solve(memory, runtimes, max_memory, time_limit=time_limit)
    return res.value, res.saved, res.recomputed
