"""Whole-graph rematerialization: save or recompute every forward value, exactly (SciPy HiGHS MILP).

torch's ``activation_memory_budget`` runs a 0/1 knapsack over the partitioner's *banned* nodes only
(matmuls, attention) and leaves every other forward value to the min cut. This module decides every
forward value of a joint graph at once: for a cap on the bytes saved for backward, the plan with
the least recompute cost. It is pure data in, data out; :mod:`lightning_memplan.forecasting.remat_graph` builds
the problem from an FX joint graph and writes the plan back as ``torch.utils.checkpoint``'s tags.

The problem (:class:`RematProblem`): forward values ``0..n-1`` in topological order. Value ``i``
costs ``nbytes[i]`` bytes while saved and ``cost[i]`` (FLOP-equivalents) to recompute once;
``needed[i]`` says the backward reads it; ``edges`` holds ``(u, v)`` when value ``v`` is computed
from value ``u`` (graph inputs such as parameters and the batch are always available and are not
values). With binary ``s_i`` (saved) and ``r_i`` (recomputed in backward)::

    needed i:     s_i + r_i >= 1         the backward gets every value it reads
    edge (u, v):  s_u + r_u >= r_v       a recomputed value's inputs are saved or recomputed too
    cap:          sum nbytes_i s_i <= max_saved_bytes
    minimise      sum cost_i r_i, then (at that cost) sum nbytes_i s_i

Budgets (:func:`solve_remat_budget`): a budget ``b`` in [0, 1] caps the saved bytes at
``lo + b * (hi - lo)``, where ``hi`` is the saved bytes of the cheapest plan (least cost, then
fewest bytes) and ``lo`` the fewest saved bytes any plan reaches. So ``b = 1`` recomputes only what
costs nothing to recompute and ``b = 0`` keeps the least possible; like torch's budget, a ratio of
activation memory, but over all saved values, not only the knapsack's candidates.

Limits: saved bytes count each value's storage, so two saved views of one storage count twice (the
cap is then conservative); the recompute cost is per execution (a value recomputed for several users
is recomputed once, as torch's partitioner does); when values are freed in backward is left to the
partitioner and checked by the forecast, not modelled here.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lightning_memplan._native_io import silence_native_output

__all__ = ["RematProblem", "RematSolution", "check_solution", "remat_bounds", "solve_remat", "solve_remat_budget"]

DEFAULT_TIME_LIMIT = 30.0
"""Seconds HiGHS may search one plan before the best feasible plan found is returned."""


@dataclass(frozen=True)
class RematProblem:
    """Forward values of one joint graph (see the module docstring). Invariant: all sequences have
    length ``n``; ``edges`` hold index pairs ``(u, v)`` with ``u < v``."""

    nbytes: tuple[int, ...]
    """Bytes each value holds while saved (its storage)."""
    cost: tuple[float, ...]
    """Cost of recomputing each value once, FLOP-equivalents (>= 0)."""
    needed: tuple[bool, ...]
    """Whether the backward reads the value."""
    saveable: tuple[bool, ...]
    """False for values that cannot be saved (a multi-output op's tuple; only its items can)."""
    recomputable: tuple[bool, ...]
    """False for values that must not run twice (random or side-effecting ops)."""
    edges: tuple[tuple[int, int], ...]
    """``(u, v)``: value ``v`` is computed from value ``u``."""

    def __post_init__(self) -> None:
        n = len(self.nbytes)
        lengths = [len(x) for x in (self.nbytes, self.cost, self.needed, self.saveable, self.recomputable)]
        if any(k != n for k in lengths):
            raise ValueError("RematProblem: nbytes, cost, needed, saveable and recomputable must have one "
                             f"entry per value; got lengths {lengths}.")
        if any(b < 0 for b in self.nbytes) or any(not (c >= 0) for c in self.cost):
            raise ValueError("RematProblem: nbytes and cost must be >= 0.")
        bad = [e for e in self.edges if not (0 <= e[0] < e[1] < n)]
        if bad:
            raise ValueError(f"RematProblem: edges must be (u, v) with 0 <= u < v < {n}; got {bad[:3]!r}.")

    @property
    def n(self) -> int:
        """Number of forward values."""
        return len(self.nbytes)


@dataclass(frozen=True, kw_only=True)
class RematSolution:
    """A plan for a :class:`RematProblem`. Invariant: ``saved`` and ``recomputed`` are disjoint,
    ascending, and together satisfy every constraint of the problem."""

    saved: tuple[int, ...]
    """Values kept from forward to backward."""
    recomputed: tuple[int, ...]
    """Values recomputed in backward."""
    saved_bytes: int
    """Sum of ``nbytes`` over ``saved`` (bytes)."""
    cost: float
    """Sum of ``cost`` over ``recomputed`` (FLOP-equivalents)."""
    optimal: bool
    """True when HiGHS proved the plan optimal within its default gap; False at its time limit."""


def _matrices(p: RematProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Constraint rows (coo triplets), their lower bounds and their count, over the variables
    ``[s_0..s_n-1, r_0..r_n-1]``."""
    n = p.n
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lower: list[float] = []
    k = 0
    for i in range(n):
        if p.needed[i]:
            rows += [k, k]
            cols += [i, n + i]
            vals += [1.0, 1.0]
            lower.append(1.0)
            k += 1
    for u, v in p.edges:
        rows += [k, k, k]
        cols += [u, n + u, n + v]
        vals += [1.0, 1.0, -1.0]
        lower.append(0.0)
        k += 1
    return np.array(rows), np.array(cols), np.array(vals), np.array(lower), k


def _milp(c: np.ndarray, a: Any, lo: np.ndarray, hi: np.ndarray, ub: np.ndarray,
          time_limit: float) -> tuple[np.ndarray, bool] | None:
    from scipy.optimize import Bounds, LinearConstraint, milp

    with silence_native_output():
        res = milp(c, constraints=LinearConstraint(a, lo, hi), integrality=np.ones(c.size),
                   bounds=Bounds(np.zeros(c.size), ub), options={"time_limit": time_limit})
    return None if res.x is None else (res.x, res.status == 0)


def _solve(p: RematProblem, *, max_saved_bytes: float | None, minimise: str, time_limit: float) -> RematSolution | None:
    """Lexicographic: ``minimise="cost"`` gives the least cost under the cap, then the fewest saved
    bytes at that cost; ``"bytes"`` the fewest saved bytes, then the least cost. Two HiGHS solves,
    the second bounded by the first's optimum. None when no plan fits the cap."""
    from scipy.sparse import coo_matrix, vstack

    n = p.n
    if n == 0:
        return RematSolution(saved=(), recomputed=(), saved_bytes=0, cost=0.0, optimal=True)
    # both objectives scaled to a largest item of 1, so HiGHS's tolerances see every item
    nbytes = np.asarray(p.nbytes, dtype=float)
    cost = np.asarray(p.cost, dtype=float)
    row_b = np.concatenate([nbytes / max(float(nbytes.max()), 1.0), np.zeros(n)])
    row_c = np.concatenate([np.zeros(n), cost / max(float(cost.max()), 1.0)])
    rows, cols, vals, lower, k = _matrices(p)
    base = coo_matrix((vals, (rows, cols)), shape=(k, 2 * n)).tocsr()
    ub = np.concatenate([np.asarray(p.saveable, dtype=float), np.asarray(p.recomputable, dtype=float)])
    extra_a: list[np.ndarray] = []
    extra_hi: list[float] = []
    if max_saved_bytes is not None:
        extra_a.append(row_b)
        extra_hi.append(max_saved_bytes / max(float(nbytes.max()), 1.0) + 1e-9)
    first, second = (row_c, row_b) if minimise == "cost" else (row_b, row_c)
    optimal = True
    x = None
    for objective in (first, second):
        a = vstack([base, *[r[None, :] for r in extra_a]]).tocsr() if extra_a else base
        got = _milp(objective, a, np.concatenate([lower, np.full(len(extra_a), -np.inf)]),
                    np.concatenate([np.full(k, np.inf), extra_hi]), ub, time_limit)
        if got is None:
            if x is None:
                return None
            break  # keep the first solve's plan
        x, ok = got
        optimal = optimal and ok
        best = float(objective @ x)
        extra_a.append(objective)
        extra_hi.append(best + max(1e-6 * abs(best), 1e-9))
    assert x is not None
    s, r = x[:n] > 0.5, x[n:] > 0.5
    r &= ~s  # a saved value is never recomputed (only a tie could set both)
    saved = tuple(int(i) for i in np.flatnonzero(s))
    recomputed = tuple(int(i) for i in np.flatnonzero(r))
    return RematSolution(saved=saved, recomputed=recomputed, saved_bytes=int(sum(p.nbytes[i] for i in saved)),
                         cost=float(sum(p.cost[i] for i in recomputed)), optimal=optimal)


def remat_bounds(problem: RematProblem, *,
                 time_limit: float = DEFAULT_TIME_LIMIT) -> tuple[RematSolution, RematSolution]:
    """``(least_bytes, cheapest)``: the plan with the fewest saved bytes (then least cost) and the
    plan with the least recompute cost (then fewest bytes). Their saved bytes span budgets 0..1.

    Raises:
        ValueError: the problem has no plan (a needed value that can be neither saved nor recomputed).
    """
    lo = _solve(problem, max_saved_bytes=None, minimise="bytes", time_limit=time_limit)
    hi = _solve(problem, max_saved_bytes=None, minimise="cost", time_limit=time_limit)
    if lo is None or hi is None:
        raise ValueError("RematProblem has no plan: a value the backward reads can be neither saved nor recomputed.")
    return lo, hi


def solve_remat(problem: RematProblem, max_saved_bytes: float, *,
                time_limit: float = DEFAULT_TIME_LIMIT) -> RematSolution | None:
    """The least-cost plan saving at most ``max_saved_bytes`` bytes; None when no plan fits the cap."""
    if not (max_saved_bytes >= 0):
        raise ValueError(f"`solve_remat(max_saved_bytes={max_saved_bytes!r})` must be a number of bytes >= 0.")
    return _solve(problem, max_saved_bytes=float(max_saved_bytes), minimise="cost", time_limit=time_limit)


def solve_remat_budget(problem: RematProblem, budget: float, *,
                       bounds: tuple[RematSolution, RematSolution] | None = None,
                       time_limit: float = DEFAULT_TIME_LIMIT) -> RematSolution:
    """The least-cost plan saving at most ``lo + budget * (hi - lo)`` bytes (module docstring).

    ``bounds`` is :func:`remat_bounds`'s result when the caller already has it (several budgets on
    one graph). Budget 1 returns the cheapest plan, budget 0 the least-bytes plan.

    Raises:
        ValueError: ``budget`` outside [0, 1], or a problem without any plan.
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not (0.0 <= budget <= 1.0):
        raise ValueError(f"`solve_remat_budget(budget={budget!r})` must be a number in [0, 1].")
    lo, hi = bounds if bounds is not None else remat_bounds(problem, time_limit=time_limit)
    if budget >= 1.0:
        return hi
    if budget <= 0.0:
        return lo
    cap = lo.saved_bytes + float(budget) * max(hi.saved_bytes - lo.saved_bytes, 0)
    sol = solve_remat(problem, cap, time_limit=time_limit)
    return sol if sol is not None else lo


def check_solution(problem: RematProblem, saved: Sequence[int], recomputed: Sequence[int]) -> list[str]:
    """The constraints a plan violates (empty when it is valid): the oracle for tests and callers."""
    s, r = set(saved), set(recomputed)
    out = [f"value {i} is both saved and recomputed" for i in sorted(s & r)]
    out += [f"value {i} is needed but neither saved nor recomputed" for i in range(problem.n)
            if problem.needed[i] and i not in s and i not in r]
    out += [f"value {v} is recomputed but its input {u} is neither saved nor recomputed"
            for u, v in problem.edges if v in r and u not in s and u not in r]
    out += [f"value {i} cannot be saved" for i in sorted(s) if not problem.saveable[i]]
    out += [f"value {i} cannot be recomputed" for i in sorted(r) if not problem.recomputable[i]]
    return out
