"""Rematerialization of repeated blocks, one block solved for all: plain data."""
from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from lightning_memplan.core.remat import RematProblem, check_solution, solve_remat
from lightning_memplan.core.remat_parts import parts_bounds, solve_parts_budget, split_repeated


def _chain_of_blocks(copies: int, seed: int = 0, *, widths: list[int] | None = None) -> tuple[RematProblem, list[list[int]]]:
    """A stem value, ``copies`` blocks of one random 4-value problem (each block's first value reads
    the previous block's last), a head value reading the last block: (problem, the blocks' values)."""
    rng = np.random.default_rng(seed)
    inner = [(u, v) for v in range(1, 4) for u in range(v) if rng.random() < 0.5] + [(2, 3)]
    nbytes = [int(x) for x in rng.integers(1, 100, 4)]
    cost = [float(x) for x in rng.integers(1, 50, 4)]
    needed = [bool(x) for x in rng.random(4) < 0.6]
    vals: dict[str, list] = {"nbytes": [10], "cost": [5.0], "needed": [True], "saveable": [True], "recomputable": [True]}
    edges: list[tuple[int, int]] = []
    groups = []
    for k in range(copies):
        base = 1 + 4 * k
        groups.append(list(range(base, base + 4)))
        scale = (widths or [1] * copies)[k]
        vals["nbytes"] += [b * scale for b in nbytes]
        vals["cost"] += cost
        vals["needed"] += needed
        vals["saveable"] += [True] * 4
        vals["recomputable"] += [True] * 4
        edges += [(base + u, base + v) for u, v in sorted(set(inner))]
        edges.append((base - 1 if k else 0, base))  # the previous block's last value (the stem's for the first)
    head = 1 + 4 * copies
    for key, v in (("nbytes", 20), ("cost", 7.0), ("needed", True), ("saveable", True), ("recomputable", True)):
        vals[key].append(v)
    edges.append((head - 1, head))
    problem = RematProblem(**{k: tuple(v) for k, v in vals.items()}, edges=tuple(sorted(edges)))
    return problem, groups


def _least_cost(p: RematProblem, cap: float) -> float | None:
    best = None
    for states in itertools.product((0, 1, 2), repeat=p.n):
        saved = [i for i, st in enumerate(states) if st == 1]
        recomputed = [i for i, st in enumerate(states) if st == 2]
        if sum(p.nbytes[i] for i in saved) <= cap and not check_solution(p, saved, recomputed):
            cost = sum(p.cost[i] for i in recomputed)
            best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_one_block_solved_for_all_is_a_valid_plan_of_the_whole_graph(seed: int) -> None:
    problem, groups = _chain_of_blocks(5, seed)
    parts = split_repeated(problem, groups)
    assert parts is not None and parts.block.n == 4 and parts.others.n == 2
    bounds = parts_bounds(parts)
    for budget in (1.0, 0.6, 0.3, 0.0):
        sol = solve_parts_budget(parts, budget, bounds=bounds)
        assert check_solution(problem, sol.saved, sol.recomputed) == []
        # the same plan in every copy, position by position
        plans = {(tuple(g.index(v) for v in sol.saved if v in g), tuple(g.index(v) for v in sol.recomputed if v in g))
                 for g in groups}
        assert len(plans) == 1
        assert sol.saved_bytes == sum(problem.nbytes[i] for i in sol.saved)
        assert sol.cost == pytest.approx(sum(problem.cost[i] for i in sol.recomputed))
        # the block's plan is the block problem's optimum at its own cap (brute force)
        lo, hi = bounds[0]
        cap = lo.saved_bytes + budget * (hi.saved_bytes - lo.saved_bytes)
        block_cost = sum(problem.cost[i] for i in sol.recomputed if i in groups[0])
        assert block_cost == pytest.approx(_least_cost(parts.block, cap))


def test_the_boundaries_are_saved_and_budget_one_costs_what_the_whole_graph_costs() -> None:
    problem, groups = _chain_of_blocks(4, 1)
    parts = split_repeated(problem, groups)
    assert parts is not None
    sol = solve_parts_budget(parts, 1.0)
    last_values = [g[-1] for g in groups]  # each read by the next block (the head for the last)
    assert set(last_values) <= set(sol.saved)
    whole = solve_remat(problem, sum(problem.nbytes))
    assert whole is not None and sol.cost == pytest.approx(whole.cost)


def test_a_block_that_poses_another_problem_is_solved_with_the_rest() -> None:
    wider, groups = _chain_of_blocks(4, 2, widths=[1, 1, 2, 1])  # one block of another width
    parts = split_repeated(wider, groups)
    assert parts is not None and parts.groups == (tuple(groups[0]), tuple(groups[1]), tuple(groups[3]))
    assert set(groups[2]) <= set(parts.rest)
    sol = solve_parts_budget(parts, 0.4)
    assert check_solution(wider, sol.saved, sol.recomputed) == []
    assert split_repeated(wider, [groups[1], groups[2]]) is None  # no two alike


def test_a_copy_with_another_edge_or_flag_is_not_taken_for_a_copy() -> None:
    same, groups = _chain_of_blocks(4, 2)
    b0, b1 = groups[0][0], groups[1][0]
    missing = next((u, v) for v in range(1, 4) for u in range(v) if (b0 + u, b0 + v) not in same.edges)
    extra = tuple(sorted({*same.edges, (b1 + missing[0], b1 + missing[1])}))  # an inner edge of the second copy only
    parts = split_repeated(dataclasses.replace(same, edges=extra), groups)
    assert parts is not None and tuple(groups[1]) not in parts.groups and set(groups[1]) <= set(parts.rest)
    flags = list(same.recomputable)
    flags[groups[3][1]] = False  # a value only the last copy cannot recompute
    parts = split_repeated(dataclasses.replace(same, recomputable=tuple(flags)), groups)
    assert parts is not None and len(parts.groups) == 3 and set(groups[3]) <= set(parts.rest)
    assert split_repeated(same, groups[:1]) is None  # one copy is no repetition


def test_a_boundary_value_that_cannot_be_saved_keeps_the_graph_whole() -> None:
    problem, groups = _chain_of_blocks(3, 0)
    saveable = list(problem.saveable)
    for g in groups:
        saveable[g[-1]] = False  # every block's output, read by the next part
    assert split_repeated(dataclasses.replace(problem, saveable=tuple(saveable)), groups) is None


def test_bad_groups_are_refused() -> None:
    problem, groups = _chain_of_blocks(3, 0)
    with pytest.raises(ValueError, match="disjoint"):
        split_repeated(problem, [groups[0], groups[0]])
    with pytest.raises(ValueError, match="disjoint"):
        split_repeated(problem, [groups[0], [problem.n, problem.n + 1, 0, 1]])
