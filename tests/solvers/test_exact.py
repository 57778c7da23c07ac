"""Property tests against brute force over all subsets (seeded, thousands of small instances)."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from lightning_memplan.solvers import (
    dp_knapsack,
    get_solver,
    greedy_knapsack,
    hirschberg_knapsack,
    ilp_knapsack,
)
from lightning_memplan.solvers._problem import fits, quantize_budget, quantize_sizes

from .oracle import optima, random_instance

FAMILIES = ("loguniform", "grid", "wide")


def _check_plan(memory, runtimes, budget, result) -> float:
    value, saved, recomputed = result
    n = len(memory)
    assert sorted(saved + recomputed) == list(range(n)), "saved/recomputed must partition range(n)"
    assert saved == sorted(saved) and recomputed == sorted(recomputed)
    assert fits(np.asarray(memory), saved, budget), "plan exceeds max_memory in real units"
    assert value == pytest.approx(math.fsum(runtimes[i] for i in saved), rel=1e-12, abs=0)
    assert all(memory[i] > 0 or i in saved for i in range(n)), "zero-size items are always saved"
    assert not any(memory[i] > budget for i in saved), "oversize items are never saved"
    return value


def _instances(count: int, seed: int):
    rng = np.random.default_rng(seed)
    for k in range(count):
        n = int(rng.integers(0, 11))
        yield random_instance(rng, n, FAMILIES[k % len(FAMILIES)])


@pytest.mark.parametrize("solver", [dp_knapsack, hirschberg_knapsack], ids=["dp", "hirschberg"])
def test_quantized_solvers_are_optimal_for_the_quantized_problem(solver) -> None:
    for memory, runtimes, budget in _instances(1500, seed=1):
        if len(memory) == 0:
            assert solver(memory, runtimes, budget) == (0.0, [], [])
            continue
        opt = optima(memory, runtimes, budget)
        raw = solver(memory, runtimes, budget, complete=False)
        value = _check_plan(memory, runtimes, budget, raw)
        q = quantize_sizes(memory, 10_000)
        assert q[raw[1]].sum() <= quantize_budget(budget, 10_000)
        assert value == pytest.approx(opt.quantized, rel=1e-12, abs=0)
        # completed plan: at least the quantized optimum, at most the real optimum
        done = _check_plan(memory, runtimes, budget, solver(memory, runtimes, budget))
        assert opt.quantized * (1 - 1e-12) <= done <= opt.real * (1 + 1e-12)


@pytest.mark.parametrize("name", ["greedy", "dp", "hirschberg", "ilp"])
def test_issue_24_any_finite_sizes_match_the_oracle(name: str) -> None:
    # sizes from 1e-300 to 1e300, often in one instance: no OverflowError, every plan feasible in
    # exact arithmetic, dp/hirschberg optimal at their (coarsened) quantization, ilp on real values
    rng = np.random.default_rng(24)
    solver = get_solver(name)
    for _ in range(300):
        memory, runtimes, budget = random_instance(rng, int(rng.integers(1, 11)), "extreme")
        opt = optima(memory, runtimes, budget)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # neither time-limit nor numpy overflow warnings
            value = _check_plan(memory, runtimes, budget, solver(memory, runtimes, budget))
            if name in ("dp", "hirschberg"):
                raw = _check_plan(memory, runtimes, budget, solver(memory, runtimes, budget, complete=False))
                assert raw == pytest.approx(opt.quantized, rel=1e-12, abs=0)
                assert opt.quantized * (1 - 1e-12) <= value
        if name == "ilp":
            assert value == pytest.approx(opt.real, rel=1e-9, abs=0)
        assert value <= opt.real * (1 + 1e-12)


def test_ilp_is_optimal_on_real_values() -> None:
    for memory, runtimes, budget in _instances(600, seed=2):
        if len(memory) == 0:
            continue
        opt = optima(memory, runtimes, budget)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no time-limit warning on small instances
            value = _check_plan(memory, runtimes, budget, ilp_knapsack(memory, runtimes, budget))
        assert value == pytest.approx(opt.real, rel=1e-9, abs=0)


def test_greedy_is_feasible_and_never_beats_the_optimum() -> None:
    for memory, runtimes, budget in _instances(1500, seed=3):
        if len(memory) == 0:
            continue
        opt = optima(memory, runtimes, budget)
        value = _check_plan(memory, runtimes, budget, greedy_knapsack(memory, runtimes, budget))
        assert value <= opt.real * (1 + 1e-12)


@pytest.mark.parametrize("name", ["greedy", "dp", "hirschberg", "ilp"])
@pytest.mark.parametrize(
    ("memory", "runtimes", "budget", "saved"),
    [
        ([], [], 0.5, []),
        ([0.1, 0.2], [1.0, 2.0], 0.0, []),  # budget 0 saves nothing with a size
        ([0.0, 0.2, 0.0], [0.0, 2.0, 5.0], 0.0, [0, 2]),  # zero-size always saved
        ([0.7, 0.2], [9.0, 2.0], 0.5, [1]),  # larger than the budget: never saved
        ([0.2, 0.2], [0.0, 1.0], 1.0, [1]),  # zero runtime with a size: not worth saving
        ([0.25, 0.25, 0.25, 0.25], [1.0, 1.0, 1.0, 1.0], 10.0, [0, 1, 2, 3]),  # all fit
    ],
)
def test_edge_cases(name: str, memory, runtimes, budget, saved) -> None:
    value, got, _ = get_solver(name)(memory, runtimes, budget)
    assert got == saved
    assert value == sum(runtimes[i] for i in saved)


def test_ties_are_deterministic_and_documented() -> None:
    # four identical items, room for two: the DP keeps the first-visited ones (same size, so
    # by index) and greedy too (ties by index)
    memory, runtimes = [0.25] * 4, [1.0] * 4
    for name in ("dp", "hirschberg", "greedy"):
        assert get_solver(name)(memory, runtimes, 0.5)[1] == [0, 1]
    # equal value, different memory: dp picks the plan with the least memory
    value, saved, _ = dp_knapsack([0.3, 0.1, 0.1], [2.0, 1.0, 1.0], 0.3, complete=False)
    assert (value, saved) == (2.0, [1, 2])
    # repeated calls give the same answer
    rng = np.random.default_rng(7)
    m, r, b = random_instance(rng, 200, "grid")
    for name in ("dp", "hirschberg", "greedy", "ilp"):
        assert get_solver(name)(m, r, b) == get_solver(name)(m, r, b)


@pytest.mark.parametrize("n", [1000, 3000])
def test_large_instances_feasible_and_consistent(n: int) -> None:
    rng = np.random.default_rng(n)
    memory = np.exp(rng.uniform(0, np.log(1e4), n))
    memory /= memory.sum()
    runtimes = np.exp(rng.uniform(0, np.log(1e12), n))
    results = {}
    for name in ("greedy", "dp", "hirschberg", "ilp"):
        results[name] = _check_plan(memory, runtimes, 0.5, get_solver(name)(memory, runtimes, 0.5))
    raw_dp = dp_knapsack(memory, runtimes, 0.5, complete=False)[0]
    raw_h = hirschberg_knapsack(memory, runtimes, 0.5, complete=False)[0]
    assert raw_dp == pytest.approx(raw_h, rel=1e-12)
    assert results["ilp"] >= max(results.values()) * (1 - 1e-12)
    assert results["dp"] >= raw_dp
