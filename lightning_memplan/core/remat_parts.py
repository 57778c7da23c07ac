"""Rematerialization of a graph of repeated blocks: one block's problem solved for every copy.

A model of ``K`` identical blocks (a transformer's layers) gives a :class:`RematProblem` of ``K``
copies of one sub-problem plus the values outside them (stem, head). The whole-graph MILP grows
faster than the graph; here the graph is cut at the blocks' boundaries and each distinct part is
solved once:

* **Parts.** ``groups`` are the copies' values (index lists aligned by position: value ``p`` of one
  copy corresponds to value ``p`` of every other); the *rest* is every other value.
* **Boundaries fixed.** A value read by a value of another part is saved (``needed``, not
  recomputable, in its own part's problem), so every edge between parts holds whatever the other
  part decides and the parts' problems are independent.
* **Budget per part.** At budget ``b`` each part saves at most ``lo + b * (hi - lo)`` of its own
  bytes (:func:`~lightning_memplan.core.remat.solve_remat_budget` on the part's problem): the same
  ratio of activation memory in every block, as the whole graph's budget is over all values.
* **Copies.** The copies are the groups that pose the same problem (each value's bytes, cost, flags
  and boundary status, and the edges inside the copy, position by position); one solve is the plan
  of all of them. A group that differs (another width, another op, a first block that computes no
  gradient for its input) joins the rest; without two alike, :func:`split_repeated` returns
  ``None`` and the caller solves the whole graph.

The plan is valid for the whole problem (:func:`~lightning_memplan.core.remat.check_solution`), and
each part's plan is that part's optimum at its cap. It is not the whole-graph optimum at a cap on the
total: a boundary value is saved even where that optimum would recompute it. Pure data in, data out.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from lightning_memplan.core.remat import (
    DEFAULT_TIME_LIMIT,
    RematProblem,
    RematSolution,
    remat_bounds,
    solve_remat_budget,
)

__all__ = ["RepeatedParts", "parts_bounds", "solve_parts_budget", "split_repeated"]

Bounds = tuple[RematSolution, RematSolution]


@dataclass(frozen=True)
class RepeatedParts:
    """A problem cut into copies of one block and the rest. Invariant: ``groups`` and ``rest`` are
    disjoint and cover every value; every group has ``block.n`` values; ``others.n == len(rest)``."""

    groups: tuple[tuple[int, ...], ...]
    """Each copy's values (indices of the whole problem), aligned by position."""
    rest: tuple[int, ...]
    """The values outside every copy, ascending."""
    block: RematProblem
    """The first copy's problem (its boundary values forced saved); every copy's."""
    others: RematProblem
    """The rest's problem (its boundary values forced saved)."""


def _subproblem(p: RematProblem, members: Sequence[int]) -> tuple[RematProblem, tuple[bool, ...]] | None:
    """``members``' problem with the edges from outside dropped and the values read outside forced
    saved, and which values are so forced; ``None`` when a forced value cannot be saved."""
    local = {v: i for i, v in enumerate(members)}
    forced = [False] * len(members)
    edges: list[tuple[int, int]] = []
    for u, v in p.edges:
        if u in local and v in local:
            edges.append((local[u], local[v]))
        elif u in local:
            forced[local[u]] = True
    if any(f and not p.saveable[v] for v, f in zip(members, forced)):
        return None
    sub = RematProblem(
        nbytes=tuple(p.nbytes[v] for v in members), cost=tuple(p.cost[v] for v in members),
        needed=tuple(p.needed[v] or f for v, f in zip(members, forced)),
        saveable=tuple(p.saveable[v] for v in members),
        recomputable=tuple(p.recomputable[v] and not f for v, f in zip(members, forced)),
        edges=tuple(sorted(edges)))
    return sub, tuple(forced)


def split_repeated(problem: RematProblem, groups: Sequence[Sequence[int]]) -> RepeatedParts | None:
    """``problem`` cut into copies and the rest: the copies are the largest set of ``groups`` (value
    index lists aligned by position) that pose one problem, two or more (ties: the earliest); the
    other groups' values join the rest (a first block that computes no gradient for its input, a
    block of another width). ``None`` when no two groups pose one problem or a boundary value cannot
    be saved.

    Raises:
        ValueError: groups that overlap or name a value outside the problem.
    """
    gs = tuple(tuple(int(v) for v in g) for g in groups)
    flat = [v for g in gs for v in g]
    if len(set(flat)) != len(flat) or any(not 0 <= v < problem.n for v in flat):
        raise ValueError(f"split_repeated: groups must be disjoint value indices in [0, {problem.n}).")
    alike: dict[tuple[RematProblem, tuple[bool, ...]], list[tuple[int, ...]]] = {}
    for g in gs:
        sub = _subproblem(problem, g) if g else None
        if sub is not None:  # values, flags, boundary and inner edges, position by position
            alike.setdefault(sub, []).append(g)
    copies = max(alike.items(), key=lambda kv: len(kv[1]), default=None)
    if copies is None or len(copies[1]) < 2:
        return None
    (block, _), members = copies
    taken = {v for g in members for v in g}
    rest = tuple(v for v in range(problem.n) if v not in taken)
    others = _subproblem(problem, rest)
    if others is None:
        return None
    return RepeatedParts(groups=tuple(members), rest=rest, block=block, others=others[0])


def parts_bounds(parts: RepeatedParts, *, time_limit: float = DEFAULT_TIME_LIMIT) -> tuple[Bounds, Bounds]:
    """:func:`~lightning_memplan.core.remat.remat_bounds` of the block's and the rest's problems.

    Raises:
        ValueError: a part without any plan.
    """
    return (remat_bounds(parts.block, time_limit=time_limit),
            remat_bounds(parts.others, time_limit=time_limit))


def solve_parts_budget(parts: RepeatedParts, budget: float, *, bounds: tuple[Bounds, Bounds] | None = None,
                       time_limit: float = DEFAULT_TIME_LIMIT) -> RematSolution:
    """The plan of the whole problem at ``budget``: the block's plan at ``budget`` in every copy and
    the rest's plan at ``budget`` (module docstring). ``bounds``: :func:`parts_bounds`' result when
    the caller has it. ``optimal`` holds when both solves were proved optimal.

    Raises:
        ValueError: ``budget`` outside [0, 1], or a part without any plan.
    """
    block_bounds, rest_bounds = bounds if bounds is not None else parts_bounds(parts, time_limit=time_limit)
    blk = solve_remat_budget(parts.block, budget, bounds=block_bounds, time_limit=time_limit)
    oth = solve_remat_budget(parts.others, budget, bounds=rest_bounds, time_limit=time_limit)
    saved = sorted([g[i] for g in parts.groups for i in blk.saved] + [parts.rest[i] for i in oth.saved])
    recomputed = sorted([g[i] for g in parts.groups for i in blk.recomputed]
                        + [parts.rest[i] for i in oth.recomputed])
    k = len(parts.groups)
    return RematSolution(saved=tuple(saved), recomputed=tuple(recomputed),
                         saved_bytes=k * blk.saved_bytes + oth.saved_bytes, cost=k * blk.cost + oth.cost,
                         optimal=blk.optimal and oth.optimal)
