"""The whole-graph rematerialization MILP on plain data, against brute force."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from lightning_memplan.core.remat import (
    RematProblem,
    check_solution,
    remat_bounds,
    solve_remat,
    solve_remat_budget,
)


def _random_problem(rng: np.random.Generator, n: int) -> RematProblem:
    edges = tuple((u, v) for v in range(1, n) for u in range(v) if rng.random() < 0.35)
    return RematProblem(
        nbytes=tuple(int(x) for x in rng.integers(1, 100, n)),
        cost=tuple(float(x) for x in rng.integers(0, 50, n)),
        needed=tuple(bool(x) for x in rng.random(n) < 0.5),
        saveable=tuple(bool(x) for x in rng.random(n) < 0.9),
        recomputable=tuple(bool(x) for x in rng.random(n) < 0.9),
        edges=edges,
    )


def _brute_force(p: RematProblem, cap: float) -> float | None:
    """Least cost of any valid plan saving at most ``cap`` bytes (None: no plan)."""
    best = None
    for states in itertools.product((0, 1, 2), repeat=p.n):  # 0 neither, 1 saved, 2 recomputed
        saved = [i for i, st in enumerate(states) if st == 1]
        recomputed = [i for i, st in enumerate(states) if st == 2]
        if sum(p.nbytes[i] for i in saved) > cap or check_solution(p, saved, recomputed):
            continue
        cost = sum(p.cost[i] for i in recomputed)
        best = cost if best is None else min(best, cost)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_the_plan_is_valid_and_as_cheap_as_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = _random_problem(rng, 7)
    total = sum(p.nbytes)
    for cap in (total, total * 0.6, total * 0.3, total * 0.1, 0):
        want = _brute_force(p, cap)
        got = solve_remat(p, cap)
        if want is None:
            assert got is None
            continue
        assert got is not None and got.optimal
        assert check_solution(p, got.saved, got.recomputed) == []
        assert got.saved_bytes <= cap
        assert got.cost == pytest.approx(want)


def test_a_chain_recomputes_the_cheapest_values_first() -> None:
    # a -> b -> c, each 10 bytes, the backward reads all three; b is cheap, c expensive, a mid
    p = RematProblem(nbytes=(10, 10, 10), cost=(5.0, 1.0, 100.0), needed=(True, True, True),
                     saveable=(True, True, True), recomputable=(True, True, True), edges=((0, 1), (1, 2)))
    assert solve_remat(p, 30).recomputed == ()
    s20 = solve_remat(p, 20)
    assert s20.recomputed == (1,) and s20.saved == (0, 2) and s20.cost == 1.0
    s10 = solve_remat(p, 10)  # recompute b (needs a: recomputed too) and keep c
    assert s10.saved == (2,) and s10.recomputed == (0, 1) and s10.cost == 6.0
    assert solve_remat(p, 0).cost == 106.0


def test_budgets_span_the_cheapest_and_the_least_memory_plans() -> None:
    rng = np.random.default_rng(11)
    p = _random_problem(rng, 9)
    lo, hi = remat_bounds(p)
    assert solve_remat_budget(p, 1.0, bounds=(lo, hi)) == hi
    assert solve_remat_budget(p, 0.0, bounds=(lo, hi)) == lo
    assert lo.saved_bytes <= hi.saved_bytes and lo.cost >= hi.cost
    prev = None
    for b in (1.0, 0.75, 0.5, 0.25, 0.0):
        sol = solve_remat_budget(p, b, bounds=(lo, hi))
        assert check_solution(p, sol.saved, sol.recomputed) == []
        assert sol.saved_bytes <= lo.saved_bytes + b * (hi.saved_bytes - lo.saved_bytes) + 1e-6
        if prev is not None:
            assert sol.cost >= prev.cost - 1e-9  # less memory never costs less
        prev = sol


def test_cannot_save_and_cannot_recompute_are_respected() -> None:
    # value 0 is a multi-output tuple (not saveable), 1 is its item; 2 is random (not recomputable)
    p = RematProblem(nbytes=(0, 8, 8), cost=(10.0, 0.0, 1.0), needed=(False, True, True),
                     saveable=(False, True, True), recomputable=(True, True, False), edges=((0, 1),))
    sol = solve_remat(p, 8)  # 2 must be saved; 1 then must be recomputed through 0
    assert sol.saved == (2,) and sol.recomputed == (0, 1)
    assert solve_remat(p, 7) is None
    stuck = RematProblem(nbytes=(8,), cost=(1.0,), needed=(True,), saveable=(False,), recomputable=(False,), edges=())
    with pytest.raises(ValueError, match="no plan"):
        remat_bounds(stuck)


def test_bad_input_is_refused_with_the_argument_named() -> None:
    with pytest.raises(ValueError, match="one entry per value"):
        RematProblem(nbytes=(1, 2), cost=(1.0,), needed=(True, True), saveable=(True, True),
                     recomputable=(True, True), edges=())
    with pytest.raises(ValueError, match=r"edges must be \(u, v\) with 0 <= u < v < 2"):
        RematProblem(nbytes=(1, 2), cost=(1.0, 1.0), needed=(True, True), saveable=(True, True),
                     recomputable=(True, True), edges=((1, 0),))
    p = RematProblem(nbytes=(1,), cost=(1.0,), needed=(True,), saveable=(True,), recomputable=(True,), edges=())
    with pytest.raises(ValueError, match=r"`solve_remat_budget\(budget=1\.5\)` must be a number in \[0, 1\]"):
        solve_remat_budget(p, 1.5)
    with pytest.raises(ValueError, match=r"`solve_remat\(max_saved_bytes=-1\)`"):
        solve_remat(p, -1)


def test_a_graph_whose_backward_reads_nothing_saves_and_recomputes_nothing() -> None:
    p = RematProblem(nbytes=(4, 4), cost=(1.0, 1.0), needed=(False, False), saveable=(True, True),
                     recomputable=(True, True), edges=((0, 1),))
    for sol in (*remat_bounds(p), solve_remat_budget(p, 0.5), solve_remat(p, 0)):
        assert (sol.saved, sol.recomputed, sol.saved_bytes, sol.cost) == ((), (), 0, 0.0)
